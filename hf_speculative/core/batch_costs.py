"""What verifying ``[B, 1 + n]`` tokens costs, and how much a batch should draft per step.

One decoding step of B rows is one target forward over ``[B, 1]``; a speculative step verifies ``n`` more
tokens per row, ``[B, 1 + n]``. At B = 1 that forward is memory-bound (the weights are read once
whatever the token count), so extra tokens are almost free; as B grows it becomes compute-bound and
``t(B, 1 + n)`` approaches ``(1 + n) t(B, 1)``, so drafts stop paying. :class:`BatchCostModel` keeps the
measured seconds of the target's forwards per ``(B, width)`` (``width = 1 + n`` tokens per row), per model
and device, and extrapolates unmeasured shapes with a line through all measurements in the total token
count ``B * width`` (``seconds ~ overhead + per_token * B * width``), or a prior of that shape until two
token counts are measured.

:meth:`BatchCostModel.plan` picks the step's draft width: with each row's acceptance rate ``r_b`` and the
chance ``p_b`` that its drafter proposes anything, a width ``n`` yields ``B + sum_b p_b (r_b + ... + r_b^n)``
tokens for ``t(B, 1 + n) / t(B, 1)`` of a plain step's cost; the best ``n`` wins, 0 (a plain decoding step,
no drafting at all) when nothing beats plain decoding by 2%. So at a large B the batch falls back to
plain decoding by itself, and drafts again when finished rows leave the batch.
"""

from __future__ import annotations

from typing import Any, Sequence

from .state import state_of

_PRIOR = (7.3, 1.0)  # (overhead, per token): this CPU's shape at B = 1 (c(1)/c(0) ~ 1.12, as costs.py's prior)
_MARGIN = 1.02  # do not draft for noise


class BatchCostModel:
    """Measured seconds of target forwards over ``[B, width]`` tokens, and the draft width that pays.

    Args:
        smoothing (`float`, defaults to 0.3): weight of a new timing once a shape has two.
    """

    def __init__(self, smoothing: float = 0.3):
        self._cells: dict[tuple[int, int], tuple[float, int]] = {}  # (B, width) -> (seconds, timings)
        self._smoothing = smoothing
        self._fixed: tuple[float, float] | None = None
        self._frozen = False  # loaded from a profile: timings are not folded in

    def fix(self, overhead: float, per_token: float) -> None:
        """Use ``seconds(B, width) = overhead + per_token * B * width`` instead of measuring (known hardware;
        decisions that must not depend on the wall clock, as in tests)."""
        if overhead < 0 or per_token <= 0:
            raise ValueError(f"BatchCostModel.fix(overhead={overhead}, per_token={per_token}): need overhead >= 0 "
                             "and per_token > 0.")
        self._fixed = (float(overhead), float(per_token))

    def load(self, seconds: dict[tuple[int, int], float]) -> None:
        """Use measured seconds of forwards over ``[B, width]`` tokens (``{(B, width): seconds}``, from
        ``hf-speculative profile --batches``) instead of measuring: those shapes as given, others on the line
        through them; later timings are ignored."""
        if not seconds or any(s <= 0 for s in seconds.values()):
            raise ValueError("BatchCostModel.load: give positive seconds for one or more (batch, width) shapes.")
        self._cells = {(int(b), int(w)): (float(s), 2) for (b, w), s in seconds.items()}
        self._frozen = True

    def observe(self, batch: int, width: int, seconds: float) -> None:
        """Fold in one forward's wall time. As in ``costs.VerifyCostModel``: the lower of a shape's first two
        timings, then smoothed, each new timing at most doubling the estimate (one interference spike)."""
        if self._fixed is not None or self._frozen:
            return
        key = (int(batch), int(width))
        old = self._cells.get(key)
        if old is None:
            self._cells[key] = (seconds, 1)
        elif old[1] == 1:
            self._cells[key] = (min(old[0], seconds), 2)
        else:
            self._cells[key] = (old[0] + self._smoothing * (min(seconds, 2.0 * old[0]) - old[0]), old[1] + 1)

    def knows(self, batch: int) -> bool:
        """Whether a plain step of ``batch`` rows has a cost to plan by (fixed, loaded or measured twice)."""
        return self._fixed is not None or self._frozen or self.measured(batch, 1)

    def measured(self, batch: int, width: int) -> bool:
        cell = self._cells.get((batch, width))
        return cell is not None and cell[1] >= 2

    def _line(self) -> tuple[float, float]:
        """(overhead, per token) of the line through the measured shapes (by total tokens), else the prior."""
        if self._fixed is not None:
            return self._fixed
        points = [(b * w, s) for (b, w), (s, count) in self._cells.items() if count >= 2]
        if len({t for t, _ in points}) < 2:
            return _PRIOR
        mean_t = sum(t for t, _ in points) / len(points)
        mean_s = sum(s for _, s in points) / len(points)
        slope = sum((t - mean_t) * (s - mean_s) for t, s in points) / sum((t - mean_t) ** 2 for t, _ in points)
        slope = max(slope, 1e-12)
        return max(mean_s - slope * mean_t, 0.0), slope

    def seconds(self, batch: int, width: int) -> float:
        """Seconds (or the prior's units) of a forward over ``[batch, width]`` tokens."""
        if self._fixed is None and self.measured(batch, width):
            return self._cells[(batch, width)][0]
        overhead, per_token = self._line()
        return overhead + per_token * batch * width

    def ratio(self, batch: int, n: int) -> float:
        """``t(batch, 1 + n) / t(batch, 1)``: verifying ``n`` draft tokens per row against a plain step."""
        if n == 0:
            return 1.0
        if self._fixed is None and not (self.measured(batch, 1) and self.measured(batch, 1 + n)):
            overhead, per_token = self._line()  # both from one line: a measured cell over a fitted one mixes noise
            return max((overhead + per_token * batch * (1 + n)) / (overhead + per_token * batch), 1.0)
        return max(self.seconds(batch, 1 + n) / self.seconds(batch, 1), 1.0)

    def plan(self, rates: Sequence[float], chances: Sequence[float], max_tokens: int, batch: int | None = None) -> int:
        """The draft width (tokens per row, ``0..max_tokens``) with the most expected tokens per unit of cost
        for running rows that accept a draft token with probability ``rates[b]`` and propose one at all with
        probability ``chances[b]``, in a forward of ``batch`` rows (default: one per running row; finished rows
        waiting to leave the batch count too); 0 when no width beats plain decoding by 2%."""
        running = len(rates)
        batch = running if batch is None else batch
        if running == 0:
            return 0
        best_n, best_value = 0, 1.0
        terms = [1.0] * running
        gains = 0.0
        for n in range(1, max_tokens + 1):
            for b in range(running):
                terms[b] *= rates[b]
                gains += chances[b] * terms[b]
            value = (running + gains) / running / self.ratio(batch, n)
            if value > best_value * _MARGIN:
                best_n, best_value = n, value
        return best_n


def batch_costs_for(target: Any) -> BatchCostModel:
    """The batch cost model of ``target``, shared by every batched call on it (costs belong to the model and the
    device, not to a call; ``hfs.forget(target)`` drops them)."""
    state = state_of(target)
    with state.lock:
        if state.batch_costs is None:
            state.batch_costs = BatchCostModel()
        return state.batch_costs


def forget_batch_costs(target: Any) -> None:
    """Drop ``target``'s measured batch costs."""
    state = state_of(target)
    with state.lock:
        state.batch_costs = None
