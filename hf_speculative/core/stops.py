"""Where a step's new tokens stop: the first new position at which the call's stopping criteria hold.

A step adds the accepted path and the target's own token, ``k + 1`` tokens; a stop inside them ends the text there
(its token kept), so each position is a place to ask the criteria, as plain decoding asks them after every token.
Asked as transformers' objects, that is ``k + 1`` calls of the criteria list a step, each a few tensor operations
and a read of the result (~8 operations and a read per token for EOS and the length). The criteria
transformers builds from the generation config itself are plain rules about token ids and lengths, so
:class:`Stops` reads them once per call and checks them on the host, on the new tokens the step already holds as
python ints: ``EosTokenCriteria`` (any of its ids), ``MaxLengthCriteria`` (the length), ``MaxTimeCriteria`` (the clock,
once a step: it holds at the first new position if at any). Every other criterion (stop strings, a user's own, a
subclass of the three) is asked position by position as before, up to the first stop the rules found.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria

from .. import compat


class Stops:
    """The call's ``stopping_criteria`` (transformers' list, or any callable with its signature), split once."""

    def __init__(self, criteria: Any) -> None:
        self.criteria = criteria
        self.eos: set[int] = set()
        self.max_length: int | None = None
        self.clocks: list[Any] = []
        self.others: list[Any] = []
        if not isinstance(criteria, list):  # StoppingCriteriaList is a list; anything else is asked as it is
            self.others = [criteria]
            return
        for criterion in criteria:
            if type(criterion) is EosTokenCriteria:
                ids = criterion.eos_token_id
                self.eos.update(int(t) for t in (ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else ids))
            elif type(criterion) is MaxLengthCriteria:
                limit = int(criterion.max_length)
                self.max_length = limit if self.max_length is None else min(self.max_length, limit)
            elif type(criterion) is MaxTimeCriteria:
                self.clocks.append(criterion)
            else:
                self.others.append(criterion)

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> Any:
        """The criteria themselves (what a caller that does not know the new tokens asks)."""
        return self.criteria(input_ids, scores, **kwargs)

    def first(self, sequence: torch.LongTensor, start: int, new_tokens: list[int]) -> int | None:
        """The length at the first stop among ``sequence``'s positions ``start + 1 ..`` (``sequence`` ``[1, L]``,
        whose tokens from ``start`` on are ``new_tokens``), or None."""
        length = start + len(new_tokens)
        end = next((start + i + 1 for i, token in enumerate(new_tokens) if token in self.eos), None)
        if self.max_length is not None and self.max_length <= length:
            end = min(end or length, max(self.max_length, start + 1))
        if any(compat.stopping_result(clock(sequence[:, : start + 1], None)) for clock in self.clocks):
            return start + 1
        for at in range(start + 1, (end or length + 1)):  # only positions before the first stop found so far
            if any(compat.stopping_result(other(sequence[:, :at], None)) for other in self.others):
                return at
        return end
