"""The call's logits processors, applied as transformers' ``LogitsProcessorList`` applies them, without its per-call
signature reading.

``LogitsProcessorList.__call__`` reads ``inspect.signature(processor.__call__)`` of every processor at every call, to
learn whether it wants keyword arguments. Plain decoding calls the list once a token; a speculative step calls it once
per verified row (each tree node with its own branch as the context: ``core.loop.processed_scores``) and, for drafters
that guide their drafts by the call's processors, once per drafted row too. The signature costs ~0.2 ms a processor
here (on a tiny model it was an eighth of a sampled lookahead call), so :class:`ProcessorList` reads each processor
class's once. The processors, their order and their outputs are the list's: a call with keyword arguments, or a
processor that wants some, goes through transformers' own ``__call__`` (its error included).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import LogitsProcessorList

_WANTS_KWARGS: dict[type, bool] = {}  # by class: whether its __call__ takes more than (input_ids, scores)


def wants_kwargs(processor: Any) -> bool:
    """Whether ``processor(input_ids, scores, ...)`` takes more parameters (transformers' test: ``> 2``), read once
    per class (a processor whose instance carries its own ``__call__`` is read every time)."""
    if "__call__" in getattr(processor, "__dict__", {}):
        return len(inspect.signature(processor.__call__).parameters) > 2
    kind = type(processor)
    known = _WANTS_KWARGS.get(kind)
    if known is None:
        known = _WANTS_KWARGS[kind] = len(inspect.signature(processor.__call__).parameters) > 2
    return known


class ProcessorList(LogitsProcessorList):
    """A ``LogitsProcessorList`` that applies its processors as transformers' does, each class's signature read once."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if kwargs or any(wants_kwargs(processor) for processor in self):
            return super().__call__(input_ids, scores, **kwargs)
        for processor in self:
            scores = processor(input_ids, scores)
        return scores
