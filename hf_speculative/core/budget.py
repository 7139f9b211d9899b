"""How much to draft each step: the loop's decision, one routine for every drafter.

A per-call drafter says once how it drafts (:class:`Sizing`: its longest chain, its tree budget, the evidence it
can give); the loop keeps one :class:`DraftBudget` per drafter and per call, and every step hands the drafter a
:class:`Plan`, its window onto that budget::

    plan  = budget.plan(room)                 # the deepest draft the call has room for
    tree  = drafter.draft(sequence, plan)     # the drafter asks the plan as it drafts (below)
    ...   verify, accept ...
    budget.verified(plan, tree, verdict, s)   # the rules learn: acceptance, calibration, verify costs

What the drafter asks depends on the evidence it has, and the rules behind the answers are in
:mod:`hf_speculative.core.policy` (the math is there):

- ``plan.tree_nodes()``: a tree drafter's node budget this step (:class:`~.policy.TreeBudget`: 0, a size, or
  :data:`CHAIN` when its own chain is worth more);
- ``plan.start_chain()`` / ``plan.wants(peak)`` / ``plan.took(confidence)``: a drafter that sees its confidence in
  every token grows a chain while it pays (:class:`~.policy.ChainLengthPolicy`; ``draft_chain`` in accept.py asks);
- ``plan.chain_length(key, available)``: a drafter that copies text gets the length that pays for the acceptance
  measured for ``key`` (:func:`~.policy.best_length`);
- ``plan.copy_length(keys, prior)``: a drafter whose ``j``-th copied token has an acceptance of its own (prompt
  lookup: a copy that has matched further is likelier to go on) gets the length that pays for the product of the
  acceptances measured under ``keys[0..j]`` (:func:`best_survival_length`); each key learns from its own tokens;
- ``plan.prefix_size(probs)``: a drafter with a best-first list of nodes and their probabilities (SuffixDecoding)
  gets how many pay (:class:`~.policy.ScoredPrefix`).

A drafter asks only when it is about to draft (an EAGLE drafter before the prefill asks nothing), and the budget
learns only from what was asked, so no decision depends on the token being chosen. Drafters never keep a copy of
these rules: a new drafter declares its :class:`Sizing` and asks its plan.

A fixed budget (``adaptive=False``, :attr:`Sizing.adaptive`) asks the drafter for its whole budget at every step,
whatever earlier drafts got: a tree drafter gets its ``nodes`` (its own chain is no option then), a confidence
chain runs to ``tokens`` (no gate, no pause, no price per token, and its longest draft neither shrinks after a
rejected draft nor grows after a whole accept), a keyed chain is ``tokens`` of what matched and a scored list keeps
every node listed. A draft is shorter only where the plan's depth (the room left before ``max_length``) cuts it,
where the drafter has less to propose (prompt lookup without a match or with a short one, fewer Medusa heads, the
drafter's own end of text). A confidence chain's ``confidence_threshold`` is one of the cost rules and is not
applied: fixed means fixed, which benchmarks and pinned budgets rely on. In a batch, the loop's width for the
batch's forward (core/rows.py) still bounds every row's draft.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from .costs import VerifyCostModel
from .policy import AcceptanceEstimate, ChainLengthPolicy, ScoredPrefix, TreeBudget, best_length
from .tree import DraftTree, Verdict

CHAIN = TreeBudget.CHAIN  # plan.tree_nodes()'s answer for "draft your chain this step"
_RULES = ("fixed", "confidence", "keyed", "scored")


def _zero(*_: Any) -> float:
    return 0.0


@dataclasses.dataclass(frozen=True)
class Sizing:
    """How a per-call drafter drafts, declared once (its ``sizing`` attribute), for the loop that sizes its drafts.

    Args:
        costs (`VerifyCostModel`): the call's verify-cost model (``ctx.verify_costs(n)``).
        tokens (`int`): its longest chain.
        nodes (`int`, defaults to 0): its tree budget; 0 when it drafts chains only.
        rule (`str`, defaults to ``"fixed"``): how its chains are sized: ``"confidence"`` (token by token on its own
            distribution), ``"keyed"`` (by the acceptance measured per key), ``"scored"`` (a best-first list with
            probabilities), ``"fixed"`` (what it proposes, up to the room).
        adaptive (`bool`, defaults to `True`): apply the cost rules; ``False``: a fixed budget, ``tokens`` (or
            ``nodes``) at every step, fewer only where the room or the drafter ends the draft; no
            ``confidence_threshold`` (the module docstring).
        confidence_threshold (`float`, defaults to 0.3): adaptive ``"confidence"`` chains stop after a token below it.
        draft_price (`Callable[[], float]`, *optional*): one drafter forward, in target forwards (measured).
        draft_steps (`Callable[[int], int]`, *optional*): the drafter forwards a tree of ``m`` nodes takes.
        chain_option (`bool`, defaults to `False`): a tree drafter whose own chain is one more option each step.
        members (`tuple[Sizing, ...]`, defaults to ``()``): a drafter made of drafters (``hfs.Hybrid``): one budget
            each, the plan's ``members``.
    """

    costs: VerifyCostModel | None
    tokens: int = 1
    nodes: int = 0
    rule: str = "fixed"
    adaptive: bool = True
    confidence_threshold: float = 0.3
    draft_price: Callable[[], float] | None = None
    draft_steps: Callable[[int], int] | None = None
    chain_option: bool = False
    members: tuple["Sizing", ...] = ()

    def __post_init__(self):
        if self.rule not in _RULES:
            raise ValueError(f"Sizing(rule={self.rule!r}): one of {', '.join(_RULES)}.")
        if self.costs is None and not self.members and (self.rule != "fixed" or self.nodes):
            raise ValueError("Sizing: a drafter sized by the cost model needs costs= (ctx.verify_costs(n)).")


FIXED = Sizing(costs=None, tokens=64)  # a drafter with no sizing of its own (a user's CandidateGenerator)


@dataclasses.dataclass(eq=False)
class Plan:
    """One step's allowance, handed to ``drafter.draft(sequence, plan)``.

    Attributes:
        depth (`int`): the deepest draft the call has room for (>= 1); a chain is at most this long.
        full_depth (`int`, *optional*): how deep a step away from the call's end may draft (``depth`` less what the
            last steps lose to ``max_length``; default ``depth``): what a compiled region is sized by, so that those
            last steps run the region of the others and keep ``depth`` of its draft instead of compiling their own.
        chain_only (`bool`): the loop verifies chains only this step (transformers' loop): draft a chain.
        members (`list[Plan]`): a composite drafter's members' plans.
        steps (`int`, *optional*): set by the drafter when its chain took other than one drafter step per token.
        member (`int`, *optional*): set by a composite drafter: the member whose draft it returned.
    """

    depth: int
    chain_only: bool = False
    members: list["Plan"] = dataclasses.field(default_factory=list)
    steps: int | None = None
    member: int | None = None
    _budget: "DraftBudget | None" = dataclasses.field(default=None, repr=False)
    asked_tree: bool = False   # the drafter asked tree_nodes()
    asked_chain: bool = False  # the drafter started a chain (start_chain / chain_length)
    began: bool = False        # start_chain() said yes: the chain rule closes the draft when verified
    nodes: int = 0             # the tree budget's answer (a size, 0, or CHAIN)
    key: Any = None          # the key of a "keyed" chain
    keys: tuple | None = None  # the per-token keys of a "keyed" chain sized by copy_length
    full_depth: int = 0        # (0: ``depth``; set in __post_init__)

    def __post_init__(self) -> None:
        self.full_depth = max(self.full_depth, self.depth)

    # -- what a drafter asks ---------------------------------------------------------------------
    def tree_nodes(self) -> int:
        """This step's node budget for a tree drafter: a size, 0 (draft nothing) or :data:`CHAIN` (draft your chain,
        asking :meth:`start_chain` and the chain rule as a chain drafter does)."""
        budget = self._budget
        if self.chain_only or budget.tree is None:
            return CHAIN
        self.asked_tree, self.nodes = True, budget.tree.choose()
        return self.nodes

    def start_chain(self) -> bool:
        """Whether to draft a chain this step (``False`` while drafting pauses: it has not been paying)."""
        self.asked_chain = True
        policy = self._budget.policy
        self.began = True if policy is None else policy.begin()
        return self.began

    def catch_up_pays(self, cost: float, remaining: int, earlier_rate: float | None = None,
                      generated: int | None = None) -> bool:
        """Whether the drafter should feed tokens it has not seen, at ``cost`` target forwards, before a chain
        (:meth:`~.policy.ChainLengthPolicy.catch_up_pays`; yes without a chain rule). Asked before
        :meth:`start_chain`: a no drafts nothing and runs no drafter, and counts as no attempt."""
        policy = self._budget.policy
        return True if policy is None else policy.catch_up_pays(cost, remaining, earlier_rate, generated)

    def fixed_chain(self, limit: int, full: bool = False) -> int | None:
        """Under a fixed budget (``adaptive=False``), after :meth:`start_chain` said yes: the length the chain rule
        will let the chain reach, at most ``limit`` (every token is drafted whatever its confidence, so a drafter may
        draft them all on the device and report the confidences afterwards with :meth:`took`); ``None`` under the
        cost rules, whose decision after each token needs that token's confidence on the host. ``full``: within
        :attr:`full_depth` instead of :attr:`depth` (a compiled region's length; the draft keeps ``depth`` of it)."""
        policy = self._budget.policy
        if policy is None or policy.adaptive:
            return None
        return max(min(limit, self.full_depth if full else self.depth, policy.max_draft), 0)

    def longest_chain(self, limit: int, full: bool = False) -> int | None:
        """Under the cost rules too: the longest chain the chain rule could let through, at most ``limit`` (a drafter
        that drafts it all on the device replays the rule afterwards, :meth:`wants` and :meth:`took` on each token's
        confidence in order, and keeps what the rule would have kept); ``None`` without a chain rule. ``full``: as
        :meth:`fixed_chain`'s."""
        policy = self._budget.policy
        return None if policy is None else max(min(limit, self.full_depth if full else self.depth, policy.max_draft), 0)

    def region_chain(self, limit: int, ask: bool) -> int | None:
        """The length of a chain drafted in one compiled region: a step away from the call's end's (within
        :attr:`full_depth`, at most ``limit``), so that the last steps run the same region and keep :attr:`depth` of
        it. ``ask``: the cost rules are replayed on the region's chain (:meth:`longest_chain`), else the budget is
        fixed (:meth:`fixed_chain`)."""
        return (self.longest_chain if ask else self.fixed_chain)(limit, full=True)

    def wants(self, peak: float) -> bool:
        """Whether to draft the next token, given the peak of the drafter's distribution there (before choosing)."""
        return self._budget.policy.wants(peak)

    def took(self, confidence: float, limit: int | None = None) -> bool:
        """Record a drafted token of drafter probability ``confidence``; whether to draft another (at most ``limit``
        tokens in all; default the plan's depth)."""
        return self._budget.policy.took(confidence, self.depth if limit is None else min(limit, self.depth))

    def chain_length(self, key: Any, available: int) -> int:
        """How many of ``available`` copied tokens to draft, for the acceptance measured under ``key``."""
        budget = self._budget
        self.asked_chain, self.key = True, key
        k = min(budget.sizing.tokens, available, self.depth)
        if budget.sizing.adaptive:
            estimate = budget.estimate(key)
            k = best_length(budget.sizing.costs, estimate.rate, k)
            if k == 0:
                estimate.forgive()
                self.key = None
        return k

    def copy_length(self, keys: Sequence[Any], prior: Callable[[Any], float] | None = None) -> int:
        """How many of ``len(keys)`` copied tokens to draft when the ``j``-th one, once the ones before it were
        accepted, is accepted at the rate measured under ``keys[j]`` (a key's estimate starts at ``prior(key)``).
        A fixed budget drafts them all, within ``tokens`` and the depth."""
        budget = self._budget
        keys = tuple(keys)[: min(budget.sizing.tokens, self.depth)]
        self.asked_chain = True
        if not budget.sizing.adaptive or not keys:
            self.keys = keys or None
            return len(keys)
        rates = {key: budget.estimate(key, None if prior is None else prior(key)).rate for key in set(keys)}
        k = best_survival_length(budget.sizing.costs, [rates[key] for key in keys])
        if k == 0:
            budget.estimate(keys[0]).forgive()
        self.keys = keys[:k] or None
        return k

    def prefix_size(self, probs: list[float]) -> int:
        """How many of a best-first list of nodes (``probs``: each one's probability of being accepted) to draft."""
        return self._budget.scored.size(probs)


def best_survival_length(costs: VerifyCostModel, rates: Sequence[float]) -> int:
    """:func:`~.policy.best_length` for a per-token acceptance that varies along the draft: token ``j`` is accepted
    with probability ``rates[j]`` once the ones before it were, so ``k`` tokens gain
    ``E(k) = sum_{i<=k} prod_{j<i} rates[j]`` in expectation; the ``k`` in ``[0, len(rates)]`` with the best
    ``(1 + E(k)) / c(k)``, 0 unless it beats a plain step by 2%."""
    best_k, best, gain, survival = 0, 1.0, 0.0, 1.0
    for k, rate in enumerate(rates, start=1):
        survival *= rate
        gain += survival
        value = (1.0 + gain) / costs.ratio(k)
        if value > best * 1.02:  # the same margin as best_length: do not draft for noise
            best_k, best = k, value
    return best_k


def learn_per_token(budget: "DraftBudget", keys: Sequence[Any], accepted: int) -> None:
    """Each key of a verified copy learns from its own tokens: the accepted ones, and the rejected one if it was that
    key's (the tokens after the first rejection were never tried)."""
    tried = keys[: accepted + 1]
    for key in dict.fromkeys(tried):  # distinct, in order
        budget.estimate(key).update(keys[:accepted].count(key), tried.count(key))


class DraftBudget:
    """The loop's sizing routine for one per-call drafter (see the module docstring)."""

    def __init__(self, sizing: Sizing):
        self.sizing = sizing
        costs, price = sizing.costs, sizing.draft_price or _zero
        self.policy = ChainLengthPolicy(costs, sizing.tokens, price, sizing.confidence_threshold, sizing.adaptive) \
            if sizing.rule == "confidence" else None
        self.tree = TreeBudget(costs, sizing.nodes, sizing.adaptive, draft_price=sizing.draft_price,
                               draft_steps=sizing.draft_steps, chain=sizing.chain_option and sizing.adaptive) \
            if sizing.nodes else None
        self.scored = ScoredPrefix(costs, sizing.adaptive) if sizing.rule == "scored" else None
        self.estimates: dict[Any, AcceptanceEstimate] = {}
        self.members = list(map(DraftBudget, sizing.members))

    def estimate(self, key: Any, prior: float | None = None) -> AcceptanceEstimate:
        """The acceptance measured under ``key``; a new one starts at ``prior`` (two drafts' worth of evidence)."""
        estimate = self.estimates.get(key)
        if estimate is None:
            estimate = AcceptanceEstimate() if prior is None else AcceptanceEstimate(2 * prior, 2 * (1 - prior))
            self.estimates[key] = estimate
        return estimate

    def plan(self, depth: int, chain_only: bool = False, full_depth: int = 0) -> Plan:
        """This step's plan, for a draft at most ``depth`` deep (``full_depth``: :attr:`Plan.full_depth`)."""
        if self.scored is not None:
            self.scored.predicted = 0.0
        return Plan(depth, chain_only, [member.plan(depth, chain_only, full_depth) for member in self.members],
                    _budget=self, full_depth=full_depth)

    def verified(self, plan: Plan, tree: DraftTree, verdict: Verdict, seconds: float | None, own: bool = True) -> None:
        """Learn from a verifying forward: ``tree`` (what the drafter returned, as verified) got ``verdict``, in
        ``seconds`` (``None``: not a timing to learn from: the prefill, or a batched forward). ``own=False``: the
        forward verified another drafter's draft (a composite's other member): only close what the plan opened."""
        for i, (member, member_plan) in enumerate(zip(self.members, plan.members)):
            member.verified(member_plan, tree, verdict, seconds, own=own and plan.member == i)
        sizing, size, accepted = self.sizing, tree.size if own else 0, verdict.num_accepted if own else 0
        if plan.began and self.policy is not None:
            self.policy.end(size, steps=plan.steps)
        if not own or self.members:
            return
        costs = sizing.costs
        if self.tree is not None and not plan.asked_chain:  # a tree step (or nothing asked of a tree drafter)
            if seconds is not None:
                costs.observe_step(size, seconds)
            if size and plan.asked_tree:
                self.tree.verified(plan.nodes, accepted)
            return
        if sizing.rule == "confidence":
            self.policy.verified(accepted, size, seconds)  # (a plain step's timing too)
        elif sizing.rule == "keyed":
            if seconds is not None:
                costs.observe(size, seconds)
            if plan.keys is not None and size:
                learn_per_token(self, plan.keys[:size], accepted)
            elif plan.key is not None and size:
                self.estimate(plan.key).update(accepted, size)
        elif costs is not None and size:
            if seconds is not None:
                (costs.observe if plan.chain_only else costs.observe_step)(size, seconds)
            if self.scored is not None:
                self.scored.verified(accepted)
        if plan.asked_tree and plan.nodes == CHAIN:
            self.tree.verified_chain(size, accepted)
