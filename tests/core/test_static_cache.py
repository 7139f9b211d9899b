"""Verification on a static cache at one fixed shape (``cache_implementation="static"``, ``hfs.enable(model,
compile=...)``): token-identical to plain greedy for chains and trees, drafts always and never accepted, EOS,
the length limit and stop strings inside accepted paths, seeded sampling; the cache is shared between calls;
models and drafters it cannot serve are refused with the fix named."""

from __future__ import annotations

import threading

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core import static_cache
from hf_speculative.core import budget, regions
from hf_speculative.drafters.eagle import static_drafting
from hf_speculative.core.state import forget, state_of
from hf_speculative.core.tree_shapes import DynamicTree, StaticTree
from tests.conftest import (EOS, AdversaryStrategy, OracleCandidateGenerator, build_model, char_tokenizer,
                            make_drafter, prompt_inputs, random_eagle, stock_generate)

ARCHS = ("llama", "qwen2")  # full attention; Gemma3's sliding layers are refused (test below)
TREE = DynamicTree(nodes=8, depth=4, top_k=3)
CHAINS = ("prompt-lookup-fixed", "draft-model", "draft-model-copy", "eagle1", "eagle3", "hybrid")


def static_generate(model, strategy, **kwargs):
    return model.generate(**prompt_inputs(), do_sample=False, candidate_generator=strategy,
                          cache_implementation="static", **kwargs)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", CHAINS)
def test_chains_on_a_static_cache_equal_greedy(arch, name, monkeypatch):
    runs = []
    from hf_speculative.core import loop

    monkeypatch.setattr("hf_speculative.core.entry.ladder", lambda *a, **k: runs.append(a[1]) or loop.ladder(*a, **k))
    model = hfs.enable(build_model(arch))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    out = static_generate(model, make_drafter(name, model, expected), max_new_tokens=30)
    assert out.tolist() == expected.tolist()
    assert len(runs) == 1 and isinstance(runs[0], static_cache.StaticVerifier)  # our loop, on a static cache
    assert hfs.last_stats(model).drafted_tokens > 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["lookup-tree", "eagle-dynamic", "eagle-static"])
def test_trees_on_a_static_cache_equal_greedy(arch, name):
    model = hfs.enable(build_model(arch))
    strategy = {"lookup-tree": lambda: hfs.PromptLookup(tree=TREE, adaptive=False),
                "eagle-dynamic": lambda: hfs.Eagle(random_eagle(model), tree=TREE, adaptive=False),
                "eagle-static": lambda: hfs.Eagle(random_eagle(model, version=1), adaptive=False,
                                                  tree=StaticTree([(0,), (1,), (0, 0), (0, 0, 0)]))}[name]()
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40)
    assert static_generate(model, strategy, max_new_tokens=40).tolist() == expected.tolist()
    assert hfs.last_stats(model).drafted_tokens > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_drafts_always_and_never_accepted(arch):
    model = hfs.enable(build_model(arch))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    hfs.enable(model, static_budget=6)  # a raw CandidateGenerator does not say how long its drafts are
    out = static_generate(model, OracleCandidateGenerator(expected, num_tokens=6), max_new_tokens=30)
    assert out.tolist() == expected.tolist()
    stats = hfs.last_stats(model)
    assert stats.accepted_tokens == stats.drafted_tokens > 0 and stats.target_forwards <= 6  # 30 tokens, 7 a forward
    out = static_generate(model, AdversaryStrategy(expected, num_tokens=6), max_new_tokens=30)
    assert out.tolist() == expected.tolist() and hfs.last_stats(model).accepted_tokens == 0
    forget(model)


@pytest.mark.parametrize("arch", ARCHS)
def test_stops_inside_accepted_paths(arch):
    model, tokenizer = hfs.enable(build_model(arch)), char_tokenizer()
    free = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None)
    start = prompt_inputs()["input_ids"].shape[1]
    oracle = OracleCandidateGenerator(free, num_tokens=6)
    hfs.enable(model, static_budget=6)
    stop = tokenizer.decode(free[0, start + 7: start + 9])  # inside the second accepted draft
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None,
                              stop_strings=[stop], tokenizer=tokenizer)
    out = static_generate(model, oracle, max_new_tokens=30, eos_token_id=None, stop_strings=[stop], tokenizer=tokenizer)
    assert out.tolist() == expected.tolist()
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=9, eos_token_id=None)
    out = static_generate(model, OracleCandidateGenerator(free, num_tokens=6), max_new_tokens=9, eos_token_id=None)
    assert out.tolist() == expected.tolist()  # the length limit in the middle of an accepted draft
    if EOS[arch] is not None:
        eos = int(free[0, start + 4])
        expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=eos)
        out = static_generate(model, OracleCandidateGenerator(free, num_tokens=6), max_new_tokens=30, eos_token_id=eos)
        assert out.tolist() == expected.tolist()
    forget(model)


def test_seeded_sampling_on_a_static_cache_is_the_plain_seeded_sample():
    model = hfs.enable(build_model("llama"))
    kwargs = dict(**prompt_inputs(), do_sample=True, temperature=0.8, max_new_tokens=25, sampling_seed=11)
    plain = model.generate(**kwargs)
    for strategy in (hfs.PromptLookup(adaptive=False), hfs.PromptLookup(tree=TREE, adaptive=False)):
        assert model.generate(**kwargs, candidate_generator=strategy, cache_implementation="static").tolist() \
            == plain.tolist()


def test_the_static_cache_is_shared_between_calls_and_not_between_concurrent_ones():
    model = hfs.enable(build_model("llama"))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=20)
    static_generate(model, hfs.PromptLookup(tree=TREE, adaptive=False), max_new_tokens=20)
    first = state_of(model).static_cache[1]
    static_generate(model, hfs.PromptLookup(tree=TREE, adaptive=False), max_new_tokens=20)
    assert state_of(model).static_cache[1] is first  # same size: the same cache (and compiled graph)
    capacity = state_of(model).static_cache[0][0]
    assert capacity % static_cache.CAPACITY_STEP == 0 and capacity >= expected.shape[1] + TREE.nodes + 1
    longer = static_generate(model, hfs.PromptLookup(tree=TREE, adaptive=False), max_new_tokens=capacity)
    assert longer.tolist() == stock_generate(model, **prompt_inputs(), do_sample=False,
                                             max_new_tokens=capacity).tolist()
    grown = state_of(model).static_cache
    assert grown[1] is not first and grown[0][0] > capacity  # a longer call: a larger cache replaces the held one
    static_generate(model, hfs.PromptLookup(tree=TREE, adaptive=False), max_new_tokens=20)
    assert state_of(model).static_cache[1] is grown[1]  # and shorter calls use it (no graph per length)

    results, barrier = [], threading.Barrier(3)

    def call():
        barrier.wait()
        results.append(static_generate(model, hfs.PromptLookup(tree=TREE, adaptive=False), max_new_tokens=20).tolist())

    threads = [threading.Thread(target=call) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected.tolist()] * 3


def test_static_verifier_pads_every_draft_to_one_shape_and_runs_plain_steps_at_one_token():
    model = build_model("llama")
    verifier = static_cache.StaticVerifier(model, budget=8, capacity=256)
    shapes = []
    original = model.forward
    model.forward = lambda **kw: shapes.append((tuple(kw["input_ids"].shape), tuple(kw["attention_mask"].shape))) \
        or original(**kw)
    try:
        from hf_speculative.core.tree import DraftTree

        verifier.forward_row(torch.tensor([3, 5, 6, 7]), DraftTree.chain([8, 9]))  # prefill, then the step
        verifier.keep_row(3, DraftTree.chain([8, 9]), [0])
        verifier.forward_row(torch.tensor([9]), DraftTree(torch.tensor([5, 6, 7]), torch.tensor([-1, -1, 0])))
        verifier.keep_row(5, DraftTree(torch.tensor([5, 6, 7]), torch.tensor([-1, -1, 0])), [])
        plain = verifier.forward_row(torch.tensor([4]), DraftTree.empty())  # no draft: one token, its own shape
    finally:
        model.forward = original
        verifier.close()
    assert shapes == [((1, 3), (1, 1, 3, 256)), ((1, 9), (1, 1, 9, 256)), ((1, 9), (1, 1, 9, 256)),
                      ((1, 1), (1, 1, 1, 256))]
    assert verifier.length == 6 and plain.shape == (1, model.config.vocab_size)


def test_models_and_drafters_a_static_cache_cannot_serve_are_refused():
    gemma = hfs.enable(build_model("gemma3"))
    with pytest.raises(static_cache.StaticCacheError, match="sliding-window layers"):
        static_generate(gemma, hfs.PromptLookup(), max_new_tokens=5)
    with pytest.raises(static_cache.StaticCacheError, match="sliding-window layers"):
        hfs.enable(gemma, compile=True)
    model = hfs.enable(build_model("llama"))
    with pytest.raises(static_cache.StaticCacheError, match="dynamic KV cache"):
        static_generate(model, hfs.EarlyExit(exit_layer=1), max_new_tokens=5)
    with pytest.raises(static_cache.StaticCacheError, match="dynamic KV cache"):
        static_generate(model, hfs.Hybrid(hfs.PromptLookup(), hfs.LayerSkip(skip=[0])), max_new_tokens=5)
    hfs.enable(model, static_budget=4)
    with pytest.raises(static_cache.StaticCacheError, match=r"static_budget=4\) is smaller than the 8"):
        static_generate(model, hfs.PromptLookup(tree=TREE), max_new_tokens=5)
    for bad in ("fast", 3, 1.5):
        with pytest.raises(ValueError, match="compile="):
            hfs.enable(model, compile=bad)
    with pytest.raises(ValueError, match="static_budget"):
        hfs.enable(model, static_budget=0)
    with pytest.raises(ValueError, match="cannot be rolled back"):
        model.generate(**prompt_inputs(), candidate_generator=hfs.PromptLookup(), cache_implementation="offloaded")
    forget(model)


def feature_drafters(model):
    """Drafters that read the target's states: EAGLE-3 (layers 1, 1, 0 of a 4-layer target), EAGLE-1 and Medusa (the
    final norm's output), DFlash (the registry's examples), MTP (its own layers, where transformers has them), as
    chains and trees."""
    from hf_speculative.drafters import registry
    from tests.drafters.medusa.conftest import random_heads

    mtp = {}
    try:  # MTP's own layers (transformers 5.x): each step one region under compile=
        mtp = {"mtp-chain": registry.example("mtp", model), "mtp-tree": registry.example("mtp-tree", model)}
    except registry.ExampleNotApplicable:
        pass
    dflash = {"dflash-chain": registry.example("dflash", model), "dflash-tree": registry.example("dflash-tree", model)}
    return {**mtp, **dflash, "eagle3-tree": hfs.Eagle(random_eagle(model), tree=TREE, adaptive=False),
            "eagle3-chain": hfs.Eagle(random_eagle(model), num_tokens=4, confidence_threshold=0.0, adaptive=False),
            "eagle1-tree": hfs.Eagle(random_eagle(model, version=1), tree=TREE, adaptive=False),
            "medusa-tree": hfs.Medusa(random_heads(model), adaptive=False,
                                      tree=StaticTree([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])),
            "medusa-chain": hfs.Medusa(random_heads(model), adaptive=False, confidence_threshold=0.0)}


@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_targets_feed_drafters_from_their_outputs(arch, monkeypatch):
    """Under compile= the verifier runs the target with output_hidden_states=True and hands the states to the
    drafters; no hook is on the target in its forwards (hooks break compiled graphs). The drafts are those the
    hooks give on a static cache without compiling: same drafted and kept counts, same text as greedy. (The
    compiled forward is the eager model here; the real torch.compile is the slow test below.)"""
    model = hfs.enable(build_model(arch, layers=4))
    forwards = []

    def compiled(target, mode):
        def forward(**kwargs):
            modules = [*target.model.layers, target.model.norm]  # (transformers 5 records hidden states with hooks of
            # its own, made to run under compile: only ours are counted)
            ours = [h for m in modules for h in m._forward_hooks.values() if "FeatureTap" in h.__qualname__]
            forwards.append((kwargs.get("output_hidden_states", False), len(ours)))
            return target(**kwargs)
        return forward

    monkeypatch.setattr(static_cache, "compiled_forward", compiled)
    monkeypatch.setattr(regions, "compile_region", lambda step, mode: step)  # (tests/drafters/eagle)
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    for name, strategy in feature_drafters(model).items():
        hfs.enable(model, compile=False)
        assert static_generate(model, strategy, max_new_tokens=30).tolist() == expected.tolist()
        hooked = hfs.last_stats(model)
        hfs.enable(model, compile=True)
        forwards.clear()
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=strategy)
        assert out.tolist() == expected.tolist(), name
        fed = hfs.last_stats(model)
        assert forwards and all(states and hooks == 0 for states, hooks in forwards), (name, forwards)
        assert (fed.drafted_tokens, fed.accepted_tokens) == (hooked.drafted_tokens, hooked.accepted_tokens), name
        assert fed.drafted_tokens > 0, name
    hfs.enable(model, compile=False)
    forget(model)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_calls_last_steps_run_the_regions_of_its_others(arch, monkeypatch):
    """Near ``max_new_tokens`` a step has less room than the others (``Plan.depth < Plan.full_depth``): it runs their
    region and keeps what fits (a chain's first tokens, a tree's nodes within its levels) instead of a region of its
    own, so a call makes one region of a kind, not one per room (each one a compile: on this CPU, minutes for
    EAGLE's 8-level tree). The drafts are eager drafting's (each drafter's test_*_captured.py); here: greedy's text."""
    made, rooms = [], []
    monkeypatch.setattr(static_cache, "compiled_forward", lambda target, mode: target)
    monkeypatch.setattr(regions, "compile_region", lambda module, mode: module)
    get = regions.Regions.get

    def recording(self, key, make):
        if key not in self.runs:
            made.append(key[0])  # a new region: its kind
        return get(self, key, make)

    monkeypatch.setattr(regions.Regions, "get", recording)
    plan = budget.DraftBudget.plan
    monkeypatch.setattr(budget.DraftBudget, "plan", lambda self, *a, **k: rooms.append(plan(self, *a, **k)) or rooms[-1])
    model = hfs.enable(build_model(arch, layers=4))
    try:
        expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
        for name, strategy in feature_drafters(model).items():
            made.clear(), rooms.clear()
            hfs.enable(model, compile=True)
            out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=strategy)
            assert out.tolist() == expected.tolist(), name
            assert any(p.depth < p.full_depth for p in rooms), name  # the call reached steps with less room
            assert made and len(made) == len(set(made)), (name, made)  # one region of each kind it drafts with
    finally:
        hfs.enable(model, compile=False)
        forget(model)


def test_compiled_targets_refuse_drafters_of_the_last_layer_before_its_norm(monkeypatch):
    model = hfs.enable(build_model("llama"))  # 2 layers: EAGLE-3's default layers (1, 0, 0) include the last
    monkeypatch.setattr(static_cache, "compiled_forward", lambda target, mode: target)
    hfs.enable(model, compile=True)
    try:
        with pytest.raises(ValueError, match=r"target layer 1's output before the final norm.*without compile="):
            model.generate(**prompt_inputs(), candidate_generator=hfs.Eagle(random_eagle(model)), max_new_tokens=5)
    finally:
        hfs.enable(model, compile=False)
        forget(model)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_verification_equals_greedy(arch, monkeypatch):
    """torch.compile on the CPU (inductor): one graph for the padded step, reused by the next call; EAGLE drafts
    with its fixed-shape step compiled (tests/drafters/eagle/test_static_drafting.py), and every feature drafter's
    whole steps are compiled regions (the drafters' test_*_captured.py run them uncompiled against eager drafting).
    Every call pads its steps to one ``static_budget`` (a server's one graph for all its drafters), so that the target
    compiles a step graph once, and once more with its hidden states for the feature drafters, rather than once per
    strategy (each strategy's own width is the uncompiled static-cache tests' and test_device.py's); plain greedy runs
    eagerly, the reference the compiled calls are held to."""
    compiled_kinds, compile_step = [], regions.compile_region
    monkeypatch.setattr(regions, "compile_region", lambda module, mode: compiled_kinds.append(
        f"{type(module).__module__.split('.')[-2]}.{type(module).__name__}") or compile_step(module, mode))
    model = hfs.enable(build_model(arch, layers=4))
    try:
        expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
        hfs.enable(model, compile=True, static_budget=16)
        strategies = [hfs.PromptLookup(tree=TREE, adaptive=False), hfs.PromptLookup(tree=TREE, adaptive=False),
                      hfs.Hybrid(hfs.PromptLookup(num_tokens=8, adaptive=False),
                                 make_drafter("draft-model", model, expected)),
                      *feature_drafters(model).values()]
        for strategy in strategies:
            out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=strategy)
            assert out.tolist() == expected.tolist()
        assert state_of(model).compiled[0] == "default"
        shared = state_of(model).drafter_state(static_drafting.SharedDraftGraph)
        (drafter, _, mode, _), (step, compiled), _ = shared.held  # EAGLE's drafting compiled too
        assert mode == "default" and compiled is not step and isinstance(drafter, torch.nn.Module)
        # EAGLE's fixed chains and dynamic trees, Medusa's, DFlash's and MTP's chains and static trees drafted each
        # step in one region (their captured.py), compiled too (MTP where transformers has it)
        expected = {"eagle.ChainRegion", "eagle.TreeRegion", "medusa.ChainRegion", "medusa.TreeRegion",
                    "dflash.ChainRegion", "dflash.PathsRegion"}
        if "mtp-chain" in feature_drafters(model):
            expected |= {"mtp.ChainRegion", "mtp.TreeRegion"}
        assert expected <= set(compiled_kinds), compiled_kinds
    finally:
        hfs.enable(model, compile=False)
        forget(model)
