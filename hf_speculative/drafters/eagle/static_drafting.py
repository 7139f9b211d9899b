"""EAGLE drafting at fixed shapes on a preallocated cache, so that a compiled drafter step is built once and
replayed (CUDA graphs with ``mode="reduce-overhead"``) under ``hfs.enable(model, compile=...)``.

Eager drafting runs each drafter forward at the width the step needs, over a cache grown by doubling; on a
GPU the many small kernels of those forwards, launched one by one, cost more than their arithmetic. Here
every forward has one of three shapes, over one cache of ``C`` positions at fixed addresses::

    catch-up  [1, P]  the verified pairs since the last draft, padded to P = the longest draft + 1
                      (a longer backlog, the prompt's for one, runs eagerly at its own length)
    expand    [1, W]  one depth of a tree: W = top_k (DynamicTree), the widest level with children
                      (StaticTree); its frontier padded to W
    chain     [1, 1]  one chain token

    every row writes its keys and values at its own slot (real rows from the cache's length on, padding
    rows after them, where the next real rows overwrite them) and attends through a mask [T, C]:
    a real row to the true prefix, its ancestors' slots and itself; a padding row to itself only.

The logits of the rows that drafting reads (``pick``) are computed in the same graph, at the target's
vocabulary width. Outputs are copied before use: a CUDA graph's outputs are overwritten by its next replay.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import nn

from ..generator import to_target_vocab
from ...core import regions
from ...core.static_cache import new_replay
from ...core.state import borrow
from .model import EagleDraftModel, SlotCache
from .tree_drafting import Branches

CAPACITY_STEP = 256  # like the target's static cache: calls of similar lengths share one cache and one graph


@dataclasses.dataclass(eq=False)
class SharedDraftGraph:
    """The fixed-shape drafting step that compiled calls on a target share, in the target's state
    (``state_of(target).drafter_state(SharedDraftGraph)``; ``hfs.forget(target)`` drops it).

    Attributes:
        held (`tuple`, *optional*): ``((drafter, capacity, mode, vocab), (DraftStep, compiled step), Lock)``, the
            lock held by the call drafting on it (``core.state.borrow``).
    """

    held: Any = None


class DraftStep(nn.Module):
    """One drafter forward over ``T`` rows at fixed addresses: the module that gets compiled.

    Args:
        net (`EagleDraftModel`): the drafter.
        embed, head (`nn.Module`): the target's input embedding and lm_head (EAGLE-1 reads logits through it).
        target_ids (`torch.Tensor`, *optional*): `[V_draft]` target id of every draft id (a reduced vocabulary).
        vocab_size (`int`): the width of the target's logits.
        capacity (`int`): cache positions ``C``.
    """

    def __init__(self, net: EagleDraftModel, embed: nn.Module, head: nn.Module, target_ids: torch.Tensor | None,
                 vocab_size: int, capacity: int):
        super().__init__()
        self.net, self.embed, self.head, self.vocab_size = net, embed, head, vocab_size
        self.target_ids = target_ids
        config, weight = net.config, next(net.parameters())
        shape = (1, config.num_key_value_heads, capacity, config.head_dim)
        self.register_buffer("keys", torch.zeros(shape, dtype=weight.dtype, device=weight.device), persistent=False)
        self.register_buffer("values", torch.zeros(shape, dtype=weight.dtype, device=weight.device), persistent=False)
        for buffer in (self.keys, self.values):  # written in place by CUDA graphs: their addresses must not move
            torch._dynamo.mark_static_address(buffer)
        self.regions: dict = {}  # whole draft steps over this step (``captured``, ``core.regions``), by shape

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                mask: torch.Tensor, pick: torch.Tensor, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens `[1, T]`, hidden `[1, T, F]` (target features, ``fused``) or `[1, T, H]` (the drafter's own
        outputs), positions `[1, T]`, slots `[T]`, mask bool `[T, C]`, pick `[R]` rows whose logits are read.
        Returns the output hidden states `[1, T, H]` and the picked rows' logits over the target's vocabulary
        `[R, V]` (float32)."""
        cache = SlotCache(self.keys, self.values, slots)
        out = self.net(self.embed(tokens), hidden, positions, cache, fused=fused, attn_mask=mask)  # [1, T, H]
        logits = self.net.draft_logits(out[0].index_select(0, pick), self.head)  # [R, V_draft]
        return out, to_target_vocab(logits, self.vocab_size, self.target_ids)


def capacity_for(max_length: int, speculative: int) -> int:
    """Drafter cache positions for a call of ``max_length`` tokens whose drafts write up to ``speculative``
    entries past the verified ones (catch-up padding included), rounded up."""
    need = max_length + speculative + 1
    return -(-need // CAPACITY_STEP) * CAPACITY_STEP


class StaticDrafting:
    """A call's fixed-shape drafting: the cache's length and the three kinds of forward over a :class:`DraftStep`.

    Args:
        step (`DraftStep`): its buffers are this call's drafter cache.
        run (*callable*): ``step`` compiled, or ``step`` itself.
        catch_width (`int`): ``P``; width (`int`): ``W``.
        release (*callable*, *optional*): gives a borrowed step back.
        mode (`str`, *optional*): ``torch.compile``'s mode, for the whole-step regions (``captured``) of a
            compiled ``run`` (``regions``: kept on ``step``, shared by the calls on it).
    """

    def __init__(self, step: DraftStep, run: Callable, catch_width: int, width: int,
                 release: Callable[[], None] | None = None, mode: str | None = None):
        self.step, self.run, self.catch_width, self.width = step, run, catch_width, width
        self.compiled, self.mode = run is not step, mode
        self.capacity = step.keys.shape[2]
        self.device = step.keys.device
        self.length = 0  # entries in use: the true prefix, then this step's speculative ones
        self._columns = torch.arange(self.capacity)  # [C] masks and indices are built on the host, then copied
        self._release = release
        self.regions = regions.Regions(mode if self.compiled else None, self.device, runs=step.regions)

    def crop(self, length: int) -> None:
        self.length = min(self.length, max(length, 0))

    def _forward(self, rows: int, width: int, tokens: list[int] | torch.Tensor, hidden, positions: list[int], seen,
                 pick: list[int], fused: bool):
        """Run ``rows`` real rows padded to ``width`` (eagerly at their own width when they do not fit). ``tokens``
        (``rows`` ids, on the host), ``hidden`` `[rows, F]` on the device; ``positions`` (``rows`` ints),
        ``seen`` `[rows, C]` on the host (what each real row may attend to besides itself) and ``pick`` (the rows
        whose logits are read). Tokens and indices go to the device as one tensor and the mask as another: on a
        GPU two copies per forward, not a kernel per index or mask entry. Returns outputs `[rows, H]` and logits
        `[R, V]`."""
        start = self.length
        if start + max(rows, width) > self.capacity:
            raise RuntimeError(f"the drafter's static cache ({self.capacity} positions) is full at {start}; this is a "
                               f"bug in hf_speculative's capacity rule: please report it.")
        run = self.run
        if rows > width:  # a long backlog (the prompt): once, eagerly, at its own length
            run, width = self.step, rows
        pad = width - rows
        # [W] tokens, [W] positions, [W] slots (padding rows: token 0, any valid position), [R] picked rows
        on_device = isinstance(tokens, torch.Tensor)  # a chain's token, chosen on the device: not read back
        ints = torch.tensor((([0] * rows) if on_device else tokens) + [0] * pad + positions + positions[-1:] * pad
                            + list(range(start, start + width)) + pick)
        mask = torch.zeros(width, self.capacity, dtype=torch.bool)  # [W, C]
        mask[:rows] = seen
        mask[:, start:start + width].diagonal().fill_(True)  # every row sees itself, a padding row only itself
        ints, mask = ints.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)
        if on_device:
            ints[:rows].copy_(tokens.reshape(-1))
        tokens, positions = ints[None, :width], ints[None, width:2 * width]  # [1, W] each
        slots, pick = ints[2 * width:3 * width], ints[3 * width:]  # [W], [R]
        hidden = torch.nn.functional.pad(hidden, (0, 0, 0, pad))[None]  # [1, W, F]
        if run is not self.step:
            new_replay(self.device)
        out, logits = run(tokens, hidden, positions, slots, mask, pick, fused)
        self.length = start + rows
        return out[0, :rows].clone(), logits.clone()  # [rows, H], [R, V]

    def catch_up(self, tokens: torch.Tensor, features: torch.Tensor, first: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the verified pairs: ``tokens`` `[P']`, ``features`` `[P', F]` at positions ``first ..``, after a
        crop to the true prefix ``first``. Returns the last row's output `[H]` and its logits `[V]`."""
        self.crop(first)
        rows = tokens.shape[0]
        seen = self._columns[None, :] <= torch.arange(first, first + rows)[:, None]  # [P', C] causal over the prefix
        out, logits = self._forward(rows, self.catch_width, tokens.tolist(), features, list(range(first, first + rows)),
                                    seen, [rows - 1], fused=True)
        return out[-1], logits[0]

    def chain_step(self, token: int | torch.Tensor, hidden: torch.Tensor, position: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """One chain token (an int, or a device tensor ``[]`` that stays there) after the entries so far. Returns its
        output `[H]` and logits `[V]`."""
        seen = (self._columns < self.length + 1)[None]  # [1, C]
        token = token if isinstance(token, torch.Tensor) else [token]
        out, logits = self._forward(1, 1, token, hidden[None], [position], seen, [0], fused=False)
        return out[0], logits[0]

    def tree_expander(self, n_true: int, root_position: int, root_hidden: torch.Tensor):
        """The static twin of :func:`~hf_speculative.drafters.eagle.tree_drafting.tree_expander`: an
        ``expand(frontier, tokens, parents) -> [k, V]`` logits, one padded forward per depth."""
        branches = Branches(root_hidden)

        def expand(frontier: list[int], tokens: torch.Tensor, parents: list[int]) -> torch.Tensor:
            k, past = len(frontier), self.length
            ancestors, positions, hidden_in = branches.enter(frontier, parents, root_position)  # ..., [k, H]
            seen = (self._columns < n_true).expand(k, -1).clone()  # [k, C]
            rows = [i for i, slots in enumerate(ancestors) for _ in slots]
            seen[rows, [slot for slots in ancestors for slot in slots]] = True  # one write for every row
            out, logits = self._forward(k, self.width, tokens.tolist(), hidden_in, positions, seen,
                                        list(range(max(k, self.width))), fused=False)
            branches.expanded(frontier, out, past)
            return logits[:k].float()  # [k, V]: the grower processes and normalises them per branch

        return expand

    def close(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None


def open_static(target: nn.Module, net: EagleDraftModel, mode: str, *, target_ids: torch.Tensor | None,
                vocab_size: int, max_length: int, catch_width: int, width: int, speculative: int) -> StaticDrafting:
    """This call's fixed-shape drafting for ``net`` drafting for ``target`` under ``torch.compile`` mode ``mode``.

    The compiled step is kept in the target's state and shared by the calls that fit it (same drafter and mode, a
    cache at least as large: its graphs are not rebuilt for every length), one at a time; a call that finds it
    busy drafts on a step of its own at the same shapes, uncompiled.
    """
    capacity = capacity_for(max_length, speculative)

    def make(shared: bool) -> tuple[DraftStep, Callable]:
        step = DraftStep(net, target.get_input_embeddings(), target.get_output_embeddings(), target_ids, vocab_size,
                         capacity)
        return step, regions.compile_region(step, mode) if shared else step

    _, (step, run), release = borrow(
        target, "held", (net, capacity, mode, vocab_size), make=make, kind=SharedDraftGraph,
        fits=lambda held: held[0] is net and held[2:] == (mode, vocab_size) and held[1] >= capacity)
    return StaticDrafting(step, run, catch_width, width, release, mode)


def frontier_width(shape: Any) -> int:
    """The widest expansion a tree of ``shape`` asks of the drafter in one forward: ``top_k`` for a dynamic tree,
    the most nodes with children at one depth for a static tree."""
    paths = getattr(shape, "paths", None)
    if paths is None:
        return int(shape.top_k)
    parents = {p[:-1] for p in paths if len(p) > 1}
    by_depth: dict[int, int] = {}
    for p in parents:
        by_depth[len(p)] = by_depth.get(len(p), 0) + 1
    return max(by_depth.values(), default=1)
