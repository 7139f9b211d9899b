"""DFlash's drafter forward at one fixed shape on a preallocated context cache, so that under
``hfs.enable(model, compile=...)`` a whole draft step is one compiled region (``captured``), built once per shape and
replayed (CUDA graphs with ``mode="reduce-overhead"``).

Eager drafting (``drafter.window_logits``) feeds the pending context at its own length and grows the context cache
with ``torch.cat``: every step a new shape, a new graph. Here every forward has one shape::

    context  [1, P]  the verified features since the last step, padded to P = the block's width B (a step verifies
                     at most its B - 1 drafted positions, plus the target's own token); a longer backlog, the
                     prompt's, is fed first, all but its last P rows, eagerly at its own length
                     (:meth:`DFlashStep.feed`)
    window   [1, B]  the anchor (the newest verified token) and B - 1 mask tokens

    Context row i writes its keys and values at slot (= position) ``first + i``, the window's row j at slot
    ``first + P + j``: one ``index_copy_`` of P + B rows per layer into buffers of ``C`` slots at fixed addresses.
    The window's rows attend through a mask [B, C]: the true context prefix ``[0, first + rows)`` and the window's
    own slots, with the drafter's own rules (causal, sliding) on their positions. Padding context rows and the window
    are never seen by a later step: their slots are overwritten by the context rows that come after.

``first`` and ``rows`` enter as a device tensor, so one graph serves every step of its shape.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...core import regions
from ...core.state import borrow
from ..generator import to_target_vocab
from ..eagle.model import SlotCache
from .model import DFlashDraftModel

CAPACITY_STEP = 256  # like the target's static cache: calls of similar lengths share one cache and one graph


@dataclasses.dataclass(eq=False)
class SharedDFlashStep:
    """The fixed-shape DFlash step that compiled calls on a target share, in the target's state
    (``state_of(target).drafter_state(SharedDFlashStep)``; ``hfs.forget(target)`` drops it).

    Attributes:
        held (`tuple`, *optional*): ``((network, capacity, mode, vocab), DFlashStep, Lock)``, the lock held by the
            call drafting on it (``core.state.borrow``).
    """

    held: Any = None


def window_embedding(net: DFlashDraftModel, embed: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The window's embeddings `[1, B, H]`: the target's embedding module (an ``embed_norm`` left out, as
    transformers does), or a raw table lookup times ``embed_scale`` (z-lab's)."""
    scale = net.config.embed_scale
    if scale is None and getattr(embed, "embed_norm", None) is None:
        return embed(ids)
    return F.embedding(ids, embed.weight) * (scale if scale is not None else getattr(embed, "embed_scale", 1.0))


class DFlashStep(nn.Module):
    """The drafter's forward over ``P`` context rows and the ``B``-wide window at fixed addresses: what the regions
    (``captured``) run.

    Args:
        net (`DFlashDraftModel`): the drafter.
        embed, head (`nn.Module`): the target's input embedding and lm_head.
        vocab_size (`int`): the width of the target's logits.
        capacity (`int`): cache slots ``C`` (:func:`capacity_for`).
    """

    def __init__(self, net: DFlashDraftModel, embed: nn.Module, head: nn.Module, vocab_size: int, capacity: int):
        super().__init__()
        self.net, self.embed, self.head, self.vocab_size = net, embed, head, vocab_size
        config, weight = net.config, next(net.parameters())
        self.block, self.catch_width = config.block_size, config.block_size  # B, P
        shape = (len(net.layers), 1, config.num_key_value_heads, capacity, config.head_dim)
        self.register_buffer("keys", torch.zeros(shape, dtype=weight.dtype, device=weight.device), persistent=False)
        self.register_buffer("values", torch.zeros(shape, dtype=weight.dtype, device=weight.device), persistent=False)
        for buffer in (self.keys, self.values):  # written in place by CUDA graphs: their addresses must not move
            torch._dynamo.mark_static_address(buffer)
        self.register_buffer("columns", torch.arange(capacity, device=weight.device), persistent=False)  # [C]
        masks = torch.full((1, config.drafted), config.mask_token_id, dtype=torch.long, device=weight.device)
        self.register_buffer("masks", masks, persistent=False)  # [1, B - 1]
        self.register_buffer("head_rows", None, persistent=False)  # [N, H] the draft vocabulary's (``refresh``)
        self.register_buffer("head_bias", None, persistent=False)  # [N]
        self.regions: dict = {}  # whole draft steps over this step (``captured``, ``core.regions``), by shape

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def refresh(self) -> None:
        """Before a step, on the host: the lm_head's rows of the drafter's draft vocabulary, if any, as buffers
        (``DFlashDraftModel.head_rows`` keeps them, and copies them again after the head changes; inside a region
        its check of the head would break the graph). A new copy is a new graph."""
        rows = self.net.head_rows(self.head)
        if rows is None:
            self.head_rows = self.head_bias = None
        elif rows[0] is not self.head_rows:
            self.head_rows, self.head_bias = rows
            torch._dynamo.mark_static_address(self.head_rows)

    def forward(self, anchor: torch.Tensor, features: torch.Tensor, scalars: torch.Tensor, depth: int
                ) -> torch.Tensor:
        """anchor `[1]` (the newest verified token), features `[P, F]` (``rows`` real, then padding), scalars
        `[2]` = (first, rows): the context's first position and its real rows. Returns the logits of the window's
        positions 1 .. ``depth`` over the target's vocabulary `[depth, V]` (float32)."""
        net, width = self.net, self.catch_width
        first, rows = scalars[0], scalars[1]
        n = first + rows  # the anchor's position: the true context is [0, n)
        window = window_embedding(net, self.embed, torch.cat([anchor[None], self.masks], dim=1))  # [1, B, H]
        context = net.context(features[None].to(window.dtype))  # [1, P, H]
        span = torch.arange(width + self.block, device=anchor.device)  # [P + B]
        positions = torch.where(span < width, first + span, n + span - width)[None]  # [1, P + B]
        rope = net.rotary_emb(window, positions)  # cos, sin [1, P + B, D]
        masks = {size: self._mask(first, n, positions[0, width:], size)
                 for size in {net.config.sliding(i) for i in range(len(net.layers))}}
        slots = first + span  # [P + B]
        for i, layer in enumerate(net.layers):
            cache = SlotCache(self.keys[i], self.values[i], slots)
            window = layer(window, context, rope, cache, masks[net.config.sliding(i)])  # [1, B, H]
        hidden = net.norm(window)[:, : depth + 1]  # [1, D + 1, H]
        if self.head_rows is None:
            logits = net.draft_logits(hidden, self.head)[0]  # [D, V] (or [D, N]: a head given as a function)
        else:
            logits = F.linear(hidden[0, 1:], self.head_rows, self.head_bias)  # [D, N]
        return to_target_vocab(logits, self.vocab_size, net.draft_vocab)  # [D, V]

    def _mask(self, first: torch.Tensor, n: torch.Tensor, queries: torch.Tensor, sliding: int | None
              ) -> torch.Tensor:
        """bool `[1, 1, B, C]`: what each window row (positions ``queries`` `[B]`) may see: the true prefix
        ``[0, n)`` and the window's slots, under the drafter's causal and sliding rules (``DFlashDraftModel._mask``)."""
        columns, start = self.columns, first + self.catch_width  # the window's first slot
        inside = (columns >= start) & (columns < start + self.block)  # [C]
        keys = torch.where(inside, n + columns - start, columns)  # [C] each slot's position
        seen = ((columns < n) | inside)[None].expand(queries.shape[0], -1)  # [B, C]
        gap = queries[:, None] - keys[None, :]  # [B, C]
        if self.net.config.causal:
            seen = seen & (gap >= 0)
        if sliding is not None:
            seen = seen & (gap.abs() <= sliding)
        return seen[None, None]

    @torch.no_grad()
    def feed(self, features: torch.Tensor, first: int) -> None:
        """A backlog's context rows `[1, X, F]` at positions and slots ``first ..``, eagerly at its own length (no
        window: only their keys and values, which the window's rows of later steps read)."""
        net, rows = self.net, features.shape[1]
        if first + rows > self.capacity:
            raise_full(self.capacity, first + rows)
        context = net.context(features.to(self.keys.dtype))  # [1, X, H]
        slots = torch.arange(first, first + rows, device=context.device)  # [X]
        rope = net.rotary_emb(context, slots[None])  # cos, sin [1, X, D]
        for i, layer in enumerate(net.layers):
            SlotCache(self.keys[i], self.values[i], slots).append(*layer.self_attn.keys_values(context, rope))


def raise_full(capacity: int, need: int) -> None:
    raise RuntimeError(f"DFlash's static context cache ({capacity} slots) cannot take a step reaching slot {need}; "
                       "this is a bug in hf_speculative's capacity rule: please report it.")


def capacity_for(max_length: int, block: int) -> int:
    """Context cache slots for a call of ``max_length`` tokens: a step writes ``P + B = 2 B`` slots from its first
    context position (at most ``max_length - 1``), rounded up to :data:`CAPACITY_STEP`."""
    need = max_length + 2 * block
    return -(-need // CAPACITY_STEP) * CAPACITY_STEP


class StaticDFlash:
    """A call's fixed-shape drafting: a :class:`DFlashStep` (shared or its own) and its regions.

    Args:
        step (`DFlashStep`): its buffers are this call's context cache.
        mode (`str`, *optional*): ``torch.compile``'s mode for the regions; ``None``: run as they are.
        release (*callable*, *optional*): gives a borrowed step back.
    """

    def __init__(self, step: DFlashStep, mode: str | None, release=None):
        self.step, self.catch_width = step, step.catch_width
        self.device = step.keys.device
        self.regions = regions.Regions(mode, self.device, runs=step.regions)
        self._release = release

    def inputs(self, anchor: torch.Tensor, pending: torch.Tensor | None, first: int, *more: int) -> tuple:
        """A region's inputs for the step after the pending features ``pending`` `[1, P', F]` (or ``None``) from
        position ``first``: a backlog longer than ``P`` is fed first, but for its last ``P`` rows
        (:meth:`DFlashStep.feed`); ``anchor`` `[1]` the newest token. Returns ``(anchor [1], features [P, F],
        scalars [2 + len(more)])`` (``first``, the real rows, then ``more``), each of the same strides at every step
        (a view of a `[1, L]` sequence's last column would not be: a new graph)."""
        if pending is None:
            pending = self.step.keys.new_zeros(1, 0, self.step.net.fc.in_features)  # [1, 0, F]
        extra = pending.shape[1] - self.catch_width
        if extra > 0:
            self.step.feed(pending[:, :extra], first)
            pending, first = pending[:, extra:], first + extra
        rows = pending.shape[1]
        if first + self.catch_width + self.step.block > self.step.capacity:
            raise_full(self.step.capacity, first + self.catch_width + self.step.block)
        features = F.pad(pending[0], (0, 0, 0, self.catch_width - rows))  # [P, F]
        self.step.refresh()
        return anchor, features, torch.tensor([first, rows, *more], device=self.device)

    def close(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None


def open_static(target: nn.Module, net: DFlashDraftModel, mode: str, *, vocab_size: int,
                max_length: int) -> StaticDFlash:
    """This call's fixed-shape drafting for ``net`` drafting for ``target`` under ``torch.compile`` mode ``mode``.

    The step (its cache and its compiled regions) is kept in the target's state and shared by the calls that fit it
    (same network, mode and vocabulary, a cache at least as large), one at a time; a call that finds it busy drafts
    on a step of its own, its regions uncompiled."""
    capacity = capacity_for(max_length, net.config.block_size)

    def make(shared: bool) -> DFlashStep:
        return DFlashStep(net, target.get_input_embeddings(), target.get_output_embeddings(), vocab_size, capacity)

    _, step, release = borrow(
        target, "held", (net, capacity, mode, vocab_size), make=make, kind=SharedDFlashStep,
        fits=lambda held: held[0] is net and held[2:] == (mode, vocab_size) and held[1] >= capacity)
    return StaticDFlash(step, mode if release is not None else None, release)
