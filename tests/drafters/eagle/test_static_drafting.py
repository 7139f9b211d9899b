"""EAGLE drafting at fixed shapes under ``hfs.enable(model, compile=...)``: the same drafts as eager drafting, step
for step (chains, dynamic and static trees, EAGLE-1 and EAGLE-3), every forward at one of three widths but the
long backlogs, which run eagerly on the same cache; the compiled step is shared by the calls that fit it, one at
a time. The fixed-shape path runs uncompiled here; the slow test in tests/core/test_static_cache.py compiles it."""

from __future__ import annotations

import threading

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core import static_cache
from hf_speculative.core import regions
from hf_speculative.core.policy import ChainLengthPolicy
from hf_speculative.drafters.eagle import static_drafting
from hf_speculative.drafters.eagle.drafter import EagleCandidateGenerator
from hf_speculative.core.policy import TreeBudget
from hf_speculative.core.state import forget, state_of
from hf_speculative.core.tree_shapes import DynamicTree, StaticTree
from tests.conftest import build_model, fit_eagle, prompt_inputs, random_eagle, stock_generate

NEW = 40
SHAPES = {"chain": None, "dynamic": DynamicTree(nodes=8, depth=4, top_k=3),
          "static": StaticTree([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1)])}


@pytest.fixture(scope="module", params=[("llama", 3), ("qwen2", 3), ("llama", 1)], ids=lambda p: f"{p[0]}-eagle{p[1]}")
def trained(request):
    arch, version = request.param
    target = hfs.enable(build_model(arch, layers=4, init=0.3).requires_grad_(False))
    text = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    net, _, _ = fit_eagle(target, version, text, iterations=200, unroll=3)
    yield target, net.eval().requires_grad_(False), text
    forget(target)


@pytest.fixture
def uncompiled(monkeypatch):
    """compile= takes the fixed-shape paths, without torch.compile; records the width of every drafter forward."""
    widths = []
    forward = static_drafting.DraftStep.forward

    def recording(self, tokens, *args, **kwargs):
        widths.append(tokens.shape[1])
        return forward(self, tokens, *args, **kwargs)

    monkeypatch.setattr(static_cache, "compiled_forward", lambda target, mode: target)
    monkeypatch.setattr(regions, "compile_region", lambda step, mode: step)
    monkeypatch.setattr(static_drafting.DraftStep, "forward", recording)
    return widths


def record_drafts(monkeypatch) -> list:
    drafts = []
    original = EagleCandidateGenerator.draft

    def recording(self, *args, **kwargs):
        tree = original(self, *args, **kwargs)
        drafts.append((tree.tokens.tolist(), tree.parents.tolist()))
        return tree

    monkeypatch.setattr(EagleCandidateGenerator, "draft", recording)
    return drafts


def generate(target, strategy, compile: bool):
    hfs.enable(target, compile=compile)
    try:
        out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=None,
                              candidate_generator=strategy, cache_implementation="static")
    finally:
        hfs.enable(target, compile=False)
    stats = hfs.last_stats(target)
    return out, (stats.drafted_tokens, stats.accepted_tokens)


@pytest.mark.parametrize("shape", SHAPES)
def test_fixed_shape_drafting_drafts_what_eager_drafting_drafts(trained, shape, uncompiled, monkeypatch):
    target, net, text = trained
    strategy = hfs.Eagle(net, tree=SHAPES[shape], adaptive=False, num_tokens=5, confidence_threshold=0.0)
    drafts = record_drafts(monkeypatch)
    eager, eager_counts = generate(target, strategy, compile=False)
    eager_drafts, widths_eager = list(drafts), list(uncompiled)
    drafts.clear()
    fixed, fixed_counts = generate(target, strategy, compile=True)
    assert eager.tolist() == fixed.tolist() == text.tolist()
    assert widths_eager == []  # without compile= the drafter runs eagerly, as before
    assert drafts == eager_drafts and fixed_counts == eager_counts
    assert fixed_counts[1] >= 10, fixed_counts  # a drafter that keeps tokens: the feature alignment is tested
    catch_width = 6  # num_tokens + 1
    width = {"chain": 1, "dynamic": 3, "static": 2}[shape]
    prompt = prompt_inputs()["input_ids"].shape[1]  # pairs (f_t, x_{t+1}) up to the prefill's own token
    # the prompt's backlog eagerly at its own length; a captured step's region takes its last catch_width pairs
    assert uncompiled[0] == (prompt if shape == "static" else prompt - catch_width)
    assert set(uncompiled[1:]) <= {catch_width, width, 1}, uncompiled
    assert catch_width in uncompiled[1:] and width in uncompiled[1:]


@pytest.mark.parametrize("shape", ["chain", "dynamic"])
def test_a_fixed_chain_or_a_dynamic_tree_drafts_in_one_captured_region_a_step(trained, shape, uncompiled, monkeypatch):
    """Under compile=, a chain of fixed length and a dynamic tree draft each step in one call of a whole-step region
    (the catch-up and every depth, compiled as one: ``captured``), and read the device once after it; the drafts are
    eager drafting's. Under the cost rules a chain's length is decided token by token: no region."""
    from hf_speculative.drafters.eagle import captured

    target, net, text = trained
    ran, reads = [], []
    for kind in (captured.ChainRegion, captured.TreeRegion):
        monkeypatch.setattr(kind, "forward", lambda self, *a, _forward=kind.forward:
                            ran.append(type(self).__name__) or _forward(self, *a))
    strategy = hfs.Eagle(net, tree=SHAPES[shape], adaptive=False, num_tokens=5, confidence_threshold=0.0)
    drafts = record_drafts(monkeypatch)
    eager, eager_counts = generate(target, strategy, compile=False)
    eager_drafts = list(drafts)
    drafts.clear()
    original = captured.chain_from_read if shape == "chain" else captured.tree_from_device
    monkeypatch.setattr(captured, original.__name__, lambda *a: reads.append(1) or original(*a))
    fixed, fixed_counts = generate(target, strategy, compile=True)
    assert fixed.tolist() == eager.tolist() == text.tolist()
    assert drafts == eager_drafts and fixed_counts == eager_counts and fixed_counts[1] > 0
    name = {"chain": "ChainRegion", "dynamic": "TreeRegion"}[shape]
    # every step drafted in one region call and one read, but the first (before the prefill: no features yet)
    assert ran == [name] * len(reads) == [name] * (len(drafts) - 1), (ran, len(drafts))
    ran.clear()
    generate(target, hfs.Eagle(net, num_tokens=5), compile=True)  # adaptive: the chain rule reads each token
    assert ran == []


def test_under_the_cost_rules_a_gpu_drafts_the_longest_chain_in_one_region_and_replays_the_rule(
        trained, uncompiled, monkeypatch):
    """Where a region's forwards are cheaper than a read per token (``regions.ADAPTIVE_CHAIN_DEVICES``: CUDA; this
    CPU stands in for one here), an adaptive chain drafts its longest length in one region and keeps what the cost
    rules, replayed on the confidences read after it, keep; the text is greedy's."""
    from hf_speculative.drafters.eagle import captured

    target, net, text = trained
    # drafts whatever the machine's load: the gate before a chain reads the measured (padded) verify costs
    monkeypatch.setattr(ChainLengthPolicy, "could_pay", lambda self: True)
    monkeypatch.setattr(regions, "ADAPTIVE_CHAIN_DEVICES", ("cpu",))
    steps, read = [], captured.chain_from_read
    monkeypatch.setattr(captured, "chain_from_read", lambda plan, chain, ids, probs, length, ask=False: (
        lambda tree: steps.append((length, tree.size, ask)) or tree)(read(plan, chain, ids, probs, length, ask)))
    strategy = hfs.Eagle(net, num_tokens=5, draft_cost=0.01)  # adaptive: the cost rules (drafting priced cheap)
    out, (drafted, _) = generate(target, strategy, compile=True)
    assert out.tolist() == text.tolist()
    assert steps and all(ask and kept <= length for length, kept, ask in steps), steps
    assert drafted == sum(kept for _, kept, _ in steps)


def test_backlogs_after_steps_without_a_draft_run_eagerly_on_the_same_cache(trained, uncompiled, monkeypatch):
    """A step whose budget is 0 drafts nothing; the next catch-up feeds both steps' pairs. Wider than the padded
    catch-up, it runs eagerly on the same cache (but for its last pairs, which the step's captured region takes), and
    the drafts stay those of eager drafting."""
    target, net, text = trained
    choices, backlogs = [], []
    catch_up = static_drafting.StaticDrafting.catch_up
    monkeypatch.setattr(static_drafting.StaticDrafting, "catch_up",
                        lambda self, tokens, *a: backlogs.append(tokens.shape[0]) or catch_up(self, tokens, *a))

    def every_third_step_plain(self):
        choices.append(0 if len(choices) % 3 == 1 else self.nodes)
        return choices[-1]

    monkeypatch.setattr(TreeBudget, "choose", every_third_step_plain)
    strategy = hfs.Eagle(net, tree=DynamicTree(nodes=6, depth=2, top_k=2), adaptive=False, num_tokens=2)
    drafts = record_drafts(monkeypatch)
    eager, eager_counts = generate(target, strategy, compile=False)
    eager_drafts = list(drafts)
    drafts.clear()
    choices.clear()
    fixed, fixed_counts = generate(target, strategy, compile=True)
    assert eager.tolist() == fixed.tolist() == text.tolist()
    assert drafts == eager_drafts and fixed_counts == eager_counts and fixed_counts[1] > 0
    catch_width = 3  # max(num_tokens, depth) + 1
    assert len(backlogs) > 1, (backlogs, uncompiled)  # the prompt's and later ones  # backlogs longer than the region's catch-up ran, eagerly
    assert set(uncompiled) - set(backlogs) <= {catch_width, 2}, uncompiled  # else the region's widths (top_k 2)


def test_compiled_calls_share_one_step_one_call_at_a_time(monkeypatch):
    compiled = []
    monkeypatch.setattr(regions, "compile_region", lambda step, mode: compiled.append(step) or step)
    target = build_model("llama", layers=4)
    net, other = random_eagle(target), random_eagle(target, seed=8)

    def open_(drafter=net, max_length=100):
        return static_drafting.open_static(target, drafter, "default", target_ids=None, vocab_size=64,
                                           max_length=max_length, catch_width=9, width=3, speculative=30)

    first = open_()
    assert first.capacity == 256 and first.run is compiled[0]
    busy = open_()  # the shared step is in use: a private one at the same shapes, uncompiled
    assert busy.step is not first.step and busy.run is busy.step and len(compiled) == 1
    first.close()
    again = open_()
    assert again.step is first.step and len(compiled) == 1  # the same graph
    again.close()
    longer = open_(max_length=300)  # more than the held step's cache: a larger one replaces it
    assert longer.capacity == 512 and longer.step is not first.step and len(compiled) == 2
    longer.close()
    shorter = open_(max_length=100)  # fits the larger cache: the same step, no graph built for its length
    assert shorter.step is longer.step and shorter.capacity == 512 and len(compiled) == 2
    shorter.close()
    swapped = open_(drafter=other, max_length=300)  # another drafter
    assert swapped.step.net is other and len(compiled) == 3
    swapped.close()
    forget(target)
    assert state_of(target).drafter_state(static_drafting.SharedDraftGraph).held is None


def test_fixed_shape_drafting_refuses_to_write_past_its_cache():
    target = build_model("llama", layers=4)
    drafting = static_drafting.StaticDrafting(
        static_drafting.DraftStep(random_eagle(target), target.get_input_embeddings(), target.get_output_embeddings(),
                                  None, 64, capacity=8), None, catch_width=4, width=2)
    drafting.length = 8
    with pytest.raises(RuntimeError, match="full at 8"):
        drafting.chain_step(1, torch.zeros(target.config.hidden_size), 8)


def test_concurrent_compiled_calls_each_draft_their_own(trained, uncompiled):
    """Two threads generate at once with compile=: one borrows the shared step, the other drafts on its own; both
    give greedy's text and the drafts of a call alone."""
    target, net, text = trained
    strategy = hfs.Eagle(net, tree=SHAPES["dynamic"], adaptive=False)
    hfs.enable(target, compile=True)
    results, errors = [None, None], []
    barrier = threading.Barrier(2)

    def call(i):
        try:
            barrier.wait()
            results[i] = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=None,
                                         candidate_generator=strategy).tolist()
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    try:
        threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        hfs.enable(target, compile=False)
    assert not errors and results[0] == results[1] == text.tolist()


def test_every_compiled_call_starts_a_fresh_cuda_graph_replay(trained, monkeypatch):
    """On CUDA every compiled call (the target's verify forward, each drafter step) is preceded by
    ``cudagraph_mark_step_begin``: its inputs' outputs were copied already, so each call is a root of the CUDA-graph
    trees (one graph per shape, whatever the number of drafter steps between two verifications)."""
    target, net, text = trained
    marks, calls = [], []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    static_cache.new_replay(torch.device("cuda"))
    static_cache.new_replay(torch.device("cpu"))
    assert marks == [1]
    forget(target)  # the drafter step earlier tests compiled (uncompiled) is dropped: this test's compiles it
    replays = []
    monkeypatch.setattr(static_cache, "new_replay", lambda device: replays.append("target"))
    monkeypatch.setattr(static_drafting, "new_replay", lambda device: replays.append("drafter"))
    monkeypatch.setattr(regions, "new_replay", lambda device: replays.append("drafter"))  # (whole-step regions)
    monkeypatch.setattr(static_cache, "compiled_forward", lambda model, mode: lambda **kw: calls.append(1) or model(**kw))
    monkeypatch.setattr(regions, "compile_region", lambda step, mode: lambda *a: calls.append(1) or step(*a))
    out, (drafted, _) = generate(target, hfs.Eagle(net, tree=SHAPES["dynamic"], adaptive=False), compile=True)
    assert out.tolist() == text.tolist() and drafted > 0
    assert len(replays) == len(calls) and {"target", "drafter"} <= set(replays)


@pytest.mark.single_version  # torch's recompile limit, on random networks: the same torch in both venvs
def test_more_regions_of_a_kind_than_torchs_recompile_limit_all_compile(monkeypatch):
    """Regions of one kind share one code object: past torch's default of 8 compiles of it, torch would run the later
    shapes eagerly. Each region compiles its own graph (here with the eager backend: dynamo's tracing, no inductor),
    up to ``MAX_REGIONS`` of a kind, and later shapes draft on the old path."""
    from torch._dynamo.utils import counters

    from hf_speculative.drafters.eagle import captured

    target = build_model("llama", layers=2)
    net = random_eagle(target)
    monkeypatch.setattr(regions, "compile_region",
                        lambda module, mode: torch.compile(module, backend="eager", dynamic=False))
    monkeypatch.setattr(regions, "MAX_REGIONS", 11)
    torch._dynamo.reset()
    drafting = static_drafting.open_static(target, net, "default", target_ids=net.target_ids(),
                                           vocab_size=target.config.vocab_size, max_length=64, catch_width=4, width=1,
                                           speculative=20)
    try:
        tokens = torch.tensor([5, 6])
        features = torch.randn(2, net.config.feature_size)
        graphs = counters["stats"]["unique_graphs"]
        for length in range(1, 12):
            run = captured.chain_region(drafting, length)
            inputs, _ = captured._inputs(drafting, tokens, features, 3)
            chain, readout = drafting.regions.replay(run, *inputs)
            assert chain.shape == (length,) and readout.shape == (2, length)
        assert counters["stats"]["unique_graphs"] - graphs == 11  # one graph per length: none ran eagerly
        assert captured.chain_region(drafting, 12) is None  # past MAX_REGIONS: the old path
    finally:
        drafting.close()
        forget(target)
        torch._dynamo.reset()
