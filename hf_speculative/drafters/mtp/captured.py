"""MTP's draft step under ``hfs.enable(model, compile=...)``: every depth's layer forward and the choice of its token
in one region for ``torch.compile`` (issue 69), over the fixed-address buffers of ``static_step``; the host reads
once, after it.

Eager MTP drafting runs one layer forward per depth at the width that depth needs and reads nothing but launches
each kernel from the host; under compile= the target is a few graph replays a step and the drafter's launches and
its host glue would be most of a step on a GPU. Here a step is::

    catch-up     the verified pairs since the last step, padded to P (a longer backlog, the prompt's, is fed first
                 but for its last P pairs, eagerly, at its own width; so is a layer left behind by short steps)
    depth 0      layer 0 over its rows [fed[0], L - 1), padded to P: its last row guesses x_L
    depth d < K  layer d over its rows [fed[d], L - 1), padded to P + d (its last d rows read drafted tokens)
    depth d >= K the last layer again on the next row, reading its own output (num_tokens > K)

    chain  the argmax of each depth fed to the next; read out as ``chain_readout`` (``chain_from_read``)
    tree   the spine of first guesses, then every rank path's guess (``path_guesses``; ``tree_from_paths``)

``L`` and the rows each layer has cached enter as a device tensor, so one region serves every step of its shape (a
chain's length; a tree's levels and paths). Regions are kept on the :class:`~.static_step.MtpStep` shared in the
target's state, by shape (``core.regions``). Steps a region does not draft (the call's processors or sampler choose
the tokens; a chain under the cost rules on a CPU) run the same forwards eagerly, token by token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...core import regions
from ...core.budget import CHAIN, Plan
from ...core.chain_drafting import (
    chain_from_read,
    chain_readout,
    device_chain_length,
    draft_chain,
    host_chooses,
    kept_read,
)
from ...core.costs import record_draft_step
from ...core.draft_guide import DraftGuide, first_guess
from ...core.state import borrow
from ...core.tree import DraftTree
from ...core.tree_shapes import grow_paths, path_guesses, tree_from_paths
from .static_step import MtpStep, SharedMtpStep, capacity_for


def _spine(step: MtpStep, tokens: torch.Tensor, feats: torch.Tensor, scalars: torch.Tensor, levels: int,
           alive_masked: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The first ``levels`` depths: each depth's logits `[V]` and its greedy token `[]`, fed to the next depth. A
    chain's token is the argmax (as ``draft_chain_on_device`` picks it); with ``alive_masked`` the tree's spine is
    ranked as ``MTPCandidateGenerator._device_tree`` ranks it, and a level after a guess without probability gets
    none (all ``-inf``)."""
    width = tokens.shape[1]
    logits = step.begin(tokens, feats, scalars)  # [V]
    rows, chosen, alive = [logits.float() if alive_masked else logits], [], None
    while True:
        if alive_masked:
            logprobs = torch.log_softmax(rows[-1], dim=-1)
            top = logprobs.masked_fill(logprobs.isnan(), float("-inf")).topk(1)
            token, finite = top.indices[0], top.values[0].isfinite()
            alive = finite if alive is None else alive & finite
        else:
            token = torch.argmax(rows[-1])  # []
        chosen.append(token)
        if len(rows) == levels:
            return rows, chosen
        logits = step.advance(len(rows), token, scalars, width)  # [V]
        rows.append(torch.where(alive, logits.float(), float("-inf")) if alive_masked else logits)


class ChainRegion(nn.Module):
    """A greedy chain of ``length`` tokens. ``forward(tokens [1, P], feats [1, P, H], scalars [1 + K])`` returns the
    chain `[k]` and its read-out `[2, k]` (``chain_readout``)."""

    def __init__(self, step: MtpStep, length: int):
        super().__init__()
        self.step, self.length = step, length

    def forward(self, tokens: torch.Tensor, feats: torch.Tensor, scalars: torch.Tensor):
        rows, chosen = _spine(self.step, tokens, feats, scalars, self.length, alive_masked=False)
        chain = torch.stack(chosen)  # [k]
        return chain, chain_readout(chain, torch.stack(rows))


class TreeRegion(nn.Module):
    """A static tree's rank ``paths`` (non-empty, parents first): the spine down to the deepest, then every path's
    guess. ``forward`` as :class:`ChainRegion`'s; returns each path's guess and whether it has a probability `[n]`
    each (``path_guesses``)."""

    def __init__(self, step: MtpStep, paths: tuple):
        super().__init__()
        self.step, self.paths = step, paths

    def forward(self, tokens: torch.Tensor, feats: torch.Tensor, scalars: torch.Tensor):
        levels = max(len(p) for p in self.paths)
        rows, _ = _spine(self.step, tokens, feats, scalars, levels, alive_masked=True)
        return path_guesses(list(self.paths), torch.stack(rows))  # [n], [n]


class StaticMtp:
    """A call's fixed-shape MTP drafting over a (shared) :class:`MtpStep`: what each layer has cached (``fed``, on the
    host), the step's inputs, its regions.

    Args:
        step (`MtpStep`): its buffers are this call's MTP cache.
        catch_width (`int`): ``P``, the most verified pairs a step's region takes.
        mode (`str`, *optional*): ``torch.compile``'s mode of the regions (``None``: they run as they are, on a step
            of this call's own while another call holds the shared one).
        release (*callable*, *optional*): gives a borrowed step back.
        reach (`int`): the rows past the verified length a step may touch (the buffers' margin).
    """

    def __init__(self, step: MtpStep, catch_width: int, mode: str | None, release: Callable[[], None] | None = None,
                 reach: int = 0):
        self.step, self.catch_width, self._release = step, catch_width, release
        self.reach = reach  # rows a step writes or reads past the verified length
        self.num_layers = step.num_layers
        self.fed = [0] * self.num_layers  # layer k caches its rows [0, fed[k])
        self.regions = regions.Regions(mode, step.device, runs=step.regions)
        self.length = 0
        self.ran = 0  # the layers the last eager step (:meth:`stepper`) ran

    # -- inputs --------------------------------------------------------------------------------------------------
    def prepare(self, sequence: torch.LongTensor, fresh: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The region's inputs for the verified ``sequence`` `[1, L]` and the features of its new rows ``fresh``
        `[1, L - 1 - fed[0], H]`: ``(tokens [1, P], feats [1, P, H], scalars [1 + K])``. A backlog longer than ``P``
        (the prompt's) is fed first but for its last ``P`` pairs, eagerly; so are a layer's rows past its window."""
        step, width, length = self.step, self.catch_width, sequence.shape[1]
        if length + self.reach > step.capacity:
            raise RuntimeError(f"hfs.MTP's fixed-shape buffers ({step.capacity} rows) are full at {length} tokens; this "
                               "is a bug in hf_speculative's capacity rule: please report it.")
        self.length = length
        tokens, feats = sequence[0, self.fed[0] + 1:length], fresh[0]  # [r], [r, H]
        extra = tokens.shape[0] - width
        if extra > 0:
            at = torch.tensor(self.fed[0], device=step.device)
            step.write(step.text, at + 1, tokens[:extra])
            step.write(step.feats, at, feats[:extra])
            step.layer_pass(0, at, extra, extra)
            tokens, feats, self.fed[0] = tokens[extra:], feats[extra:], self.fed[0] + extra
        for k in range(1, self.num_layers):  # a layer left behind: its verified rows before its window
            behind = length - 1 - width - k - self.fed[k]
            if behind > 0:
                step.layer_pass(k, torch.tensor(self.fed[k], device=step.device), behind, behind)
                self.fed[k] += behind
        pad = width - tokens.shape[0]
        tokens = torch.nn.functional.pad(tokens, (0, pad))[None]  # [1, P]
        feats = torch.nn.functional.pad(feats, (0, 0, 0, pad))[None]  # [1, P, H]
        return tokens, feats, torch.tensor([length, *self.fed], device=step.device)

    def drafted(self, layers: int) -> None:
        """The step ran its first ``layers`` layers: each caches its verified rows, up to ``L - 1 - k``."""
        for k in range(min(layers, self.num_layers)):
            self.fed[k] = self.length - 1 - k

    # -- a step's draft ------------------------------------------------------------------------------------------
    def chain(self, plan: Any, inputs: tuple, length: int, ask: bool, timed: Any,
              keep: int | None = None) -> DraftTree | None:
        """A chain of ``length`` in one region (``None`` past ``MAX_REGIONS`` shapes), its first ``keep`` (default
        all) offered to the chain rule; ``ask``: the cost rules replayed on what it drafted."""
        run = self.regions.get(("chain", length), lambda: ChainRegion(self.step, length))
        if run is None:
            return None
        start = time.perf_counter()
        chain, readout = self.regions.replay(run, *inputs)
        self.drafted(length)
        tree = chain_from_read(plan, chain.clone(), *kept_read(readout.tolist(), length, keep), ask)  # the read
        record_draft_step(timed, (time.perf_counter() - start) / length)
        return tree

    def tree(self, paths: list, inputs: tuple, timed: Any) -> DraftTree | None:
        """The rank ``paths`` of a static tree in one region, as :meth:`chain`."""
        key = tuple(paths)
        run = self.regions.get(("tree", key), lambda: TreeRegion(self.step, key))
        if run is None:
            return None
        start = time.perf_counter()
        levels = max(len(p) for p in paths)
        guesses = [t.clone() for t in self.regions.replay(run, *inputs)]  # a replay's outputs: copied before the next
        self.drafted(levels)
        tree = tree_from_paths(paths, *guesses)  # the read
        record_draft_step(timed, (time.perf_counter() - start) / levels)
        return tree

    def stepper(self, inputs: tuple, timed: Any) -> tuple[torch.Tensor, Callable]:
        """The first depth's logits `[V]`, run now, and ``step(token) -> logits`` for the next depths (a token an
        int or a device tensor ``[]``), eagerly: the path of steps no region drafts. Call :meth:`drafted` after."""
        step, (tokens, feats, scalars) = self.step, inputs
        start = time.perf_counter()
        logits = step.begin(tokens, feats, scalars)
        record_draft_step(timed, time.perf_counter() - start)
        depth = 0

        def advance(token: int | torch.Tensor) -> torch.Tensor:
            nonlocal depth
            begun = time.perf_counter()
            depth += 1
            self.ran = depth + 1
            token = token if isinstance(token, torch.Tensor) else torch.tensor(token, device=step.device)
            out = step.advance(depth, token, scalars, tokens.shape[1])
            record_draft_step(timed, time.perf_counter() - begun)
            return out

        self.ran = 1
        return logits, advance

    def close(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None


def open_static(target: nn.Module, modules: Any, mode: str, *, vocab_size: int, max_length: int, catch_width: int,
                depth: int) -> StaticMtp:
    """This call's fixed-shape drafting with ``modules`` for ``target`` compiled with ``mode``: the step (and its
    regions) kept in the target's state and shared by the calls that fit it (same layers, a large enough buffer),
    one at a time; a call that finds it busy drafts on a step of its own, its regions uncompiled."""
    reach = catch_width + 2 * len(modules.layers) + depth + 2  # padding rows, their tokens, the drafts
    capacity = capacity_for(max_length, reach)
    _, step, release = borrow(
        target, "held", (modules, capacity, vocab_size), kind=SharedMtpStep,
        make=lambda shared: MtpStep(modules, vocab_size, capacity),
        fits=lambda held: held[0] is modules and held[2] == vocab_size and held[1] >= capacity)
    return StaticMtp(step, catch_width, mode if release is not None else None, release, reach)


# -- a compiled call's draft step (``MTPCandidateGenerator.draft`` hands it over) ---------------------------------
def static_draft(gen: Any, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
    """``gen``'s draft (an ``MTPCandidateGenerator`` whose ``static`` is a :class:`StaticMtp`): the same decisions
    as its eager ``draft``, the forwards on the fixed-shape step, in one region where the shape allows."""
    empty = DraftTree.empty(sequence.device)
    static, shape, depth = gen.static, gen.config.tree, min(plan.depth, gen._depth(sequence))
    # a region is the shape of a step away from the call's end: a last step, with less room, keeps what fits of it
    full = min(plan.full_depth, gen._depth(sequence))
    if shape is not None and not plan.chain_only:
        nodes = plan.tree_nodes()
        if nodes == 0:
            return empty
        if nodes != CHAIN:
            paths = [p for p in shape.paths[:nodes] if len(p) <= depth]
            inputs = _inputs(gen, sequence) if paths else None
            if inputs is None:
                return empty
            tree = None if host_chooses(gen.ctx) else static.tree(
                [p for p in shape.paths[:nodes] if len(p) <= full], inputs, gen.modules)
            return tree.within(depth) if tree is not None else _host_tree(gen, sequence, paths, inputs)
    if not plan.start_chain():
        return empty
    inputs = _inputs(gen, sequence)
    if inputs is None:
        return empty
    length = device_chain_length(plan, gen.ctx, depth)
    ask = length is None and not host_chooses(gen.ctx) and regions.replays_longest_chain(static.step.device)
    if ask:
        length = plan.longest_chain(depth)
    widest = plan.region_chain(full, ask) if length else 0
    tree = static.chain(plan, inputs, widest, ask, gen.modules, keep=length) if length else None
    if tree is not None:
        return tree
    logits, step = static.stepper(inputs, gen.modules)
    try:
        return draft_chain(plan, gen.ctx, sequence, logits, depth, step, on_device=True)
    finally:
        static.drafted(static.ran)


def _inputs(gen: Any, sequence: torch.LongTensor) -> tuple[torch.Tensor, ...] | None:
    """The step's inputs (:meth:`StaticMtp.prepare`), or ``None`` where the features of the new rows are missing (or
    no longer line up with the tokens: drafting stops for the call, which stays exact)."""
    fresh = gen.features.pop()  # [1, r, H]
    if fresh is None or fresh.shape[1] != sequence.shape[1] - 1 - gen.static.fed[0]:
        gen.broken = fresh is not None
        return None
    return gen.static.prepare(sequence, fresh)


def _host_tree(gen: Any, sequence: torch.LongTensor, paths: list, inputs: tuple) -> DraftTree:
    """The tree's paths with the call's processors on every node (``MTPCandidateGenerator._tree``'s host path), the
    spine's forwards eagerly on the fixed-shape step."""
    guide = DraftGuide(gen.ctx.logits_processor, sequence)
    logits, step = gen.static.stepper(inputs, gen.modules)
    levels, spine = [logits], []
    try:
        while len(levels) < max(len(p) for p in paths):
            token = first_guess(guide, levels[-1], spine)
            if token is None:
                break
            spine.append(token)
            levels.append(step(token))
    finally:
        gen.static.drafted(gen.static.ran)
    level = 0

    def expand(frontier: list[int], tokens: torch.Tensor, parents: list[int]) -> torch.Tensor:
        nonlocal level
        level += 1
        return levels[level].expand(len(frontier), -1)  # [k, V]

    tree = grow_paths(paths, levels[0], expand, len(levels), guide)
    return DraftTree(tree.tokens.to(sequence.device), tree.parents.to(sequence.device))
