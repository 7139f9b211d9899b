"""The verify-cost model (``hf_speculative.core.costs``): measured ratios, their per-model sharing and the
measured price of a drafting step."""

from __future__ import annotations

import pytest
import torch

from hf_speculative.core.costs import VerifyCostModel, draft_price, forget_costs, record_draft_step, verify_costs_for
from hf_speculative.core.policy import best_length


def measured(costs: list[float]) -> VerifyCostModel:
    """A cost model that has measured ``costs[k]`` seconds for a forward verifying ``k`` tokens
    (twice: a length counts as measured from its second timing)."""
    model = VerifyCostModel(len(costs) - 1)
    for _ in range(2):
        for k, seconds in enumerate(costs):
            model.observe(k, seconds)
    return model


# -- VerifyCostModel -----------------------------------------------------------------------------
def test_ratio_uses_measurements():
    model = measured([1.0, 1.2, 1.5, 3.0])
    assert model.ratio(0) == 1.0
    assert model.ratio(1) == pytest.approx(1.2)
    assert model.ratio(3) == pytest.approx(3.0)
    faster = measured([2.0, 1.0])  # a noisy measurement below the base is clamped to 1
    assert faster.ratio(1) == 1.0


def test_observations_are_smoothed():
    model = measured([1.0, 2.0])
    model.observe(1, 4.0)
    assert 2.0 < model.ratio(1) < 4.0


def test_unmeasured_lengths_extrapolate_upwards():
    model = VerifyCostModel(6)
    for _ in range(2):
        model.observe(0, 1.0)
        model.observe(2, 1.5)
    assert model.ratio(2) == pytest.approx(1.5)
    assert model.ratio(3) > model.ratio(2) and model.ratio(6) > model.ratio(3)
    assert model.ratio(1) >= 1.0


def test_base_cost_is_extrapolated_when_never_measured():
    """A drafter that always drafts never measures k = 0: the base comes from a line through the
    measured lengths, so that measured costs still decide."""
    model = VerifyCostModel(8)
    model.observe(2, 1.4)
    model.observe(2, 1.4)
    assert model.seconds(0) is None  # one point is not a line
    model.observe(4, 1.8)  # 1.0 + 0.2 k
    model.observe(4, 1.8)
    assert model.seconds(0) == pytest.approx(1.0)
    assert model.ratio(4) == pytest.approx(1.8)
    expensive = VerifyCostModel(8)
    for k in range(1, 9):  # every verified token costs 1.5 plain steps; k = 0 never measured
        expensive.observe(k, 1.0 + 1.5 * k)
        expensive.observe(k, 1.0 + 1.5 * k)
    assert expensive.seconds(0) == pytest.approx(1.0)
    assert best_length(expensive, 1.0, 8) == 0


def test_one_slow_first_timing_does_not_stop_drafting():
    """The first forward verifying a draft may include one-time work (e.g. packing weights): it is
    not trusted alone, and the lower of the first two timings is kept, so drafting that pays goes on."""
    model = VerifyCostModel(4)
    for _ in range(3):
        model.observe(0, 1.0)
    model.observe(2, 20.0)  # one-time work inside the first verification
    assert model.seconds(2) is None and model.ratio(2) == model._prior[2]  # the prior still decides
    assert best_length(model, 0.8, 4) > 0
    model.observe(2, 1.3)
    assert model.ratio(2) == pytest.approx(1.3)
    model.observe(2, 13.0)  # a later spike at most doubles the estimate, then decays
    assert model.ratio(2) <= 1.3 + 0.3 * 1.3 + 1e-9
    for _ in range(20):
        model.observe(2, 1.3)
    assert model.ratio(2) == pytest.approx(1.3, rel=1e-3)


def test_fixed_ratios_are_checked_and_extrapolated():
    model = VerifyCostModel(8)
    with pytest.raises(ValueError, match="start at 1.0 and not decrease"):
        model.fix([1.0, 1.2, 1.1])
    model.fix([1.0, 1.2, 1.5])
    model.observe(1, 100.0)  # fixed ratios ignore the clock
    assert [model.ratio(k) for k in range(5)] == pytest.approx([1.0, 1.2, 1.5, 1.8, 2.1])
    assert model.seconds(0) is None


# -- shared per model ----------------------------------------------------------------------------
def test_one_cost_model_per_target_that_grows_and_keeps_its_measurements():
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    costs = verify_costs_for(first, 8)
    assert verify_costs_for(first, 4) is costs and verify_costs_for(second, 8) is not costs
    costs.observe(3, 0.5)
    costs.observe(3, 0.5)
    longer = verify_costs_for(first, 40)  # a longer draft than measured for: grown, measurements kept
    assert longer.max_tokens == 40 and longer.seconds(3) == 0.5
    assert verify_costs_for(first, 8) is longer
    forget_costs(first)
    assert verify_costs_for(first, 8).seconds(3) is None
    assert verify_costs_for(None, 8) is not verify_costs_for(None, 8)  # outside a call: nothing shared


def test_draft_price_is_given_then_measured_then_the_prior():
    target, drafter = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    costs = verify_costs_for(target, 8)
    assert draft_price(drafter, costs, 0.2, prior=0.5) == 0.2
    assert draft_price(drafter, costs, None, prior=0.5) == 0.5  # nothing measured yet
    record_draft_step(drafter, 0.01)
    assert draft_price(drafter, costs, None, prior=0.5) == 0.5  # the target's step is not measured yet
    costs.observe(0, 0.1)
    costs.observe(0, 0.1)
    assert draft_price(drafter, costs, None, prior=0.5) == pytest.approx(0.1)
    record_draft_step(drafter, 0.03)  # smoothed: 0.01 + 0.3 * (0.03 - 0.01)
    assert draft_price(drafter, costs, None, prior=0.5) == pytest.approx(0.016 / 0.1)
    assert draft_price(torch.nn.Linear(2, 2), costs, None, prior=0.5) == 0.5  # per drafter


# -- padded static verification -------------------------------------------------------------------
def test_padded_costs_price_every_draft_at_the_padded_forward():
    from hf_speculative.core.costs import PaddedCostModel

    model = PaddedCostModel(16)
    for _ in range(2):
        model.observe_step(3, 2.0)  # a 3-node tree: verified in the forward padded to 16
        model.observe_step(0, 1.0)  # a step without a draft: the plain forward
    assert model.ratio(0) == 1.0
    assert model.ratio(1) == model.ratio(3) == model.ratio(16) == pytest.approx(2.0)
    assert model.seconds(0) == pytest.approx(1.0) and model.seconds(7) == pytest.approx(2.0)
    dynamic = VerifyCostModel(16)
    for _ in range(2):
        dynamic.observe_step(0, 1.0)  # the dynamic cache leaves steps without a draft out, as before
    assert dynamic.seconds(0) is None


def test_static_calls_keep_their_costs_apart_from_the_dynamic_cache_s():
    import hf_speculative as hfs
    from hf_speculative.core.costs import PaddedCostModel
    from hf_speculative.core.state import state_of
    from hf_speculative.core.tree_shapes import DynamicTree
    from tests.conftest import build_model, prompt_inputs

    target = hfs.enable(build_model("llama"))
    compiled = verify_costs_for(target, 8, padded=(8, True))
    static = verify_costs_for(target, 4, padded=(8, False))
    assert isinstance(compiled, PaddedCostModel) and isinstance(static, PaddedCostModel) and compiled is not static
    assert verify_costs_for(target, 8) is not compiled and not isinstance(verify_costs_for(target, 8), PaddedCostModel)
    dynamic = verify_costs_for(target, 8)
    before = list(dynamic._timings)
    strategy = hfs.PromptLookup(tree=DynamicTree(nodes=8, depth=4, top_k=3), adaptive=False)
    target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=strategy,
                    cache_implementation="static")
    assert dynamic._timings == before  # the static call's padded timings did not reach the dynamic cache's costs
    padded = state_of(target).padded_costs[(8, False)]
    assert padded is static and padded._timings[0] > 0 and sum(padded._timings) > padded._timings[0]
    forget_costs(target)
    assert state_of(target).padded_costs == {}


def test_a_drafters_acceptance_carries_over_calls():
    from hf_speculative.core.costs import record_accept_rate
    from hf_speculative.core.state import state_of

    drafter = torch.nn.Linear(2, 2)
    record_accept_rate(drafter, [4, 4], [1, 2])  # 3 kept, 2 rejections: too little to say
    assert state_of(drafter).accept_rate is None
    record_accept_rate(drafter, [4, 4, 4, 4], [4, 2, 4, 0])  # 10 kept, 2 rejected drafts
    assert state_of(drafter).accept_rate == pytest.approx(10 / 12)
    record_accept_rate(drafter, [5] * 8, [0] * 8)  # nothing kept: halfway down
    assert state_of(drafter).accept_rate == pytest.approx(10 / 24)
