"""One target forward over B rows, each with its own draft tree, on one dynamic cache with holes.

Every row keeps its own number of tokens, yet all rows share one cache length: a cache *slot* is either
a real token of that row or a *hole* (left padding of the prompt, or a draft node the row did not
accept). ``slots`` (``[B, S]`` bool) says which, and every forward's 4-D attention mask hides the holes::

    cache slots (S)                 pending (m)   nodes (n, padded to the step's longest draft)
    row 0:  pad pad  a  b  .  c     r0            x  y  z            . = a hole left by an earlier step
    row 1:   d   e   f  g  h  i     r1            u  <pad> <pad>

A query sees the real slots of its row, the real pending tokens up to itself (the prompt, in the first
forward; later the root, the target's last token) and, for a draft node, its ancestors in its row's tree.
Position ids count real tokens, never slots, so a row's positions are exactly those of the row decoded
alone (and of transformers' own left-padded batch, whose positions are ``cumsum(attention_mask) - 1``).

After the verdicts, :meth:`BatchVerifier.keep` moves each row's accepted path to the front of the
step's node slots (one ``gather`` per cache tensor) and crops the cache after the longest path: the
shorter rows' remaining node slots become holes. When a re-pack would cut a quarter of the cache,
:meth:`BatchVerifier.compact` re-packs every row to the right (new left padding), and finished rows leave the batch
(:meth:`BatchVerifier.select`, an ``index_select`` on the cache's batch axis).

A cache the caller passed to ``generate()`` holding the prompts' first columns (as transformers' batched
``generate`` would fill it from the same left-padded prompts: :func:`passed_prefix`) is read, not filled: the
verifier's cache starts as a borrowed one over its tensors (``compat.borrowed_cache``), its slots the prompts'
padding mask there, and the first forward runs the columns after them (under the 4-D masks). Every write after it
lands in tensors of the verifier's own, so the caller's cache stays as it was and can start the next call too (one
prefill of a shared long context, many generations).

After the first forward the cache's layers write new slots in place (``kv_room.make_room``) instead of
transformers' ``torch.cat`` of the whole cache per forward: at 8 rows of 4,096 tokens of SmolLM2-135M that copy was
195 ms of a 337 ms step on this CPU (one thread, a random cache: 198 ms a step without it). A re-pack or a row
selection replaces the tensors, and the next forward copies them into fresh room once.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import compat
from . import kv_cache
from .kv_room import make_room
from .tree import DraftTree
from .verify import _window, check_tree_attention


_COMPACT_MIN_SLOTS = 8


def passed_prefix(cache: Any, batch: int, length: int) -> int:
    """The prompts' first columns a cache passed to ``generate()`` with a batch of ``batch`` rows of ``length``
    columns holds (0: none, or an empty cache); raises, naming the fix, for one the batch cannot start from: as many
    columns as the prompts or more, sliding-window layers (they drop old positions), or layers of other rows or
    lengths than the batch's first columns."""
    cached = kv_cache.cache_length(cache)
    if cached == 0:
        return 0
    if cached >= length:
        raise ValueError(f"The cache passed to generate() already holds {cached} tokens, as many as the prompts' "
                         f"{length} columns (their left padding included) or more; pass a cache of the prompts' first "
                         "columns at most.")
    sliding = compat.sliding_cache_layers(cache)
    if sliding:
        raise ValueError(f"The cache passed to generate() has {sliding} sliding-window layers, which drop old "
                         "positions; a batch needs full-attention layers: prefill a DynamicCache() made without the "
                         "model's config, or pass no cache.")
    for layer, (keys, values) in enumerate(compat.cache_layer_tensors(cache)):
        for tensor in (keys, values):
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4 or tensor.shape[0] != batch or \
                    tensor.shape[-2] != cached:
                shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                raise ValueError(f"The cache passed to generate() holds {shape} in layer {layer}, not the batch's "
                                 f"{batch} rows of the prompts' first {cached} columns: prefill it with the same "
                                 f"left-padded input_ids[:, :{cached}] and attention_mask[:, :{cached}], or pass "
                                 "no cache.")
    return cached


class BatchVerifier:
    """The target's dynamic cache for a batch of rows, and the forwards that verify their drafts.

    Args:
        model (`PreTrainedModel`): the target (eager or SDPA attention: a 4-D mask per row).
        batch_size (`int`): the rows of the first forward.
        prefix (`tuple`, *optional*): ``(cache, mask)``: a cache the caller passed, holding the prompts' first
            ``c`` columns (checked by :func:`passed_prefix`), and the padding mask of those columns ``[B, c]``.
    """

    budget = 64  # the most draft nodes a step verifies per row (as the one-row DynamicVerifier)

    def __init__(self, model: torch.nn.Module, batch_size: int, prefix: tuple[Any, torch.Tensor] | None = None):
        check_tree_attention(model)
        self.model = model
        self.device = model.get_input_embeddings().weight.device
        self.dtype = model.get_input_embeddings().weight.dtype
        self.cache = kv_cache.new_dynamic_cache()  # full attention only: sliding windows are in the masks
        self.slots = torch.zeros(batch_size, 0, dtype=torch.bool, device=self.device)       # [B, S] real?
        self.positions = torch.zeros(batch_size, 0, dtype=torch.long, device=self.device)   # [B, S]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)        # [B] real tokens
        self.cached = 0  # the prompts' columns the caller's cache held
        if prefix is not None:
            cache, mask = prefix
            mask = mask.to(device=self.device, dtype=torch.bool)                            # [B, c]
            self.cache, self.cached = compat.borrowed_cache(cache), mask.shape[1]
            # positions as transformers' left-padded prefill gave them (padding's are never seen)
            self.slots, self.positions = mask, (mask.long().cumsum(-1) - 1).clamp(min=0)
            self.lengths = mask.long().sum(-1)
        self._roomy = False  # the cache's layers write in place once a forward of ours made their tensors
        config = compat.text_config(model.config)
        kinds = getattr(config, "layer_types", None)
        if kinds and len(set(kinds)) > 1:
            self._kinds = sorted(set(kinds))
        else:
            single = kinds[0] if kinds else ("sliding_attention" if getattr(config, "use_sliding_window", True)
                                             else "full_attention")
            self._kinds = [single]
        self._windows = {kind: _window(config, kind) for kind in self._kinds}
        self._pending: tuple[int, int, torch.Tensor] | None = None  # (S, m, root positions [B]) of the last forward

    @property
    def holes(self) -> int:
        """Slots of the cache that are holes, over all rows."""
        return int((~self.slots).sum())

    def forward(self, pending: torch.Tensor, pending_mask: torch.Tensor, trees: Sequence[DraftTree]) -> torch.Tensor:
        """Run the target once over every row's uncached tokens and draft tree.

        Args:
            pending: ``[B, m]`` tokens after the cache's end; each row's last one is its tree's root
                (must be real).
            pending_mask: ``[B, m]`` bool, False at left padding (the prompt of the first forward).
            trees: one :class:`DraftTree` per row (empty for a plain step).

        Returns:
            ``[B, 1 + n, V]`` logits (``n``: the step's longest tree): row ``b``'s root at 0, its node ``i``
            at ``1 + i``; the rows past a shorter tree's size are padding.
        """
        device = self.device
        pending, pending_mask = pending.to(device), pending_mask.to(device=device, dtype=torch.bool)
        batch, m = pending.shape
        n = max((tree.size for tree in trees), default=0)
        tokens = torch.zeros(batch, n, dtype=torch.long, device=device)          # [B, n] (padding: token 0)
        depths = torch.zeros(batch, n, dtype=torch.long, device=device)          # [B, n]
        ancestors = torch.eye(n, dtype=torch.bool, device=device).repeat(batch, 1, 1)  # [B, n, n]
        real_nodes = torch.zeros(batch, n, dtype=torch.bool, device=device)      # [B, n]
        for row, tree in enumerate(trees):
            k = tree.size
            if k:
                tokens[row, :k] = tree.tokens.to(device)
                depths[row, :k] = tree.depths().to(device)
                ancestors[row, :k, :k] = tree.ancestors().to(device)
                real_nodes[row, :k] = True
        # positions: real tokens before each one (padding gets the next real position; it is never seen)
        counts = pending_mask.long().cumsum(-1)                                      # [B, m]
        pending_pos = self.lengths[:, None] + (counts - 1).clamp(min=0)             # [B, m]
        root_pos = self.lengths + counts[:, -1] - 1                                  # [B]
        node_pos = root_pos[:, None] + 1 + depths                                    # [B, n]
        position_ids = torch.cat([pending_pos, node_pos], dim=-1)                   # [B, m + n]

        s = self.slots.shape[1]
        if s == 0 and n == 0 and m > 1:
            out = self._prefill(pending, pending_mask, pending_pos)
        else:
            out = self._forward(pending, pending_mask, tokens, ancestors, pending_pos, node_pos, position_ids)
        self.cache = compat.output_cache(out)
        if not self._roomy:
            make_room(self.cache)  # later forwards write their slots in place (the module docstring)
            self._roomy = True
        self._before = (self.slots, self.positions, self.lengths)
        self.slots = torch.cat([self.slots, pending_mask, real_nodes], dim=-1)
        self.positions = torch.cat([self.positions, pending_pos, node_pos], dim=-1)
        self.lengths = root_pos + 1
        self._pending = (s, m, root_pos)
        return out.logits[:, -(1 + n):]                                              # [B, 1 + n, V]

    def _prefill(self, pending: torch.Tensor, pending_mask: torch.Tensor, pending_pos: torch.Tensor) -> Any:
        """The prompts alone (the first forward, no draft nodes): the model's own masks from the 2-D padding mask, as
        transformers' batched greedy prefills them (SDPA's causal kernel where no row is padded), instead of a
        ``[B, 1, m, m]`` mask of our own, which forces SDPA's masked path (25% slower at 4 rows of 2,048 tokens)."""
        keep = compat.logits_to_keep_kwargs(self.model, 1)
        return self.model(input_ids=pending, attention_mask=pending_mask.long(), position_ids=pending_pos,
                          use_cache=True, **{compat.cache_kwarg(): self.cache}, **keep)

    def _forward(self, pending: torch.Tensor, pending_mask: torch.Tensor, tokens: torch.Tensor,
                 ancestors: torch.Tensor, pending_pos: torch.Tensor, node_pos: torch.Tensor,
                 position_ids: torch.Tensor) -> Any:
        """Every row's pending tokens and draft nodes in one forward, under the 4-D masks of the holes and trees."""
        device = self.device
        batch, m = pending.shape
        n = tokens.shape[1]
        s = self.slots.shape[1]
        seen = torch.zeros(batch, m + n, s + m + n, dtype=torch.bool, device=device)  # [B, Q, K]
        seen[:, :, :s] = self.slots[:, None, :]
        causal = torch.ones(m, m, dtype=torch.bool, device=device).tril()
        seen[:, :m, s:s + m] = causal[None] & pending_mask[:, None, :]
        seen[:, m:, s:s + m] = pending_mask[:, None, :]
        seen[:, m:, s + m:] = ancestors
        key_pos = torch.cat([self.positions, pending_pos, node_pos], dim=-1)        # [B, K]
        masks = {}
        for kind in self._kinds:
            window = self._windows[kind]
            visible = seen if window is None else seen & (key_pos[:, None, :] > position_ids[:, :, None] - window)
            additive = torch.zeros(visible.shape, dtype=self.dtype, device=device)
            additive.masked_fill_(~visible, torch.finfo(self.dtype).min)  # the minimum, not -inf: no NaN rows
            masks[kind] = additive[:, None]                                          # [B, 1, Q, K]
        mask: Any = masks if len(masks) > 1 else next(iter(masks.values()))

        ids = torch.cat([pending, tokens], dim=-1)                                   # [B, m + n]
        keep = compat.logits_to_keep_kwargs(self.model, 1 + n)
        return self.model(input_ids=ids, position_ids=position_ids, attention_mask=mask, use_cache=True,
                          **{compat.cache_kwarg(): self.cache}, **keep)

    def keep(self, paths: Sequence[Sequence[int]]) -> None:
        """After :meth:`forward`: keep each row's accepted ``path`` (node indices, root to leaf) at the front of
        the step's node slots; the rest of them become holes, cropped after the longest path."""
        s, m, root_pos = self._pending
        start = s + m
        written = self.slots.shape[1] - start
        longest = max((len(p) for p in paths), default=0)
        batch = len(paths)
        index = torch.zeros(batch, longest, dtype=torch.long, device=self.device)   # [B, A]
        kept = torch.zeros(batch, longest, dtype=torch.bool, device=self.device)    # [B, A]
        for row, path in enumerate(paths):
            if path:
                index[row, :len(path)] = torch.tensor(list(path), dtype=torch.long, device=self.device)
                kept[row, :len(path)] = True
        in_place = all(list(path) == list(range(len(path))) for path in paths)
        if longest and not in_place:
            kv_cache.gather_cache_slots(self.cache, start, index)
        compat.crop_cache(self.cache, written - longest)
        self.slots = torch.cat([self.slots[:, :start], kept], dim=-1)
        steps = torch.arange(1, longest + 1, device=self.device)
        self.positions = torch.cat([self.positions[:, :start], root_pos[:, None] + steps[None]], dim=-1)
        self.lengths = root_pos + 1 + kept.sum(-1)
        self._pending = None

    def undo(self) -> None:
        """Forget the last :meth:`forward` (instead of :meth:`keep`): the cache and its bookkeeping as they were
        before it (``hf-speculative profile`` times one shape again and again)."""
        s = self._pending[0]
        compat.crop_cache(self.cache, self.slots.shape[1] - s)
        self.slots, self.positions, self.lengths = self._before
        self._pending = None

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (``[B']`` indices) of the batch: finished rows leave it."""
        rows = rows.to(self.device)
        kv_cache.select_cache_rows(self.cache, rows)
        self.slots, self.positions, self.lengths = self.slots[rows], self.positions[rows], self.lengths[rows]

    def shrinkable(self) -> int:
        """Slots a :meth:`compact` would cut: the cache's length less its longest row's real slots."""
        return self.slots.shape[1] - (int(self.slots.sum(-1).max()) if self.slots.numel() else 0)

    def tidy(self) -> None:
        """Re-pack the cache when that cuts a quarter of its slots and at least ``_COMPACT_MIN_SLOTS`` (a re-pack
        copies the whole cache)."""
        if self.shrinkable() * 4 > max(self.slots.shape[1], _COMPACT_MIN_SLOTS * 4):
            self.compact()

    def compact(self) -> None:
        """Re-pack every row's real slots to the right end (holes become left padding, cut to the longest row)."""
        real = self.slots.long().sum(-1)                                             # [B]
        width = int(real.max()) if real.numel() else 0
        # a stable sort of holes before real slots keeps each row's order
        order = torch.sort(self.slots.long(), dim=-1, stable=True).indices[:, -width:] if width else \
            self.slots.new_zeros(self.slots.shape[0], 0, dtype=torch.long)           # [B, width]
        kv_cache.reorder_cache_slots(self.cache, order)
        self.slots = torch.gather(self.slots, 1, order)
        self.positions = torch.gather(self.positions, 1, order)

    def close(self) -> None:
        self.cache = None
