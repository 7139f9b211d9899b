"""MagicDec's second KV cache: per row, its attention sinks and a sliding window of its latest tokens, bounded.

Each row keeps the keys and values the target itself computed (read from its verifying forwards: see
``kv_tap.py``) for the first ``sinks`` positions of its text and for the latest ``window`` ones, so the cache holds
at most ``sinks + window`` entries per row and layer, whatever the context. Keys stay rotated at their true
positions: a draft's queries use true positions too, so drafting attends over the sinks and the window as the full
model sees them (StreamingLLM's eviction, the original positions kept; StreamingLLM itself re-numbers positions
inside its cache).

Layout, one store for keys and one for values over every layer, ``[L, R, H, C, D]`` (layers, rows, key-value heads,
slots, head size), so that a row's tokens enter every layer in one copy (:meth:`WindowCache.write`; ``keys`` and
``values`` are the per-layer views ``[R, H, C, D]``)::

    slot:   0 .. sinks-1       sinks .. sinks+window-1
            the row's first    a ring: position p >= sinks lives in slot sinks + (p - sinks) % window,
            positions          so a new token overwrites the oldest one of the window (the eviction)

Slots are in no particular order past the sinks; attention does not care, since every key carries its position in
its rotation, and ``filled`` ``[R, C]`` says which slots hold a token (a short row's others are masked). The store
grows to ``sinks + window`` slots as rows get longer, never further.
"""

from __future__ import annotations

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
        self._k: torch.Tensor | None = None    # [L, R, H, C, D]
        self._v: torch.Tensor | None = None
        self.filled: torch.Tensor | None = None  # [R, C] bool

    @property
    def keys(self) -> list[torch.Tensor] | None:
        """Per layer the rows' keys ``[R, H, C, D]`` (views of the store)."""
        return None if self._k is None else list(self._k.unbind(0))

    @property
    def values(self) -> list[torch.Tensor] | None:
        return None if self._v is None else list(self._v.unbind(0))

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
        if self._k is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self._k, self._v))

    # -- rows -----------------------------------------------------------------------------------
    def add_row(self) -> int:
        """A new, empty row; returns its index."""
        if self._k is not None:
            self._k = torch.cat([self._k, self._k.new_zeros(self._k.shape[0], 1, *self._k.shape[2:])], dim=1)
            self._v = torch.cat([self._v, self._v.new_zeros(self._v.shape[0], 1, *self._v.shape[2:])], dim=1)
            self.filled = torch.cat([self.filled, self.filled.new_zeros(1, self.capacity)])
        self.rows += 1
        return self.rows - 1

    def remove_row(self, row: int) -> None:
        """Drop row ``row``; the rows after it move down by one."""
        if self._k is not None:
            keep = torch.tensor([r for r in range(self.rows) if r != row], dtype=torch.long,
                                device=self.filled.device)
            self._k, self._v = self._k.index_select(1, keep), self._v.index_select(1, keep)
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

    def write(self, row: int, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Put tokens of a row into its cache, a newer one over the oldest of the window.

        Args:
            row (`int`): the row.
            keys, values (`torch.Tensor`): ``[L, H, n, D]`` each: the target's own, for those ``n`` tokens, every
                layer.
            positions (`torch.Tensor`): ``[n]`` their positions in the row's text, at most ``window`` of them past the
                sinks (:meth:`kept` picks them).
        """
        if positions.numel() == 0:
            return
        slots = self.slots(positions.to(keys.device))
        self._allocate(keys, int(slots.max()) + 1)
        self._k.select(1, row).index_copy_(2, slots, keys.to(self._k.dtype))  # [L, H, C, D] <- [L, H, n, D]
        self._v.select(1, row).index_copy_(2, slots, values.to(self._v.dtype))
        self.filled[row, slots] = True

    def _allocate(self, like: torch.Tensor, needed: int) -> None:
        """Make the stores (shaped after ``like``, ``[L, H, n, D]``) hold at least ``needed`` slots: they double up
        to the bound."""
        if self._k is not None and needed <= self.capacity:
            return
        size = min(self.bound, max(needed, 2 * self.capacity, 16))

        def grown(old: torch.Tensor | None) -> torch.Tensor:
            new = like.new_zeros(like.shape[0], self.rows, like.shape[1], size, like.shape[-1])  # [L, R, H, C, D]
            if old is not None:
                new[..., : old.shape[3], :] = old
            return new

        self._k, self._v = grown(self._k), grown(self._v)
        filled = torch.zeros(self.rows, size, dtype=torch.bool, device=like.device)
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
        for layer, (keys, values) in enumerate(zip(self._k.unbind(0), self._v.unbind(0))):
            if not every:
                keys, values = keys.index_select(0, rows), values.index_select(0, rows)
            cache.update(keys, values, layer)  # (copied: the stores are never written by a forward)
        make_room(cache)  # each draft step writes its token in place, not a copy of the whole cache (CPU)
        return cache, (self.filled if every else self.filled.index_select(0, rows))
