"""The verify-cost model: what a target forward verifying ``k`` draft tokens costs, on this device.

A draft of ``k`` tokens pays when what it gains beats ``c(k) / c(0)``, the cost of the forward that
verifies it relative to a plain one-token step (the draft-length rules are in ``drafters.policy``).
That ratio differs by orders of magnitude between hardware: on this CPU a 2-token forward of
SmolLM2-135M costs ~1.15x a 1-token one and an 11-token one ~2.5x (fp32 GEMMs grow with the rows),
on a GPU almost nothing more. So it is measured on the fly, from the wall time of the target's
forwards; the prior below is this CPU's shape, and the measurements replace it within a few steps.
Costs belong to the model and the hardware, not to a call: they are kept per model (``state.py``)
and carry over from call to call, as do the measured seconds of a drafter's step.
"""

from __future__ import annotations

from typing import Any

from ..options import check_verify_tokens
from .state import state_of


class VerifyCostModel:
    """Relative cost ``c(k) / c(0)`` of a target forward that verifies ``k`` draft tokens.

    Args:
        max_tokens (`int`): the largest draft length that will be asked about.
        prior_step (`float`): assumed extra cost of verifying any draft at all (per-op overhead of
            a multi-token forward), until measured.
        prior_per_token (`float`): assumed extra cost per draft token, until measured.
    """

    def __init__(self, max_tokens: int, prior_step: float = 0.1, prior_per_token: float = 0.12, smoothing: float = 0.3):
        # bounded before the lists below are built: they are this long, and kept per model
        self.max_tokens = max_tokens = check_verify_tokens("VerifyCostModel", max_tokens)
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

    def observe_step(self, k: int, seconds: float) -> None:
        """A tree step's timing: ``k`` nodes verified (0: the step drafted nothing). Here a step without a draft
        is left out: on the dynamic cache the plain forward's cost is extrapolated from the drafts' (and in a
        batch a row's step times the batch's forward). :class:`PaddedCostModel` measures it."""
        if k:
            self.observe(k, seconds)

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

    def knows_drafts(self) -> bool:
        """Whether a draft's verification has been measured on this model (two timings of one length, and of the
        plain step or a second length), or the ratios were fixed: then ``ratio`` no longer reads the prior alone."""
        if self._fixed is not None:
            return True
        return self.seconds(0) is not None and any(self._measured(k) is not None for k in range(1, len(self._seconds)))

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


class PaddedCostModel(VerifyCostModel):
    """The costs of a static-cache verifier that pads every draft to ``budget`` nodes (``static_cache``): any draft
    costs the padded forward, a step without one a plain forward. Only those two are measured; every ``k >= 1``
    reads the padded one, so a draft of 1 is never priced below what its forward costs. ``PaddedCostModel(budget)``."""

    def _padded(self, k: int) -> int:
        return 0 if k <= 0 else self.max_tokens

    def observe(self, k: int, seconds: float) -> None:
        super().observe(self._padded(k), seconds)

    def observe_step(self, k: int, seconds: float) -> None:
        self.observe(k, seconds)  # a step without a draft is the one other shape: the plain forward

    def seconds(self, k: int) -> float | None:
        return super().seconds(self._padded(k))

    def ratio(self, k: int) -> float:
        return super().ratio(self._padded(k))


def verify_costs_for(target: Any, max_tokens: int, padded: tuple[int, bool] | None = None) -> VerifyCostModel:
    """The cost model of ``target``'s verifying forwards, shared by all calls on that model.

    Costs are a property of the model and the hardware, not of the prompt, so measurements carry
    over from call to call (short generations would otherwise decide on the prior alone).
    Concurrent calls may interleave their updates; each update is one tuple assignment.
    ``max_tokens`` is at most ``options.MAX_VERIFY_TOKENS``: the model never shrinks, so an oversize
    request is refused here, whatever path it came by, rather than kept for the life of ``target``.
    ``padded``: ``(budget, compiled)`` of a static-cache verifier (``CallContext.cost_key``): the costs of
    verification padded to that budget, kept apart per key.
    """
    max_tokens = check_verify_tokens("verify_costs_for", max_tokens)
    if target is None:  # a generator built by hand, outside a generate() call
        return VerifyCostModel(max_tokens)
    state = state_of(target)
    key = padded
    if key is not None:  # padded static verification: its own costs, per budget and mode, never mixed with these
        with state.lock:
            return state.padded_costs.setdefault(key, PaddedCostModel(key[0]))
    with state.lock:
        model = state.verify_costs
        if model is None or model.max_tokens < max_tokens:
            grown = VerifyCostModel(max(max_tokens, 16))
            if model is not None:
                grown._seconds[: len(model._seconds)] = model._seconds
                grown._timings[: len(model._timings)] = model._timings
            model = state.verify_costs = grown
        return model


def forget_costs(target: Any) -> None:
    """Drop ``target``'s measured verify costs (after a change that alters them, e.g. its weight layout)."""
    state = state_of(target)
    with state.lock:
        state.verify_costs = None
        state.padded_costs = {}


def record_draft_step(drafter: Any, seconds: float) -> None:
    """Fold one measured drafting step of ``drafter`` (a network, a layer view) into its running
    estimate, shared by every call that drafts with it."""
    _fold(drafter, "draft_step_s", seconds, 0.3)


def record_catch_up(drafter: Any, seconds_per_token: float) -> None:
    """Fold one measured catch-up of ``drafter`` (a forward over many tokens it had not seen: a draft model's prefill
    on the prompt), in seconds per token, into its running estimate, shared by every call that drafts with it."""
    _fold(drafter, "catch_up_token_s", seconds_per_token, 0.3)


def record_accept_rate(drafter: Any, drafted: list[int], accepted: list[int]) -> None:
    """Fold a call's per-token acceptance (accepted tokens over accepted tokens plus rejected drafts, as
    ``policy.AcceptanceEstimate``; from the call's per-step ``drafted`` and ``accepted`` counts) into ``drafter``'s
    running estimate, when the call drafted enough to say (8 tokens and rejections or more)."""
    kept = sum(accepted)
    rejected = sum(1 for d, a in zip(drafted, accepted) if a < d)
    if kept + rejected < 8:
        return
    _fold(drafter, "accept_rate", kept / (kept + rejected), 0.5)


def _fold(model: Any, slot: str, value: float, weight: float) -> None:
    """Move ``model``'s running estimate in state slot ``slot`` by ``weight`` towards ``value`` (``value`` when
    there is none yet)."""
    state = state_of(model)
    old = getattr(state, slot)
    setattr(state, slot, value if old is None else old + weight * (value - old))


def draft_price(drafter: Any, verify_costs: VerifyCostModel, fixed: float | None, prior: float) -> float:
    """One drafting step of ``drafter`` in target forwards: ``fixed`` if the user gave it, else measured
    (drafter step / one-token target forward), else ``prior`` until both are measured."""
    if fixed is not None:
        return fixed
    target_step, step = verify_costs.seconds(0), state_of(drafter).draft_step_s
    if step is not None and target_step:
        return step / target_step
    return prior
