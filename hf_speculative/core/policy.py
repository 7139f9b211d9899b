"""Choosing the draft length: expected gain against the measured cost of verifying it.

With a per-token acceptance probability ``r``, a draft of ``k`` tokens gains in expectation
``E(k) = r + r^2 + ... + r^k`` tokens on top of the target's own one, and its verifying forward
costs ``c(k)`` instead of ``c(0)``. The draft pays off when ``(1 + E(k)) / (c(k) / c(0)) > 1``;
we pick the ``k`` that maximises that ratio, and draft nothing when no ``k`` beats 1
(:func:`best_length`, with ``r`` from an :class:`AcceptanceEstimate`). Drafters that see their own
confidence in every token decide token by token instead (:class:`ChainLengthPolicy`). The ratio
``c(k) / c(0)`` is measured on this device (``hf_speculative.core.costs``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .. import options
from .costs import VerifyCostModel, verify_costs_for  # noqa: F401 - verify_costs_for: tests/app still import it here


PRIOR_RATE = 0.6  # AcceptanceEstimate's prior per-token acceptance


@dataclasses.dataclass
class AcceptanceEstimate:
    """Decayed counts of accepted tokens and rejections (geometric model of acceptance)."""

    accepted: float = 2 * PRIOR_RATE
    rejected: float = 2 * (1 - PRIOR_RATE)  # prior r = 0.6: optimistic enough to try, cheap to unlearn
    decay: float = 0.9
    updates: int = 0  # drafts counted so far (0: the rate is the prior's)

    @property
    def rate(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def update(self, num_accepted: int, num_proposed: int) -> None:
        self.updates += 1
        self.accepted = self.accepted * self.decay + num_accepted
        self.rejected = self.rejected * self.decay + (1.0 if num_accepted < num_proposed else 0.0)

    def forgive(self, factor: float = 0.97) -> None:
        """Called when a draft was skipped: slowly forget rejections so that drafting is retried."""
        self.rejected *= factor


def best_length(costs: VerifyCostModel, rate: float, max_tokens: int, price: float = 0.0) -> int:
    """The draft length in ``[0, max_tokens]`` with the best expected tokens per unit of cost, for a
    per-token acceptance ``rate`` and ``costs``' ratios (see the module docstring); ``price``: one drafter step
    per drafted token, in target forwards (0: drafting is free, e.g. a copy from the prompt)."""
    return _best(costs, rate, max_tokens, price)[0]


def best_value(costs: VerifyCostModel, rate: float, max_tokens: int, price: float = 0.0) -> float:
    """The expected tokens per target forward of :func:`best_length`'s draft (1.0 when no draft pays): a call that
    drafts so saves ``1 - 1 / value`` target forwards per generated token."""
    return _best(costs, rate, max_tokens, price)[1]


def _best(costs: VerifyCostModel, rate: float, max_tokens: int, price: float) -> tuple[int, float]:
    best_k, best_value, gain, term = 0, 1.0, 0.0, 1.0
    for k in range(1, max_tokens + 1):
        term *= rate
        gain += term
        value = (1.0 + gain) / (costs.ratio(k) + price * k)
        if value > best_value * 1.02:  # a 2% margin: do not draft for noise
            best_k, best_value = k, value
    return best_k, best_value


def check_input_ids(owner: str, input_ids, *, min_length: int = 0) -> None:
    """A clear ``ValueError`` unless ``input_ids`` is a 2-D ``[batch, length]`` tensor of token ids with at least
    ``min_length`` tokens (a 3-D tensor or an empty prompt would otherwise fail deep inside a drafter)."""
    shape = tuple(getattr(input_ids, "shape", ()))
    if len(shape) != 2:
        raise ValueError(f"{owner}: input_ids must be a 2-D tensor [batch, length] of token ids, got shape {shape}; "
                         "pass the tokenizer's input_ids as they are (e.g. tokenizer(text, return_tensors='pt')).")
    if shape[1] < min_length:
        raise ValueError(f"{owner}: the prompt is empty (input_ids of shape {shape}), and it drafts from the prompt's "
                         "tokens; give at least one token (e.g. the tokenizer's bos_token_id).")


def check_chain_options(strategy) -> None:
    """The checks every chain drafter's options share (``num_tokens``, ``confidence_threshold``,
    ``adaptive``, ``draft_cost``), with the strategy's class name in the message (see ``options``)."""
    options.check_chain_options(strategy)


class ChainLengthPolicy:
    """When to stop a chain draft whose tokens come with the drafter's own confidence.

    Used by drafters that see a distribution for every token (``DraftModel``, ``Eagle``). Drafting
    token ``i`` pays when the chance that the whole draft up to it is accepted (the product of the
    drafter's confidences, calibrated against what was really accepted) exceeds its price in
    target forwards: the extra cost of verifying one more token, plus one drafter step for every
    token after the first. Before any drafter work a step asks whether a draft could pay at all: at the
    per-token acceptance seen so far in the call (:class:`AcceptanceEstimate`, prior 0.6), the best length
    by :func:`best_length` with every drafter step priced, the first one included, once the target's
    verification of drafts has been measured (until then the costs are a prior: drafts measure them). When
    none pays the step drafts nothing and the drafter does not run, not even to catch up with the tokens
    since its last draft (a draft model's prefill included). Each such step forgives a little of the
    measured rejections, up to the prior: a probe draft comes back where drafting pays at the prior
    acceptance, and never where the measured costs alone forbid it (a catch-up after a long pause, or a
    draft model's prefill, can cost more than the tokens a probe could win). A long catch-up whose measured cost
    the rest of the call could not win back is not run either (:meth:`catch_up_pays`). When even the first token does
    not pay for several steps, drafting pauses (1, 2, 4, ... 32 steps). Drafting also pauses (with its own
    backoff) while the measured profit of recent attempts is negative: accepted tokens minus what the attempt
    cost in target forwards (its drafter steps, the first one included, plus the extra verification). An
    attempt that drafted nothing still paid its first drafter step, and counts as that loss. This is what
    stops a drafter whose every step is expensive (self-speculation) from losing time to confident
    but wrong drafts, and one that is asked often but rarely drafts (EAGLE beside prompt lookup on
    translation) from paying a drafter step at every target forward. Decisions depend on past
    attempts only, never on the token being sampled, so the rejection sampler stays exact.

    Args:
        verify_costs (`VerifyCostModel`): the target's measured verify costs.
        num_tokens (`int`): the longest draft.
        draft_price (`Callable[[], float]`): one drafter step, in target forwards (read per token).
        confidence_threshold (`float`): stop after a token whose drafter probability is below it.
        adaptive (`bool`): apply the cost rules: the gate and the pauses above, the token-by-token price, and a
            longest draft that grows by 2 after a fully accepted draft and shrinks by 1 otherwise (within
            ``[1, num_tokens]``, as transformers' ``num_assistant_tokens`` schedule). ``False``: a fixed budget:
            every step drafts ``num_tokens`` tokens, fewer only where the plan's depth (the room left before
            ``max_length``) or the drafter itself ends the chain; ``confidence_threshold`` is not applied and
            nothing pauses.
    """

    def __init__(self, verify_costs: VerifyCostModel, num_tokens: int, draft_price, confidence_threshold: float = 0.3,
                 adaptive: bool = True):
        self.verify_costs = verify_costs
        self.num_tokens = options.check_int("ChainLengthPolicy", "num_tokens", num_tokens, 1, options.MAX_DRAFT_TOKENS)
        self.max_draft = self.num_tokens
        self.draft_price = draft_price
        self.confidence_threshold = confidence_threshold
        self.adaptive = adaptive
        self.calibration = 1.0  # accepted tokens / predicted accepted tokens
        self.predicted = 0.0  # expected accepted tokens of the pending draft
        self._accept_all = 1.0
        self._drafted = 0
        self._unprofitable = 0
        self._pause = 0
        self._backoff = 1
        self.profit = 0.5  # decayed mean of (accepted tokens - cost in target forwards) per draft
        self._steps = 0
        self._loss_backoff = 1
        self.acceptance = AcceptanceEstimate()  # per-token acceptance of this call's drafts
        self.gated = 0  # steps on which no draft could pay (the drafter did not run)

    def begin(self) -> bool:
        """Start a draft; ``False`` while drafting is paused or no draft could pay (then draft nothing this
        step, and run no drafter)."""
        self.predicted, self._accept_all, self._drafted = 0.0, 1.0, 0
        if self._pause > 0:
            self._pause -= 1
            return False
        if self.adaptive and not self.could_pay():
            # back towards the prior, never past it: where no draft pays even at the prior acceptance (the costs
            # alone forbid it), the drafter never runs, not even to probe
            if self.acceptance.rate < PRIOR_RATE:
                self.acceptance.forgive()
            self.gated += 1
            return False
        return True

    def could_pay(self) -> bool:
        """Whether a draft of some length pays at the acceptance seen so far, each of its tokens priced at one
        drafter step plus its share of the verification (decided before the drafter runs). Until this model's
        verification of a draft has been measured, yes: the prior costs are a guess, and only drafts measure them."""
        if not self.verify_costs.knows_drafts():
            return True
        # the longest draft the options allow, not today's cap: the cap grows back only after a draft
        return best_length(self.verify_costs, self.acceptance.rate, self.num_tokens, self.draft_price()) > 0

    def catch_up_pays(self, cost: float, remaining: int, earlier_rate: float | None = None,
                      generated: int | None = None) -> bool:
        """Whether feeding the drafter ``cost`` target forwards' worth of tokens it has not seen (a draft model's
        prefill on the prompt) can be won back over the rest of the call: each token saves ``1 - 1 / value``
        forwards, ``value`` the best draft's tokens per forward (:func:`best_value`) at the acceptance seen so far
        in the call (before its first draft: ``earlier_rate``, the drafter's acceptance in earlier calls, if given,
        else the prior), every drafter step priced. Yes without the cost rule, and until the target's verification
        of drafts has been measured (as :meth:`could_pay`).

        How long the rest of the call is, is unknown: at most ``remaining`` tokens (the budget left) and, given
        ``generated`` (the tokens the call has produced so far), about as many more as it has already produced.
        That is the ski-rental rule: the prefill runs once the tokens already generated could have paid for it, so
        a call that stops early (an 18-token answer) never pays a prefill it could not win back, and a long one
        drafts from a few tokens in, losing at most the prefill's cost again."""
        if not self.adaptive or not self.verify_costs.knows_drafts():
            return True
        if generated is not None:
            remaining = min(remaining, generated)
        rate = earlier_rate if earlier_rate is not None and not self.acceptance.updates else self.acceptance.rate
        value = best_value(self.verify_costs, rate, self.num_tokens, self.draft_price())
        if remaining * (1.0 - 1.0 / value) > cost:
            return True
        self.gated += 1
        return False

    def _verify_price(self, i: int) -> float:
        return self.verify_costs.ratio(i) - self.verify_costs.ratio(i - 1)

    def wants(self, peak: float) -> bool:
        """Whether to draft the next token, given the peak of the drafter's distribution there.
        Decided before sampling: a choice that depended on the sampled token would bias the
        rejection sampler."""
        if not self.adaptive:
            return True
        return self._accept_all * min(peak * self.calibration, 1.0) >= self._verify_price(self._drafted + 1)

    def took(self, confidence: float, limit: int) -> bool:
        """Record a drafted token of drafter probability ``confidence``; whether to draft another."""
        self._drafted += 1
        self._accept_all *= min(confidence * self.calibration, 1.0)
        self.predicted += self._accept_all
        if self._drafted >= min(limit, self.max_draft) or (self.adaptive and confidence < self.confidence_threshold):
            return False  # (the threshold is a cost rule too: a fixed budget drafts its whole chain)
        # Draft one more only if even a sure next token could pay for drafting and verifying it.
        return not self.adaptive or self._accept_all >= self.draft_price() + self._verify_price(self._drafted + 1)

    def end(self, num_drafted: int, steps: int | None = None) -> None:
        """Close a draft of ``num_drafted`` tokens that took ``steps`` drafter steps (default: one
        per token); an empty one counts towards pausing."""
        self._steps = num_drafted if steps is None else steps
        if num_drafted:
            self._unprofitable, self._backoff = 0, 1
            return
        self._learn(-max(self._steps, 1) * self.draft_price())  # the step that chose to draft nothing
        self.acceptance.update(0, 1)  # the drafter was not sure enough of any token: as good as a rejection
        self._unprofitable += 1
        if self.adaptive and self._unprofitable >= 2:  # a fixed budget asks the drafter at every step
            self._pause = max(self._pause, self._backoff)
            self._backoff, self._unprofitable = min(self._backoff * 2, 32), 0

    def verified(self, num_accepted: int, num_proposed: int, seconds: float | None = None) -> None:
        """Learn from a verifying forward: ``num_accepted`` of ``num_proposed`` drafted tokens kept, in
        ``seconds`` of wall time (folded into the target's verify-cost model; ``None``: not a timing
        to learn from, e.g. the prefill)."""
        if seconds is not None:
            self.verify_costs.observe(num_proposed, seconds)
        if num_proposed == 0:
            return
        self.acceptance.update(num_accepted, num_proposed)
        cost = self._steps * self.draft_price() + self.verify_costs.ratio(num_proposed) - 1.0
        self._learn(num_accepted - cost)
        if self.predicted > 0:
            ratio = num_accepted / self.predicted
            self.calibration = min(max(self.calibration + 0.1 * (ratio - self.calibration), 0.2), 2.0)
        if not self.adaptive:
            return  # a fixed budget: the next draft is as long as the options say, whatever this one got
        if num_accepted == num_proposed:
            self.max_draft = min(self.max_draft + 2, self.num_tokens)
        else:
            self.max_draft = max(self.max_draft - 1, 1)

    def _learn(self, gain: float) -> None:
        """Fold one attempt's gain (accepted tokens minus its cost, in target forwards) into ``profit``."""
        self.profit += 0.25 * (gain - self.profit)
        if gain > 0:
            self._loss_backoff = 1
        elif self.adaptive and self.profit < 0:
            # drafting loses time here: stop for a while (1, 2, 4, ... 32 steps), then try again
            self._pause = max(self._pause, self._loss_backoff)
            self._loss_backoff = min(self._loss_backoff * 2, 32)
            self.profit = 0.0


class TreeBudget:
    """How many nodes a tree drafter verifies this step: none, or its budget ``nodes`` or a half, quarter...
    of it, whichever gives the most tokens per unit of cost.

    The value of ``m`` nodes is ``(1 + kept[m]) / (cost(m) + price * steps(m))``: ``kept[m]``, the decayed mean
    of draft tokens that trees of that size kept (optimistic until measured); ``cost(m)``, the measured cost of
    verifying ``m`` tokens on this target and device in one-token forwards; ``price``, one drafter forward in
    target forwards (``draft_price()``, measured; 0 for a drafter that runs no network) and ``steps(m)`` the
    drafter forwards a tree of ``m`` nodes takes (``draft_steps(m)``: its depth for EAGLE or a draft model).
    Plain decoding is worth 1. When nothing pays, every estimate creeps back towards its prior so that drafting
    is retried.

    With ``chain=True`` a chain is one more option (:data:`CHAIN`): the drafter's own chain policy, which stops
    token by token on its confidence, valued the same way from the tokens its chains kept and their mean
    length. Where verifying and drafting are dear (a CPU) chains win; where tens of nodes verify at the price of
    one token (a GPU) trees do. A measured chain would otherwise shut out the tree sizes never tried, so there
    an unmeasured size is valued optimistically, at the most it could keep (its depth), until it has been tried.
    """

    PRIOR = 1.0  # kept tokens assumed before a size is measured
    CHAIN = -1  # choose()'s answer for "draft a chain this step"

    def __init__(self, costs: VerifyCostModel, nodes: int, adaptive: bool = True, decay: float = 0.8,
                 draft_price: Callable[[], float] | None = None, draft_steps: Callable[[int], int] | None = None,
                 chain: bool = False):
        # checked before the sizes are listed: the budget is a user's option (``DynamicTree.nodes``)
        nodes = options.check_int("TreeBudget", "nodes", nodes, 1, options.MAX_TREE_NODES)
        self.costs, self.nodes, self.adaptive, self.decay = costs, nodes, adaptive, decay
        self.draft_price = draft_price or (lambda: 0.0)
        self.draft_steps = draft_steps or (lambda m: 0)
        sizes, m = [], nodes
        while m >= 1:
            sizes.append(m)
            m //= 2
        self.kept = {m: self.PRIOR for m in sizes}
        # the chain option: decayed means of the tokens its steps kept and drafted (the chain policy's lengths)
        self.chain = {"kept": self.PRIOR, "drafted": 1.0} if chain else None
        self.measured: set[int] = set()

    def choose(self) -> int:
        if not self.adaptive:
            return self.nodes
        best, value, price = 0, 1.0, self.draft_price()
        if self.chain is not None:  # asked first: a tree must beat it by the margin
            k = self.chain["drafted"]
            low, frac = int(k), k - int(k)
            verify = self.costs.ratio(low) + (frac * (self.costs.ratio(low + 1) - self.costs.ratio(low)) if frac else 0.0)
            candidate = (1.0 + self.chain["kept"]) / (verify + price * k)
            if candidate > value * 1.02:
                best, value = self.CHAIN, candidate
        for m, kept in self.kept.items():
            if self.chain is not None and m not in self.measured:
                kept = float(max(self.draft_steps(m), 1))  # optimistic until tried
            candidate = (1.0 + kept) / (self.costs.ratio(m) + price * self.draft_steps(m))
            if candidate > value * 1.02:  # a 2% margin: do not draft for noise
                best, value = m, candidate
        if best == 0:
            for m, kept in self.kept.items():
                self.kept[m] = kept + (self.PRIOR - kept) * 0.03
            if self.chain is not None:
                self.chain["kept"] += (self.PRIOR - self.chain["kept"]) * 0.03
        return best

    def verified_chain(self, num_proposed: int, num_accepted: int) -> None:
        """A chain step's outcome (``num_proposed`` may be 0: the chain policy drafted nothing this step)."""
        if self.chain is not None:
            self.chain["kept"] = self.chain["kept"] * self.decay + num_accepted * (1 - self.decay)
            self.chain["drafted"] = self.chain["drafted"] * self.decay + num_proposed * (1 - self.decay)

    def verified(self, size: int, num_accepted: int) -> None:
        if size in self.kept:
            if self.chain is not None and size not in self.measured:
                self.kept[size] = float(num_accepted)  # the first measurement replaces the optimistic bound
            else:
                self.kept[size] = self.kept[size] * self.decay + num_accepted * (1 - self.decay)
            self.measured.add(size)


class ScoredPrefix:
    """How many of a best-first list of draft nodes to verify, given the drafter's probability that each is
    accepted (SuffixDecoding's path frequencies): all without ``adaptive``; else the ``n`` with the most expected
    tokens per unit of measured cost, ``(1 + calibration * sum(probs[:n])) / cost(n)``, and 0 unless that beats a
    plain step by 2% (noise). ``calibration`` (accepted tokens / predicted, decayed) learns from verdicts."""

    def __init__(self, costs: VerifyCostModel, adaptive: bool = True):
        self.costs, self.adaptive = costs, adaptive
        self.calibration = 1.0
        self.predicted = 0.0  # the expected accepted tokens of the pending draft

    def size(self, probs: list[float]) -> int:
        if not self.adaptive:
            best = len(probs)
        else:
            best, value, gain = 0, 1.0, 0.0
            for n, prob in enumerate(probs, 1):
                gain += prob * self.calibration
                candidate = (1.0 + gain) / self.costs.ratio(n)
                if candidate > value * 1.02:
                    best, value = n, candidate
            if best == 0 and probs:  # nothing paid: forget a pessimistic calibration slowly, so drafting is retried
                self.calibration += (1.0 - self.calibration) * 0.03
        self.predicted = sum(probs[:best])
        return best

    def verified(self, num_accepted: int) -> None:
        if self.predicted > 0:
            ratio = num_accepted / self.predicted
            self.calibration = min(max(self.calibration + 0.1 * (ratio - self.calibration), 0.2), 2.0)
