"""When MagicDec drafts: a full-cache step against a compressed-cache step, measured in this call.

A draft of ``n`` tokens costs ``n`` draft steps (the target's weights over the bounded cache, ``t_d(B')`` for the
``B'`` rows drafting) on top of the verifying forward ``t_f(B, 1 + n)`` (the weights over the whole cache, for the
``B`` rows of the batch). A plain decoding step costs ``t_f(B, 1)``. With each drafting row's per-token acceptance
``r_b``, the step is worth::

    value(n) = (B' + sum_b (r_b + r_b^2 + ... + r_b^n)) / B'  /  (t_f(B, 1 + n) / t_f(B, 1) + n * t_d(B') / t_f(B, 1))

and the group drafts the ``n`` that maximises it, nothing when no ``n`` beats plain decoding by 2%. Where the cache
dominates what a step reads (long contexts, large batches) ``t_d`` is a small fraction of ``t_f(B, 1)``; at short
contexts it is about the whole of it (the same weights, a cache about as long), and nothing pays.

Both costs are timed here, on this call's forwards (``kv_tap.py`` times every verifying forward, the group its own
draft steps), so they follow the call's batch and its growing context. ``t_f(B, 1 + n) / t_f(B, 1)`` is this call's
once a plain step and a wider one are timed twice (a width not timed: linear between the timed ones, past the widest
along the line from the plain step to it); before, it comes from the target's shared cost models (the loop's
``BatchCostModel`` for a batch, the ``VerifyCostModel`` for one row), and ``t_d / t_f`` from the bytes each step
reads (the weights, plus the bounded cache against the whole one), a prior from the model's shapes, not a constant
tuned on one machine.

The shared models are learned at the contexts other calls ran, and a verifying forward's cost over thousands of keys
is not theirs: on a CPU, where attention over a long cache is compute-bound, ``t_f(B, 1 + n)`` grows with ``n``
where the shared model (short contexts, memory-bound) says it barely does. So the group drafts nothing until this
call has timed its plain step twice (:meth:`StepCosts.plain_timed`: two plain steps at the start, again when
finished rows have halved the batch). Deciding on the shared ratio alone drafted at 8,000 tokens a row and decoded
22-34% slower, and a call drafting at every step never timed a plain one to learn better.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from ...core.batch_costs import batch_costs_for
from ...cpu.weight_bytes import weight_bytes

_WIDEST = 65  # a forward wider than any verification (a prefill) says nothing of a step's cost
_MARGIN = 1.02  # do not draft for noise


class _Timing:
    """Seconds of one shape: the lower of its first two timings (the first often includes one-time work), then
    smoothed, each new timing at most doubling it (an interference spike), as ``core/costs.py`` folds them."""

    def __init__(self, seconds: float):
        self.seconds, self.count = seconds, 1

    def fold(self, seconds: float) -> None:
        if self.count == 1:
            self.seconds = min(self.seconds, seconds)
        else:
            self.seconds += 0.3 * (min(seconds, 2.0 * self.seconds) - self.seconds)
        self.count += 1

    @property
    def measured(self) -> bool:
        return self.count >= 2


class StepCosts:
    """The measured costs of one call's steps, and the draft depth that pays (see the module docstring).

    Args:
        target (`PreTrainedModel`): the model (its shared cost models, the weight bytes a step reads).
        bound (`int`): slots per row of the compressed cache (``sinks + window``).
        verify_costs (`VerifyCostModel`): the call's one-row verify costs (``ctx.verify_costs(n)``).
        fixed_price (`float`, *optional*): one draft step in plain steps, given by the user (``draft_cost``).
    """

    def __init__(self, target: torch.nn.Module, bound: int, verify_costs, fixed_price: float | None = None):
        self.target, self.bound, self.verify_costs, self.fixed_price = target, bound, verify_costs, fixed_price
        self.weight_bytes = weight_bytes(target)  # the bandwidth report's rule: the kernel's copies, one embedding row
        self.token_bytes = 0  # keys and values of one token over every layer, once a forward showed them
        self._full: dict[tuple[int, int], _Timing] = {}  # (batch, width) -> verifying forwards
        self._draft: dict[int, _Timing] = {}             # rows drafting -> one draft step

    # -- timings ------------------------------------------------------------------------------------
    def observe_forward(self, batch: int, width: int, seconds: float) -> None:
        """A verifying forward of ``batch`` rows of ``width`` tokens took ``seconds``."""
        if width <= _WIDEST:
            _fold(self._full, (batch, width), seconds)

    def observe_draft(self, batch: int, seconds: float) -> None:
        """One draft step of ``batch`` rows over the compressed cache took ``seconds``."""
        _fold(self._draft, batch, seconds)

    def draft_seconds(self, batch: int) -> float | None:
        timing = self._draft.get(batch)
        return None if timing is None else timing.seconds

    # -- what they say --------------------------------------------------------------------------------
    def shared_ratio(self, batch: int, n: int) -> float:
        """``t_f(batch, 1 + n) / t_f(batch, 1)`` from the target's shared cost models."""
        if batch > 1:
            return batch_costs_for(self.target).ratio(batch, n)
        return self.verify_costs.ratio(n)

    def reference(self, batch: int) -> int | None:
        """The batch whose timings stand for ``batch``'s: itself once its plain step is timed twice, else the timed one
        nearest it within a factor of 2 (finished rows shrink a batch a row at a time, and a verification's cost over
        the width changes little between neighbours; further apart it does, and the rule times again); ``None``:
        none yet, and the rule waits (:meth:`plain_timed`)."""
        timed = [b for (b, width), t in self._full.items() if width == 1 and t.measured and batch <= 2 * b <= 4 * batch]
        return min(timed, key=lambda b: (abs(b - batch), -b)) if timed else None

    def plain_timed(self, batch: int) -> bool:
        """Whether a plain step of ``batch`` rows, or of a batch standing for it (:meth:`reference`), was timed twice
        in this call (what the cost rule waits for)."""
        return self.reference(batch) is not None

    def ratio(self, batch: int, n: int) -> float:
        """``t_f(batch, 1 + n) / t_f(batch, 1)``: this call's when the plain step and a wider one of ``batch`` (or of
        the batch standing for it) are timed (linear in the width between timed widths, and past the widest along the
        line from the plain step to it), else shared."""
        if not n:
            return 1.0
        ref = self.reference(batch)
        if ref is None:
            return self.shared_ratio(batch, n)
        timed = sorted((width, t.seconds) for (b, width), t in self._full.items() if b == ref and t.measured)
        if len(timed) == 1:  # the plain step alone
            return self.shared_ratio(batch, n)
        width = 1 + n
        (w0, t0), (w1, t1) = timed[0], timed[-1]  # beyond the widest: the plain step's line through it
        for (a, ta), (b, tb) in itertools.pairwise(timed):
            if a <= width <= b:
                (w0, t0), (w1, t1) = (a, ta), (b, tb)
                break
        seconds = t0 + (t1 - t0) * (width - w0) / (w1 - w0)
        return max(seconds / timed[0][1], 1.0)

    def plain(self, batch: int) -> float | None:
        """Seconds of a plain step of ``batch`` rows now: timed, or a timed wider forward over its ratio."""
        timings = [(width, t) for (b, width), t in self._full.items() if b == batch and t.measured]
        if not timings:
            return None
        width, timing = min(timings, key=lambda item: item[0])  # the plain step itself when it was timed
        return timing.seconds / self.ratio(batch, width - 1)

    def price(self, batch: int, drafting: int, context: float) -> float:
        """One draft step of ``drafting`` rows, in plain steps of the ``batch`` rows at ``context`` tokens each:
        the user's ``draft_cost``, else timed, else the bytes the two read (the prior)."""
        if self.fixed_price is not None:
            return self.fixed_price
        draft, plain = self.draft_seconds(drafting), self.plain(batch)
        if draft is not None and plain:
            return draft / plain
        compressed = self.weight_bytes + drafting * self.bound * self.token_bytes
        full = self.weight_bytes + batch * max(context, 1.0) * self.token_bytes
        return compressed / full

    def best_depth(self, rates: Sequence[float], max_depth: int, batch: int, price: float) -> int:
        """The draft depth (``0..max_depth``) with the most expected tokens per unit of cost for drafting rows of
        per-token acceptance ``rates``, in a batch of ``batch`` rows (see the module docstring); 0 when none
        beats plain decoding by 2%."""
        if not rates:
            return 0
        rows, terms, gains = len(rates), [1.0] * len(rates), 0.0
        best, best_value = 0, 1.0
        for n in range(1, max_depth + 1):
            for b, rate in enumerate(rates):
                terms[b] *= rate
                gains += terms[b]
            value = (rows + gains) / rows / (self.ratio(batch, n) + n * price)
            if value > best_value * _MARGIN:
                best, best_value = n, value
        return best


def _fold(cells: dict, key, seconds: float) -> None:
    timing = cells.get(key)
    if timing is None:
        cells[key] = _Timing(seconds)
    else:
        timing.fold(seconds)
