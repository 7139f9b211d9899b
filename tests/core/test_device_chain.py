"""Chains drafted on the device (core/chain_drafting.py ``draft_chain_on_device``): under a fixed budget, without
processors or a sampler, a drafter's chain is chosen and fed back without reading the device (issue 69), one read
at the end. It drafts what ``draft_chain`` drafts, the chain rule sees the same confidences, and the call's output
is greedy's: for EAGLE eagerly and on its fixed-shape (compile=) path, against the host path token for token."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

import hf_speculative as hfs
from hf_speculative.core.budget import DraftBudget, Sizing
from hf_speculative.core import chain_drafting
from hf_speculative.core.chain_drafting import device_chain_length, draft_chain, draft_chain_on_device
from hf_speculative.core.costs import VerifyCostModel
from hf_speculative.drafters.eagle import drafter as eagle_drafter
from tests.conftest import build_model, prompt_inputs, random_eagle, stock_generate

VOCAB = 11


def plan_for(adaptive: bool, tokens: int = 5, depth: int = 8):
    budget = DraftBudget(Sizing(VerifyCostModel(16), tokens=tokens, rule="confidence", adaptive=adaptive))
    plan = budget.plan(depth)
    assert plan.start_chain()
    return plan, budget


def scripted(sequence: list[int], nan_at: int | None = None):
    """Logits whose argmax is ``sequence[j]`` at the j-th call (NaN at ``nan_at``), and a step fed device tensors
    or ints alike."""
    def logits(j: int) -> torch.Tensor:
        out = torch.linspace(0, 1, VOCAB)
        out[sequence[j]] = 5.0 + j
        return out * float("nan") if j == nan_at else out

    fed = []

    def step(token) -> torch.Tensor:
        fed.append(int(token))
        return logits(len(fed))

    return logits(0), step, fed


@pytest.mark.parametrize("length", [0, 1, 5])
def test_the_device_chain_drafts_what_the_host_chain_drafts(length):
    sequence = [3, 1, 4, 1, 5, 9, 2]
    first, step, fed = scripted(sequence)
    plan, _ = plan_for(adaptive=False, tokens=length or 1)
    k = plan.fixed_chain(length)
    assert k == length
    on_device = draft_chain_on_device(plan, first, k, step)
    first, step, fed_host = scripted(sequence)
    host_plan, _ = plan_for(adaptive=False, tokens=length or 1)
    ctx = SimpleNamespace(processors=LogitsProcessorList(), sampler=None)
    on_host = draft_chain(host_plan, ctx, torch.tensor([[0]]), first, length, step) if length else None
    assert on_device.tokens.tolist() == sequence[:length]
    if length:
        assert on_host.tokens.tolist() == on_device.tokens.tolist() and fed == fed_host == sequence[:length - 1]
        # the chain rule saw the same confidences: the same prediction to calibrate against
        assert plan._budget.policy.predicted == pytest.approx(host_plan._budget.policy.predicted)
        assert plan._budget.policy._drafted == host_plan._budget.policy._drafted == length


@pytest.mark.parametrize("peaks", [[0.9, 0.8, 0.7, 0.6, 0.5, 0.4], [0.95, 0.2, 0.9, 0.9, 0.9, 0.9], [0.1] * 6])
def test_the_cost_rules_replayed_on_a_drafted_chain_keep_what_the_host_chain_keeps(peaks):
    """Under the cost rules a captured region drafts the longest chain and the host replays the rule on its
    confidences (``chain_from_read(ask=True)``): the same tokens kept, the same policy state after, as
    ``draft_chain`` deciding token by token."""
    sequence = [3, 1, 4, 1, 5, 9]

    def logits(j: int) -> torch.Tensor:  # token sequence[j] with probability peaks[j]
        out = torch.full((VOCAB,), math.log((1 - peaks[j]) / (VOCAB - 1)))
        out[sequence[j]] = math.log(peaks[j])
        return out

    fed = []
    host_plan, _ = plan_for(adaptive=True, tokens=6)
    ctx = SimpleNamespace(processors=LogitsProcessorList(), sampler=None)
    on_host = draft_chain(host_plan, ctx, torch.tensor([[0]]), logits(0), 6,
                          lambda token: fed.append(int(token)) or logits(len(fed)))
    plan, _ = plan_for(adaptive=True, tokens=6)
    length = plan.longest_chain(6)
    assert length == 6 and plan.fixed_chain(6) is None
    confidences = [float(torch.softmax(logits(j), -1).max()) for j in range(length)]
    replayed = chain_drafting.chain_from_read(plan, torch.tensor(sequence), sequence, confidences, length, ask=True)
    assert replayed.tokens.tolist() == on_host.tokens.tolist()
    policy, host_policy = plan._budget.policy, host_plan._budget.policy
    assert (policy._drafted, policy.predicted) == pytest.approx((host_policy._drafted, host_policy.predicted))
    without = chain_drafting.chain_from_read(plan_for(adaptive=True, tokens=6)[0], torch.tensor(sequence), sequence,
                                             confidences, length)  # not asked: the negative control
    assert peaks[0] > 0.5 or without.size > on_host.size


def test_a_nan_distribution_ends_the_device_chain_before_it():
    first, step, _ = scripted([3, 1, 4, 1, 5], nan_at=2)
    plan, _ = plan_for(adaptive=False)
    tree = draft_chain_on_device(plan, first, 5, step)
    assert tree.tokens.tolist() == [3, 1] and not math.isnan(plan._budget.policy.predicted)


def test_only_a_fixed_budget_without_processors_or_sampler_drafts_on_the_device():
    greedy = SimpleNamespace(processors=LogitsProcessorList(), sampler=None)
    assert device_chain_length(plan_for(adaptive=False)[0], greedy, 8) == 5
    assert device_chain_length(plan_for(adaptive=False, depth=3)[0], greedy, 8) == 3  # the room
    assert device_chain_length(plan_for(adaptive=True)[0], greedy, 8) is None  # the cost rules read each token
    warped = SimpleNamespace(processors=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3)]), sampler=None)
    assert device_chain_length(plan_for(adaptive=False)[0], warped, 8) is None
    sampled = SimpleNamespace(processors=LogitsProcessorList(), sampler=object())
    assert device_chain_length(plan_for(adaptive=False)[0], sampled, 8) is None


def _drafts(monkeypatch, target, strategy, host: bool, compile: bool, **kwargs):
    """The call's output, every chain drafted and how many went through the device chain."""
    from hf_speculative.drafters.eagle import captured

    if host:
        for module in (chain_drafting, eagle_drafter):
            monkeypatch.setattr(module, "device_chain_length", lambda plan, ctx, limit: None)
    used, drafts = [], []
    original, read = chain_drafting.draft_chain_on_device, captured.chain_from_read

    def counting(plan, logits, length, step, vocab=None):
        used.append(length)
        return original(plan, logits, length, step, vocab)

    def counting_read(plan, chain, ids, probs, length, ask=False):  # a chain drafted in one region (compile=)
        used.append(length)
        return read(plan, chain, ids, probs, length, ask)

    monkeypatch.setattr(chain_drafting, "draft_chain_on_device", counting)
    monkeypatch.setattr(captured, "chain_from_read", counting_read)
    draft = eagle_drafter.EagleCandidateGenerator.draft

    def recording(self, *args):
        tree = draft(self, *args)
        drafts.append(tree.tokens.tolist())
        return tree

    monkeypatch.setattr(eagle_drafter.EagleCandidateGenerator, "draft", recording)
    hfs.enable(target, compile=compile)
    try:
        extra = {"cache_implementation": "static"} if compile else {}
        out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None,
                              candidate_generator=strategy, **extra, **kwargs)
    finally:
        hfs.enable(target, compile=False)
        monkeypatch.undo()
    return out.tolist(), drafts, used


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "fixed-shape"])
@pytest.mark.parametrize("version", [1, 3])
def test_eagle_chains_on_the_device_equal_the_host_path_and_greedy(version, compile, monkeypatch):
    from hf_speculative.core import static_cache
    from hf_speculative.core import regions

    target = build_model("llama", layers=4)  # EAGLE-3 reads three layers before the last (compile= needs that)
    reference = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=30,
                               eos_token_id=None).tolist()
    strategy = hfs.Eagle(random_eagle(target, version=version), num_tokens=4, adaptive=False)

    def uncompiled():  # compile= takes the fixed-shape paths without torch.compile (tests/drafters/eagle)
        if compile:
            monkeypatch.setattr(static_cache, "compiled_forward", lambda t, mode: t)
            monkeypatch.setattr(regions, "compile_region", lambda step, mode: step)

    uncompiled()
    host = _drafts(monkeypatch, target, strategy, host=True, compile=compile)
    uncompiled()
    device = _drafts(monkeypatch, target, strategy, host=False, compile=compile)
    assert host[0] == device[0] == reference
    assert host[1] == device[1] and any(device[1])  # the same chains, step for step
    assert host[2] == [] and device[2] and set(device[2]) <= {1, 2, 3, 4}


def test_a_call_with_processors_drafts_on_the_host(monkeypatch):
    target = build_model("llama")
    strategy = hfs.Eagle(random_eagle(target), num_tokens=4, adaptive=False)
    reference = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None,
                               repetition_penalty=1.3).tolist()
    out, drafts, used = _drafts(monkeypatch, target, strategy, host=False, compile=False, repetition_penalty=1.3)
    assert out == reference and any(drafts) and used == []


@pytest.mark.parametrize("label", ["medusa", "dflash"])
def test_drafters_whose_chain_is_precomputed_draft_it_on_the_device(label, monkeypatch):
    """Medusa's heads and DFlash's block have every position's logits before the chain starts: with a fixed budget
    they go through the device chain (``draft_chain(on_device=True)``), drafting what the host path drafts."""
    from hf_speculative.core import chain_drafting
    from hf_speculative.drafters import registry

    target = hfs.enable(build_model("llama", layers=4))
    reference = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=24,
                               eos_token_id=None).tolist()

    def run(host: bool):
        used = []
        with monkeypatch.context() as patch:
            if host:
                patch.setattr(chain_drafting, "device_chain_length", lambda plan, ctx, limit: None)
            original = chain_drafting.draft_chain_on_device
            patch.setattr(chain_drafting, "draft_chain_on_device",
                          lambda *args: used.append(args[2]) or original(*args))
            out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24, eos_token_id=None,
                                  candidate_generator=registry.example(label, target, adaptive=False))
        steps = hfs.last_stats(target).steps()
        return out.tolist(), (steps["drafted"], steps["accepted"]), used

    host, device = run(host=True), run(host=False)
    assert host[0] == device[0] == reference
    assert host[1] == device[1] and any(device[1][0])  # the same draft lengths and acceptance, step for step
    assert host[2] == [] and device[2]


# -- a drafter's own vocabulary (EAGLE-3's reduced one): tokens picked there, mapped, never widened per token -----
def widener(width: int, target_ids: torch.Tensor | None):
    def widen(logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        if target_ids is None:
            return logits[..., :width]
        full = logits.new_full((*logits.shape[:-1], width), float("-inf"))
        full[..., target_ids] = logits
        return full

    return widen


def draft_scripted(rows: list[torch.Tensor]):
    """Draft-vocabulary logits, row ``j`` at the j-th call; the step records the (target) tokens fed to it."""
    fed = []

    def step(token) -> torch.Tensor:
        fed.append(int(token))
        return rows[len(fed)]

    return rows[0], step, fed


def host_and_device(rows, vocab, length=4):
    first, step, fed_host = draft_scripted(rows)
    host_plan, _ = plan_for(adaptive=False, tokens=length)
    greedy = SimpleNamespace(processors=LogitsProcessorList(), sampler=None)
    host = draft_chain(host_plan, greedy, torch.tensor([[1, 2]]), first, length, step, vocab=vocab)
    first, step, fed_device = draft_scripted(rows)
    plan, _ = plan_for(adaptive=False, tokens=length)
    device = draft_chain_on_device(plan, first, length, step, vocab)
    return host, device, fed_host, fed_device, host_plan, plan


@pytest.mark.parametrize("order", ["ordered", "reversed", "shuffled"])
def test_a_reduced_vocabulary_chain_drafts_the_widened_chains_tokens(order):
    generator = torch.Generator().manual_seed(3)
    width, size = 40, 12
    ids = torch.randperm(width, generator=generator)[:size]
    ids = {"ordered": ids.sort().values, "reversed": ids.sort(descending=True).values, "shuffled": ids}[order]
    vocab = chain_drafting.DraftVocab.of(widener(width, ids), width, ids)
    assert vocab.ordered == (order == "ordered")
    rows = [torch.randn(size, generator=generator) for _ in range(5)]
    rows[1][[2, 7]] = rows[1].max() + 1.0  # a tie: the widened argmax takes the lower target id
    host, device, fed_host, fed_device, host_plan, plan = host_and_device(rows, vocab)
    assert device.tokens.tolist() == host.tokens.tolist() and len(host.tokens) == 4
    assert fed_device == fed_host and set(fed_host) <= set(ids.tolist())  # target ids fed to the drafter
    assert math.isclose(plan._budget.policy.predicted, host_plan._budget.policy.predicted, rel_tol=1e-6)


def test_a_drafter_wider_than_the_target_never_drafts_its_extra_ids():
    width = 10
    vocab = chain_drafting.DraftVocab.of(widener(width, None), width, None)
    rows = [torch.linspace(0, 1, 14) for _ in range(4)]  # the largest logits at ids 10-13, outside the target
    host, device, fed_host, fed_device, *_ = host_and_device(rows, vocab, length=3)
    assert device.tokens.tolist() == host.tokens.tolist() == [9, 9, 9]
    assert fed_device == fed_host


def test_a_nan_row_of_the_drafters_own_logits_ends_the_chain_before_it():
    width, ids = 20, torch.arange(0, 20, 2)
    vocab = chain_drafting.DraftVocab.of(widener(width, ids), width, ids)
    rows = [torch.randn(10, generator=torch.Generator().manual_seed(j)) for j in range(4)]
    rows[2] = rows[2] * float("nan")
    host, device, *_ = host_and_device(rows, vocab)
    assert device.tokens.tolist() == host.tokens.tolist() and len(device.tokens) == 2


def test_eagle3_with_a_shuffled_draft_vocabulary_drafts_as_on_the_host(monkeypatch):
    target = build_model("llama", layers=4)
    reference = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=30,
                               eos_token_id=None).tolist()
    net = random_eagle(target, version=3)
    size = net.config.draft_vocab_size
    ids = torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(5))[:size]
    net.d2t.copy_(ids - torch.arange(size))
    net.t2d.zero_()
    net.t2d[ids] = True
    strategy = hfs.Eagle(net, num_tokens=4, adaptive=False)
    host = _drafts(monkeypatch, target, strategy, host=True, compile=False)
    device = _drafts(monkeypatch, target, strategy, host=False, compile=False)
    assert host[0] == device[0] == reference
    assert host[1] == device[1] and any(device[1])
