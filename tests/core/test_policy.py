"""The draft-length policy: ``AcceptanceEstimate``, ``best_length`` and ``ChainLengthPolicy``."""

from __future__ import annotations

import pytest

from hf_speculative.core.costs import VerifyCostModel
from hf_speculative.core.policy import AcceptanceEstimate, ChainLengthPolicy, best_length, best_value
from tests.core.test_costs import measured


# -- AcceptanceEstimate ------------------------------------------------------------------------
def test_acceptance_update_is_a_decayed_count():
    estimate = AcceptanceEstimate()
    accepted, rejected, decay = estimate.accepted, estimate.rejected, estimate.decay
    assert 0 < decay < 1 and 0 < estimate.rate < 1
    estimate.update(3, 3)  # all accepted: no rejection
    assert estimate.accepted == pytest.approx(accepted * decay + 3)
    assert estimate.rejected == pytest.approx(rejected * decay)
    estimate.update(1, 4)  # one accepted, then a rejection
    assert estimate.accepted == pytest.approx((accepted * decay + 3) * decay + 1)
    assert estimate.rejected == pytest.approx(rejected * decay * decay + 1)
    assert estimate.rate == pytest.approx(estimate.accepted / (estimate.accepted + estimate.rejected))


def test_acceptance_rate_follows_what_happens():
    good, bad = AcceptanceEstimate(), AcceptanceEstimate()
    start = good.rate
    rates_good, rates_bad = [], []
    for _ in range(30):
        good.update(4, 4)
        bad.update(0, 4)
        rates_good.append(good.rate)
        rates_bad.append(bad.rate)
    assert rates_good == sorted(rates_good) and rates_good[-1] > 0.95 > start
    assert rates_bad == sorted(rates_bad, reverse=True) and rates_bad[-1] < 0.01


def test_forgive_slowly_raises_the_rate():
    estimate = AcceptanceEstimate()
    for _ in range(20):
        estimate.update(0, 2)
    low, rejected = estimate.rate, estimate.rejected
    estimate.forgive()
    assert estimate.rejected < rejected and estimate.rate > low
    for _ in range(2000):
        estimate.forgive()
    assert estimate.rate > 0.9  # eventually drafting is retried


# -- best_length ---------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [0.0, 0.05, 0.1])
def test_best_length_is_zero_for_low_acceptance(rate):
    # verifying a draft costs 30% more than a plain step: a rarely accepted draft cannot pay
    model = measured([1.0] + [1.3 + 0.05 * k for k in range(1, 9)])
    assert best_length(model, rate, 8) == 0


@pytest.mark.parametrize("rate", [0.7, 0.9, 0.99])
def test_best_length_is_positive_for_high_acceptance(rate):
    model = measured([1.0] + [1.3 + 0.05 * k for k in range(1, 9)])
    assert best_length(model, rate, 8) > 0


def test_best_value_is_the_best_lengths_tokens_per_forward():
    model = measured([1.0] + [1.1 + 0.05 * k for k in range(1, 11)])
    assert best_value(model, 0.0, 10) == 1.0  # no draft pays: plain decoding's one token a forward
    k = best_length(model, 0.8, 10, 0.1)
    expected = sum(0.8 ** i for i in range(k + 1)) / (model.ratio(k) + 0.1 * k)
    assert k > 0 and best_value(model, 0.8, 10, 0.1) == pytest.approx(expected)
    assert best_value(model, 0.9, 10) > best_value(model, 0.8, 10) > 1.0


def test_a_catch_up_pays_when_the_rest_of_the_call_wins_it_back():
    model = measured([1.0] + [1.1 + 0.05 * k for k in range(1, 11)])
    policy = ChainLengthPolicy(model, 10, lambda: 0.1)
    saving = 1.0 - 1.0 / best_value(model, policy.acceptance.rate, 10, 0.1)  # forwards saved per generated token
    assert policy.catch_up_pays(0.9 * 100 * saving, remaining=100)
    assert not policy.catch_up_pays(1.1 * 100 * saving, remaining=100) and policy.gated == 1
    assert ChainLengthPolicy(model, 10, lambda: 0.1, adaptive=False).catch_up_pays(1e9, remaining=1)
    assert ChainLengthPolicy(VerifyCostModel(10), 10, lambda: 0.1).catch_up_pays(1e9, remaining=1)  # unmeasured
    # before the call's first draft, the drafter's earlier acceptance stands for the prior; after it, the call's own
    fresh = ChainLengthPolicy(model, 10, lambda: 0.1)
    high = 1.0 - 1.0 / best_value(model, 0.9, 10, 0.1)
    assert fresh.catch_up_pays(0.9 * 100 * high, 100, earlier_rate=0.9)
    assert not fresh.catch_up_pays(0.9 * 100 * high, 100)  # at the prior 0.6 the same prefill does not pay
    fresh.acceptance.update(0, 3)  # a rejected draft in this call: its own estimate now
    assert not fresh.catch_up_pays(0.9 * 100 * high, 100, earlier_rate=0.9)


def test_a_catch_up_is_weighed_against_what_the_call_has_shown():
    """Given the tokens generated so far, the rest of the call counts for as many (within the budget left): the
    catch-up a 100-token budget pays for waits until the call has produced enough tokens to pay for it itself."""
    model = measured([1.0] + [1.1 + 0.05 * k for k in range(1, 11)])
    policy = ChainLengthPolicy(model, 10, lambda: 0.1)
    saving = 1.0 - 1.0 / best_value(model, policy.acceptance.rate, 10, 0.1)
    cost = 20 * saving  # won back by 20 tokens of drafting
    assert policy.catch_up_pays(cost, remaining=100)  # the budget alone: at once
    assert not policy.catch_up_pays(cost, remaining=100, generated=1) and policy.gated == 1
    assert not policy.catch_up_pays(cost, remaining=100, generated=19)
    assert policy.catch_up_pays(cost, remaining=100, generated=21)
    assert not policy.catch_up_pays(cost, remaining=15, generated=60)  # the budget left still bounds it
    assert policy.gated == 3


def test_best_length_grows_with_the_rate_and_respects_the_cap():
    model = measured([1.0] + [1.1 + 0.05 * k for k in range(1, 11)])
    lengths = [best_length(model, rate, 10) for rate in (0.0, 0.3, 0.5, 0.7, 0.9, 0.99)]
    assert lengths == sorted(lengths) and lengths[0] == 0 and lengths[-1] >= 5
    assert all(0 <= k <= 10 for k in lengths)
    assert best_length(model, 0.99, 3) <= 3
    free = measured([1.0] * 11)  # verification costs nothing more: draft the longest when always right
    assert best_length(free, 1.0, 10) == 10


def test_best_length_is_zero_when_verification_is_too_expensive():
    model = measured([1.0] + [1.5 + 1.2 * k for k in range(1, 9)])  # each token costs more than a step
    assert best_length(model, 1.0, 8) == 0


def test_best_length_prices_the_drafters_steps():
    model = measured([1.0] + [1.1 + 0.05 * k for k in range(1, 9)])
    assert best_length(model, 0.6, 8) > 0  # free drafts (a copy from the prompt) pay at 60%
    assert best_length(model, 0.6, 8, price=0.5) == 0  # a drafter half the target's size does not
    assert best_length(model, 0.9, 8, price=0.5) > 0  # ... unless it is nearly always right


# -- ChainLengthPolicy -------------------------------------------------------------------------
def chain_policy(draft_price: float = 0.05) -> ChainLengthPolicy:
    costs = VerifyCostModel(8)
    costs.fix([1.0, 1.2, 1.35, 1.5, 1.65, 1.8, 1.95, 2.1, 2.25])  # fixed: decisions must not follow the clock
    return ChainLengthPolicy(costs, 8, lambda: draft_price, confidence_threshold=0.0)


def share_of_forwards_drafted_at(policy: ChainLengthPolicy, attempt, forwards: int = 400) -> float:
    """Drive ``policy`` as a drafter does over ``forwards`` target forwards; ``attempt(i)`` gives
    the i-th attempt's (drafted, accepted) tokens. Returns the share of forwards at which the
    drafter ran (and paid at least one drafter step)."""
    attempts = 0
    for _ in range(forwards):
        if not policy.begin():
            continue
        drafted, accepted = attempt(attempts)
        attempts += 1
        policy.end(drafted)
        if drafted:
            policy.verified(accepted, drafted)
    return attempts / forwards


def test_attempts_that_draft_nothing_count_as_losses():
    """A drafter asked at every forward that mostly declines and, once in eight attempts, drafts a
    token that is rejected loses a drafter step each time: it must be asked rarely. (Before empty
    attempts counted in the profit, each rare draft reset the pauses: it ran at 26% of forwards.)"""
    share = share_of_forwards_drafted_at(chain_policy(), lambda i: (1, 0) if i % 8 == 0 else (0, 0))
    assert share < 0.1, share


@pytest.mark.parametrize("every, at_least", [(1, 0.99), (4, 0.75), (8, 0.3)])
def test_drafts_that_pay_keep_the_drafter_running(every, at_least):
    """Fully accepted 3-token drafts pay for the empty attempts between them, however rare: the
    drafter keeps being asked (not paused for good). An empty attempt counts as a rejection in the
    acceptance the gate reads (``could_pay``), so with seven in eight attempts empty the gate shuts
    now and then: asked at 37% of forwards, against 50%+ before the gate."""
    share = share_of_forwards_drafted_at(chain_policy(), lambda i: (3, 3) if i % every == 0 else (0, 0))
    assert share >= at_least, share


def test_tree_budget_prices_the_drafters_forwards():
    """A tree's value is its expected tokens over verification plus drafting: with free drafting the whole budget
    wins on a cheap device; as each drafter forward (one per level) gets dearer, smaller and shallower trees win,
    and at last none."""
    from hf_speculative.core.costs import VerifyCostModel
    from hf_speculative.core.policy import TreeBudget
    from hf_speculative.core.tree_shapes import DynamicTree, tree_depth

    costs = VerifyCostModel(32)
    costs.fix([1.0 + 0.01 * k for k in range(33)])  # verifying is about free
    shape = DynamicTree(nodes=32, depth=8, top_k=8)
    price = [0.0]

    def budget_with(kept: dict) -> TreeBudget:
        budget = TreeBudget(costs, 32, draft_price=lambda: price[0], draft_steps=lambda m: tree_depth(shape, m))
        budget.kept.update(kept)
        return budget

    kept = {32: 2.4, 16: 1.8, 8: 1.5, 4: 1.2, 2: 0.9, 1: 0.6}
    assert budget_with(kept).choose() == 32
    price[0] = 0.2  # 8 levels cost 1.6 forwards, 2 levels 0.4: (1 + 0.9) / (1.02 + 0.4) beats (1 + 2.4) / (1.32 + 1.6)
    assert budget_with(kept).choose() == 2
    price[0] = 1.0
    assert budget_with(kept).choose() == 0
    unpriced = TreeBudget(costs, 32)  # no price given: verification alone decides (prompt lookup)
    unpriced.kept.update(kept)
    assert unpriced.choose() == 32
    assert [tree_depth(shape, m) for m in (1, 2, 4, 8, 32)] == [1, 2, 4, 8, 8]


def test_tree_budget_weighs_the_drafters_own_chain():
    """With the chain option, a CPU-like cost (each verified token +30% of a forward) picks the drafter's chain,
    a GPU-like one (+1%) the whole tree; verified chains move the chain's estimate."""
    from hf_speculative.core.costs import VerifyCostModel
    from hf_speculative.core.policy import TreeBudget
    from hf_speculative.core.tree_shapes import DynamicTree, tree_depth

    shape = DynamicTree(nodes=32, depth=8, top_k=8)
    kept = {32: 2.4, 16: 1.8, 8: 1.5, 4: 1.2, 2: 0.9, 1: 0.6}

    def choice(per_token: float, price: float) -> int:
        costs = VerifyCostModel(32)
        costs.fix([1.0 + per_token * k for k in range(33)])
        budget = TreeBudget(costs, 32, draft_price=lambda: price, draft_steps=lambda m: tree_depth(shape, m),
                            chain=True)
        budget.kept.update(kept)
        budget.measured.update(kept)
        budget.chain.update(kept=1.0, drafted=1.5)
        return budget.choose()

    assert choice(0.3, 0.1) == TreeBudget.CHAIN
    assert choice(0.01, 0.02) == 32
    untried = TreeBudget(VerifyCostModel(32), 32, draft_price=lambda: 0.02, draft_steps=lambda m: tree_depth(shape, m),
                         chain=True)
    untried.costs.fix([1.0 + 0.01 * k for k in range(33)])
    untried.chain.update(kept=3.0, drafted=4.0)  # a good chain measured, no tree tried yet
    tried = []
    for _ in range(len(untried.kept) + 1):  # each size valued at its depth until tried; each keeps 1 token
        m = untried.choose()
        if m == TreeBudget.CHAIN:
            break
        tried.append(m)
        untried.verified(m, 1)
    assert m == TreeBudget.CHAIN and tried and len(set(tried)) == len(tried)  # every size tried at most once
    assert all(untried.kept[m] == 1.0 for m in tried)
    budget = TreeBudget(VerifyCostModel(8), 8, chain=True)
    for _ in range(30):
        budget.verified_chain(4, 0)  # chains of 4 never kept: the chain's value falls below plain decoding's
    assert budget.chain["kept"] < 0.01 and abs(budget.chain["drafted"] - 4) < 0.01
    assert TreeBudget(VerifyCostModel(8), 8).chain is None  # without the option: trees or nothing


def chain_length(policy: ChainLengthPolicy, depth: int = 8, confidence: float = 0.9) -> int:
    """The tokens a drafter drafts under ``policy`` this step, each of drafter probability ``confidence``, at most
    ``depth`` (the plan's room); 0 when the step does not draft."""
    if not policy.begin():
        return 0
    drafted = 0
    while policy.wants(confidence):
        drafted += 1
        if not policy.took(confidence, depth):
            break
    return drafted


@pytest.mark.parametrize("accepted", ["none", "all", "alternately"])
def test_a_fixed_budget_keeps_its_chain_length(accepted):
    """``adaptive=False``: every step drafts ``num_tokens``, however the drafts before it fared (the longest draft
    used to lose one token per rejected draft, and grow back two per whole accept), fewer only within less room."""
    policy = ChainLengthPolicy(chain_policy().verify_costs, 5, lambda: 0.05, confidence_threshold=0.0, adaptive=False)
    lengths = []
    for step in range(12):
        k = chain_length(policy)
        lengths.append(k)
        policy.end(k)
        kept = {"none": 0, "all": k, "alternately": k * (step % 2)}[accepted]
        policy.verified(kept, k)
    assert lengths == [5] * 12
    assert chain_length(policy, depth=3) == 3  # the room left before the length limit still bounds it
    assert ChainLengthPolicy(chain_policy().verify_costs, 5, lambda: 0.05, confidence_threshold=0.5,
                             adaptive=False).took(0.4, 8) is True  # no threshold: fixed means fixed
    assert ChainLengthPolicy(chain_policy().verify_costs, 5, lambda: 0.05, confidence_threshold=0.5,
                             adaptive=True).took(0.4, 8) is False  # adaptive chains stop below it


def test_a_fixed_budget_never_pauses():
    """Empty drafts (the drafter had nothing to propose) do not pause a fixed budget: it asks again at the next step."""
    policy = ChainLengthPolicy(chain_policy().verify_costs, 5, lambda: 0.05, confidence_threshold=0.0, adaptive=False)
    for _ in range(6):
        assert policy.begin()
        policy.end(0)
    assert chain_length(policy) == 5


def test_the_adaptive_chain_rule_shrinks_after_a_rejection_and_grows_after_a_whole_accept():
    policy = chain_policy()  # cheap verification, a confident drafter: the cost rule lets chains run to the cap
    assert chain_length(policy, confidence=0.99) == 8
    policy.end(8)
    policy.verified(0, 8)
    assert policy.max_draft == 7
    policy.verified(1, 3)
    assert policy.max_draft == 6
    policy.verified(3, 3)
    assert policy.max_draft == 8  # +2, within num_tokens


def expensive_policy() -> ChainLengthPolicy:
    """Verification as the default layout's on this CPU for a 1.5B target (a second token costs 0.7 of a step) and a
    drafter a third of the target's size."""
    costs = VerifyCostModel(8)
    costs.fix([1.0] + [1.7 + 0.05 * k for k in range(8)])
    return ChainLengthPolicy(costs, 8, lambda: 0.35, confidence_threshold=0.0)


def test_no_drafter_runs_where_no_draft_could_pay():
    """Where no draft pays at the prior acceptance, the drafter is not asked, not even once (no prefill, no probe
    that would have to catch up): the decision is the whole cost."""
    policy = expensive_policy()
    began = [policy.begin() for _ in range(500)]
    assert not any(began) and policy.gated == 500
    assert policy.acceptance.rate == pytest.approx(0.6)  # forgiveness stops at the prior


def test_forgiveness_brings_a_probe_back_where_the_prior_would_pay():
    policy = chain_policy()  # cheap verification: drafts pay at the prior acceptance
    for _ in range(3):  # three rejected drafts: the acceptance falls below what pays
        assert policy.begin()
        policy.took(0.9, 8)
        policy.end(1)
        policy.verified(0, 1)
    assert not policy.could_pay()
    began = [policy.begin() for _ in range(200)]
    assert began.count(True) >= 1 and policy.acceptance.rate <= 0.6 + 1e-9


def test_drafts_that_are_nearly_always_right_open_the_gate_and_keep_it_open():
    policy = expensive_policy()
    policy.acceptance = AcceptanceEstimate(accepted=9.0, rejected=0.5)  # as after a call of fully accepted drafts
    share = share_of_forwards_drafted_at(policy, lambda i: (4, 4))
    assert share > 0.95, share


def test_an_empty_attempt_counts_against_the_acceptance():
    policy = chain_policy()
    before = policy.acceptance.rate
    assert policy.begin()
    policy.end(0)  # the drafter ran and chose to draft nothing
    assert policy.acceptance.rate < before


def test_until_drafts_are_measured_the_gate_lets_them_run():
    """The prior costs are a guess: while no draft's verification has been measured, a step may draft (and so
    measure); once measured costs forbid drafting at the prior acceptance, it stops."""
    costs = VerifyCostModel(8)
    policy = ChainLengthPolicy(costs, 8, lambda: 0.5, confidence_threshold=0.0)
    assert not costs.knows_drafts() and policy.could_pay()
    for _ in range(2):  # expensive verification, timed twice for one length and the plain step
        costs.observe(0, 1.0)
        costs.observe(2, 1.8)
    assert costs.knows_drafts() and not policy.could_pay()
