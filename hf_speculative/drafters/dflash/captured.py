"""DFlash's whole draft step as one region for ``torch.compile`` (issue 69): the drafter's forward on the fixed-shape
cache of ``static_drafting`` and the choice of the step's tokens, with no read of the device inside. The host makes
one read of what the step drafted, after it.

Eager drafting reads the device to choose: a chain's tokens and confidences, a tree's guesses. A block's positions do
not depend on the tokens drafted before them (the window is mask tokens), so the whole choice is tensor work on the
window's logits `[D, V]`:

    chain         the argmax of each of the ``k`` positions (``chain_readout``: the tokens and their confidences)
    static tree   every rank path's guess (``path_guesses``: each depth's top-k under every node)
    dynamic tree  ``grow_dynamic_tensors`` with the same logits of a level under every node

A region is built per shape (its kind and a chain's length, a static tree's paths, a dynamic tree's top-k, nodes and
levels) and kept on the shared :class:`~.static_drafting.DFlashStep` (``core.regions``), like CUDA graphs per batch
size; one of ``("logits", depth)`` gives the logits alone, for the steps whose tokens the host chooses (the cost rules
on a CPU) or past ``core.regions.MAX_REGIONS`` shapes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import nn

from ...core.chain_drafting import chain_from_read, chain_readout, kept_read
from ...core.costs import record_draft_step
from ...core.tree import DraftTree
from ...core.tree_shapes import (
    DynamicTree,
    RankPath,
    grow_dynamic_tensors,
    path_guesses,
    tree_from_device,
    tree_from_paths,
)


class LogitsRegion(nn.Module):
    """The window's logits alone: ``forward(anchor [1], features [P, F], scalars [2])`` -> `[depth, V]`."""

    def __init__(self, step: nn.Module, depth: int):
        super().__init__()
        self.step, self.depth = step, depth

    def forward(self, anchor: torch.Tensor, features: torch.Tensor, scalars: torch.Tensor) -> torch.Tensor:
        return self.step(anchor, features, scalars, self.depth)


class ChainRegion(nn.Module):
    """A greedy chain of ``length`` positions: returns the chain `[k]` and its read-out `[2, k]` (``chain_readout``),
    as ``draft_chain_on_device`` picks it."""

    def __init__(self, step: nn.Module, length: int):
        super().__init__()
        self.step, self.length = step, length

    def forward(self, anchor: torch.Tensor, features: torch.Tensor, scalars: torch.Tensor):
        logits = self.step(anchor, features, scalars, self.length)  # [k, V]
        chain = torch.argmax(logits, dim=-1)  # [k]
        return chain, chain_readout(chain, logits)


class PathsRegion(nn.Module):
    """A static tree's rank ``paths`` (kept ones, parents first): each node's guess `[n]` and whether it has a
    probability `[n]` (``path_guesses``, for ``tree_from_paths``)."""

    def __init__(self, step: nn.Module, paths: tuple[RankPath, ...]):
        super().__init__()
        self.step, self.paths = step, list(paths)
        self.depth = max(len(p) for p in paths)

    def forward(self, anchor: torch.Tensor, features: torch.Tensor, scalars: torch.Tensor):
        return path_guesses(self.paths, self.step(anchor, features, scalars, self.depth))  # [n], [n]


class DynamicRegion(nn.Module):
    """A dynamic tree of at most ``nodes`` nodes over ``levels`` of the block (``grow_dynamic_tensors``, the same
    logits of a level under every node): the kept nodes' tokens, parents and finiteness `[m]` each
    (``tree_from_device``)."""

    def __init__(self, step: nn.Module, shape: DynamicTree, nodes: int, levels: int):
        super().__init__()
        self.step, self.shape, self.nodes, self.levels = step, shape, nodes, levels

    def forward(self, anchor: torch.Tensor, features: torch.Tensor, scalars: torch.Tensor):
        logits = self.step(anchor, features, scalars, self.levels)  # [levels, V]

        def expand(frontier: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
            return logits[level + 1].expand(frontier.shape[0], -1)  # [W, V]

        # scalars[2]: the levels this step keeps (a call's last steps, with less room, keep fewer)
        return grow_dynamic_tensors(self.shape, logits[0], expand, self.nodes, self.levels, keep_levels=scalars[2])


def region(static: Any, key: tuple[Hashable, ...], make: Callable[[], nn.Module]) -> Callable | None:
    """The call's region of shape ``key`` (made, and compiled where the step is shared, on first use); ``None`` past
    ``core.regions.MAX_REGIONS`` of its kind."""
    return static.regions.get(key, make)


def chain_region(static: Any, length: int) -> Callable | None:
    return region(static, ("chain", length), lambda: ChainRegion(static.step, length))


def paths_region(static: Any, paths: list[RankPath]) -> Callable | None:
    key = tuple(paths)
    return region(static, ("paths", key), lambda: PathsRegion(static.step, key))


def dynamic_region(static: Any, shape: DynamicTree, nodes: int, levels: int) -> Callable | None:
    return region(static, ("dynamic", shape.top_k, nodes, levels),
                  lambda: DynamicRegion(static.step, shape, nodes, levels))


def _replay(static: Any, run: Callable, anchor: torch.Tensor, pending: torch.Tensor | None, first: int,
            keep: int = 1, more: tuple[int, ...] = ()) -> list:
    """``run`` on the step after ``pending`` from ``first`` (``more``: scalars after the step's own); its first
    ``keep`` outputs, those that outlive the read after it (the draft's tensors), copied: a replay's are overwritten
    by the next one."""
    out = static.regions.replay(run, *static.inputs(anchor, pending, first, *more))
    out = out if isinstance(out, tuple) else (out,)
    return [t.clone() if i < keep else t for i, t in enumerate(out)]


def window_logits(static: Any, anchor: torch.Tensor, pending: torch.Tensor | None, first: int,
                  depth: int) -> torch.Tensor:
    """The window's logits `[depth, V]` (float32) through the fixed-shape step: its ``("logits", depth)`` region, or
    the step as it is past ``MAX_REGIONS``."""
    run = region(static, ("logits", depth), lambda: LogitsRegion(static.step, depth))
    run = LogitsRegion(static.step, depth) if run is None else run
    return _replay(static, run, anchor, pending, first)[0]


def captured_chain(static: Any, run: Callable, net: nn.Module, plan: Any, anchor: torch.Tensor,
                   pending: torch.Tensor | None, first: int, length: int, ask: bool = False,
                   keep: int | None = None) -> DraftTree:
    """A chain of ``length`` tokens drafted by ``run`` (:func:`chain_region`), its first ``keep`` (default all)
    offered to the chain rule; ``ask``: the cost rules replayed on it (``chain_from_read``)."""
    start = time.perf_counter()
    chain, readout = _replay(static, run, anchor, pending, first)
    tree = chain_from_read(plan, chain, *kept_read(readout.tolist(), length, keep), ask)  # the read
    record_draft_step(net, time.perf_counter() - start)
    return tree


def captured_paths(static: Any, run: Callable, net: nn.Module, paths: list[RankPath], anchor: torch.Tensor,
                   pending: torch.Tensor | None, first: int, depth: int | None = None) -> DraftTree:
    """A static tree of the kept rank ``paths`` drafted by ``run`` (:func:`paths_region`), cut to ``depth`` (a
    call's last steps: the paths of the others, drafted by their region, kept as deep as this step's room)."""
    start = time.perf_counter()
    tree = tree_from_paths(paths, *_replay(static, run, anchor, pending, first))  # the read
    record_draft_step(net, time.perf_counter() - start)
    return tree if depth is None else tree.within(depth)


def captured_dynamic(static: Any, run: Callable, net: nn.Module, anchor: torch.Tensor,
                     pending: torch.Tensor | None, first: int, levels: int) -> DraftTree:
    """A dynamic tree drafted by ``run`` (:func:`dynamic_region`), its nodes chosen among its first ``levels``."""
    start = time.perf_counter()
    tree = tree_from_device(*_replay(static, run, anchor, pending, first, keep=2, more=(levels,)))  # the read
    record_draft_step(net, time.perf_counter() - start)
    return tree
