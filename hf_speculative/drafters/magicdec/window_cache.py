"""MagicDec's second KV cache: per row, its attention sinks and a sliding window of its latest tokens, bounded.

Each row keeps the keys and values the target itself computed (read from its verifying forwards: see
``kv_tap.py``) for the first ``sinks`` positions of its text and for the latest ``window`` ones, so the cache holds
at most ``sinks + window`` entries per row and layer, whatever the context. Keys stay rotated at their true
positions: a draft's queries use true positions too, so drafting attends over the sinks and the window as the full
model sees them (StreamingLLM's eviction, the original positions kept; StreamingLLM itself re-numbers positions
inside its cache).

Layout, one store per layer ``[R, H, C, D]`` (rows, key-value heads, slots, head size)::

    slot:   0 .. sinks-1       sinks .. sinks+window-1
            the row's first    a ring: position p >= sinks lives in slot sinks + (p - sinks) % window,
            positions          so a new token overwrites the oldest one of the window (the eviction)

Slots are in no particular order past the sinks; attention does not care, since every key carries its position in
its rotation, and ``filled`` ``[R, C]`` says which slots hold a token (a short row's others are masked). The store
grows to ``sinks + window`` slots as rows get longer, never further.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...core import kv_cache


class WindowCache:
    """The bounded caches of a group of rows (see the module docstring).

    Args:
        sinks (`int`): positions kept from the start of each row.
        window (`int`): latest positions kept per row.
    """

    def __init__(self, sinks: int, window: int):
        self.sinks, self.window = sinks, window
        self.rows = 0
        self.keys: list[torch.Tensor] | None = None    # per layer [R, H, C, D]
        self.values: list[torch.Tensor] | None = None
        self.filled: torch.Tensor | None = None        # [R, C] bool

    @property
    def bound(self) -> int:
        """The most slots a row can hold: ``sinks + window``."""
        return self.sinks + self.window

    @property
    def capacity(self) -> int:
        """Slots per row allocated now (at most :attr:`bound`)."""
        return 0 if self.filled is None else self.filled.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes the stores hold now, keys and values of every layer and row."""
        if self.keys is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    # -- rows -----------------------------------------------------------------------------------
    def add_row(self) -> int:
        """A new, empty row; returns its index."""
        if self.keys is not None:
            self.keys = [torch.cat([t, t.new_zeros(1, *t.shape[1:])]) for t in self.keys]
            self.values = [torch.cat([t, t.new_zeros(1, *t.shape[1:])]) for t in self.values]
            self.filled = torch.cat([self.filled, self.filled.new_zeros(1, self.capacity)])
        self.rows += 1
        return self.rows - 1

    def remove_row(self, row: int) -> None:
        """Drop row ``row``; the rows after it move down by one."""
        if self.keys is not None:
            keep = torch.tensor([r for r in range(self.rows) if r != row], dtype=torch.long,
                                device=self.filled.device)
            self.keys = [t.index_select(0, keep) for t in self.keys]
            self.values = [t.index_select(0, keep) for t in self.values]
            self.filled = self.filled.index_select(0, keep)
        self.rows -= 1

    # -- writing ---------------------------------------------------------------------------------
    def slots(self, positions: torch.Tensor) -> torch.Tensor:
        """The slot of each position ``[n]``: itself among the sinks, else its place in the ring."""
        ring = self.sinks + (positions - self.sinks).remainder(self.window)
        return torch.where(positions < self.sinks, positions, ring)

    def kept(self, start: int, n: int) -> torch.Tensor:
        """Which of ``n`` new tokens at positions ``start, start + 1, ...`` the cache keeps, ``[n]`` bool: the sinks
        and the last ``window`` (an older one would be overwritten by a newer one at once)."""
        positions = torch.arange(start, start + n)
        return (positions < self.sinks) | (positions >= start + n - self.window)

    def write(self, row: int, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], positions: torch.Tensor) -> None:
        """Put tokens of a row into its cache, a newer one over the oldest of the window.

        Args:
            row (`int`): the row.
            layers: per layer ``(keys, values)``, each ``[H, n, D]``: the target's own, for those ``n`` tokens.
            positions (`torch.Tensor`): ``[n]`` their positions in the row's text, at most ``window`` of them past the
                sinks (:meth:`kept` picks them).
        """
        if positions.numel() == 0:
            return
        slots = self.slots(positions.to(layers[0][0].device))
        self._allocate(layers, int(slots.max()) + 1)
        for store_k, store_v, (keys, values) in zip(self.keys, self.values, layers):
            store_k[row].index_copy_(1, slots, keys.to(store_k.dtype))
            store_v[row].index_copy_(1, slots, values.to(store_v.dtype))
        self.filled[row, slots] = True

    def _allocate(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], needed: int) -> None:
        """Make the stores (shaped after ``layers``) hold at least ``needed`` slots: they double up to the bound."""
        if self.keys is not None and needed <= self.capacity:
            return
        size = min(self.bound, max(needed, 2 * self.capacity, 16))

        def grown(old: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
            shape = (self.rows, like.shape[0], size, like.shape[-1])  # [R, H, C, D]
            new = like.new_zeros(shape)
            if old is not None:
                new[:, :, : old.shape[2]] = old
            return new

        old_k, old_v = self.keys or [None] * len(layers), self.values or [None] * len(layers)
        self.keys = [grown(o, k) for o, (k, _) in zip(old_k, layers)]
        self.values = [grown(o, v) for o, (_, v) in zip(old_v, layers)]
        filled = torch.zeros(self.rows, size, dtype=torch.bool, device=layers[0][0].device)
        if self.filled is not None:
            filled[:, : self.filled.shape[1]] = self.filled
        self.filled = filled

    # -- drafting ---------------------------------------------------------------------------------
    def draft_cache(self, rows: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """A transformers ``DynamicCache`` holding the caches of ``rows`` (``[R']`` indices; the drafter's
        forwards append to it, and it is thrown away after the draft, so the drafted tokens never enter the
        stores), and which of its slots hold a token, ``[R', C]`` bool."""
        from ...core.kv_room import make_room

        cache = kv_cache.new_dynamic_cache()
        every = rows.numel() == self.rows and bool((rows == torch.arange(self.rows, device=rows.device)).all())
        for layer, (keys, values) in enumerate(zip(self.keys, self.values)):
            if not every:
                keys, values = keys.index_select(0, rows), values.index_select(0, rows)
            cache.update(keys, values, layer)  # (copied: the stores are never written by a forward)
        make_room(cache)  # each draft step writes its token in place, not a copy of the whole cache (CPU)
        return cache, (self.filled if every else self.filled.index_select(0, rows))
