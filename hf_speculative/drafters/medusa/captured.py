"""Medusa's whole draft step as one compiled region under ``hfs.enable(model, compile=...)`` (issue 69, item 1).

A step reads one hidden state and runs every head the step can use: each head a residual block and a projection
onto the vocabulary, then a chain's argmaxes or a static tree's ranked guesses. Eagerly that is a few small kernels
per head launched one by one and a read of the device afterwards; here the heads, the widening to the target's
vocabulary and the choice of tokens are one region (one CUDA graph under ``reduce-overhead``), read once after it.
The heads keep no state between steps, so a region's only input is the hidden state ``last`` `[H]`.

    chain  [k]  head ``j``'s argmax for ``j < k``, with its confidence (``chain_readout``)
    tree   [n]  each rank path's guess (``path_guesses``: head ``d - 1``'s rank-``r`` token for a path ending
                ``r`` at depth ``d``), with whether it has a probability

Regions are per shape (a chain's length; a tree's paths) in :class:`~hf_speculative.core.regions.Regions`, kept in
the target's state for the calls that share them, one call at a time (a concurrent call runs its own uncompiled).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...core.chain_drafting import chain_from_read, chain_readout, kept_read
from ...core.costs import record_draft_step
from ...core.regions import Regions
from ...core.state import borrow
from ...core.tree import DraftTree
from ...core.tree_shapes import RankPath, path_guesses, tree_from_paths
from ..generator import to_target_vocab
from .model import MedusaHeads


@dataclasses.dataclass(eq=False)
class SharedHeadsRegions:
    """The compiled regions that calls on a target share (``state_of(target).drafter_state(SharedHeadsRegions)``;
    ``hfs.forget(target)`` drops them): ``held`` is ``((heads, mode, vocab), runs, Lock)`` (``core.state.borrow``)."""

    held: Any = None


class _Levels(nn.Module):
    """The first ``depth`` heads' logits for ``last`` `[H]`, over the target's vocabulary `[depth, V]` (float32)."""

    def __init__(self, heads: MedusaHeads, head: nn.Module, vocab_size: int, depth: int):
        super().__init__()
        self.heads, self.head, self.vocab_size, self.depth = heads, head, vocab_size, depth

    def levels(self, last: torch.Tensor) -> torch.Tensor:
        rows = [self.heads.head_logits(last, k, self.head) for k in range(self.depth)]  # depth x [V_h]
        return to_target_vocab(torch.stack(rows), self.vocab_size)  # [D, V]


class ChainRegion(_Levels):
    """``forward(last [H])``: a chain of every head's argmax `[k]` and its read-out `[2, k]` (``chain_readout``)."""

    def forward(self, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.levels(last)  # [k, V]
        chain = logits.argmax(dim=-1)  # [k]
        return chain, chain_readout(chain, logits)


class TreeRegion(_Levels):
    """``forward(last [H])``: the guess of every rank path of ``paths`` `[n]` and whether it has a probability `[n]`
    (``path_guesses``)."""

    def __init__(self, heads: MedusaHeads, head: nn.Module, vocab_size: int, paths: tuple[RankPath, ...]):
        super().__init__(heads, head, vocab_size, max(len(p) for p in paths))
        self.paths = paths

    def forward(self, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return path_guesses(self.paths, self.levels(last))


class HeadsRegions:
    """A call's captured steps over ``heads`` on a compiled ``target``: ``chain`` and ``tree`` draft a step in one
    region call and one read; ``close`` gives the shared regions back."""

    def __init__(self, target: nn.Module, heads: MedusaHeads, mode: str, vocab_size: int):
        self.heads, self.head, self.vocab_size = heads, target.get_output_embeddings(), vocab_size
        key = (heads, mode, vocab_size)
        _, runs, self._release = borrow(target, "held", key, fits=lambda held: held[0] is heads and held[1:] == key[1:],
                                        make=lambda shared: {}, kind=SharedHeadsRegions)
        device = next(heads.parameters()).device
        self.regions = Regions(mode if self._release is not None else None, device, runs)

    def chain(self, last: torch.Tensor, plan: Any, length: int, ask: bool, keep: int | None = None) -> DraftTree | None:
        """A chain of ``length`` heads' guesses, its first ``keep`` (default all) offered to the chain rule (``ask``:
        the cost rules replayed on it, ``chain_from_read``); ``None`` past the regions' shapes (draft as before)."""
        run = self.regions.get(("chain", length), lambda: ChainRegion(self.heads, self.head, self.vocab_size, length))
        if run is None:
            return None
        return self._timed(run, last, length, lambda chain, readout: chain_from_read(
            plan, chain.clone(), *kept_read(readout.tolist(), length, keep), ask))  # the read

    def tree(self, last: torch.Tensor, paths: list[RankPath]) -> DraftTree | None:
        """The static tree of rank ``paths`` (non-empty, parents first), as :meth:`chain`."""
        shape = tuple(paths)
        run = self.regions.get(("tree", shape), lambda: TreeRegion(self.heads, self.head, self.vocab_size, shape))
        if run is None:
            return None
        return self._timed(run, last, max(len(p) for p in paths),
                           lambda tokens, finite: tree_from_paths(paths, tokens.clone(), finite.clone()))  # the read

    def _timed(self, run: Callable, last: torch.Tensor, heads: int, read: Callable) -> DraftTree:
        """``read(*run(last))``, timed to the read (a GPU's work is done by then) per head, as eager drafting times
        each head (its price is one head's)."""
        start = time.perf_counter()
        tree = read(*self.regions.replay(run, last))
        record_draft_step(self.heads, (time.perf_counter() - start) / heads)
        return tree

    def close(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None
