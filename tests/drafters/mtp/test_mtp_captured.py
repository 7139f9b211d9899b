"""``hfs.MTP`` on a compiled target (``hfs.enable(model, compile=True)``): each draft step one region over fixed-address
buffers (drafters/mtp/captured.py, static_step.py), read once. The compiled functions run eagerly here (the target's
forward and the regions, as tests/core/test_static_cache.py runs them); the drafts must be those of compile=False step
for step, and the text greedy's. The slow test compiles for real."""

from __future__ import annotations

import functools

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core import regions, static_cache
from hf_speculative.core.state import forget
from tests.conftest import PROMPT, build_model, prompt_inputs, stock_generate
from tests.drafters.mtp.conftest import needs_mtp

pytestmark = needs_mtp

TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def mtp(model, shape="chain", layers=2, num_tokens=3, **options):
    from hf_speculative.drafters.mtp.modules import random_modules

    tree = hfs.StaticTree(TREE) if shape == "tree" else None
    settings = {"tree": tree, "num_tokens": num_tokens, "adaptive": False, "confidence_threshold": 0.0, **options}
    return hfs.MTP(random_modules(model, layers, scale=0.3), **settings)


def foresee(strategy, text):
    """Make ``strategy``'s MTP layers guess ``text``'s tokens (`[1, T]`) by a tensor function, the same eagerly and in
    a region: a layer's row at position ``p`` carries ``text[p + 1]`` in its output's first entry, which the head
    turns into a point mass. The layers, their caches and masks all still run."""
    modules = strategy.modules
    vocab = int(modules.config.vocab_size)
    ahead = torch.tensor(text[0].tolist()[1:] + [4] * 1024)  # [T + 1023]: the token after each position

    for layer in modules.layers:
        def forward(*args, _run=layer.forward, **kwargs):
            out = _run(*args, **kwargs).clone()  # [1, W, H]
            out[..., 0] = ahead[kwargs["position_ids"]].to(out.dtype)
            return out
        layer.forward = forward
    modules._project_to_logits = lambda hidden: -30.0 * (torch.arange(vocab) - hidden[..., :1]).abs()
    return strategy


@pytest.fixture
def compiled_eagerly(monkeypatch):
    """compile= with the target's compiled forward and the regions run as they are; counts the regions' calls."""
    from hf_speculative.drafters.mtp import captured

    monkeypatch.setattr(static_cache, "compiled_forward", lambda target, mode: target)
    monkeypatch.setattr(regions, "compile_region", lambda module, mode: module)
    calls = []
    for cls in (captured.ChainRegion, captured.TreeRegion):
        def forward(self, *inputs, _run=cls.forward):
            calls.append(type(self).__name__)
            return _run(self, *inputs)
        monkeypatch.setattr(cls, "forward", forward)
    return calls


@pytest.fixture
def drafts(monkeypatch):
    """Each draft's tokens and parents, and the reads of the device made while drafting (``.tolist()``/``.item()``)."""
    from hf_speculative.drafters.mtp.drafter import MTPCandidateGenerator

    seen, reads, drafting = [], [], []
    draft = MTPCandidateGenerator.draft

    def recorded(self, sequence, plan):
        drafting.append(True)
        start = len(reads)
        try:
            tree = draft(self, sequence, plan)
        finally:
            drafting.pop()
        seen.append((sequence.shape[1], tree.tokens.tolist(), tree.parents.tolist(), len(reads) - start))
        return tree

    for name in ("tolist", "item"):
        original = getattr(torch.Tensor, name)

        def read(tensor, *args, _run=original, **kwargs):
            if drafting:
                reads.append(1)
            return _run(tensor, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, read)
    monkeypatch.setattr(MTPCandidateGenerator, "draft", recorded)
    return seen


def run_both(model, make, prompt=PROMPT, **kwargs):
    """The text, stats and drafts with compile=False, then with compile=True (``make()``: a fresh strategy)."""
    results = []
    for compiled in (False, True):
        hfs.enable(model, compile=compiled)
        out = model.generate(**prompt_inputs(prompt), do_sample=False, candidate_generator=make(), **kwargs)
        results.append((out, hfs.last_stats(model)))
    return results


def check_same(model, make, seen, calls, prompt=PROMPT, **kwargs):
    """compile=True gives greedy's text and compile=False's drafts, each step after the first (the prefill's) one
    region call and one read."""
    expected = stock_generate(model, **prompt_inputs(prompt), do_sample=False, **kwargs)
    try:
        runs = []
        for compiled in (False, True):
            seen.clear()
            calls.clear()
            hfs.enable(model, compile=compiled)
            out = model.generate(**prompt_inputs(prompt), do_sample=False, candidate_generator=make(), **kwargs)
            runs.append((out, hfs.last_stats(model), [d[:3] for d in seen]))
    finally:
        hfs.enable(model, compile=False)
        forget(model)
    (eager, eager_stats, eager_drafts), (out, stats, compiled_drafts) = runs
    assert eager.tolist() == expected.tolist() and out.tolist() == expected.tolist()
    assert compiled_drafts == eager_drafts
    assert (stats.drafted_tokens, stats.accepted_tokens) == (eager_stats.drafted_tokens, eager_stats.accepted_tokens)
    # before the prefill nothing to draft from; then each step one region and one read
    assert len(calls) == len(seen) - 1 and [reads for *_, reads in seen] == [0] + [1] * len(calls), (calls, seen)
    return stats


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("shape,layers", [("chain", 1), ("chain", 2), ("tree", 1), ("tree", 2)])
def test_compiled_drafts_are_the_eager_drafts(arch, shape, layers, compiled_eagerly, drafts):
    model = hfs.enable(build_model(arch, layers=4))
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None)
    stats = check_same(model, lambda: foresee(mtp(model, shape, layers), ref), drafts, compiled_eagerly,
                       max_new_tokens=30, eos_token_id=None)
    assert stats.accepted_tokens >= 2 * stats.target_forwards  # the guesses are right: long accepted paths


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_random_layers_and_the_registry_examples(arch, compiled_eagerly, drafts):
    """Random layers (their guesses rarely kept): every output row counts, through the caches, into the drafts."""
    from hf_speculative.drafters import registry

    model = hfs.enable(build_model(arch, layers=4))
    makes = {"mtp": lambda: registry.example("mtp", model), "mtp-tree": lambda: registry.example("mtp-tree", model),
             "tree of 2 layers": lambda: mtp(model, "tree", 2), "1 layer reused": lambda: mtp(model, "chain", 1, 4)}
    for make in makes.values():
        check_same(model, make, drafts, compiled_eagerly, max_new_tokens=20)


@pytest.mark.parametrize("max_new_tokens", [3, 7])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_max_new_tokens_inside_an_accepted_draft(shape, max_new_tokens, compiled_eagerly, drafts):
    model = hfs.enable(build_model("llama", layers=4))
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None)
    check_same(model, lambda: foresee(mtp(model, shape), ref), drafts, compiled_eagerly,
               max_new_tokens=max_new_tokens, eos_token_id=None)


@pytest.mark.parametrize("prompt", [[3], [3, 4], (PROMPT * 3)[:37]])
def test_short_prompts_and_one_longer_than_the_region(prompt, compiled_eagerly, drafts):
    """A prompt longer than P (= num_tokens + 1) is fed eagerly but for its last P pairs; a short one leaves the
    deeper layers' first rows out until the text has them."""
    model = hfs.enable(build_model("qwen2", layers=4))
    ref = stock_generate(model, **prompt_inputs(prompt), do_sample=False, max_new_tokens=40, eos_token_id=None)
    for layers, num_tokens in ((2, 3), (3, 4)):
        make = functools.partial(lambda n, k: foresee(mtp(model, "chain", n, k), ref), layers, num_tokens)
        check_same(model, make, drafts, compiled_eagerly, prompt=prompt, max_new_tokens=12, eos_token_id=None)


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("options,kwargs", [({}, {"repetition_penalty": 1.3}), ({"adaptive": True}, {})])
def test_processors_and_adaptive_chains_on_the_fixed_buffers(shape, options, kwargs, compiled_eagerly, drafts):
    """The call's processors choose the tokens (no region: the same forwards token by token), or the cost rules
    size the draft (a chain on a CPU token by token; a tree in its region): the text of compile=False."""
    model = hfs.enable(build_model("llama", layers=4))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=20, **kwargs)
    try:
        (eager, _), (out, _) = run_both(model, lambda: mtp(model, shape, **options), max_new_tokens=20, **kwargs)
    finally:
        hfs.enable(model, compile=False)
        forget(model)
    assert eager.tolist() == expected.tolist() == out.tolist()
    assert drafts and (not compiled_eagerly) == (bool(kwargs) or shape == "chain")


def test_adaptive_chains_at_their_longest_in_a_region_where_that_pays(compiled_eagerly, drafts, monkeypatch):
    """Where a region's extra forwards cost less than a read per token (CUDA), an adaptive chain is drafted at its
    longest in one region and cut by the cost rules replayed on what was read."""
    monkeypatch.setattr(regions, "replays_longest_chain", lambda device: True)
    model = hfs.enable(build_model("llama", layers=4))
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None)
    try:
        hfs.enable(model, compile=True)
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None,
                             candidate_generator=foresee(mtp(model, adaptive=True, confidence_threshold=0.05), ref))
    finally:
        hfs.enable(model, compile=False)
        forget(model)
    assert out.tolist() == ref[:, :out.shape[1]].tolist() and out.shape[1] == len(PROMPT) + 30
    assert set(compiled_eagerly) == {"ChainRegion"} and len(compiled_eagerly) == len(drafts) - 1
    assert all(reads == 1 for *_, reads in drafts[1:])


def test_a_loaded_glm_checkpoint_on_a_compiled_target(glm_folder, compiled_eagerly, drafts):
    """GLM-4.5's layout (a MoE decoder layer in the MTP layer, loaded from the target's folder): chains and trees
    drafted in regions, as compile=False drafts them."""
    from tests.drafters.mtp.conftest import load_glm

    model = hfs.enable(load_glm(glm_folder))
    prompt = [3, 17, 42, 9, 11, 64, 5]
    for tree in (None, hfs.StaticTree(TREE)):
        make = functools.partial(hfs.MTP, tree=tree, num_tokens=3, adaptive=False, confidence_threshold=0.0)
        check_same(model, make, drafts, compiled_eagerly, prompt=prompt, max_new_tokens=16)


def test_a_sliding_window_mtp_layer(compiled_eagerly, drafts):
    """An MTP layer with a sliding window (``mtp_layer_types``) on a full-attention target: its rows see the window
    only, in the region as eagerly."""
    import copy

    from hf_speculative.drafters.mtp import modules as mtp_modules

    model = hfs.enable(build_model("qwen2", layers=4))

    def make():
        config = copy.deepcopy(model.config)
        config.num_mtp_layers, config.sliding_window = 2, 3
        config.mtp_layer_types = ["sliding_attention", "full_attention"]
        torch.manual_seed(7)
        layers = mtp_modules.mtp_model_class()(mtp_modules._TargetAs(model, config=config), 2)
        with torch.no_grad():
            for p in layers.layers.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.3)
        return hfs.MTP(mtp_modules.prepared(layers, model), num_tokens=3, adaptive=False, confidence_threshold=0.0)

    check_same(model, make, drafts, compiled_eagerly, prompt=(PROMPT * 3)[:30], max_new_tokens=20)
