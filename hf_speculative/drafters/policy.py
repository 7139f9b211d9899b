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
        if self._fixed is not None:
            return
        k = min(k, self.max_tokens)
        old = self._seconds[k]
        self._seconds[k] = seconds if old is None else old + self._smoothing * (seconds - old)

    def seconds(self, k: int) -> float | None:
        """Measured seconds of a forward verifying ``k`` draft tokens (``None`` until measured).

        A drafter that always drafts never measures ``k = 0``; it is then extrapolated from the
        measured lengths (a least-squares line through them), once two lengths are known.
        """
        k = min(k, self.max_tokens)
        if self._fixed is not None:
            return None
        if self._seconds[k] is not None or k != 0:
            return self._seconds[k]
        points = [(j, s) for j, s in enumerate(self._seconds) if s is not None]
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
        if self._seconds[k] is not None:
            return max(self._seconds[k] / base, 1.0)
        # Unmeasured length: extrapolate from the nearest measured shorter draft.
        for j in range(k - 1, 0, -1):
            if self._seconds[j] is not None:
                return max(self._seconds[j] / base, 1.0) + (self._prior[k] - self._prior[j])
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


_COSTS: "weakref.WeakKeyDictionary[torch.nn.Module, VerifyCostModel]" = weakref.WeakKeyDictionary()
_COSTS_LOCK = threading.Lock()


def verify_costs_for(target: torch.nn.Module, max_tokens: int) -> VerifyCostModel:
    """The cost model of ``target``'s verifying forwards, shared by all calls on that model.

    Costs are a property of the model and the hardware, not of the prompt, so measurements carry
    over from call to call (short generations would otherwise decide on the prior alone).
    Concurrent calls may interleave their updates; each update is a single assignment.
    """
    if target is None:  # a generator built by hand, outside a generate() call
        return VerifyCostModel(max_tokens)
    with _COSTS_LOCK:
        model = _COSTS.get(target)
        if model is None or model.max_tokens < max_tokens:
            grown = VerifyCostModel(max(max_tokens, 16))
            if model is not None:
                grown._seconds[: len(model._seconds)] = model._seconds
            model = _COSTS[target] = grown
        return model
