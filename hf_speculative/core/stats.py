"""Per-call speculative decoding statistics.

A :class:`SpeculativeStats` is filled in by the per-call candidate generator *where each event
happens* (a draft is proposed, a target forward verifies it) and published when the call ends, so
``hf_speculative.last_stats(model)`` always describes one complete ``generate()`` call.

Besides the totals it keeps one record per verification step (draft tokens verified, tokens accepted,
draft, verify and other seconds) in compact arrays, 20 bytes a step: :meth:`SpeculativeStats.steps`. Both
routes fill them through :meth:`~SpeculativeStats.record_draft` / :meth:`~SpeculativeStats.record_verify`
(transformers' assisted loop for chains, through ``base.SpeculativeCandidateGenerator``; our loop for
trees), which ``hf-speculative project`` reads from the benchmark's JSONL.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from array import array
from collections import Counter
from typing import Any


@dataclasses.dataclass
class SpeculativeStats:
    """Counters of one ``generate()`` call.

    Attributes:
        method (`str`): name of the drafting strategy (``"prompt-lookup"``, ``"draft-model"``, ...).
        target_forwards (`int`): forwards of the target model, prefill included.
        drafted_tokens (`int`): tokens proposed by the drafter and sent to verification.
        accepted_tokens (`int`): proposed tokens that the target kept.
        new_tokens (`int`): tokens added to the sequence by the call.
        accepted_lengths (`Counter[int]`): histogram, for every target forward, of the number of
            proposed tokens it accepted (0 = the forward produced only the target's own token).
        draft_time_s / verify_time_s / total_time_s (`float`): wall time spent proposing, in the
            target forward plus acceptance, and in the whole call.
        extra (`dict`): drafter specific details (e.g. the layer set chosen by a calibration).

    Per step (one target forward each, in order; :meth:`steps` returns them as lists): the draft tokens it
    verified (the chain's length or the tree's node count), the tokens it accepted, and the seconds of the
    draft, of the verification and of the rest of the step (``other_s``: from the verification's end to the next
    draft's start, where the loop appends the tokens, checks stops, streams and the drafter observes the
    verdict; 0 for the call's last step). A draft recorded without a verification after it (the call ended) is
    left out; two drafts before one verification count as one step's draft.
    """

    method: str = ""
    target_forwards: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    new_tokens: int = 0
    accepted_lengths: Counter = dataclasses.field(default_factory=Counter)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    total_time_s: float = 0.0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    # per step: int32 counts and float32 seconds (see steps()); the draft waiting for its verification
    _step_drafted: array = dataclasses.field(default_factory=functools.partial(array, "i"), repr=False)
    _step_accepted: array = dataclasses.field(default_factory=functools.partial(array, "i"), repr=False)
    _step_draft_s: array = dataclasses.field(default_factory=functools.partial(array, "f"), repr=False)
    _step_verify_s: array = dataclasses.field(default_factory=functools.partial(array, "f"), repr=False)
    _step_other_s: array = dataclasses.field(default_factory=functools.partial(array, "f"), repr=False)
    _verified_at: float | None = dataclasses.field(default=None, repr=False)  # the last verification's end
    _pending_draft: tuple[int, float] = dataclasses.field(default=(0, 0.0), repr=False)

    # -- events -------------------------------------------------------------------------------
    def record_draft(self, num_tokens: int, seconds: float) -> None:
        self.drafted_tokens += num_tokens
        self.draft_time_s += seconds
        tokens, before = self._pending_draft
        if self._verified_at is not None:  # the step before ended when this draft began
            self._step_other_s[-1] = max(time.perf_counter() - float(seconds) - self._verified_at, 0.0)
            self._verified_at = None
        self._pending_draft = (tokens + int(num_tokens), before + float(seconds))

    def record_verify(self, num_accepted: int, seconds: float) -> None:
        self.target_forwards += 1
        self.accepted_tokens += num_accepted
        self.accepted_lengths[num_accepted] += 1
        self.verify_time_s += seconds
        drafted, draft_s = self._pending_draft
        self._pending_draft = (0, 0.0)
        self._step_drafted.append(drafted)
        self._step_accepted.append(int(num_accepted))
        self._step_draft_s.append(draft_s)
        self._step_verify_s.append(float(seconds))
        self._step_other_s.append(0.0)
        self._verified_at = time.perf_counter()

    def steps(self) -> dict[str, list]:
        """The per-step records, one entry per target forward: ``{"drafted": [...], "accepted": [...],
        "draft_s": [...], "verify_s": [...], "other_s": [...]}`` (seconds rounded to the microsecond)."""
        return {"drafted": self._step_drafted.tolist(), "accepted": self._step_accepted.tolist(),
                "draft_s": [round(t, 6) for t in self._step_draft_s],
                "verify_s": [round(t, 6) for t in self._step_verify_s],
                "other_s": [round(t, 6) for t in self._step_other_s]}

    # -- derived figures ----------------------------------------------------------------------
    @property
    def tau(self) -> float:
        """Mean tokens gained per target forward, the target's own token included (1.0 = no gain)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Fraction of proposed tokens that were accepted (0.0 when nothing was proposed)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with the counters and the derived figures (the per-step records: :meth:`steps`)."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if not k.startswith("_")}
        out["accepted_lengths"] = {int(k): int(v) for k, v in sorted(self.accepted_lengths.items())}
        out.update(tau=self.tau, acceptance_rate=self.acceptance_rate, tokens_per_second=self.tokens_per_second)
        return out

    def summary(self) -> str:
        """One line: tokens, seconds, tokens/s, tau, acceptance (``no drafts`` when the drafter proposed nothing,
        rather than a misleading 0%) and target forwards."""
        return (
            f"{self.method}: {self.new_tokens} tokens in {self.total_time_s:.2f}s "
            f"({self.tokens_per_second:.1f} tok/s), tau={self.tau:.2f}, "
            f"acceptance={format_acceptance(self.acceptance_rate, self.drafted_tokens)}, "
            f"target forwards={self.target_forwards}"
        )


NO_DRAFTS = "no drafts"
"""How an acceptance rate is shown when nothing was drafted (0 of 0 is no rate at all, not 0%)."""


def format_acceptance(rate: float | None, drafted: int | None, unknown: str = "–") -> str:
    """An acceptance rate for people: ``"62%"``; :data:`NO_DRAFTS` when ``drafted`` is 0 (the drafter proposed
    nothing); ``unknown`` when the rate is not known (``rate`` ``None``: a method that does not report its drafts,
    such as transformers' own). The one place the CLI, the benchmark report and ``summary()`` format it."""
    if drafted == 0:
        return NO_DRAFTS
    return unknown if rate is None else f"{rate:.0%}"


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __enter__(self) -> "Stopwatch":
        self._t0 = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t0
