"""MagicDec's cost rule (``drafters/magicdec/costs.py``): a draft of ``n`` pays when its expected tokens beat
``t_f(B, 1 + n) / t_f(B, 1) + n * t_d / t_f(B, 1)``; both costs timed in the call, the prior from the bytes a step
reads. Decisions are checked on given timings (never the wall clock), and a call that must decline does."""

from __future__ import annotations

import pytest

import hf_speculative as hfs
from hf_speculative.core.batch_costs import batch_costs_for
from hf_speculative.core.costs import verify_costs_for
from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.drafters.magicdec.costs import StepCosts
from tests.conftest import build_model, fix_cheap_costs, prompt_inputs, stock_generate


@pytest.fixture
def costs(magicdec_costs):
    target = build_model("llama")
    magicdec_costs(target)
    verify = verify_costs_for(target, 8)
    verify.fix([1.0 + 0.05 * k for k in range(9)])  # verifying k tokens: 5% of a step each
    batch_costs_for(target).fix(overhead=10.0, per_token=0.01)  # a batch's forward: memory-bound
    model = StepCosts(target, bound=16, verify_costs=verify)
    model.token_bytes = 1024
    return model


def test_a_draft_step_as_dear_as_a_full_one_never_pays(costs):
    costs.observe_forward(1, 1, 0.010)
    costs.observe_forward(1, 1, 0.010)
    costs.observe_draft(1, 0.010)
    costs.observe_draft(1, 0.010)
    assert costs.price(1, 1, context=20) == pytest.approx(1.0)
    assert costs.best_depth([0.9], 8, batch=1, price=costs.price(1, 1, 20)) == 0


def test_a_cheap_draft_step_pays_by_the_acceptance(costs):
    costs.observe_forward(8, 1, 0.100)
    costs.observe_forward(8, 1, 0.100)
    costs.observe_draft(8, 0.020)
    costs.observe_draft(8, 0.030)  # the lower of the first two
    price = costs.price(8, 8, context=4096)
    assert price == pytest.approx(0.2)
    assert costs.best_depth([0.9] * 8, 8, batch=8, price=price) >= 3
    assert costs.best_depth([0.1] * 8, 8, batch=8, price=price) == 0  # drafts that are rarely right do not pay


def test_verification_timed_in_the_call_replaces_the_shared_ratio(costs):
    assert costs.ratio(1, 4) == pytest.approx(1.2)  # the shared one-row model's, until timed
    for width, seconds in ((1, 0.010), (5, 0.030)):
        costs.observe_forward(1, width, seconds)
        costs.observe_forward(1, width, seconds)
    assert costs.ratio(1, 4) == pytest.approx(3.0)
    costs.observe_forward(1, 600, 5.0)  # a prefill: no step's cost
    assert costs.plain(1) == pytest.approx(0.010)


def test_widths_not_timed_follow_the_call_s_timed_ones(costs):
    """Once the plain step and a wider one are timed, an untimed width is read off them (linear between, along the
    plain step's line past the widest), not off the shared models, which at long contexts misjudge it."""
    assert not costs.plain_timed(8)
    for width, seconds in ((1, 0.100), (2, 0.180), (4, 0.260)):
        costs.observe_forward(8, width, seconds)
        costs.observe_forward(8, width, seconds)
    assert costs.plain_timed(8) and not costs.plain_timed(3)
    assert costs.ratio(8, 0) == 1.0
    assert costs.ratio(8, 1) == pytest.approx(1.8) and costs.ratio(8, 3) == pytest.approx(2.6)
    assert costs.ratio(8, 2) == pytest.approx(2.2)  # between widths 2 and 4
    assert costs.ratio(8, 5) == pytest.approx((0.100 + 5 * 0.160 / 3) / 0.100)  # past 4: (0.26 - 0.10) / 3 a token
    assert costs.ratio(3, 3) == pytest.approx(batch_costs_for(costs.target).ratio(3, 3))  # a far batch: shared


def test_a_batch_that_lost_a_few_rows_reads_its_neighbour_s_timings(costs):
    """Finished rows leave the batch a row at a time: the rule does not wait for a plain step of each new size, it
    reads the nearest timed batch within a factor of 2 (and times again past that), a timed plain step of the batch
    itself first."""
    for width, seconds in ((1, 0.100), (3, 0.200)):
        costs.observe_forward(8, width, seconds)
        costs.observe_forward(8, width, seconds)
    assert costs.reference(7) == costs.reference(4) == costs.reference(16) == 8
    assert costs.plain_timed(7) and costs.plain_timed(4) and not costs.plain_timed(3) and not costs.plain_timed(17)
    assert costs.ratio(7, 2) == pytest.approx(2.0) and costs.ratio(3, 2) == pytest.approx(costs.shared_ratio(3, 2))
    costs.observe_forward(7, 3, 0.180)  # drafting at 7 rows: its plain step from 8 rows' curve, not the shared one
    costs.observe_forward(7, 3, 0.180)
    assert costs.plain(7) == pytest.approx(0.090)
    costs.observe_forward(6, 1, 0.080)
    costs.observe_forward(6, 1, 0.080)
    assert costs.reference(7) == 8 and costs.reference(6) == 6 and costs.reference(5) == 6  # the nearest; a tie: larger


def test_verification_that_grows_with_the_draft_declines_what_the_shared_ratio_would_draft(costs):
    """The defect the grid found (8,000 tokens a row on a CPU): the shared ratio (memory-bound, from short contexts)
    says verifying two tokens costs about one, so drafts accepted 90% of the time look worth it; this call's timings
    say a token more costs 80% of a step, and the rule declines."""
    costs.observe_forward(4, 1, 0.100)
    costs.observe_forward(4, 1, 0.100)
    costs.observe_draft(4, 0.020)
    costs.observe_draft(4, 0.020)
    price = costs.price(4, 4, context=8000)
    assert costs.best_depth([0.9] * 4, 4, batch=4, price=price) > 0  # the shared ratio alone: drafts
    costs.observe_forward(4, 2, 0.180)
    costs.observe_forward(4, 2, 0.180)
    assert costs.best_depth([0.9] * 4, 4, batch=4, price=price) == 0
    assert costs.best_depth([0.9] * 4, 4, batch=4, price=price) == 0


def test_the_plain_step_is_derived_from_a_timed_verification(costs):
    costs.observe_forward(1, 5, 0.012)
    costs.observe_forward(1, 5, 0.012)
    assert costs.plain(1) == pytest.approx(0.012 / 1.2)  # over the shared ratio of 4 draft tokens


def test_the_prior_is_the_bytes_each_step_reads(costs):
    weights = costs.weight_bytes
    assert costs.price(1, 1, context=16) == pytest.approx(1.0)  # the cache is the whole cache
    long = costs.price(8, 8, context=4096)
    assert long == pytest.approx((weights + 8 * 16 * 1024) / (weights + 8 * 4096 * 1024))
    assert long < costs.price(1, 1, context=4096) < 1.0  # cheaper at a larger batch, where the cache dominates


def test_a_given_draft_cost_is_the_price(costs):
    costs.fixed_price = 0.25
    assert costs.price(4, 4, context=10_000) == 0.25


def test_a_call_declines_every_step_where_drafts_cannot_pay(magicdec_costs):
    model = hfs.enable(build_model("llama"))
    magicdec_costs(model)
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    strategy = hfs.MagicDec(window=4, sinks=2, draft_cost=1.0)  # a draft step priced as a full one
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=strategy)
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens == 0 and stats.extra["magicdec"]["declined_steps"] > 0, stats.extra


def test_a_call_drafts_where_drafts_are_cheap(magicdec_costs):
    model = hfs.enable(build_model("llama"))
    magicdec_costs(model)
    fix_cheap_costs(model)
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    strategy = hfs.MagicDec(window=4, sinks=2, draft_cost=0.01, confidence_threshold=0.0)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=strategy)
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0 and stats.extra["magicdec"]["price"] == 0.01
    # a plain step timed twice before the first draft (the price of a draft is in plain steps), and not again
    assert stats.extra["magicdec"]["timing_steps"] == 2, stats.extra


@pytest.mark.parametrize("rows", [1, 3])
def test_a_call_where_no_draft_can_pay_stands_down(magicdec_costs, rows):
    """Weights far larger than the cache a short call reaches (a 16,384-token vocabulary; prompts of ~20 tokens and 30
    new ones): a draft step over the compressed cache reads 99% of what a plain step reads, so no draft can pay even
    always accepted and verified for free. The call stands down at its first forward: no draft, no compressed cache,
    and no hook left on the model; the output is plain greedy's. Negative controls: the same call with ``adaptive=False``
    drafts, and a model whose cache outweighs its weights (a 96-token vocabulary) does not stand down."""
    from tests.core.test_batch import left_padded

    model = hfs.enable(build_model("llama", vocab_size=16384, eos=None))
    magicdec_costs(model)
    prompts = [prompt_inputs()["input_ids"][0].tolist()[: 20 - 3 * r] for r in range(rows)]
    inputs = left_padded(prompts) if rows > 1 else prompt_inputs()
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=30)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=30,
                         candidate_generator=hfs.MagicDec(window=4, sinks=2))
    assert out.tolist() == ref.tolist()
    info = hfs.last_stats(model).extra["magicdec"]
    assert "stood_down" in info and info["price"] > 0.98, info
    assert info["draft_steps"] == 0 and info["cache_bytes"] == 0 and info["declined_steps"] == 0, info
    assert not model._forward_hooks and not model._forward_pre_hooks
    out = model.generate(**inputs, do_sample=False, max_new_tokens=30,
                         candidate_generator=hfs.MagicDec(window=4, sinks=2, adaptive=False, confidence_threshold=0.0))
    assert out.tolist() == ref.tolist()
    info = hfs.last_stats(model).extra["magicdec"]
    assert "stood_down" not in info and info["draft_steps"] > 0, info
    small = hfs.enable(build_model("llama", eos=None))
    magicdec_costs(small)
    small.generate(**inputs, do_sample=False, max_new_tokens=30, candidate_generator=hfs.MagicDec(window=4, sinks=2))
    assert "stood_down" not in hfs.last_stats(small).extra["magicdec"]


def test_the_prior_counts_the_weights_a_step_reads():
    """An untied input embedding is looked up a row per token: one row counts; a tied one is the lm_head's whole read.
    The same bytes as the bandwidth report's (``bench/bandwidth.py``), which the prior shares."""
    from hf_speculative.bench.bandwidth import weight_bytes

    untied = build_model("llama", vocab_size=1024)
    table = untied.get_input_embeddings().weight
    every = sum(p.numel() * p.element_size() for p in untied.parameters())
    prior = StepCosts(untied, bound=16, verify_costs=verify_costs_for(untied, 8)).weight_bytes
    assert prior == every - table.numel() * table.element_size() + table.shape[1] * table.element_size()
    assert prior == weight_bytes(untied)
    untied.get_output_embeddings().weight = table  # tied: the lm_head reads the table whole
    prior = StepCosts(untied, bound=16, verify_costs=verify_costs_for(untied, 8)).weight_bytes
    assert prior == sum(p.numel() * p.element_size() for p in untied.parameters()) == weight_bytes(untied)


@pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA")
@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_the_prior_reads_the_kernels_copies_as_the_bandwidth_report_does(monkeypatch, weights):
    """On ``optimize_for_cpu``'s kernel the linear layers read its blocked copies (padded to 16 output columns; int8
    values and their scales): the prior prices a draft step by those bytes, the bandwidth report's, not the weights'."""
    from hf_speculative.bench.bandwidth import weight_bytes

    monkeypatch.delenv("HFS_KERNEL_BF16", raising=False)
    model = build_model("llama", vocab_size=100)  # an lm_head of 100 outputs: its copy is padded to 112
    plain = StepCosts(model, bound=16, verify_costs=verify_costs_for(model, 8)).weight_bytes
    hfs.optimize_for_cpu(model, kernel=True, **({} if weights == "fp32" else {"weights": "int8"}))
    try:
        costs = StepCosts(model, bound=16, verify_costs=verify_costs_for(model, 8))
        costs.token_bytes = 1024
        assert costs.weight_bytes == weight_bytes(model) != plain
        assert (costs.weight_bytes > plain) == (weights == "fp32")  # padded fp32 copies; int8 reads a quarter
        assert costs.price(8, 8, context=4096) == pytest.approx(
            (weight_bytes(model) + 8 * 16 * 1024) / (weight_bytes(model) + 8 * 4096 * 1024))
    finally:
        hfs.optimize_for_cpu(model, False)
    assert StepCosts(model, bound=16, verify_costs=verify_costs_for(model, 8)).weight_bytes == plain
