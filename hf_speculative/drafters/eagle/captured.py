"""EAGLE's whole draft step as one region for ``torch.compile`` (issue 69): the catch-up on the verified pairs, then
every depth of a chain or of a dynamic tree, with no read of the device inside, on the fixed-shape cache of
``static_drafting``. The host makes one read of what the step drafted, after it.

Without a captured region a compiled call replays the drafter's graph once per depth, and between replays the host
builds masks and positions, picks the frontier and reads the chosen tokens: on a GPU that host work, not the
drafter's arithmetic, was most of a draft step (docs/gpu.md). Here it is all tensor work inside the region:

    catch-up   [1, P]  the verified pairs padded to P; real row i at position and slot ``first + i`` sees the
                       prefix up to itself, a padding row only itself (its slot is overwritten by the next rows)
    chain      k - 1 forwards [1, 1]: token j's argmax feeds forward j + 1, at slot and position ``n + j``
                       (``n = first + rows``: the cache's length after the catch-up)
    tree       a forward [1, W] per level (W = the shape's top_k): the frontier's rows see the prefix, the entries
                       their ancestors wrote and their own (``grow_dynamic_tensors``: the same nodes, scores and
                       order as ``grow_dynamic_on_device``)

``first`` and ``rows`` enter as a device tensor, so one region serves every step of its shape. A region is built per
shape (a chain's length; a tree's levels and node budget) and kept on its :class:`DraftStep` (``core.regions``), like
CUDA graphs per batch size; it runs compiled where the step does (a step borrowed while another call holds the shared one runs
eagerly, its regions too).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...core.chain_drafting import chain_from_read, chain_readout, kept_read
from ...core.costs import record_draft_step
from ...core.tree import DraftTree
from ...core.tree_shapes import DynamicTree, grow_dynamic_tensors, tree_from_device


def _catch_up(step: nn.Module, columns: torch.Tensor, tokens: torch.Tensor, features: torch.Tensor,
              first: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The catch-up's forward: ``tokens`` `[1, P]`, ``features`` `[1, P, F]` (``rows`` real, then padding) at
    positions and slots ``first + i``. Returns the last real row's output `[H]` and logits `[V]`."""
    width = tokens.shape[1]
    where = first + torch.arange(width, device=tokens.device)  # [P] positions and slots
    real = torch.arange(width, device=tokens.device) < rows  # [P]
    mask = torch.where(real[:, None], columns[None, :] <= where[:, None], columns[None, :] == where[:, None])  # [P, C]
    last = (rows - 1).reshape(1)  # [1]
    out, logits = step(tokens, features, where[None], where, mask, last, True)  # [1, P, H], [1, V]
    return out[0].index_select(0, last)[0], logits[0]


class ChainRegion(nn.Module):
    """The catch-up and a greedy chain of ``length`` tokens. ``forward(tokens [1, P], features [1, P, F], scalars
    [2] = (first, rows))`` returns the chain `[k]` and its read-out `[2, k]` (``chain_readout``)."""

    def __init__(self, step: nn.Module, length: int):
        super().__init__()
        self.step, self.length = step, length
        self.register_buffer("columns", torch.arange(step.keys.shape[2], device=step.keys.device), persistent=False)

    def forward(self, tokens: torch.Tensor, features: torch.Tensor, scalars: torch.Tensor):
        first, rows = scalars[0], scalars[1]
        hidden, logits = _catch_up(self.step, self.columns, tokens, features, first, rows)
        n = first + rows  # the cache's length: the root's position, the chain's first slot
        zero = torch.zeros(1, dtype=torch.long, device=tokens.device)  # [1]: the one row a chain step picks
        chosen, picked = [], []
        for j in range(self.length):
            token = torch.argmax(logits)  # []
            chosen.append(token)
            picked.append(logits)
            if j + 1 == self.length:
                break
            where = (n + j).reshape(1)  # [1] position and slot
            mask = (self.columns <= where)[None]  # [1, C]: the prefix, the chain so far, itself
            out, step_logits = self.step(token.reshape(1, 1), hidden.reshape(1, 1, -1), where[None], where, mask,
                                         zero, False)
            hidden, logits = out[0, 0], step_logits[0]
        chain = torch.stack(chosen)  # [k]
        return chain, chain_readout(chain, torch.stack(picked))


class TreeRegion(nn.Module):
    """The catch-up and a dynamic tree of ``levels`` drafter forwards (``grow_dynamic_tensors``: ``shape``,
    ``nodes``).
    ``forward(tokens [1, P], features [1, P, F], scalars [3] = (first, rows, keep))`` returns the kept nodes' tokens,
    parents and finiteness `[m]` each (``tree_from_device``), chosen among the first ``keep`` levels (a call's last
    steps keep fewer than the region grows)."""

    def __init__(self, step: nn.Module, shape: DynamicTree, nodes: int, levels: int, capacity: int):
        super().__init__()
        self.step, self.shape, self.nodes, self.levels, self.capacity = step, shape, nodes, levels, capacity
        self.register_buffer("columns", torch.arange(step.keys.shape[2], device=step.keys.device), persistent=False)

    def forward(self, tokens: torch.Tensor, features: torch.Tensor, scalars: torch.Tensor):
        first, rows = scalars[0], scalars[1]
        hidden, logits = _catch_up(self.step, self.columns, tokens, features, first, rows)
        expand = self._expander(first + rows, hidden)
        return grow_dynamic_tensors(self.shape, logits, expand, self.nodes, self.levels, keep_levels=scalars[2])

    def _expander(self, n: torch.Tensor, root_hidden: torch.Tensor):
        """``expand(frontier [W], tokens [W], parents [W], level) -> [W, V]`` over the step's cache: level ``d``
        writes its ``W`` rows at slots ``n + d W ..`` (every level expands ``W`` nodes), positions ``n + d``. Each
        drafted node keeps its output and its row of the mask over this step's entries (as
        ``tree_drafting.device_tree_expander``)."""
        nodes, columns = self.capacity, self.columns
        hidden = root_hidden.new_zeros(nodes + 1, root_hidden.shape[-1])  # [N + 1, H]: row 0 the root
        hidden[0] = root_hidden
        seen = torch.zeros(nodes + 1, nodes, dtype=torch.bool, device=n.device)  # [N + 1, N] over this step's entries
        offset = columns - n  # [C]: each column's entry in this step (negative: the true prefix)
        entry = offset.clamp(0, nodes - 1)[None]  # [1, C]
        inside = (offset >= 0) & (offset < nodes)  # [C]
        prefix = offset < 0  # [C]

        def expand(frontier: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
            width = frontier.shape[0]
            own = level * width + torch.arange(width, device=n.device)  # [W] this level's entries
            rows = seen[parents + 1]  # [W, N] its parent's row (a copy) ...
            rows[torch.arange(width, device=n.device), own] = True  # ... and its own entry
            mask = prefix[None, :] | (rows.gather(1, entry.expand(width, -1)) & inside[None, :])  # [W, C]
            position = (n + level).reshape(1, 1).expand(1, width)  # [1, W]
            out, logits = self.step(tokens[None], hidden[parents + 1][None], position, n + own, mask,
                                    torch.arange(width, device=n.device), False)
            seen[frontier + 1] = rows
            hidden[frontier + 1] = out[0]  # out: [1, W, H]
            return logits  # [W, V] float32

        return expand


def chain_region(static: Any, length: int) -> Callable | None:
    """The step's region drafting a chain of ``length`` tokens (``length >= 1``), made (and compiled where the
    step is) on first use; ``None`` past ``core.regions.MAX_REGIONS`` shapes. (A call's last steps, with less room,
    keep the start of the chain of the others: ``captured_chain``'s ``keep``.)"""
    return static.regions.get(("chain", length), lambda: ChainRegion(static.step, length))


def tree_region(static: Any, shape: DynamicTree, nodes: int, levels: int, capacity: int) -> Callable | None:
    """The step's region drafting a dynamic tree of ``nodes`` nodes (``nodes >= 1``) over ``levels`` drafter
    forwards, at most ``capacity`` nodes drafted, as :func:`chain_region`. (Keyed by the levels of a step away from
    the call's end: its last steps, with less room, choose their nodes among fewer levels of the same region.)"""
    return static.regions.get(("tree", shape.top_k, nodes, levels),
                              lambda: TreeRegion(static.step, shape, nodes, levels, capacity))


def _inputs(static: Any, tokens: torch.Tensor, features: torch.Tensor, first: int, *more: int):
    """The region's inputs for the verified pairs ``tokens`` `[P']`, ``features`` `[P', F]` from ``first``: a backlog
    longer than the region's ``P`` (the prompt's) is fed first, but for its last ``P`` pairs, at its own width,
    eagerly (``StaticDrafting.catch_up``). ``more``: scalars after ``(first, rows)``."""
    extra = tokens.shape[0] - static.catch_width
    if extra > 0:
        static.catch_up(tokens[:extra], features[:extra], first)
        tokens, features, first = tokens[extra:], features[extra:], first + extra
    static.crop(first)
    rows, pad = tokens.shape[0], static.catch_width - tokens.shape[0]
    tokens = torch.nn.functional.pad(tokens, (0, pad))[None]  # [1, P]
    features = torch.nn.functional.pad(features, (0, 0, 0, pad))[None]  # [1, P, F]
    return (tokens, features, torch.tensor([first, rows, *more], device=static.device)), first + rows


def captured_chain(static: Any, run: Callable, net: nn.Module, plan: Any, tokens: torch.Tensor,
                   features: torch.Tensor, first: int, length: int, ask: bool = False,
                   keep: int | None = None) -> DraftTree:
    """A chain of ``length`` tokens drafted by ``run`` (:func:`chain_region`) after the catch-up on ``tokens``
    `[P']`, ``features`` `[P', F]` from ``first``, its first ``keep`` (default all) offered to the chain rule;
    ``ask``: the cost rules replayed on it (``chain_from_read``)."""
    start = time.perf_counter()
    inputs, root = _inputs(static, tokens, features, first)
    chain, readout = static.regions.replay(run, *inputs)
    static.length = root + length - 1
    # the read; a replay's outputs copied (the next replay overwrites them)
    tree = chain_from_read(plan, chain.clone(), *kept_read(readout.tolist(), length, keep), ask)
    record_draft_step(net, (time.perf_counter() - start) / length)
    return tree


def captured_tree(static: Any, run: Callable, net: nn.Module, tokens: torch.Tensor, features: torch.Tensor,
                  first: int, levels: int, width: int, keep: int | None = None) -> DraftTree:
    """A dynamic tree drafted by ``run`` (:func:`tree_region`; ``levels`` forwards, ``width`` rows a level after the
    first) after the catch-up, its nodes chosen among the first ``keep`` levels (default all), as
    :func:`captured_chain`."""
    start = time.perf_counter()
    inputs, root = _inputs(static, tokens, features, first, levels if keep is None else keep)
    kept = [t.clone() for t in static.regions.replay(run, *inputs)]  # a replay's outputs: copied before the next
    static.length = root + (levels - 1) * width
    tree = tree_from_device(*kept)  # the read
    record_draft_step(net, (time.perf_counter() - start) / levels)
    return tree
