"""DFlash under ``hfs.enable(model, compile=...)``: each draft step is one region (``drafters/dflash/captured.py``)
over the fixed-shape context cache of ``static_drafting.py``, read once after it. The step computes eager drafting's
logits (causal and sliding windows, backlogs, empty context), and compile= drafts what compile=False drafts, step for
step, with greedy's text (chains, static and dynamic trees; EOS and max_new_tokens inside accepted blocks; a call
reaching the cache's capacity). The regions run uncompiled here but for the slow test, which compiles them."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core import regions, static_cache
from hf_speculative.core.state import forget
from hf_speculative.drafters.dflash import captured, static_drafting
from hf_speculative.drafters.dflash.drafter import DFlash, DFlashCandidateGenerator, random_network
from hf_speculative.drafters.dflash.model import DFlashDraftModel
from hf_speculative.drafters.generator import to_target_vocab
from tests.conftest import build_model, prompt_inputs, recurring_token, stock_generate

SHAPES = {"chain": None,
          "static": hfs.StaticTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)]),
          "dynamic": hfs.DynamicTree(nodes=8, depth=4, top_k=2)}
REGIONS = {"chain": "ChainRegion", "static": "PathsRegion", "dynamic": "DynamicRegion"}
READS = {"chain": "chain_from_read", "static": "tree_from_paths", "dynamic": "tree_from_device"}


@pytest.fixture
def uncompiled(monkeypatch):
    """compile= takes the fixed-shape paths, without torch.compile; records every region call by class."""
    ran = []
    monkeypatch.setattr(static_cache, "compiled_forward", lambda target, mode: target)
    monkeypatch.setattr(regions, "compile_region", lambda module, mode: module)
    for kind in (captured.LogitsRegion, captured.ChainRegion, captured.PathsRegion, captured.DynamicRegion):
        monkeypatch.setattr(kind, "forward", lambda self, *a, _forward=kind.forward:
                            ran.append(type(self).__name__) or _forward(self, *a))
    return ran


@pytest.fixture
def oracle(monkeypatch):
    """The drafter's logits pushed towards ``text[0]`` (set by the test) at 3 of every 4 positions, in both paths
    (``draft_logits`` is where eager and fixed-shape drafting meet): long accepted blocks, of varying lengths."""
    text, current = [], []
    original_draft, original_logits = DFlashCandidateGenerator.draft, DFlashDraftModel.draft_logits

    def draft(self, sequence, plan):
        current[:] = [sequence[0].tolist()]
        return original_draft(self, sequence, plan)

    def draft_logits(self, hidden, head):
        logits = original_logits(self, hidden, head)  # [1, D, V]
        if text and current:
            length = len(current[0])
            for d in range(logits.shape[1]):
                at = length + d
                if at < len(text[0]) and text[0][:length] == current[0] and at % 4:
                    logits[0, d, text[0][at]] += 100.0
        return logits

    monkeypatch.setattr(DFlashCandidateGenerator, "draft", draft)
    monkeypatch.setattr(DFlashDraftModel, "draft_logits", draft_logits)
    return text


def record_drafts(monkeypatch) -> list:
    drafts, original = [], DFlashCandidateGenerator.draft

    def recording(self, *args):
        tree = original(self, *args)
        drafts.append((tree.tokens.tolist(), tree.parents.tolist()))
        return tree

    monkeypatch.setattr(DFlashCandidateGenerator, "draft", recording)
    return drafts


def generate(target, strategy, compile: bool, inputs=None, **options):
    hfs.enable(target, compile=compile)
    try:
        out = target.generate(**(inputs or prompt_inputs()), do_sample=False, candidate_generator=strategy,
                              **{"max_new_tokens": 30, "eos_token_id": None, **options})
    finally:
        hfs.enable(target, compile=False)
    stats = hfs.last_stats(target)
    return out.tolist(), (stats.drafted_tokens, stats.accepted_tokens)


def eager_logits(net, embed, head, cache, anchor, pending, first, depth, vocab):
    """``window_logits``' eager forward: the pending context at its own length, the window after it."""
    mask = torch.full((1, net.config.drafted), net.config.mask_token_id, dtype=torch.long)
    window = static_drafting.window_embedding(net, embed, torch.cat([anchor, mask], dim=1))  # [1, B, H]
    rows = 0 if pending is None else pending.shape[1]
    positions = torch.arange(first, first + rows + net.config.block_size)[None]
    hidden = net(window, pending, positions, cache)
    return to_target_vocab(net.draft_logits(hidden[:, : depth + 1], head)[0], vocab, net.draft_vocab)


@pytest.mark.parametrize("fields", [{}, {"causal": True}, {"num_hidden_layers": 2, "sliding_window": 3,
                                                                 "layer_types": ["sliding_attention", "full_attention"]},
                                    {"vocab": True}], ids=["bidirectional", "causal", "sliding", "draft-vocab"])
def test_the_fixed_shape_step_computes_eager_drafting_s_logits(fields):
    """Steps of every context length (a backlog longer than P, P, a few, none) give eager drafting's logits (a draft
    vocabulary's too)."""
    target = build_model("llama", layers=4)
    fields = dict(fields)
    vocab_only = fields.pop("vocab", False)
    net = random_network(target, **fields)
    if vocab_only:
        net.set_draft_vocab(torch.arange(1, target.config.vocab_size, 3))
    embed, head, vocab = target.get_input_embeddings(), target.get_output_embeddings(), target.config.vocab_size
    step = static_drafting.DFlashStep(net, embed, head, vocab, static_drafting.capacity_for(64, net.config.block_size))
    static, cache = static_drafting.StaticDFlash(step, None), net.new_cache()
    torch.manual_seed(0)
    first = 0
    for rows, depth in [(14, 5), (6, 5), (1, 2), (3, 4), (0, 1), (6, 3), (2, 5)]:
        pending = torch.randn(1, rows, net.fc.in_features) if rows else None
        anchor = torch.randint(0, vocab, (1, 1))
        expected = eager_logits(net, embed, head, cache, anchor, pending, first, depth, vocab)
        got = captured.window_logits(static, anchor[0], pending, first, depth)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        first += rows
    with pytest.raises(RuntimeError, match="static context cache"):
        captured.window_logits(static, anchor[0], torch.randn(1, 6, net.fc.in_features), step.capacity - 6, 5)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_step_drafts_in_one_region_and_one_read_what_eager_drafting_drafts(shape, uncompiled, monkeypatch):
    target = hfs.enable(build_model("llama", layers=4))
    try:
        expected = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None)
        strategy = DFlash(random_network(target), tree=SHAPES[shape], num_tokens=5, confidence_threshold=0.0,
                          adaptive=False)
        drafts = record_drafts(monkeypatch)
        eager = generate(target, strategy, compile=False)
        eager_drafts = list(drafts)
        assert uncompiled == []  # without compile= the drafter runs eagerly, as before
        drafts.clear()
        reads, read = [], getattr(captured, READS[shape])
        monkeypatch.setattr(captured, READS[shape], lambda *a: reads.append(1) or read(*a))
        fixed = generate(target, strategy, compile=True)
        assert fixed[0] == eager[0] == expected.tolist() and fixed[1] == eager[1] and fixed[1][0] > 0
        assert drafts == eager_drafts
        # every step in one region call and one read, but the first (before the prefill: no features yet)
        assert uncompiled == [REGIONS[shape]] * len(reads) == [REGIONS[shape]] * (len(drafts) - 1)
    finally:
        forget(target)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_long_accepted_blocks_and_short_prompts(shape, uncompiled, oracle, monkeypatch):
    """With blocks mostly accepted (context steps of 1 to P rows), after a prompt longer than P (its backlog fed
    first) and one shorter: the same drafts as eager drafting, greedy's text."""
    target = hfs.enable(build_model("qwen2", layers=4))
    try:
        strategy = DFlash(random_network(target), tree=SHAPES[shape], num_tokens=5, confidence_threshold=0.0,
                          adaptive=False)
        for prompt in (prompt_inputs()["input_ids"][0].tolist(), [3, 5, 7]):
            inputs = prompt_inputs(prompt)
            expected = stock_generate(target, **inputs, do_sample=False, max_new_tokens=40, eos_token_id=None)
            oracle[:] = [expected[0].tolist()]
            drafts = record_drafts(monkeypatch)
            eager = generate(target, strategy, compile=False, inputs=inputs, max_new_tokens=40)
            eager_drafts = list(drafts)
            drafts.clear()
            fixed = generate(target, strategy, compile=True, inputs=inputs, max_new_tokens=40)
            assert fixed == eager and fixed[0] == expected.tolist() and drafts == eager_drafts
            assert fixed[1][1] >= 20, fixed[1]  # long blocks accepted
            assert uncompiled and set(uncompiled) == {REGIONS[shape]}
            uncompiled.clear()
    finally:
        forget(target)


def test_under_the_cost_rules_a_gpu_drafts_the_longest_chain_in_one_region(uncompiled, monkeypatch):
    """Adaptive chains: where a region's positions cost less than a read per token (CUDA; this CPU stands in for one
    here) the longest chain in one region, the cost rules replayed on what was read (``ask``); elsewhere the window's
    logits from a region and the chain chosen on the host, as eager drafting chooses it. Greedy's text either way."""
    target = hfs.enable(build_model("llama", layers=4))
    try:
        expected = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None)
        strategy = DFlash(random_network(target), num_tokens=5, confidence_threshold=0.0, adaptive=True)
        assert generate(target, strategy, compile=True)[0] == expected.tolist()
        assert uncompiled and set(uncompiled) == {"LogitsRegion"}  # a CPU: the host chooses from the logits
        uncompiled.clear()
        asked, read = [], captured.chain_from_read
        monkeypatch.setattr(captured, "chain_from_read", lambda plan, chain, ids, probs, length, ask=False: (
            asked.append(ask) or read(plan, chain, ids, probs, length, ask)))
        monkeypatch.setattr(regions, "ADAPTIVE_CHAIN_DEVICES", ("cpu",))
        assert generate(target, strategy, compile=True)[0] == expected.tolist()
        assert uncompiled and set(uncompiled) == {"ChainRegion"} and asked == [True] * len(uncompiled)
    finally:
        forget(target)


def test_the_step_is_shared_by_calls_one_at_a_time():
    """The step (its cache and compiled regions) is kept in the target's state: a call borrows it, a concurrent call
    drafts on its own, uncompiled; a larger call makes a larger one; ``close()`` gives it back."""
    target = build_model("llama", layers=4)
    net = random_network(target)
    try:
        first = static_drafting.open_static(target, net, "default", vocab_size=64, max_length=40)
        second = static_drafting.open_static(target, net, "default", vocab_size=64, max_length=40)
        assert first.regions.compiled and not second.regions.compiled and first.step is not second.step
        first.close()
        second.close()
        third = static_drafting.open_static(target, net, "default", vocab_size=64, max_length=40)
        assert third.step is first.step and third.regions.runs is first.step.regions
        third.close()
        larger = static_drafting.open_static(target, net, "default", vocab_size=64, max_length=400)
        assert larger.step.capacity == 512 and larger.regions.compiled
        larger.close()
    finally:
        forget(target)


@pytest.mark.parametrize("shape", ["chain", "static"])
def test_eos_and_max_new_tokens_inside_accepted_blocks(shape, uncompiled, oracle):
    target = hfs.enable(build_model("llama", layers=4))
    try:
        strategy = DFlash(random_network(target), tree=SHAPES[shape], num_tokens=5, confidence_threshold=0.0,
                          adaptive=False)
        free = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None)
        oracle[:] = [free[0].tolist()]
        for new in (3, 7):
            expected = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=new)
            assert generate(target, strategy, compile=True, max_new_tokens=new, eos_token_id=None)[0] == \
                expected.tolist(), new
        prompt, token, _, _ = recurring_token(target)
        inputs = prompt_inputs(prompt)
        free = stock_generate(target, **inputs, do_sample=False, max_new_tokens=40, eos_token_id=None)
        oracle[:] = [free[0].tolist()]
        expected = stock_generate(target, **inputs, do_sample=False, max_new_tokens=30, eos_token_id=token)
        assert generate(target, strategy, compile=True, inputs=inputs, eos_token_id=token)[0] == expected.tolist()
    finally:
        forget(target)


def test_a_call_up_to_the_cache_s_capacity(uncompiled, oracle, monkeypatch):
    """``max_length + 2 B`` exactly the capacity: the last steps write up to its last slot; one more token takes
    the next capacity."""
    target = hfs.enable(build_model("llama", layers=4, max_positions=512))
    try:
        strategy = DFlash(random_network(target), num_tokens=5, confidence_threshold=0.0, adaptive=False)
        block, prompt = strategy.network.config.block_size, prompt_inputs()["input_ids"].shape[1]
        capacities, capacity_for = [], static_drafting.capacity_for
        monkeypatch.setattr(static_drafting, "capacity_for", lambda *a: capacities.append(capacity_for(*a))
                            or capacities[-1])
        new = static_drafting.CAPACITY_STEP - 2 * block - prompt
        free = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=new + 1, eos_token_id=None)
        oracle[:] = [free[0].tolist()]
        for tokens in (new, new + 1):
            out, _ = generate(target, strategy, compile=True, max_new_tokens=tokens)
            assert out == free[:, : prompt + tokens].tolist()
        assert capacities == [static_drafting.CAPACITY_STEP, 2 * static_drafting.CAPACITY_STEP]
    finally:
        forget(target)
