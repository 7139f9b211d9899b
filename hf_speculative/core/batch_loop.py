"""Speculative decoding of a batch (B > 1): every row drafts and accepts its own tokens in one target forward.

The single-row ladder of :mod:`hf_speculative.core.loop`, per step, for the rows still running::

    width   = costs.plan(rows' acceptance, B)            # draft tokens per row this step; 0: plain decoding
    trees   = [drafter_b.propose_tree(row_b, width)]     # per-row drafter state (an n-gram index, a draft cache)
    logits  = verifier.forward(pending, trees)           # ONE forward over [B, 1 + n] (batch_verify.py)
    verdict_b = accept(tree_b, processed(logits_b))      # accept.py's rule, row by row
    verifier.keep(paths)                                 # accepted paths kept, the rest become holes
    row_b += path + own token, cut at its first stop     # EOS, max_length, stop strings: per row
    finished rows leave the batch (their drafter closed, their cache rows dropped)

Rows are kept as transformers keeps them: the left-padded prompt followed by the new tokens, so that the
logits processors and stopping criteria see exactly the ``input_ids`` of transformers' own batched loop
(``max_length`` counts the padding; a row that finished is filled with ``pad_token_id`` when the call has an
EOS criterion, as transformers does, and decodes on otherwise). Drafters see their row without padding.

Under sampling the call's :class:`~hf_speculative.core.sampling.SeededSampler` draws row ``b``'s position ``t`` with
the noise keyed by ``(seed, b, t)``, as it does in transformers' batched sampling loop: the text is a sample of
the target's distribution, the same whatever was drafted.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any

import torch
from transformers import LogitsProcessorList

from .accept import accept_greedy
from .call import CallContext, TargetView
from .batch_costs import BatchCostModel, batch_costs_for
from .batch_verify import BatchVerifier
from .chains import ChainDrafter
from .policy import AcceptanceEstimate
from .loop import processed_scores, stop_index
from .sampling import SeededSampler, split_sampler
from .stats import SpeculativeStats
from .tree import DraftTree

_COMPACT_MIN_SLOTS = 8  # re-pack the cache when that cuts a quarter of its slots, and at least this many


class RowSampler(SeededSampler):
    """The call's sampler, for one row of a batch processed alone: row ``row``'s noise, at position
    ``input_ids.shape[-1] + offset`` (``offset``: the row's left padding, for a drafter that sees its row
    without padding)."""

    def __init__(self, seed: int, row: int, offset: int = 0):
        super().__init__(seed)
        self.row, self.offset = row, offset

    def choose(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.LongTensor:
        position, vocab = input_ids.shape[-1] + self.offset, scores.shape[-1]
        logprobs = torch.log_softmax(scores.float(), dim=-1)  # [1, V]
        return (logprobs + self.noise(self.row, position, vocab, scores.device)).argmax(dim=-1)


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


@dataclasses.dataclass
class BatchResult:
    sequences: torch.LongTensor  # [B, L + new], finished rows padded with pad_token_id
    stats: SpeculativeStats
    scores: tuple | None = None  # per new position [B, V] (output_scores), see BatchOutputs
    logits: tuple | None = None  # per new position [B, V] (output_logits)


def left_padding(attention_mask: torch.Tensor) -> list[int]:
    """The left padding of each row; raises when a row is padded on the right or in the middle."""
    mask = attention_mask.bool()
    pads = (~mask).long().sum(-1).tolist()
    for row, pad in enumerate(pads):
        if pad >= mask.shape[1] or not bool(mask[row, pad:].all()):
            raise ValueError(
                "Batched speculative decoding needs left-padded prompts (each row's padding before its tokens, at "
                "least one token a row): set tokenizer.padding_side = 'left' before tokenizing the batch.")
    return pads


class BatchOutputs:
    """Besides the sequences: the streamer, fed one column of ``B`` tokens at a time as transformers' batched loop
    feeds it (a column once every running row has its token; finished rows give ``fill``), and per row the
    processed scores and raw logits of each new token, when the call asks for them (``output_scores`` /
    ``output_logits``: per new position a ``[B, V]`` tensor, rows that had finished by then filled with -inf)."""

    def __init__(self, batch: int, length: int, fill: int, streamer: Any = None, scores: bool = False,
                 logits: bool = False):
        self.length, self.fill, self.streamer, self.streamed = length, fill, streamer, 0
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
        for column in range(self.length + self.streamed, ready):
            self.streamer.put(torch.tensor([int(r[0, column]) if column < r.shape[1] else self.fill for r in rows]))
            self.streamed += 1

    def finish(self, out: torch.Tensor) -> tuple[tuple | None, tuple | None]:
        """Put the rest of ``out`` `[B, total]` and end the stream; the scores and logits tuples."""
        if self.streamer is not None:
            for column in range(self.length + self.streamed, out.shape[1]):
                self.streamer.put(out[:, column].cpu())
            self.streamer.end()
        return self._stacked(self.scores, out.shape[1]), self._stacked(self.logits, out.shape[1])

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


def run_batch(target: torch.nn.Module, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None,
              strategy: Any, *, generation_config: Any, stopping_criteria: Any, logits_processor: Any = None,
              stats: SpeculativeStats | None = None, pad_token_id: int | None = None, max_depth: int = 64,
              costs: BatchCostModel | None = None, streamer: Any = None, output_scores: bool = False,
              output_logits: bool = False) -> BatchResult:
    """Speculative decoding of ``input_ids`` (``[B, L]``, left-padded, ``attention_mask`` ``[B, L]``) with a
    per-row drafter opened from ``strategy`` (checked by :func:`hf_speculative.hf.checks.check_batch_strategy`); token for token what
    transformers' own batched greedy loop (or, with the call's SeededSampler last in ``logits_processor``, its
    seeded sampling loop) writes for the same batch.

    ``costs`` decides the draft width per step (default: the target's shared :func:`batch_costs_for`).
    ``streamer`` gets the new tokens one column ``[B]`` at a time (the prompt is the caller's to put, as
    ``generate()`` does); ``output_scores`` / ``output_logits`` keep each new position's ``[B, V]`` rows.
    """
    batch, length = input_ids.shape
    mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    pads = left_padding(mask)
    stats = stats or SpeculativeStats()
    costs = costs or batch_costs_for(target)
    max_length = int(generation_config.max_length)
    has_eos = any(hasattr(c, "eos_token_id") for c in (stopping_criteria or []))
    if has_eos and pad_token_id is None:
        raise ValueError("Batched generation with an EOS token needs a pad_token_id for the rows that finish "
                         "first: pass pad_token_id= to generate() (e.g. tokenizer.pad_token_id).")
    processors, sampler = split_sampler(logits_processor)

    def row_processors(row: int, offset: int) -> LogitsProcessorList:
        items = [row_view(p, row, batch) for p in processors]
        return LogitsProcessorList(items if sampler is None else [*items, RowSampler(sampler.seed, row, offset)])

    targets = [row_processors(b, 0) for b in range(batch)]
    fill = 0 if pad_token_id is None else int(pad_token_id)
    outputs = BatchOutputs(batch, length, fill, streamer, output_scores, output_logits)
    drafters: list[ChainDrafter | None] = []
    started = time.perf_counter()
    rows = [input_ids[b:b + 1] for b in range(batch)]                   # each [1, L + new_b], padded prompt
    ends: dict[int, int] = {}  # rows whose stop fired (finished, or decoding on without EOS): their length
    verifier, closed = None, set()
    try:
        views = [TargetView() for _ in range(batch)]  # each row's drafter reads its own row of the forwards
        for b in range(batch):  # per-row drafter state; its own stats, so its cost rules never see a batched forward
            ctx = CallContext(target, generation_config, row_processors(b, pads[b]), stopping_criteria,
                              SpeculativeStats(), model_kwargs=None, view=views[b])
            drafters.append(ChainDrafter(strategy.open(ctx)))
        rates = [AcceptanceEstimate() for _ in range(batch)]
        chances = [1.0] * batch
        verifier = BatchVerifier(target, batch)
        members = list(range(batch))  # the rows in the verifier's batch, in order: running ones and finished ones
        live = set(members)           # the running ones; finished rows stay (decoding nothing) until half are
        pending, pending_mask = input_ids, mask
        first = True
        while live:
            tick = time.perf_counter()
            running = [b for b in members if b in live]
            rooms = {b: min(max_depth, max_length - rows[b].shape[1] - 1) for b in running}
            width = 0
            if max(rooms.values()) > 0:
                if not first and len(members) > 1 and not costs.knows(len(members)):
                    width = 0  # measure this batch size's plain step first (twice: the lower of two timings)
                else:
                    width = costs.plan([rates[b].rate for b in running], [chances[b] for b in running],
                                       max(rooms.values()), batch=len(members))
            trees = []
            for b in members:
                room = min(rooms.get(b, 0), width)
                tree = drafters[b].propose_tree(rows[b][:, pads[b]:], room) if room > 0 else DraftTree.empty()
                if tree.size > width:  # a tree drafter bounds depth; the step's width bounds nodes
                    tree = DraftTree(tree.tokens[:width], tree.parents[:width])
                trees.append(tree)
            if width == 0:
                for b in running:
                    rates[b].forgive()
            stats.record_draft(sum(t.size for t in trees), time.perf_counter() - tick)

            tick = time.perf_counter()
            with torch.no_grad():
                logits = verifier.forward(pending, pending_mask, trees)      # [B', 1 + n, V]
            if logits.is_cuda:
                torch.cuda.synchronize()
            forward_s = time.perf_counter() - tick
            if not first:
                costs.observe(len(members), logits.shape[1], forward_s)
            verdicts, scores_of = [], []
            for i, (b, tree) in enumerate(zip(members, trees)):
                if b not in live:
                    verdicts.append(None)
                    scores_of.append(None)
                    continue
                scores = processed_scores(logits[i, : 1 + tree.size], rows[b], tree, targets[b])  # [1 + k, V]
                verdicts.append(accept_greedy(tree, scores))
                scores_of.append(scores)
            verifier.keep([() if v is None else v.path for v in verdicts])
            stats.record_verify(sum(v.num_accepted for v in verdicts if v is not None), time.perf_counter() - tick)

            for i, (b, tree, verdict) in enumerate(zip(members, trees, verdicts)):
                if verdict is None:
                    continue
                before = rows[b].shape[1]
                new = tree.path_tokens(verdict.path) + [verdict.next_token]
                rows[b] = torch.cat([rows[b], rows[b].new_tensor([new])], dim=-1)
                if b not in ends:
                    end = stop_index(rows[b], before, stopping_criteria)
                    if end is not None:
                        ends[b] = end
                        if has_eos:
                            rows[b] = rows[b][:, :end]
                if outputs.scores is not None or outputs.logits is not None:
                    kept = [node + 1 for node in (-1, *verdict.path)][: rows[b].shape[1] - before]  # score rows
                    outputs.add(b, scores_of[i][kept], logits[i, kept])
                if tree.size:
                    rates[b].update(verdict.num_accepted, tree.size)
                if width and min(width, max_length - before - 1) > 0:
                    chances[b] = 0.9 * chances[b] + (0.1 if tree.size else 0.0)
                if (b in ends and has_eos) or rows[b].shape[1] >= max_length:
                    live.discard(b)  # finished
                else:
                    views[b].row = (i, forward_columns(pending_mask[i], tree.size))  # its states, for EAGLE
                    try:
                        drafters[b].observe(rows[b][:, pads[b]:], tree, verdict, scores_of[i])
                    finally:
                        views[b].row = None
            limit = None
            if not has_eos and len(ends) == batch:  # rows decode on past their stop until the longest has stopped
                total = limit = max(ends.values())
                live = {b for b in live if rows[b].shape[1] < total}
            outputs.stream(rows, live, limit)
            for b in members:
                if b not in live and b not in closed:
                    drafters[b].close()
                    closed.add(b)
            if live and len(live) * 2 <= len(members):
                # half the batch finished: drop those rows (before, a smaller batch is not always a faster one:
                # CPU GEMMs of odd row counts can be slower than of the next even one)
                keep = [i for i, b in enumerate(members) if b in live]
                verifier.select(torch.tensor(keep, dtype=torch.long))
                members = [members[i] for i in keep]
            if live and verifier.shrinkable() * 4 > max(verifier.slots.shape[1], _COMPACT_MIN_SLOTS * 4):
                verifier.compact()  # a re-pack copies the whole cache: only when it cuts a quarter of the slots
            pending = torch.stack([rows[b][0, -1:] for b in members])  # [B', 1]
            pending_mask = torch.ones(len(members), 1, dtype=torch.bool)
            first = False
    finally:
        for b, drafter in enumerate(drafters):
            if b not in closed:
                drafter.close()
        if verifier is not None:
            verifier.close()
    total = max(ends.values()) if not has_eos and len(ends) == batch else max(r.shape[1] for r in rows)
    out = input_ids.new_full((batch, total), fill)
    for b, row in enumerate(rows):
        row = row[0, :total]
        out[b, : row.numel()] = row
    stats.new_tokens = sum(min(r.shape[1], total) - length for r in rows)
    scores, logits = outputs.finish(out)
    stats.total_time_s = time.perf_counter() - started
    return BatchResult(out, stats, scores, logits)
