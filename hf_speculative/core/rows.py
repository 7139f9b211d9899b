"""The rows of a call: what the loop keeps per row and per batch besides the drafts.

Rows are kept as transformers keeps them: the left-padded prompt followed by the new tokens, so that the
logits processors and stopping criteria see exactly the ``input_ids`` of transformers' own batched loop
(``max_length`` counts the padding). Drafters see their row without padding. Under sampling the call's
:class:`~hf_speculative.core.sampling.SeededSampler` draws row ``b``'s position ``t`` with the noise keyed by
``(seed, b, t)`` (:class:`RowSampler`), as it does in transformers' batched sampling loop.

How wide a step drafts is the loop's choice too: one row alone drafts what its budget says (:class:`SoloWidth`);
a batch of rows verifies one ``[B, 1 + n]`` forward, so the batch cost model picks ``n`` for all of them
(:class:`BatchWidth`), each row's budget deciding within it.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch

from .batch_costs import BatchCostModel
from .policy import AcceptanceEstimate
from .sampling import SeededSampler
from .tree import DraftTree, Verdict


class RowSampler(SeededSampler):
    """The call's sampler, for one row of a batch processed alone: row ``row``'s noise, at position
    ``input_ids.shape[-1] + offset`` (``offset``: the row's left padding, for a drafter that sees its row
    without padding)."""

    def __init__(self, seed: int, row: int, offset: int = 0):
        super().__init__(seed, marks=True)  # the loop's rows only: it reads the draws with its verdicts
        self.row, self.offset = row, offset

    def noises(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        position, vocab = input_ids.shape[-1] + self.offset, scores.shape[-1]
        return self.noise(self.row, position, vocab, scores.device)[None]  # [1, V]


def row_view(processor: Any, row: int, batch: int) -> Any:
    """``processor`` for row ``row`` of a ``batch``-row call, processed alone: a shallow copy whose per-row tensors
    (a leading axis of ``batch``, e.g. the repetition penalty's ``prompt_ignore_length``, each row's padding) are
    cut to that row; the processor itself when it has none."""
    rows = {name: value for name, value in getattr(processor, "__dict__", {}).items()
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == batch}
    if not rows:
        return processor
    view = copy.copy(processor)
    for name, value in rows.items():
        setattr(view, name, value[row:row + 1])
    return view


def left_padding(attention_mask: torch.Tensor) -> list[int]:
    """The left padding of each row of ``attention_mask`` ``[B, L]`` (one row or a batch); raises when a row is padded
    on the right or in the middle, or has no token."""
    mask = attention_mask.bool()
    pads = (~mask).long().sum(-1).tolist()
    for row, pad in enumerate(pads):
        if pad >= mask.shape[1] or not bool(mask[row, pad:].all()):
            raise ValueError(
                "Speculative decoding needs left-padded prompts: a row of attention_mask masks tokens after its "
                "first real one (right padding, holes) or masks every token. Set tokenizer.padding_side = 'left' "
                "before tokenizing, or pass the prompt without padding.")
    return pads


class Outputs:
    """Besides the sequences: the streamer, fed one column of ``B`` tokens at a time as transformers' batched loop
    feeds it (a column once every running row has its token; finished rows give ``fill``; one row: each step's
    accepted block at once), and per row the
    processed scores and raw logits of each new token, when the call asks for them (``output_scores`` /
    ``output_logits``: per new position a ``[B, V]`` tensor, rows that had finished by then filled with -inf)."""

    def __init__(self, batch: int, length: int, fill: int, streamer: Any = None, scores: bool = False,
                 logits: bool = False):
        self.length, self.fill, self.streamer, self.streamed = length, fill, streamer, 0
        self.blocks = batch == 1  # one row: each step's tokens go to the streamer as one block [1, k]
        self.scores = [[] for _ in range(batch)] if scores else None
        self.logits = [[] for _ in range(batch)] if logits else None

    def add(self, row: int, scores: torch.Tensor, logits: torch.Tensor) -> None:
        """Row ``row``'s new tokens of this step: their score rows `[k, V]` and logits rows `[k, V]`."""
        if self.scores is not None:
            self.scores[row] += list(scores.float())
        if self.logits is not None:
            self.logits[row] += list(logits.float())

    def stream(self, rows: list[torch.Tensor], running: set[int], limit: int | None) -> None:
        """Put the columns every running row has reached (at most ``limit`` long: the text's final length)."""
        if self.streamer is None:
            return
        ready = min((rows[b].shape[1] for b in running), default=max(r.shape[1] for r in rows))
        ready = ready if limit is None else min(ready, limit)
        if self.blocks:
            start = self.length + self.streamed
            if ready > start:
                self.streamer.put(rows[0][:, start:ready].cpu())
                self.streamed = ready - self.length
            return
        for column in range(self.length + self.streamed, ready):
            self.streamer.put(torch.tensor([int(r[0, column]) if column < r.shape[1] else self.fill for r in rows]))
            self.streamed += 1

    def finish(self, out: torch.Tensor) -> tuple[tuple | None, tuple | None]:
        """Put the rest of ``out`` `[B, total]` and end the stream; the scores and logits tuples."""
        if self.streamer is not None:
            if self.blocks and out.shape[1] > self.length + self.streamed:
                self.streamer.put(out[:, self.length + self.streamed:].cpu())
            elif not self.blocks:
                for column in range(self.length + self.streamed, out.shape[1]):
                    self.streamer.put(out[:, column].cpu())
            self.streamer.end()
        total = out.shape[1]
        return (None if self.scores is None else self._stacked(self.scores, total),
                None if self.logits is None else self._stacked(self.logits, total))

    def _stacked(self, per_row: list[list[torch.Tensor]] | None, total: int) -> tuple | None:
        if per_row is None:
            return None
        first = next((r[0] for r in per_row if r), torch.zeros(0))
        gap = torch.full_like(first, float("-inf"))  # [V]: a row that had finished
        return tuple(torch.stack([r[t] if t < len(r) else gap for r in per_row]) for t in range(total - self.length))


def forward_columns(pending_mask: torch.Tensor, nodes: int) -> torch.Tensor:
    """A row's real columns in a batched forward, `[T']`: its pending tokens (``pending_mask`` `[m]`, False at
    left padding) and its first ``nodes`` draft nodes, which follow the ``m`` pending columns."""
    m = pending_mask.shape[0]
    return torch.cat([pending_mask.nonzero()[:, 0], torch.arange(m, m + nodes, device=pending_mask.device)])


class SoloWidth:
    """One row: no width of the step's own; the row's budget decides (``cap`` None: its tree is not cut), except at the
    first forward, which carries at most ``first_room`` draft nodes (``None``, the default: no limit; set where a
    longer first forward would run as two, ``verify.prefill_room``)."""

    cap = None
    first_room: int | None = None

    def width(self, rows: Sequence[int], room: int, batch: int, first: bool) -> int:
        return room if not first or self.first_room is None else min(room, self.first_room)

    def verified(self, row: int, tree: DraftTree, verdict: Verdict, width: int, room: int) -> None:
        pass

    def observe(self, batch: int, columns: int, seconds: float, first: bool) -> None:
        pass


class BatchWidth:
    """A batch: the draft width per row that pays for the ``[B, 1 + n]`` forward (``costs.plan`` from each row's
    acceptance and its chance to draft at all), measured on this target; a plain step first at a batch size not
    measured yet. A row's tree is cut to the width (``cap``).

    The first forward, the prompts' prefill, carries no draft: with draft nodes it needs our 4-D mask, which takes
    SDPA's masked path over the whole prompt (prompt lookup drafting from the prompts made a prefill of 8 rows x 2,048
    tokens 22% slower, 82 s against 67 s, on this CPU), while a draft there saves one step at most."""

    def __init__(self, costs: BatchCostModel, batch: int):
        self.costs = costs
        self.rates = [AcceptanceEstimate() for _ in range(batch)]
        self.chances = [1.0] * batch
        self.cap = 0

    def width(self, rows: Sequence[int], room: int, batch: int, first: bool) -> int:
        if first:  # the prefill under the model's own masks (the class docstring)
            self.cap = 0
            return 0
        width = 0
        if room > 0:
            if batch > 1 and not self.costs.knows(batch):
                width = 0  # measure this batch size's plain step first (twice: the lower of two timings)
            else:
                width = self.costs.plan([self.rates[b].rate for b in rows], [self.chances[b] for b in rows], room,
                                        batch=batch)
        if width == 0:
            for b in rows:
                self.rates[b].forgive()
        self.cap = width
        return width

    def verified(self, row: int, tree: DraftTree, verdict: Verdict, width: int, room: int) -> None:
        if tree.size:
            self.rates[row].update(verdict.num_accepted, tree.size)
        if width and min(width, room) > 0:
            self.chances[row] = 0.9 * self.chances[row] + (0.1 if tree.size else 0.0)

    def observe(self, batch: int, columns: int, seconds: float, first: bool) -> None:
        if not first:
            self.costs.observe(batch, columns, seconds)


