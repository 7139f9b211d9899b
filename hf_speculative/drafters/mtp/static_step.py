"""MTP drafting at fixed shapes on preallocated buffers, so that a draft step can be one compiled region under
``hfs.enable(model, compile=...)`` (issue 69; ``captured`` builds the regions over this module).

Eager MTP drafting (``drafter.MTPCandidateGenerator``) grows a ``DynamicCache`` per layer and carries the inputs of
each layer's next rows on the host. Here everything a step reads or writes lives in buffers at fixed addresses,
indexed by *row* (row ``j`` of layer ``k`` is the pair at position ``j + 1 + k``)::

    keys{k}, values{k}  [1, kvh, C, D]  layer k's K/V, row j at slot j (what its attention's ``cache.update`` gets)
    feats               [C, H]          the target's features, row j = position j
    outs                [K, C, H]       layer k's outputs (after its post-norm), the inputs of layer k + 1
    text                [C]             the tokens, text[i] = x_i (the verified ones, then this step's drafts)

A layer runs over a window of rows ``[start, start + W)``: its ``count`` real rows first (causal over the rows
before them, within a sliding window where the layer has one), padding rows after them that see only themselves and
whose slots the next real rows overwrite. ``start`` and ``count`` are device tensors: one region serves every step.
MtpLayer's attention takes :class:`_SlotCache` through its ``cache`` argument (``cache.update(k, v, layer_idx)``),
as it takes transformers' own caches; transformers is neither patched nor copied.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ..generator import to_target_vocab

CAPACITY_STEP = 256  # like the target's static cache: calls of similar lengths share one step and its regions


class _SlotCache:
    """What an MTP layer's attention takes as its ``cache``: writes the new keys and values at ``slots`` of the layer's
    buffers and returns the whole buffers (the mask hides what a row may not see)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], slots: torch.Tensor):
        self.keys, self.values, self.slots = keys, values, slots

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        keys, values = self.keys[layer_idx], self.values[layer_idx]  # [1, kvh, C, D] each
        keys.index_copy_(2, self.slots, key_states.to(keys.dtype))
        values.index_copy_(2, self.slots, value_states.to(values.dtype))
        return keys, values


class _ShapeProbe:
    """A cache that records the shapes an attention hands it (MLA layers cache latents, not heads)."""

    def __init__(self):
        self.shapes: dict[int, tuple] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        self.shapes[layer_idx] = (key_states.shape, value_states.shape, key_states.dtype)
        return key_states, value_states


class MtpStep(nn.Module):
    """The MTP layers over fixed-address buffers (see the module's docstring).

    Args:
        modules (`MtpModel`): the layers (their embedding and head are the target's).
        vocab_size (`int`): the width of the target's logits.
        capacity (`int`): rows ``C`` of every buffer.
    """

    def __init__(self, modules: Any, vocab_size: int, capacity: int):
        super().__init__()
        self.mtp, self.vocab_size, self.capacity = modules, vocab_size, capacity
        self.num_layers = len(modules.layers)
        weight = next(modules.layers.parameters())
        types = getattr(modules.config, "layer_types", None)
        window = getattr(modules.config, "sliding_window", None)
        self.windows = [window if types is not None and types[k] == "sliding_attention" else None
                        for k in range(self.num_layers)]
        shapes = self._probe(weight)
        for k in range(self.num_layers):
            (key_shape, value_shape, dtype) = shapes[k]
            self.register_buffer(f"keys{k}", weight.new_zeros((*key_shape[:2], capacity, key_shape[3]), dtype=dtype),
                                 persistent=False)
            self.register_buffer(f"values{k}", weight.new_zeros((*value_shape[:2], capacity, value_shape[3]),
                                                                dtype=dtype), persistent=False)
        hidden = int(modules.config.hidden_size)
        self.register_buffer("feats", weight.new_zeros(capacity, hidden), persistent=False)  # [C, H]
        self.register_buffer("outs", weight.new_zeros(self.num_layers, capacity, hidden), persistent=False)  # [K, C, H]
        self.register_buffer("text", torch.zeros(capacity, dtype=torch.long, device=weight.device), persistent=False)
        self.register_buffer("columns", torch.arange(capacity, device=weight.device), persistent=False)  # [C]
        for buffer in self._buffers.values():  # written in place by CUDA graphs: their addresses must not move
            torch._dynamo.mark_static_address(buffer)
        self.regions: dict = {}  # whole draft steps over this step (``captured``, ``core.regions``), by shape

    @property
    def device(self) -> torch.device:
        return self.feats.device

    def _buffers_of(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return ([getattr(self, f"keys{k}") for k in range(self.num_layers)],
                [getattr(self, f"values{k}") for k in range(self.num_layers)])

    @torch.no_grad()
    def _probe(self, weight: torch.Tensor) -> dict[int, tuple]:
        """The shapes each layer's attention caches, from one row through every layer (nothing is kept)."""
        probe = _ShapeProbe()
        rows = torch.zeros(1, dtype=torch.long, device=weight.device)
        hidden = weight.new_zeros(1, 1, int(self.mtp.config.hidden_size))
        seen = torch.ones(1, 1, dtype=torch.bool, device=weight.device)  # [1, 1]
        for k in range(self.num_layers):
            self._forward(k, rows[None], hidden, rows, seen, probe)
        return probe.shapes

    def _forward(self, layer: int, tokens: torch.Tensor, hidden: torch.Tensor, rows: torch.Tensor, seen: torch.Tensor,
                 cache: Any) -> torch.Tensor:
        """MTP layer ``layer`` over ``tokens`` `[1, W]` and ``hidden`` `[1, W, H]` at rows ``rows`` `[W]`, each row
        attending to the slots ``seen`` `[W, C]` of ``cache``. Returns its outputs `[1, W, H]`."""
        m = self.mtp
        positions = (rows + 1 + layer)[None]  # [1, W]
        embeds = m.embed_tokens(tokens).to(hidden.device)  # [1, W, H]
        mask = torch.zeros(seen.shape, dtype=embeds.dtype, device=seen.device)
        mask = mask.masked_fill(~seen, torch.finfo(embeds.dtype).min)[None, None]  # [1, 1, W, C] (additive)
        rope = {}
        if m.rotary_emb is not None:
            kind = {"layer_type": m.config.layer_types[layer]} if m.has_per_layer_rope else {}
            rope["position_embeddings"] = m.rotary_emb(embeds, position_ids=positions, **kind)
        out = m.layers[layer](embeds, hidden.to(embeds.dtype), attention_mask=mask, position_ids=positions,
                              cache=cache, **rope)  # [1, W, H]
        return m.shared_post_norm(out) if m.use_shared_post_norm else out

    def layer_pass(self, k: int, start: torch.Tensor, count: torch.Tensor, width: int, own: bool = False
                   ) -> torch.Tensor:
        """Layer ``k`` over its rows ``[start, start + count)`` padded to ``width``: inputs from ``feats`` (layer 0) or
        layer ``k - 1``'s outputs (``own``: its own outputs at the row before, the last layer reused) and the tokens
        ``text[row + 1 + k]``; writes its K/V and outputs at those rows. Returns its outputs `[W, H]`."""
        rows = start + torch.arange(width, device=self.device)  # [W]
        real = torch.arange(width, device=self.device) < count  # [W]
        if own:
            hidden = self.outs[k].index_select(0, rows - 1)[None]  # [1, W, H]
        else:
            source = self.feats if k == 0 else self.outs[k - 1]  # [C, H]
            hidden = source.index_select(0, rows)[None]  # [1, W, H]
        tokens = self.text.index_select(0, rows + 1 + k)[None]  # [1, W]
        out = self._forward(k, tokens, hidden, rows, self._seen(k, rows, real),
                            _SlotCache(*self._buffers_of(), rows))[0]  # [W, H]
        self.outs[k].index_copy_(0, rows, out.to(self.outs.dtype))
        return out

    def _seen(self, k: int, rows: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """`[W, C]` the slots each row attends to: a real row its layer's rows up to itself (within the layer's
        sliding window, where it has one), a padding row only itself."""
        columns = self.columns[None, :]  # [1, C]
        causal = columns <= rows[:, None]  # [W, C]
        if self.windows[k] is not None:
            causal &= columns > rows[:, None] - self.windows[k]
        return torch.where(real[:, None], causal, columns == rows[:, None])

    def begin(self, tokens: torch.Tensor, feats: torch.Tensor, scalars: torch.Tensor) -> torch.Tensor:
        """A step's first guess: the verified pairs ``tokens`` `[1, P]`, ``feats`` `[1, P, H]` (real rows first) written
        from row ``fed[0]`` on, then layer 0 over its rows up to ``L - 2``. ``scalars`` `[1 + K]`: ``(L, fed[0], ...,
        fed[K - 1])``, the verified length and each layer's first row not cached. Returns the logits `[V]`."""
        length, start = scalars[0], scalars[1]
        self.write(self.text, start + 1, tokens[0])
        self.write(self.feats, start, feats[0])
        out = self.layer_pass(0, start, length - 1 - start, tokens.shape[1])  # [P, H]
        return self.logits(out.index_select(0, (length - 2 - start).reshape(1))[0])

    def advance(self, depth: int, token: torch.Tensor, scalars: torch.Tensor, width: int) -> torch.Tensor:
        """The logits `[V]` after the drafted ``token`` (``[]``, the guess of depth ``depth - 1``): layer ``depth``
        over its rows up to ``L - 2`` (``width + depth`` of them, padded), or past the last layer that layer again on
        the next row, reading its own output."""
        length, last = scalars[0], self.num_layers - 1
        self.write(self.text, length + depth - 1, token.reshape(1))
        if depth <= last:
            start = scalars[1 + depth]
            out = self.layer_pass(depth, start, length - 1 - start, width + depth)  # [P + d, H]
            row = length - 2 - start
        else:
            out = self.layer_pass(last, (length - 1 + depth - self.num_layers).reshape(()), 1, 1, own=True)  # [1, H]
            row = torch.zeros((), dtype=torch.long, device=self.device)
        return self.logits(out.index_select(0, row.reshape(1))[0])

    def logits(self, row: torch.Tensor) -> torch.Tensor:
        """The target vocabulary's logits `[V]` (float32) of one output row ``row`` `[H]`."""
        return to_target_vocab(self.mtp._project_to_logits(row[None, None])[0], self.vocab_size)[0]

    def write(self, buffer: torch.Tensor, at: torch.Tensor, values: torch.Tensor) -> None:
        """``buffer[at + i] = values[i]`` (``at`` a device tensor ``[]``)."""
        buffer.index_copy_(0, at + torch.arange(values.shape[0], device=self.device), values.to(buffer.dtype))


def capacity_for(max_length: int, extra: int) -> int:
    """Rows for a call of ``max_length`` tokens whose steps write up to ``extra`` rows past the verified ones."""
    need = max_length + extra + 1
    return -(-need // CAPACITY_STEP) * CAPACITY_STEP


@dataclasses.dataclass(eq=False)
class SharedMtpStep:
    """The fixed-shape step that compiled calls on a target share, one at a time, in the target's state
    (``state_of(target).drafter_state(SharedMtpStep)``; ``hfs.forget(target)`` drops it): ``held`` is
    ``((modules, capacity, vocab), MtpStep, Lock)`` (``core.state.borrow``)."""

    held: Any = None
