"""Our verification loop: draft a tree per row, verify every row's tree in one target forward, keep the accepted paths.

One ladder (gpt-fast's shape) for one row or a batch (a row axis, ragged acceptance), on a dynamic or a static
cache, compiled or not::

    verifier = its cache, empty; pending = the prompts        # the first forward prefills them too
    budget_b = DraftBudget(drafter_b.sizing)                  # the loop decides how much to draft (core/budget.py)
    until every row stopped:
        width     = widths.width(rows)                        # one row: its budget decides; a batch: the cost model
        plan_b    = budget_b.plan(room_b)                     # how deep; the drafter asks it how much pays
        tree_b    = drafter_b.draft(row_b, plan_b)            # DraftTree (a chain is a tree with one branch)
        logits    = verifier.forward(pending, trees)          # ONE forward [B, 1 + n, V]: tree masks, depth positions
        verdict_b = rule(tree_b, processed(logits_b))         # accept.py: the only rule, chosen once per call
        verifier.keep(paths)                                  # the cache: prefix, root, accepted path (per row)
        row_b    += path tokens + own token, cut at its first stop (EOS, length, stop strings...)
        budget_b.verified(plan_b, tree_b, verdict_b, s)       # the sizing rules learn (acceptance, costs)
        drafter_b.observe(row_b, tree_b, verdict_b, scores_b); stats; streamer
        finished rows leave the batch (their drafter closed, their cache rows dropped)
        pending = [own token of each row]

The target's own token is never in the cache when the next forward starts: it is the next tree's root.
:func:`hf_speculative.core.entry.generate`, the one entry, enters the ladder from ``generate()`` (one row or several;
core/rows.py keeps what is per row). The tests and benchmarks that drive it with an open drafter go through the same
two calls (``tests/core/loop_harness.py``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

import torch

from .. import compat
from .accept import accept_greedy, rule_for  # noqa: F401 - accept_greedy: tests import it from here
from .budget import DraftBudget, Plan, Sizing
from .call import TargetView
from .rows import Outputs, forward_columns
from .sampling import split_sampler
from .stats import SpeculativeStats
from .stops import Stops
from .tree import ROOT, DraftTree, Verdict


class Drafter(Protocol):
    """What the loop asks of a per-call drafter (``strategy.open(ctx)``; drafters/generator.py documents it)."""

    sizing: Sizing

    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        """A draft after ``sequence`` (``[1, L]``, verified), within ``plan`` (no deeper than ``plan.depth``)."""

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        """Follow the verdict; ``sequence`` is the verified text after it (the target's token included) and
        ``scores`` the forward's processed target logits, ``[1 + n, V]``."""

    def close(self) -> None:
        """Free the call's resources."""


@dataclasses.dataclass
class LoopResult:
    sequences: torch.LongTensor  # [B, L + new], finished rows of a batch padded with pad_token_id
    scores: tuple | None         # per new position the processed scores it was chosen from, [B, V] (if kept)
    stats: SpeculativeStats
    logits: tuple | None = None  # per new position the raw logits, [B, V] (if kept)


_FIND: Any = object()


@dataclasses.dataclass(eq=False)
class Row:
    """One sequence of the call: its ids (the left-padded prompt and the new tokens, ``[1, L + new]``), its drafter and
    that drafter's budget, the logits processors that see it, and where its stop fired."""

    ids: torch.LongTensor
    pad: int
    drafter: Any
    processors: Any
    view: TargetView | None = None  # a batch row's view of the forwards (its columns), for drafters reading states
    owned: bool = True              # the loop opened its drafter, and closes it when the row finishes
    budget: DraftBudget = None
    end: int | None = None          # its length when a stopping criterion fired
    closed: bool = False
    sampler: Any = _FIND            # the call's sampler (not given: the one last in its processors, if any)
    rule: Any = None                # accept.py's rule for it, chosen once (accept.rule_for)

    def __post_init__(self):
        self.budget = DraftBudget(self.drafter.sizing)
        if self.sampler is _FIND:
            self.sampler = split_sampler(self.processors)[1] if isinstance(self.processors, (list, tuple)) else None
        self.rule = rule_for(self.sampler)

    @property
    def text(self) -> torch.LongTensor:
        """What its drafter sees: the row without its padding, ``[1, L' + new]``."""
        return self.ids[:, self.pad:]

    def close(self) -> None:
        if not self.closed and self.owned:
            self.drafter.close()
        self.closed = True


def branch_ids(sequence: torch.LongTensor, tree: DraftTree, node: int) -> torch.LongTensor:
    """``[1, L + depth + 1]`` the sequence followed by the branch down to ``node`` (``-1``: the sequence)."""
    tokens = []
    while node != ROOT:
        tokens.append(int(tree.tokens[node]))
        node = int(tree.parents[node])
    return torch.cat([sequence, sequence.new_tensor([tokens[::-1]])], dim=-1) if tokens else sequence


def processed_scores(logits: torch.Tensor, sequence: torch.LongTensor, tree: DraftTree,
                     logits_processor: Any) -> torch.Tensor:
    """``[1 + n, V]`` scores: each row through the logits processors with its own branch as the context,
    as plain decoding would have processed it at that position."""
    scores = logits.float()
    if not logits_processor:
        return scores
    rows = [logits_processor(branch_ids(sequence, tree, node), scores[node + 1: node + 2])
            for node in range(ROOT, tree.size)]
    return torch.cat(rows, dim=0)


def stop_index(sequence: torch.LongTensor, start: int, stopping_criteria: Any,
               new_tokens: list[int] | None = None) -> int | None:
    """The first new position ``>= start`` at which a stopping criterion holds (its token kept), or None. With the
    call's criteria as :class:`~hf_speculative.core.stops.Stops` and the step's ``new_tokens`` (``sequence``'s tokens
    from ``start``, as ints), the rules it knows are checked on the host (stops.py)."""
    if new_tokens is not None and isinstance(stopping_criteria, Stops):
        return stopping_criteria.first(sequence, start, new_tokens)
    for end in range(start + 1, sequence.shape[1] + 1):
        if compat.stopping_result(stopping_criteria(sequence[:, :end], None)):
            return end
    return None


# -- the ladder ------------------------------------------------------------------------------------
def draft_step(rows: list[Row], members: list[int], rooms: dict[int, int], width: int,
               widths: Any, max_depth: int | None = None) -> tuple[list[Plan], list[DraftTree]]:
    """Each row in the forward drafts within its plan, at most ``rooms[b]`` deep (the running rows' room before
    ``max_length``) and ``width``; rows that finished, or have no room, draft nothing. ``max_depth``: the depth
    away from the call's end (the plans' ``full_depth``, with ``width``; default: each row's room)."""
    plans, trees = [], []
    # a solo row's width is its room (no width of the step's own, ``cap`` None); a batch's is the step's own
    full = 0 if max_depth is None else max_depth if widths.cap is None else min(max_depth, width)
    for b in members:
        row = rows[b]
        room = min(rooms.get(b, 0), width)
        plans.append(row.budget.plan(max(room, 1), full_depth=full))
        tree = row.drafter.draft(row.text, plans[-1]) if room > 0 else DraftTree.empty(row.ids.device)
        trees.append(tree if widths.cap is None else tree.first(widths.cap))  # a batch's width bounds nodes
    return plans, trees


def verify_step(rows: list[Row], members: list[int], live: set[int], logits: torch.Tensor,
                trees: list[DraftTree]) -> tuple[list[Verdict | None], list[torch.Tensor | None]]:
    """accept.py's rule (the row's, chosen once) on each running row's scores (``logits`` ``[B', 1 + n, V]``)."""
    verdicts, scores_of = [], []
    for i, (b, tree) in enumerate(zip(members, trees)):
        if b not in live:
            verdicts.append(None)
            scores_of.append(None)
            continue
        scores = processed_scores(logits[i, : 1 + tree.size], rows[b].ids, tree, rows[b].processors)  # [1 + n, V]
        verdicts.append(rows[b].rule(tree, scores))
        scores_of.append(scores)
    return verdicts, scores_of


def ladder(rows: list[Row], verifier: Any, pending: torch.Tensor, pending_mask: torch.Tensor, *,
           stopping_criteria: Any, stats: SpeculativeStats, max_length: int, max_depth: int, widths: Any,
           outputs: Outputs, cut_at_stop: bool) -> int | None:
    """Run every row to its stop (see the module docstring). ``cut_at_stop``: a row ends at its stop (a call with an
    EOS criterion, or one row); else rows decode on past it until the longest has stopped (transformers' batched
    loop without EOS), and the returned length is where they end. The rows' ``ids`` hold the text."""
    batch = len(rows)
    timed = batch == 1  # a row's own rules learn verify costs only from a forward that is its own
    members = list(range(batch))  # the rows in the verifier's batch, in order: running ones and finished ones
    live = set(members)           # the running ones; finished rows stay (decoding nothing) until half are
    first, limit = True, None
    stops = Stops(stopping_criteria)  # split once: EOS and length checked on the host (stops.py)
    while live:
        tick = time.perf_counter()
        running = [b for b in members if b in live]
        rooms = {b: min(max_depth, max_length - rows[b].ids.shape[1] - 1) for b in running}
        width = widths.width(running, max(rooms.values()), len(members), first)
        plans, trees = draft_step(rows, members, rooms, width, widths, max_depth)
        stats.record_draft(sum(t.size for t in trees), time.perf_counter() - tick)

        tick = time.perf_counter()
        with torch.no_grad():
            logits = verifier.forward(pending, pending_mask, trees)  # [B', 1 + n, V]
        if logits.is_cuda and not timed:
            torch.cuda.synchronize()
        widths.observe(len(members), logits.shape[1], time.perf_counter() - tick, first)
        verdicts, scores_of = verify_step(rows, members, live, logits, trees)
        verifier.keep([() if v is None else v.path for v in verdicts])
        stats.record_verify(sum(v.num_accepted for v in verdicts if v is not None), time.perf_counter() - tick)

        for i, (b, tree, verdict) in enumerate(zip(members, trees, verdicts)):
            if verdict is None:
                continue
            row = rows[b]
            before = row.ids.shape[1]
            new = tree.path_tokens(verdict.path) + [verdict.next_token]
            row.ids = torch.cat([row.ids, row.ids.new_tensor([new])], dim=-1)
            if row.end is None:
                row.end = stop_index(row.ids, before, stops, new)
                if row.end is not None and cut_at_stop:
                    row.ids = row.ids[:, :row.end]
            kept = [node + 1 for node in (ROOT, *verdict.path)][: row.ids.shape[1] - before]  # their score rows
            outputs.add(b, scores_of[i][kept], logits[i, kept])
            widths.verified(b, tree, verdict, width, max_length - before - 1)
            # (the first forward also prefilled the prompt: its timing says nothing of verifying)
            row.budget.verified(plans[i], tree, verdict, None if first or not timed else time.perf_counter() - tick)
            if row.view is not None:
                row.view.row = (i, forward_columns(pending_mask[i], tree.size))  # its columns, for EAGLE
            try:
                row.drafter.observe(row.text, tree, verdict, scores_of[i])
            finally:
                if row.view is not None:
                    row.view.row = None
            if (row.end is not None and cut_at_stop) or row.ids.shape[1] >= max_length:
                live.discard(b)  # finished
        if not cut_at_stop and all(row.end is not None for row in rows):
            limit = max(row.end for row in rows)  # rows decode on past their stop until the longest has stopped
            live = {b for b in live if rows[b].ids.shape[1] < limit}
        outputs.stream([row.ids for row in rows], live, limit)
        for b in members:
            if b not in live:
                rows[b].close()
        if live and len(live) * 2 <= len(members):
            # half the batch finished: drop those rows (before, a smaller batch is not always a faster one:
            # CPU GEMMs of odd row counts can be slower than of the next even one)
            keep = [i for i, b in enumerate(members) if b in live]
            verifier.select(torch.tensor(keep, dtype=torch.long))
            members = [members[i] for i in keep]
        if live:
            verifier.tidy()  # a batch's cache re-packed when holes are a quarter of it
        pending = torch.stack([rows[b].ids[0, -1:] for b in members])  # [B', 1]
        pending_mask = torch.ones(len(members), 1, dtype=torch.bool, device=pending.device)
        first = False
    return limit


def finish(rows: list[Row], input_ids: torch.LongTensor, limit: int | None, fill: int, outputs: Outputs,
           stats: SpeculativeStats, started: float) -> LoopResult:
    """The call's result: the rows (cut to ``limit``; shorter ones filled with ``fill``), scores, logits, stats."""
    length = input_ids.shape[1]
    total = limit
    if total is None:
        total = rows[0].ids.shape[1]
        for row in rows[1:]:
            total = max(total, row.ids.shape[1])
    out = input_ids.new_full((len(rows), total), fill)
    stats.new_tokens = 0
    for b, row in enumerate(rows):
        ids = row.ids[0, :total]
        out[b, : ids.numel()] = ids
        stats.new_tokens += ids.numel() - length
    scores, logits = outputs.finish(out)
    stats.total_time_s = time.perf_counter() - started
    return LoopResult(out, scores, stats, logits)
