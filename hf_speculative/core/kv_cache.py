"""KV-cache surgery: the caches our forwards write, and what the loop does to them after a verdict.

A tree verification writes every node's keys and values after the verified prefix; the verdict keeps an accepted
path (:func:`keep_tree_path`: moved down along the sequence axis, the rest cropped). A batch with holes moves each
row's accepted path to the front of its step's slots (:func:`gather_cache_slots`), re-packs rows
(:func:`reorder_cache_slots`) and drops finished ones (:func:`select_cache_rows`). Where a cache keeps its tensors
differs between transformers versions; ``compat`` says where (``cache_tensors``, ``replace_cache_tensors``,
``crop_cache``), and nothing here looks at versions.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import compat


def new_dynamic_cache() -> Any:
    """An empty full-attention ``DynamicCache`` (no sliding layers, so it can always be cropped)."""
    from transformers import DynamicCache

    return DynamicCache()


def new_static_cache(model: Any, capacity: int) -> Any:
    """A transformers ``StaticCache`` of ``capacity`` positions for ``model`` (its tensors are made at the
    first forward, on the model's device and dtype)."""
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=int(capacity))


def cache_length(cache: Any) -> int:
    """Positions a cache holds (0 for ``None``)."""
    return 0 if cache is None else int(cache.get_seq_length())


# -- tree verification ----------------------------------------------------------------------------
def keep_tree_path(cache: Any, start: int, path: Any, written: int) -> None:
    """Keep only an accepted path of the nodes a tree verification wrote into ``cache``.

    The forward wrote ``written`` node positions after ``start`` (node ``i`` at ``start + i``); afterwards
    the cache holds positions ``[0, start)`` and then the nodes of ``path`` in order, nothing more. The
    path's keys and values move down along the sequence axis (``[B, H, T, D]``, axis -2) and the rest is
    cropped, so the prefix is never copied. A path ``0, 1, ..., m-1`` (a chain kept) is a plain crop.
    """
    path = move_tree_path(cache, start, path)
    compat.crop_cache(cache, written - len(path))


def move_tree_path(cache: Any, start: int, path: Any) -> list[int]:
    """Move the keys and values of the nodes ``path`` (node ``i`` written at ``start + i``) to positions
    ``start, start + 1, ...``, in place (a static cache's tensors keep their addresses). Returns the path."""
    path = [int(i) for i in path]
    if path != list(range(len(path))):
        for tensor in compat.cache_tensors(cache):
            source = torch.tensor(path, device=tensor.device) + start
            tensor[..., start: start + len(path), :] = tensor.index_select(-2, source)
    return path


# -- batches with holes (batch_verify.py) ---------------------------------------------------------
def gather_cache_slots(cache: Any, start: int, index: torch.Tensor) -> None:
    """Per row ``b``, write the slots ``start + index[b]`` to ``start, start + 1, ...`` (``index``: ``[B, A]``), in
    place: each row's accepted draft path moved to the front of its step's node slots."""
    for tensor in compat.cache_tensors(cache):
        b, h, _, d = tensor.shape
        source = (index.to(tensor.device) + start)[:, None, :, None].expand(b, h, index.shape[1], d)
        tensor[:, :, start: start + index.shape[1]] = tensor.gather(2, source)


def reorder_cache_slots(cache: Any, order: torch.Tensor) -> None:
    """Per row ``b``, the cache becomes its slots ``order[b]`` (``[B, W]``): a re-packed batch."""
    def pick(tensor: torch.Tensor) -> torch.Tensor:
        b, h, _, d = tensor.shape
        return tensor.gather(2, order.to(tensor.device)[:, None, :, None].expand(b, h, order.shape[1], d))

    compat.replace_cache_tensors(cache, pick)


def select_cache_rows(cache: Any, rows: torch.Tensor) -> None:
    """Keep the batch rows ``rows`` (``[B']`` indices) of every key and value tensor."""
    compat.replace_cache_tensors(cache, lambda tensor: tensor.index_select(0, rows.to(tensor.device)))
