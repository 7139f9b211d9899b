"""``hfs.last_stats``: the counters are exactly what happened in the call.

With the oracle (always accepted, fixed draft length ``k``) and the adversary (never accepted) the
expected counters follow from the draft-length cap alone: a forward at ``n`` generated tokens may
draft ``min(k, N - n - 1)`` tokens (it leaves room for the target's own token). Target forwards are
also counted independently, with a forward hook on the target.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import torch

import hf_speculative as hfs
from tests.conftest import (
    DRAFTERS,
    PROMPT,
    AdversaryStrategy,
    OracleCandidateGenerator,
    build_model,
    make_drafter,
    prompt_inputs,
    stock_generate,
)

L = len(PROMPT)


def by_hand(new_tokens: int, k: int, accepted: bool) -> dict:
    """The counters of a call generating ``new_tokens`` with drafts of ``k`` that are all accepted
    (oracle) or all rejected (adversary)."""
    n, drafts, hist = 0, [], Counter()
    while n < new_tokens:
        draft = min(k, new_tokens - n - 1)
        kept = draft if accepted else 0
        drafts.append(draft)
        hist[kept] += 1
        n += kept + 1
    return dict(target_forwards=len(drafts), drafted=sum(drafts), accepted=sum(drafts) if accepted else 0,
                histogram=hist, drafts=drafts)


@pytest.fixture
def model():
    """Qwen2: no EOS, so every call runs to max_new_tokens."""
    return hfs.enable(build_model("qwen2"))


@pytest.fixture
def count_forwards():
    def attach(module):
        calls = []
        handle = module.register_forward_hook(lambda *args: calls.append(1))
        return calls, handle

    return attach


def test_by_hand_examples():
    """The helper itself, on cases worked out on paper."""
    # 23 tokens, k=4: drafts of 4, 4, 4, 4 (20 tokens), then 23 - 20 - 1 = 2.
    assert by_hand(23, 4, True) == dict(target_forwards=5, drafted=18, accepted=18, histogram=Counter({4: 4, 2: 1}),
                                        drafts=[4, 4, 4, 4, 2])
    # 12 tokens, k=5: 6 + 6.
    assert by_hand(12, 5, True) == dict(target_forwards=2, drafted=10, accepted=10, histogram=Counter({5: 2}),
                                        drafts=[5, 5])
    # adversary: one token per forward; drafts shrink to 0 at the end: 3, 3, 2, 1, 0.
    assert by_hand(5, 3, False) == dict(target_forwards=5, drafted=9, accepted=0, histogram=Counter({0: 5}),
                                        drafts=[3, 3, 2, 1, 0])


@pytest.mark.parametrize("new_tokens,k", [(23, 4), (12, 5), (1, 5), (7, 1)])
def test_oracle_counters(model, count_forwards, new_tokens, k):
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=new_tokens)
    oracle = OracleCandidateGenerator(ref, num_tokens=k)
    calls, handle = count_forwards(model)
    try:
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=new_tokens, candidate_generator=oracle)
    finally:
        handle.remove()
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    expected = by_hand(new_tokens, k, accepted=True)
    assert stats.method == "OracleCandidateGenerator"
    assert stats.new_tokens == new_tokens == out.shape[1] - L
    assert stats.target_forwards == expected["target_forwards"] == len(calls)
    assert stats.drafted_tokens == expected["drafted"]
    assert stats.accepted_tokens == expected["accepted"]
    assert stats.accepted_lengths == expected["histogram"]
    assert stats.tau == pytest.approx(new_tokens / expected["target_forwards"])
    assert stats.acceptance_rate == (1.0 if expected["drafted"] else 0.0)
    # the wrapped raw generator is told, after each forward, how many of its tokens were accepted
    assert oracle.updates == expected["drafts"]


@pytest.mark.parametrize("new_tokens,k", [(20, 4), (5, 3)])
def test_adversary_counters(model, count_forwards, new_tokens, k):
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=new_tokens)
    calls, handle = count_forwards(model)
    try:
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=new_tokens,
                             candidate_generator=AdversaryStrategy(ref, num_tokens=k))
    finally:
        handle.remove()
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    expected = by_hand(new_tokens, k, accepted=False)
    assert stats.method == "adversary"
    assert stats.target_forwards == new_tokens == len(calls)
    assert stats.drafted_tokens == expected["drafted"]
    assert stats.accepted_tokens == 0 and stats.acceptance_rate == 0.0
    assert stats.tau == 1.0
    assert stats.accepted_lengths == Counter({0: new_tokens})


@pytest.mark.parametrize("drafter_name", DRAFTERS)
def test_counters_are_consistent(drafter_name, count_forwards):
    """For every drafter: each forward adds its accepted tokens plus the target's own one, the
    histogram sums to the forwards and to the accepted tokens, and new_tokens is the output length."""
    model = hfs.enable(build_model("llama"))
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40)
    drafter = make_drafter(drafter_name, model, ref)
    calls, handle = count_forwards(model)
    try:
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=40, candidate_generator=drafter)
    finally:
        handle.remove()
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.new_tokens == out.shape[1] - L
    assert stats.target_forwards == len(calls)
    assert sum(stats.accepted_lengths.values()) == stats.target_forwards
    assert sum(k * v for k, v in stats.accepted_lengths.items()) == stats.accepted_tokens
    assert stats.new_tokens == stats.accepted_tokens + stats.target_forwards
    assert 0 <= stats.accepted_tokens <= stats.drafted_tokens
    assert stats.tau == pytest.approx(stats.new_tokens / stats.target_forwards)
    assert stats.acceptance_rate == pytest.approx(stats.accepted_tokens / stats.drafted_tokens)
    assert 0 <= stats.draft_time_s and 0 < stats.verify_time_s
    assert stats.draft_time_s + stats.verify_time_s <= stats.total_time_s


def test_new_tokens_when_eos_ends_the_call_early():
    model = hfs.enable(build_model("llama"))
    free = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None)
    eos = int(free[0, L + 6])
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=eos)
    assert ref.shape[1] < L + 30
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=eos,
                         candidate_generator=OracleCandidateGenerator(free, num_tokens=12))
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.new_tokens == ref.shape[1] - L
    assert stats.accepted_tokens == stats.drafted_tokens  # the draft was cut before EOS, not rejected


def test_stats_describe_the_last_call_only(model):
    model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=hfs.PromptLookup())
    first = hfs.last_stats(model)
    model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=10, candidate_generator=hfs.PromptLookup())
    second = hfs.last_stats(model)
    assert second is not first and first.new_tokens == 30 and second.new_tokens == 10
    other = hfs.enable(build_model("qwen2"))
    assert hfs.last_stats(other) is None


def test_to_dict_is_json_serialisable(model):
    model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=hfs.PromptLookup())
    stats = hfs.last_stats(model)
    data = json.loads(json.dumps(stats.to_dict()))
    assert data["method"] == "prompt-lookup"
    for key in ("target_forwards", "drafted_tokens", "accepted_tokens", "new_tokens", "total_time_s"):
        assert data[key] == getattr(stats, key)
    assert data["tau"] == pytest.approx(stats.tau)
    assert data["acceptance_rate"] == pytest.approx(stats.acceptance_rate)
    assert data["tokens_per_second"] == pytest.approx(stats.tokens_per_second)
    assert {int(k): v for k, v in data["accepted_lengths"].items()} == dict(stats.accepted_lengths)
    summary = stats.summary()
    assert "prompt-lookup" in summary and f"tau={stats.tau:.2f}" in summary


def test_derived_figures_without_events():
    empty = hfs.SpeculativeStats()
    assert empty.tau == 0.0 and empty.acceptance_rate == 0.0 and empty.tokens_per_second == 0.0
    json.dumps(empty.to_dict())
    stats = hfs.SpeculativeStats(method="m")
    stats.record_draft(4, 0.5)
    stats.record_verify(3, 0.25)
    stats.record_draft(0, 0.0)
    stats.record_verify(0, 0.25)
    stats.new_tokens = 5
    assert (stats.target_forwards, stats.drafted_tokens, stats.accepted_tokens) == (2, 4, 3)
    assert stats.accepted_lengths == Counter({3: 1, 0: 1})
    assert stats.tau == 2.5 and stats.acceptance_rate == 0.75
    assert stats.draft_time_s == 0.5 and stats.verify_time_s == 0.5


def test_per_step_records_pair_each_draft_with_its_verification(monkeypatch):
    clock = iter([10.0, 11.0, 13.0, 14.0, 20.0])  # the stats read time at each verification and draft
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    stats = hfs.SpeculativeStats()
    assert stats.steps() == {"drafted": [], "accepted": [], "draft_s": [], "verify_s": [], "other_s": []}
    stats.record_draft(4, 0.5)
    stats.record_verify(3, 0.25)  # ends at 10.0
    stats.record_verify(0, 0.125)  # a forward with no draft recorded before it (the prefill of some routes); ends 11.0
    stats.record_draft(2, 0.25)  # ends at 13.0, so it began at 12.75: 1.75 s after the verification
    stats.record_draft(1, 0.25)  # two drafts before one forward: one step's draft
    stats.record_verify(1, 0.5)  # ends at 14.0
    stats.record_draft(5, 1.0)  # began at 19.0; the call ended before this draft was verified: no step
    assert stats.steps() == {"drafted": [4, 0, 3], "accepted": [3, 0, 1], "draft_s": [0.5, 0.0, 0.5],
                             "verify_s": [0.25, 0.125, 0.5], "other_s": [0.0, 1.75, 5.0]}
    assert "_step_drafted" not in stats.to_dict() and "steps" not in stats.to_dict()
    assert "_verified_at" not in stats.to_dict()
    assert stats._step_drafted.itemsize == 4 and stats._step_other_s.itemsize == 4  # 20 bytes a step


@pytest.mark.parametrize("tree", [None, hfs.DynamicTree(nodes=6, depth=3)], ids=["chain", "tree"])
def test_per_step_records_of_both_routes(model, tree):
    """transformers' assisted loop (chains) and our loop (trees) record every step through the same events."""
    model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=hfs.PromptLookup(tree=tree))
    stats = hfs.last_stats(model)
    steps = stats.steps()
    assert all(len(values) == stats.target_forwards for values in steps.values())
    assert sum(steps["drafted"]) == stats.drafted_tokens and sum(steps["accepted"]) == stats.accepted_tokens
    assert Counter(steps["accepted"]) == stats.accepted_lengths
    assert sum(steps["draft_s"]) == pytest.approx(stats.draft_time_s, abs=1e-4)
    assert sum(steps["verify_s"]) == pytest.approx(stats.verify_time_s, abs=1e-4)
    other = sum(steps["other_s"])  # the rest of each step: the whole call is draft + verify + other (+ the ends)
    assert 0 < other and stats.draft_time_s + stats.verify_time_s + other <= stats.total_time_s
    if tree is not None:
        assert max(steps["drafted"]) <= 6


# -- what a newcomer reads: "no drafts", and last_stats of a model that was never enabled (issue 42) ------------
def test_summary_says_no_drafts_when_nothing_was_drafted():
    from hf_speculative.core.stats import format_acceptance

    idle = hfs.SpeculativeStats(method="prompt-lookup", new_tokens=5, target_forwards=5)
    assert "acceptance=no drafts" in idle.summary() and "0%" not in idle.summary()
    rejected = hfs.SpeculativeStats(method="m", new_tokens=5, target_forwards=5, drafted_tokens=8)
    assert "acceptance=0%" in rejected.summary()  # drafts that were all rejected: a real 0%
    assert format_acceptance(0.0, 0) == "no drafts" and format_acceptance(0.75, 4) == "75%"
    assert format_acceptance(None, None) == "–"  # a method that does not report its drafts


def test_summary_of_a_call_where_the_drafter_found_nothing(model):
    """A two-token prompt and one new token: prompt lookup finds nothing to draft from."""
    model.generate(input_ids=torch.tensor([[3, 4]]), attention_mask=torch.ones(1, 2, dtype=torch.long),
                   do_sample=False, max_new_tokens=1, candidate_generator=hfs.PromptLookup())
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens == 0 and "acceptance=no drafts" in stats.summary()


def test_last_stats_of_a_model_never_enabled_names_the_fix():
    plain = build_model("llama")
    with pytest.raises(RuntimeError, match=r"not enabled.*Call hfs\.enable\(model\) before generate"):
        hfs.last_stats(plain)
    enabled = hfs.enable(build_model("llama"))
    assert hfs.last_stats(enabled) is None  # enabled, no speculative call yet: documented None
    enabled.generate(**prompt_inputs(), do_sample=False, max_new_tokens=8, candidate_generator=hfs.PromptLookup())
    stats = hfs.last_stats(enabled)
    hfs.disable(enabled)
    assert hfs.last_stats(enabled) is stats  # what it recorded while enabled stays readable


def test_last_stats_after_the_custom_generate_route_without_enable():
    from hf_speculative import compat

    if not compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE:
        pytest.skip("custom_generate=<callable> needs transformers >= 4.57")
    model = build_model("llama")
    model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=8, custom_generate=hfs.speculative_generate,
                   candidate_generator=hfs.PromptLookup())
    assert hfs.last_stats(model).method == "prompt-lookup"  # it recorded statistics: no error
