"""How a MagicDec row chooses its drafted tokens: as every chain drafter does (``core.accept.draft_chain``).

The group drafts every row in lockstep, so it cannot run ``draft_chain``'s loop row by row; it makes the same choice
at each depth instead (:func:`choose`), and each row then asks its plan how much of the chain to keep
(``group.DraftGroup.draft_for``), in ``draft_chain``'s order: ``plan.wants(peak)`` before a token, ``plan.took(p)``
after it. Under the rejection rule the token is a draw from the row's ``q``, kept with it for the rule.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ...core.sampling import RejectionSampler


@dataclasses.dataclass(eq=False)
class Choice:
    """One drafted token of a row: the peak of its drafter distribution, the token, its probability, and under the
    rejection rule the distribution it was drawn from (``[V]``)."""

    peak: float
    token: int
    p: float
    q: torch.Tensor | None = None


def choose(processors: Any, sampler: Any, sequence: torch.Tensor, logits: torch.Tensor) -> Choice | None:
    """A row's token from the drafter's logits ``[V]`` after ``sequence``, as ``core.accept.draft_chain`` chooses
    it: through a row's logits ``processors``, then their argmax, the seeded draw at that position, or under the
    rejection rule a draw from ``q`` (kept). ``None`` when there is nothing to draw from."""
    if processors:
        logits = processors(sequence, logits[None])[0]
    probs = torch.softmax(logits.float(), dim=-1)  # [V]
    peak = float(probs.max())
    if math.isnan(peak):
        return None
    if isinstance(sampler, RejectionSampler):
        token = sampler.draw(probs)
        return Choice(peak, token, float(probs[token]), probs)
    token = int(torch.argmax(logits) if sampler is None else sampler.choose(sequence, logits[None])[0])
    return Choice(peak, token, float(probs[token]))
