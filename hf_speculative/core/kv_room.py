"""A dynamic cache that writes new keys and values in place instead of copying the whole cache each forward.

transformers' ``DynamicLayer.update`` appends with ``torch.cat([keys, new], dim=-2)``: every forward copies every
layer's keys and values, so a forward's cost grows with the context by that copy on top of attention. On a CPU it
is a visible share of a step: SmolLM2-135M (30 layers, 3 KV heads of 64) copies 24 MB per forward at a
1,536-token context, about 6 ms of a 40 ms one-token forward, and plain decoding and verification pay it alike.

:func:`make_room` gives a cache's full-attention layers room to grow: each keeps a store ``[B, H, capacity, D]``
with free positions after its ``length`` and exposes ``keys`` / ``values`` as the views ``store[..., :length, :]``,
so everything that reads them (the model's attention, ``get_seq_length``, our tree-path moves, which write through
the views) sees a dynamic cache. An update writes the new positions after ``length`` (``copy_``) and re-takes the
views; the store grows by at least a quarter when full, so copies of the whole cache become rare. Crops need
nothing: ``DynamicLayer.crop`` slices the view, and a view that still starts the store with its strides is
adopted as the new length. Anything else assigned to ``keys`` / ``values`` (a batch's row selection, a legacy
conversion) is copied into a fresh store at the next update.

A layer whose keys and values are still small (under :data:`COPY_BELOW_BYTES`, about half a core's L2 cache) is
appended by copying, as transformers does, and gets its store when it grows past that: at that size the copy is
cheap and leaves the cache in the core's cache for the attention that reads it next, while a store is read cold at
every step (the weights streamed since evicted it). On this CPU (SmolLM2-135M fp32, one thread) in-place writes cost
0.5 ms a step at a 40-90-token context and ~0.1 ms at 150-200, and neither way wins at ~550 tokens (2 x 384 KB a
layer); at 8 rows x 4,096 tokens they save 140 ms of a 337 ms step.

Positions past ``length`` are overwritten by later updates, so a view taken before a crop no longer holds what it
held: nothing in the loop keeps one (each forward reads the layers' current views), and the cache is ours (a cache
the caller passed to ``generate()`` keeps transformers' layers).
"""

from __future__ import annotations

from typing import Any

import torch

_MIN_SPARE = 256  # positions of room given beyond what a store needs at least (a few hundred steps of decoding)
COPY_BELOW_BYTES = 512 * 1024  # a layer's keys + values smaller than this are appended by copying (module docstring)


def _update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
    """``DynamicLayer.update`` writing in place: the new positions go after ``length`` in the stores
    (``self._hfs_keys`` / ``self._hfs_values``, ``[B, H, capacity, D]``), ``keys`` / ``values`` are their views."""
    keys, values = getattr(self, "keys", None), getattr(self, "values", None)
    new = key_states.shape[-2]
    # the common step first: the views this update handed out are still the layer's and the store has room (a
    # decoding step costs two narrow copies, about what transformers' two cats cost at a short context)
    if keys is not None and keys is getattr(self, "_hfs_key_view", None) and values is self._hfs_value_view:
        length = keys.shape[-2]
        if length + new <= self._hfs_keys.shape[-2]:
            return _write(self, length, new, key_states, value_states)
    if not getattr(self, "is_initialized", False) or not isinstance(keys, torch.Tensor) or keys.numel() == 0:
        return super(type(self), self).update(key_states, value_states, *args, **kwargs)
    length = keys.shape[-2]
    stores = getattr(self, "_hfs_keys", None), getattr(self, "_hfs_values", None)
    if not (_starts(keys, stores[0]) and _starts(values, stores[1])):
        if (keys.numel() + values.numel()) * keys.element_size() < COPY_BELOW_BYTES:
            return super(type(self), self).update(key_states, value_states, *args, **kwargs)  # small: copied
        self._hfs_keys, self._hfs_values = _store(keys, length + new), _store(values, length + new)
    elif length + new > stores[0].shape[-2]:
        self._hfs_keys = _store(stores[0][..., :length, :], length + new)
        self._hfs_values = _store(stores[1][..., :length, :], length + new)
    return _write(self, length, new, key_states, value_states)


def _write(self, length: int, new: int, key_states: torch.Tensor, value_states: torch.Tensor):
    """Write ``new`` positions after ``length`` into the stores and hand out the views ``store[..., :length + new, :]``
    (remembered: while the layer still holds them, the next update needs no check)."""
    self._hfs_keys.narrow(-2, length, new).copy_(key_states)
    self._hfs_values.narrow(-2, length, new).copy_(value_states)
    self.keys = self._hfs_key_view = self._hfs_keys.narrow(-2, 0, length + new)
    self.values = self._hfs_value_view = self._hfs_values.narrow(-2, 0, length + new)
    return self.keys, self.values


def _starts(view: torch.Tensor, store: torch.Tensor | None) -> bool:
    """Whether ``view`` is ``store[..., :n, :]`` for some ``n`` (what a crop of our own view leaves)."""
    return (store is not None and view.data_ptr() == store.data_ptr() and view.stride() == store.stride()
            and view.shape[:2] == store.shape[:2] and view.shape[-1] == store.shape[-1]
            and view.shape[-2] <= store.shape[-2])


def _store(prefix: torch.Tensor, needed: int) -> torch.Tensor:
    """A store with ``prefix`` (``[B, H, n, D]``) copied in and room for at least ``needed`` positions."""
    capacity = needed + max(_MIN_SPARE, needed // 4)
    store = prefix.new_empty(*prefix.shape[:2], capacity, prefix.shape[-1])  # [B, H, capacity, D]
    store[..., :prefix.shape[-2], :].copy_(prefix)
    return store


_CLASSES: dict[type, type] = {}


def _roomy_class(base: type) -> type:
    """``base`` (a ``DynamicLayer``) with :func:`_update`: one subclass adding no slots, so that a layer's class can
    be swapped in place (``layer.__class__``); importable by name, so that a returned cache pickles."""
    if base not in _CLASSES:
        name = f"Roomy{base.__name__}"
        cls = _CLASSES[base] = type(name, (base,), {"update": _update, "__module__": __name__, "__qualname__": name})
        globals()[name] = cls
    return _CLASSES[base]


def make_room(cache: Any) -> int:
    """Give ``cache``'s full-attention dynamic layers on the CPU room to grow in place (see the module docstring);
    idempotent. Layers of other kinds (sliding windows, static, quantized), other devices and caches without layer
    objects (transformers < 4.56) are left as they are. Returns how many layers changed."""
    from transformers.cache_utils import DynamicLayer

    changed = 0
    for layer in getattr(cache, "layers", None) or []:
        keys = getattr(layer, "keys", None)
        if type(layer) is not DynamicLayer or not isinstance(keys, torch.Tensor) or keys.device.type != "cpu":
            continue
        layer.__class__ = _roomy_class(DynamicLayer)
        changed += 1
    return changed
