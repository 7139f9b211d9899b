"""A call's MagicDec rows, drafting together: one forward of the target per draft step for every row of a batch.

The loop opens a drafter per row and asks each for its draft in turn (``core/loop.py``). Drafting row by row would
read the target's weights once per row and draft step, which is what a batch must not do; so the rows of one call
form a :class:`DraftGroup`, and the first row asked in a step drafts for every row at once, in lockstep: one forward
of ``[R, 1]`` tokens per depth over the rows' compressed caches (``window_cache.py``), each row's token chosen by its
own processors and sampler, as ``core.accept.draft_chain`` chooses them. Each row then takes its chain through its
own plan (the loop's sizing rules: how much of it pays), so acceptance stays ragged, row by row.

How rows find their group: the loop opens them one after another on one thread, before its first forward, with one
generation config and one list of stopping criteria for the whole call (the batch entry, core/entry.py); rows opened so join the group
that is still assembling (:func:`join`). The registry of groups holds them weakly and only while they assemble or
draft: no call's state outlives it.

Around the drafts, :meth:`DraftGroup.observe` keeps each row's compressed cache in step with its verified text: the
keys and values the target computed for the root and the accepted path of the step enter it (read from the forward by
``kv_tap.py``), the drafted tokens' never do (the draft's cache is thrown away), and the window slides.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from typing import Any

import torch

from ... import compat
from ...core.call import CallContext
from ...core.policy import AcceptanceEstimate
from ...core.tree import DraftTree, Verdict
from .choosing import Choice, choose
from .costs import _MARGIN, StepCosts
from .kv_tap import Forward, ForwardTap, row_columns
from .window_cache import WindowCache

_GROUPS: weakref.WeakValueDictionary[tuple, DraftGroup] = weakref.WeakValueDictionary()
_GROUPS_LOCK = threading.Lock()


def join(ctx: CallContext, config: Any) -> tuple[DraftGroup, int]:
    """The group of ``ctx``'s call (a new one for its first row) and this row's id in it."""
    key = (id(ctx.target), id(ctx.generation_config), id(ctx.stopping_criteria), threading.get_ident())
    with _GROUPS_LOCK:
        group = _GROUPS.get(key)
        if group is None or not group.assembling or group.config is not config:
            group = DraftGroup(ctx, config)
            _GROUPS[key] = group
        return group, group.add(ctx)


@dataclasses.dataclass(eq=False)
class RowState:
    """What the group keeps of one row: its slot in the compressed caches, how many of its tokens they have seen,
    its latest verified text ``[1, L]``, its acceptance, its processors and sampler."""

    ctx: CallContext
    index: int
    known: int = 0
    sequence: torch.Tensor | None = None
    lost: bool = False
    estimate: AcceptanceEstimate = dataclasses.field(default_factory=AcceptanceEstimate)
    last_draft: DraftTree | None = None
    processors: Any = None
    sampler: Any = None

    def __post_init__(self):
        self.processors, self.sampler = self.ctx.processors, self.ctx.sampler


class DraftGroup:
    """The rows of one call drafting with ``config`` (a ``hfs.MagicDec``) over their compressed caches.

    Args:
        ctx (`CallContext`): the first row's call context.
        config (`MagicDec`): the strategy.
    """

    def __init__(self, ctx: CallContext, config: Any):
        self.config, self.target = config, ctx.target
        # held so that the ids keying this group in the registry stay this call's while it lives
        self._call = (ctx.generation_config, ctx.stopping_criteria)
        self.dtype = ctx.target.get_input_embeddings().weight.dtype
        self.cache = WindowCache(config.sinks, config.window)
        self.costs = StepCosts(ctx.target, self.cache.bound, ctx.verify_costs(config.num_tokens), config.draft_cost)
        self.rows: dict[int, RowState] = {}
        self.assembling = True  # rows may join until the call's first forward
        self.info: dict[str, Any] = {"sinks": config.sinks, "window": config.window, "rows": 0, "cache_slots": 0,
                                     "cache_bytes": 0, "draft_steps": 0, "declined_steps": 0, "uncompressed_steps": 0,
                                     "timing_steps": 0}
        self._next = 0
        self._forwards: list[Forward] = []  # the forwards since the rows last took their keys and values
        self._waiting: set[int] = set()     # rows that have not taken them yet
        self._batch = 1                     # rows in the latest forward
        self.epoch = 0                      # target forwards seen; a step's decision and drafts are for one epoch
        self._step: tuple[int, int | None, dict[int, list[Choice]], int] = (-1, None, {}, 0)
        self.max_length = ctx.max_length  # the longest text the call can reach (None: not known)
        self.idle = False  # stood down for the call: no draft could pay at any context it reaches
        self.tap = ForwardTap(ctx.target, self._received)

    # -- rows --------------------------------------------------------------------------------------
    def add(self, ctx: CallContext) -> int:
        row, self._next = self._next, self._next + 1
        self.rows[row] = RowState(ctx, self.cache.add_row())
        self.info["rows"] = max(self.info["rows"], len(self.rows))
        return row

    def close_row(self, row: int) -> None:
        state = self.rows.pop(row, None)
        if state is None:
            return
        self.cache.remove_row(state.index)
        for other in self.rows.values():
            if other.index > state.index:
                other.index -= 1
        self._took(row)
        if not self.rows:
            self.tap.remove()
            self._forwards = []
            self.cache = WindowCache(self.config.sinks, self.config.window)  # let the stores go with the call
            self.assembling = False

    # -- the target's forwards ----------------------------------------------------------------------
    def _received(self, forward: Forward) -> None:
        first, self.assembling = self.assembling, False
        self.epoch += 1
        self._batch = forward.batch
        if forward.layers is not None and not self.costs.token_bytes:
            self.costs.token_bytes = forward.token_bytes
        if first and self._hopeless(forward.batch):
            return self._stand_down()
        self.costs.observe_forward(forward.batch, forward.width, forward.seconds)
        if not self._waiting:  # every row took the last ones: this forward starts a new step
            self._forwards, self._waiting = [], set(self.rows)
        self._forwards.append(forward)

    def _hopeless(self, batch: int) -> bool:
        """Whether no draft can pay in this call whatever the rows accept: at the longest text the call can reach
        (``max_length``), a draft step of every row still reads nearly what a plain step reads (the weights, and a
        compressed cache that is most of the whole one), so even drafts always accepted and verified for free would not
        beat plain decoding by the cost rule's 2% (``costs.py``). Only where the cost rule decides (``adaptive``,
        no ``draft_cost``) and the bytes are known."""
        if not self.config.adaptive or self.config.draft_cost is not None or not self.max_length:
            return False
        if not self.costs.token_bytes:
            return False
        price = self.costs.price(batch, batch, float(self.max_length))  # the bytes prior: nothing is timed yet
        best = max((1 + n) / (1 + n * price) for n in range(1, self.config.num_tokens + 1))
        self.info["price"] = round(price, 4)
        return best <= _MARGIN

    def _stand_down(self) -> None:
        """Draft nothing more in this call and stop reading the target's forwards (:meth:`_hopeless`): the rows'
        compressed caches are never filled, so the call costs what plain decoding in the loop costs."""
        self.idle = True
        self.tap.remove()
        self._forwards, self._waiting = [], set()
        self.info["stood_down"] = (f"a draft step costs {self.info['price']:.2f} of a plain step even at the call's "
                                   f"longest text ({self.max_length} tokens): no draft can pay")

    def _took(self, row: int) -> list[Forward]:
        forwards = self._forwards
        self._waiting.discard(row)
        if not self._waiting:
            self._forwards = []  # (a prefill's views of the target's cache go now)
        return forwards

    def observe(self, row: int, sequence: torch.Tensor, tree: DraftTree, verdict: Verdict,
                view_row: tuple[int, torch.Tensor] | None) -> None:
        """After a verifying forward: the keys and values of the row's verified tokens (the forward's tokens before
        the tree's nodes, then the accepted path's nodes) enter its compressed cache. ``view_row``: a batch row's
        index in the forward and its real columns (``TargetView.row``); ``None``: the only row, every column of
        the forwards since its last step."""
        state = self.rows[row]
        state.sequence = sequence
        if self.idle:
            return
        if tree.size and tree is state.last_draft:
            state.estimate.update(verdict.num_accepted, tree.size)
        state.last_draft = None
        forwards = self._took(row)
        if state.lost:
            return
        take, columns = row_columns(forwards, view_row)
        if take is None:
            return self._lose(state, "no keys and values were read from a verifying forward")
        before = columns.numel() - tree.size
        if state.known == 0 and forwards[0].prefix:
            self._read_prefix(state, forwards[0], view_row, before)
        path = torch.as_tensor(list(verdict.path), dtype=torch.long, device=columns.device)
        verified = torch.cat([columns[:before], columns[before + path]])  # [c]: the forward's columns, in order
        verified = verified[: max(sequence.shape[1] - 1 - state.known, 0)]  # (a stop inside the path cut the text)
        kept = self.cache.kept(state.known, verified.numel())
        pick = verified[kept.to(verified.device)]
        keys, values = take(pick)  # [L, H, n, D] each
        self.cache.write(state.index, keys, values, torch.arange(state.known, state.known + verified.numel())[kept])
        state.known += verified.numel()
        self.info["cache_slots"] = self.cache.capacity
        self.info["cache_bytes"] = max(self.info["cache_bytes"], self.cache.nbytes)
        if state.known != sequence.shape[1] - 1:
            self._lose(state, f"its keys and values cover {state.known} tokens of {sequence.shape[1] - 1} (a forward "
                              "it did not see: e.g. a cache passed to generate())")

    def _read_prefix(self, state: RowState, forward: Forward, view_row: tuple[int, torch.Tensor] | None,
                     pending: int) -> None:
        """The prompt's tokens a cache passed to ``generate()`` held before the call's first forward: the last ``r``
        of its ``prefix`` columns (left padding comes first), ``r`` the row's prompt less the ``pending`` tokens the
        forward ran for it. They enter the row's compressed cache before the forward's own."""
        held = (state.ctx.prompt_length or 0) - pending
        if not 0 < held <= forward.prefix:
            return  # out of step: the check after the forward's own columns says so
        kept = self.cache.kept(0, held)  # [r]: the sinks and the window's worth, copied alone
        columns = torch.arange(forward.prefix - held, forward.prefix)[kept].to(forward.device)
        keys, values = forward.columns(0 if view_row is None else view_row[0], columns)  # [L, H, r', D] each
        self.cache.write(state.index, keys, values, torch.arange(held)[kept])
        state.known = held

    def _lose(self, state: RowState, why: str) -> None:
        state.lost = True  # it drafts nothing more in this call; the output is exact all the same
        self.info["stopped"] = why

    # -- drafting --------------------------------------------------------------------------------------
    def draft_for(self, row: int, sequence: torch.Tensor, plan: Any) -> DraftTree:
        """Row ``row``'s draft after its verified ``sequence`` ``[1, L]``, within the loop's ``plan``."""
        state, none = self.rows[row], DraftTree.empty(sequence.device)
        state.sequence = sequence
        if self.idle or state.lost or state.known == 0 or state.known != sequence.shape[1] - 1:
            return none  # before the prefill, or out of step
        if sequence.shape[1] - 1 <= self.cache.bound:
            self.info["uncompressed_steps"] += 1
            return none  # the compressed cache is the whole cache: a draft would cost a full step
        if self._step[0] != self.epoch:
            self._step = (self.epoch, None, {}, 0)
        depth = self._decide(plan.depth)
        if depth == 0 or not plan.start_chain():
            return none
        if row not in self._step[2]:
            self._draft_rows(depth)
        choices, fed = self._step[2].get(row, []), self._step[3]
        tokens, dists = [], []
        for choice in choices:  # the plan's chain rule, as draft_chain asks it
            if not plan.wants(choice.peak):
                break
            tokens.append(choice.token)
            if choice.q is not None:
                dists.append(choice.q)
            if not plan.took(choice.p, plan.depth):
                break
        plan.steps = fed
        tree = DraftTree.from_tokens(tokens, sequence.device)
        if dists:
            tree = dataclasses.replace(tree, q=torch.stack(dists))
        state.last_draft = tree
        return tree

    def _eligible(self) -> list[int]:
        """Rows that can draft now: in step with their text, which is longer than the compressed cache holds."""
        return [row for row, s in self.rows.items()
                if not s.lost and s.sequence is not None and s.known == s.sequence.shape[1] - 1 > self.cache.bound]

    def price_now(self) -> float:
        """One draft step of the eligible rows in plain steps of the batch, at their mean context (costs.py)."""
        rows = self._eligible() or list(self.rows)
        contexts = [self.rows[r].sequence.shape[1] for r in rows if self.rows[r].sequence is not None]
        context = sum(contexts) / len(contexts) if contexts else float(self.cache.bound)
        return self.costs.price(self._batch, max(len(rows), 1), context)

    def _decide(self, depth: int) -> int:
        """This step's draft depth for the whole group (once per step): the cost rule's (costs.py), or the most the
        options and the plan allow with ``adaptive=False``."""
        epoch, decided, drafts, fed = self._step
        if decided is not None:
            return decided
        depth = min(depth, self.config.num_tokens)
        if self.config.adaptive and not self.costs.plain_timed(self._batch):
            depth = 0  # a plain step of this batch timed first: the rule prices a draft against it (costs.py)
            self.info["timing_steps"] += 1
        elif self.config.adaptive:
            rows = self._eligible()
            price = self.info["price"] = round(self.price_now(), 4)
            depth = self.costs.best_depth([self.rows[r].estimate.rate for r in rows], depth, self._batch, price)
            if depth == 0:
                self.info["declined_steps"] += 1
                for r in rows:  # retried as the rejections are slowly forgotten
                    self.rows[r].estimate.forgive()
        self._step = (epoch, depth, drafts, fed)
        return depth

    @torch.no_grad()
    def _draft_rows(self, depth: int) -> None:
        """Draft up to ``depth`` tokens for every eligible row at once (see the module docstring)."""
        rows = self._eligible()
        drafts: dict[int, list[Choice]] = {row: [] for row in rows}
        if not rows:
            self._step = (self._step[0], self._step[1], drafts, 0)
            return
        states = [self.rows[r] for r in rows]
        index = torch.tensor([s.index for s in states], dtype=torch.long, device=self.cache.filled.device)
        cache, filled = self.cache.draft_cache(index)
        count, slots = filled.shape
        device = filled.device
        mask = torch.zeros(count, 1, 1, slots + depth, dtype=self.dtype, device=device)  # [R, 1, 1, C + depth]
        mask[:, 0, 0, :slots].masked_fill_(~filled, torch.finfo(self.dtype).min)  # empty slots of short rows
        tokens = torch.tensor([[int(s.sequence[0, -1])] for s in states], dtype=torch.long, device=device)  # [R, 1]
        positions = torch.tensor([[s.sequence.shape[1] - 1] for s in states], dtype=torch.long, device=device)
        sequences = [s.sequence for s in states]
        running, fed, started = set(range(count)), 0, time.perf_counter()
        threshold = self.config.confidence_threshold if self.config.adaptive else 0.0
        while running and fed < depth:
            logits = self._forward(tokens, positions + fed, mask[..., : slots + fed + 1], cache)  # [R, V]
            fed += 1
            for k in sorted(running):
                choice = choose(states[k].processors, states[k].sampler, sequences[k], logits[k])
                if choice is None:  # nothing to draw from: the row's chain ends
                    running.discard(k)
                    continue
                drafts[rows[k]].append(choice)
                tokens[k, 0] = choice.token
                if states[k].processors or states[k].sampler is not None:  # they read the text drafted so far
                    sequences[k] = torch.cat([sequences[k], sequences[k].new_tensor([[choice.token]])], dim=-1)
                if len(drafts[rows[k]]) >= depth or choice.p < threshold:
                    running.discard(k)
        self.costs.observe_draft(count, (time.perf_counter() - started) / fed)
        self.info["draft_steps"] += fed
        self._step = (self._step[0], self._step[1], drafts, fed)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any) -> torch.Tensor:
        """One draft step: the target over ``tokens`` ``[R, 1]`` at their true ``positions``, attending to the
        compressed caches and the tokens drafted so far (``mask`` ``[R, 1, 1, K]``); the last logits ``[R, V]``.
        ``forward`` itself, not the module: no hook of the target counts it as a verifying forward (kv_tap.py)."""
        out = self.target.forward(input_ids=tokens, position_ids=positions, attention_mask=mask, use_cache=True,
                                  **{compat.cache_kwarg(): cache}, **compat.logits_to_keep_kwargs(self.target, 1))
        return out.logits[:, -1].float()
