"""Choosing the draft length: expected gain against the measured cost of verifying it.

With a per-token acceptance probability ``r``, a draft of ``k`` tokens gains in expectation
``E(k) = r + r^2 + ... + r^k`` tokens on top of the target's own one, and its verifying forward
costs ``c(k)`` instead of ``c(0)``. The draft pays off when ``(1 + E(k)) / (c(k) / c(0)) > 1``;
we pick the ``k`` that maximises that ratio, and draft nothing when no ``k`` beats 1.

``c(k) / c(0)`` is measured on the fly (wall time of the target forwards of this call) because it
differs by orders of magnitude between hardware: on this CPU a 2-token forward of SmolLM2-135M
costs ~1.15x a 1-token one and an 11-token one ~2.5x (fp32 GEMMs grow with the rows), on a GPU
almost nothing more. The prior below is this CPU's shape; the measurements replace it within a few
steps.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref

import torch


@dataclasses.dataclass
class AcceptanceEstimate:
    """Decayed counts of accepted tokens and rejections (geometric model of acceptance)."""

    accepted: float = 1.2
    rejected: float = 0.8  # prior r = 0.6: optimistic enough to try, cheap to unlearn
    decay: float = 0.9

    @property
    def rate(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def update(self, num_accepted: int, num_proposed: int) -> None:
        self.accepted = self.accepted * self.decay + num_accepted
        self.rejected = self.rejected * self.decay + (1.0 if num_accepted < num_proposed else 0.0)

    def forgive(self, factor: float = 0.97) -> None:
        """Called when a draft was skipped: slowly forget rejections so that drafting is retried."""
        self.rejected *= factor


class VerifyCostModel:
    """Relative cost ``c(k) / c(0)`` of a target forward that verifies ``k`` draft tokens.

    Args:
        max_tokens (`int`): the largest draft length that will be asked about.
        prior_step (`float`): assumed extra cost of verifying any draft at all (per-op overhead of
            a multi-token forward), until measured.
        prior_per_token (`float`): assumed extra cost per draft token, until measured.
    """

    def __init__(self, max_tokens: int, prior_step: float = 0.1, prior_per_token: float = 0.12, smoothing: float = 0.3):
        self.max_tokens = max_tokens
        self._prior = [1.0] + [1.0 + prior_step + prior_per_token * k for k in range(1, max_tokens + 1)]
        self._seconds: list[float | None] = [None] * (max_tokens + 1)
        self._timings = [0] * (max_tokens + 1)
        self._smoothing = smoothing
        self._fixed: list[float] | None = None

    def fix(self, ratios: list[float]) -> None:
        """Use the given ``c(k) / c(0)`` (index ``k``) instead of measuring: for known hardware, and
        for decisions that must not depend on the wall clock (tests). Longer drafts than given
        extrapolate the last step."""
        if not ratios or ratios[0] != 1.0 or any(b < a for a, b in zip(ratios, ratios[1:])):
            raise ValueError(f"cost ratios must start at 1.0 and not decrease, got {ratios}")
        self._fixed = list(ratios)

    def observe(self, k: int, seconds: float) -> None:
        """Fold in one timing. A length counts as measured from its second timing on: the first one
        often includes one-time work (packing weights, growing buffers), and a single inflated
        timing that stopped all drafting would never be measured again. The lower of the first two
        is kept, then later timings are smoothed, each at most doubling the estimate (one
        interference spike)."""
        if self._fixed is not None:
            return
        k = min(k, self.max_tokens)
        old, count = self._seconds[k], self._timings[k]
        if old is None:
            new = seconds
        elif count == 1:
            new = min(old, seconds)
        else:
            new = old + self._smoothing * (min(seconds, 2.0 * old) - old)
        self._seconds[k], self._timings[k] = new, count + 1

    def _measured(self, k: int) -> float | None:
        return self._seconds[k] if self._timings[k] >= 2 else None

    def seconds(self, k: int) -> float | None:
        """Measured seconds of a forward verifying ``k`` draft tokens (``None`` until measured).

        A drafter that always drafts never measures ``k = 0``; it is then extrapolated from the
        measured lengths (a least-squares line through them), once two lengths are known.
        """
        k = min(k, self.max_tokens)
        if self._fixed is not None:
            return None
        if self._measured(k) is not None or k != 0:
            return self._measured(k)
        points = [(j, self._measured(j)) for j in range(len(self._seconds)) if self._measured(j) is not None]
        if len(points) < 2:
            return None
        mean_k = sum(j for j, _ in points) / len(points)
        mean_s = sum(s for _, s in points) / len(points)
        slope = sum((j - mean_k) * (s - mean_s) for j, s in points) / sum((j - mean_k) ** 2 for j, _ in points)
        intercept = mean_s - max(slope, 0.0) * mean_k
        return intercept if intercept > 0 else None

    def ratio(self, k: int) -> float:
        if self._fixed is not None:
            fixed = self._fixed
            if k < len(fixed):
                return fixed[k]
            step = fixed[-1] - fixed[-2] if len(fixed) > 1 else 0.0
            return fixed[-1] + step * (k - len(fixed) + 1)
        base = self.seconds(0)
        if k == 0 or base is None:
            return self._prior[k]
        if self._measured(k) is not None:
            return max(self._measured(k) / base, 1.0)
        # Unmeasured length: extrapolate from the nearest measured shorter draft.
        for j in range(k - 1, 0, -1):
            if self._measured(j) is not None:
                return max(self._measured(j) / base, 1.0) + (self._prior[k] - self._prior[j])
        return self._prior[k]

    def best_length(self, rate: float, max_tokens: int) -> int:
        """The draft length in ``[0, max_tokens]`` with the best expected tokens per unit of cost."""
        best_k, best_value, gain, term = 0, 1.0, 0.0, 1.0
        for k in range(1, max_tokens + 1):
            term *= rate
            gain += term
            value = (1.0 + gain) / self.ratio(k)
            if value > best_value * 1.02:  # a 2% margin: do not draft for noise
                best_k, best_value = k, value
        return best_k


def check_chain_options(strategy) -> None:
    """The checks every chain drafter's options share (``num_tokens``, ``confidence_threshold``,
    ``draft_cost``), with the strategy's class name in the message."""
    label = type(strategy).__name__
    if strategy.num_tokens < 1:
        raise ValueError(f"{label}(num_tokens={strategy.num_tokens}): must be >= 1.")
    if not 0.0 <= strategy.confidence_threshold < 1.0:
        raise ValueError(f"{label}(confidence_threshold={strategy.confidence_threshold}): must be in [0, 1).")
    if strategy.draft_cost is not None and not strategy.draft_cost >= 0.0:
        raise ValueError(f"{label}(draft_cost={strategy.draft_cost}): must be >= 0 (in target forwards).")


_COSTS: "weakref.WeakKeyDictionary[torch.nn.Module, VerifyCostModel]" = weakref.WeakKeyDictionary()
_COSTS_LOCK = threading.Lock()


def verify_costs_for(target: torch.nn.Module, max_tokens: int) -> VerifyCostModel:
    """The cost model of ``target``'s verifying forwards, shared by all calls on that model.

    Costs are a property of the model and the hardware, not of the prompt, so measurements carry
    over from call to call (short generations would otherwise decide on the prior alone).
    Concurrent calls may interleave their updates; each update is one tuple assignment.
    """
    if target is None:  # a generator built by hand, outside a generate() call
        return VerifyCostModel(max_tokens)
    with _COSTS_LOCK:
        model = _COSTS.get(target)
        if model is None or model.max_tokens < max_tokens:
            grown = VerifyCostModel(max(max_tokens, 16))
            if model is not None:
                grown._seconds[: len(model._seconds)] = model._seconds
                grown._timings[: len(model._timings)] = model._timings
            model = _COSTS[target] = grown
        return model


def forget_costs(target: torch.nn.Module) -> None:
    """Drop ``target``'s measured verify costs (after a change that alters them, e.g. its weight layout)."""
    with _COSTS_LOCK:
        _COSTS.pop(target, None)


# drafter module -> smoothed seconds of one drafting step (a property of the drafter and the hardware,
# shared by every call that drafts with it)
_DRAFT_STEP_S: "weakref.WeakKeyDictionary[torch.nn.Module, float]" = weakref.WeakKeyDictionary()


def record_draft_step(drafter: torch.nn.Module, seconds: float) -> None:
    """Fold one measured drafting step of ``drafter`` into its running estimate."""
    old = _DRAFT_STEP_S.get(drafter)
    _DRAFT_STEP_S[drafter] = seconds if old is None else old + 0.3 * (seconds - old)


def draft_price(drafter: torch.nn.Module, verify_costs: VerifyCostModel, fixed: float | None, prior: float) -> float:
    """One drafting step of ``drafter`` in target forwards: ``fixed`` if the user gave it, else measured
    (drafter step / one-token target forward), else ``prior`` until both are measured."""
    if fixed is not None:
        return fixed
    target_step, step = verify_costs.seconds(0), _DRAFT_STEP_S.get(drafter)
    if step is not None and target_step:
        return step / target_step
    return prior


class ChainLengthPolicy:
    """When to stop a chain draft whose tokens come with the drafter's own confidence.

    Used by drafters that see a distribution for every token (``DraftModel``, ``Eagle``). Drafting
    token ``i`` pays when the chance that the whole draft up to it is accepted (the product of the
    drafter's confidences, calibrated against what was really accepted) exceeds its price in
    target forwards: the extra cost of verifying one more token, plus one drafter step for every
    token after the first. When even the first token does not pay for several steps, drafting
    pauses (1, 2, 4, ... 32 steps). Drafting also pauses (with its own backoff) while the measured
    profit of recent attempts is negative: accepted tokens minus what the attempt cost in target
    forwards (its drafter steps, the first one included, plus the extra verification). An attempt
    that drafted nothing still paid its first drafter step, and counts as that loss. This is what
    stops a drafter whose every step is expensive (self-speculation) from losing time to confident
    but wrong drafts, and one that is asked often but rarely drafts (EAGLE beside prompt lookup on
    translation) from paying a drafter step at every target forward. Decisions depend on past
    attempts only, never on the token being sampled, so the rejection sampler stays exact.

    Args:
        verify_costs (`VerifyCostModel`): the target's measured verify costs.
        num_tokens (`int`): the longest draft.
        draft_price (`Callable[[], float]`): one drafter step, in target forwards (read per token).
        confidence_threshold (`float`): stop after a token whose drafter probability is below it.
        adaptive (`bool`): apply the cost rule; the longest draft grows by 2 after a fully accepted
            draft and shrinks by 1 otherwise either way.
    """

    def __init__(self, verify_costs: VerifyCostModel, num_tokens: int, draft_price, confidence_threshold: float = 0.3,
                 adaptive: bool = True):
        self.verify_costs = verify_costs
        self.num_tokens = num_tokens
        self.max_draft = num_tokens
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

    def begin(self) -> bool:
        """Start a draft; ``False`` while drafting is paused (then draft nothing this step)."""
        self.predicted, self._accept_all, self._drafted = 0.0, 1.0, 0
        if self._pause > 0:
            self._pause -= 1
            return False
        return True

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
        if self._drafted >= min(limit, self.max_draft) or confidence < self.confidence_threshold:
            return False
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
        self._unprofitable += 1
        if self._unprofitable >= 2:
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
        cost = self._steps * self.draft_price() + self.verify_costs.ratio(num_proposed) - 1.0
        self._learn(num_accepted - cost)
        if self.predicted > 0:
            ratio = num_accepted / self.predicted
            self.calibration = min(max(self.calibration + 0.1 * (ratio - self.calibration), 0.2), 2.0)
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


def chain_candidates(policy: ChainLengthPolicy, tokens: list[int], chosen: list[torch.Tensor], do_sample: bool,
                     steps: int | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Close a chain draft in ``policy`` (``steps`` drafter steps; default one per token) and return it
    as ``propose`` does: tokens `[k]` and, under sampling, their processed logits `[k, V]`; ``(None,
    None)`` for an empty draft."""
    policy.end(len(tokens), steps=steps)
    if not tokens:
        return None, None
    return torch.tensor(tokens, dtype=torch.long), (torch.stack(chosen) if do_sample else None)


def sample_chain(policy: ChainLengthPolicy, ctx, input_ids: torch.Tensor, logits: torch.Tensor, max_tokens: int,
                 step) -> tuple[list[int], list[torch.Tensor]]:
    """Draft a chain: pick a token from ``logits`` `[V]`, feed it with ``step(token) -> logits``,
    repeat while ``policy`` says it pays. Greedy takes the argmax; sampling draws from the processed
    distribution, and the processed logits of every drafted token are returned for the rejection
    sampler. Returns (tokens, processed logits `[V]` per token)."""
    processors, do_sample = ctx.logits_processor, ctx.do_sample
    tokens: list[int] = []
    chosen: list[torch.Tensor] = []
    sequence = input_ids
    while True:
        if processors:
            logits = processors(sequence, logits[None])[0]
        probs = torch.softmax(logits, dim=-1)
        if not policy.wants(float(probs.max())):
            break  # its expected gain does not pay for verifying it (its drafting is already paid)
        token = int(torch.multinomial(probs, 1)) if do_sample else int(torch.argmax(logits))
        tokens.append(token)
        chosen.append(logits)
        if not policy.took(float(probs[token]), max_tokens):
            break
        if processors:
            sequence = torch.cat([sequence, sequence.new_tensor([[token]])], dim=-1)
        logits = step(token)
    return tokens, chosen
