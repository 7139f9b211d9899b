"""One target forward over a draft tree, through the stock transformers model.

The model gets the root and the tree's nodes as one sequence, a 4-D attention mask built from the
tree (:func:`hf_speculative.core.tree.visibility`) and depth-based position ids. transformers passes a 4-D
mask through unchanged (``masking_utils``: "already prepared, or custom"), so nothing of the model is
copied or patched. Models whose layers differ in attention (Gemma3's sliding-window and global layers)
take one mask per layer type, as a dict keyed by ``config.layer_types``' names.

Afterwards :func:`keep_path` leaves the target's cache holding the prefix, the root and the accepted
path only. :class:`DynamicVerifier` is the verifier the loop calls (through :class:`RowVerifier`, the ladder's one verifier
protocol); ``static_cache.StaticVerifier`` is the same at one fixed shape on a static cache.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import compat
from . import kv_cache, sdpa
from .call import TargetView
from .kv_room import make_room
from .tree import DraftTree, additive_mask, position_ids, visibility

# Attention implementations that add a 4-D float mask to their scores (eager) or take it as is (SDPA).
# Flash attention reads only a 2-D padding mask and would silently let siblings see each other.
TREE_ATTENTION = ("eager", *sdpa.SDPA_NAMES)

class TreeAttentionError(ValueError):
    """The model cannot verify a draft tree in one forward."""


def check_tree_attention(model: torch.nn.Module) -> None:
    """Raise :class:`TreeAttentionError` naming the model's type when it cannot take a tree mask."""
    config = compat.text_config(model.config)
    implementation = getattr(model.config, "_attn_implementation", None) or "eager"
    if implementation not in TREE_ATTENTION:
        raise TreeAttentionError(
            f"{type(model).__name__} uses attn_implementation={implementation!r}, which cannot take a tree "
            f"attention mask; load it with attn_implementation='sdpa' or 'eager' to verify draft trees "
            f"(chains, tree=None, work with any attention).")
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    unknown = kinds - {"full_attention", "sliding_attention"}
    if unknown:
        raise TreeAttentionError(
            f"{type(model).__name__} has layers of type {sorted(unknown)}, which a tree attention mask cannot "
            f"describe; use chains (tree=None) with this model.")


def _window(config: Any, kind: str) -> int | None:
    """The sliding window a layer of ``kind`` applies, or ``None`` for global attention."""
    window = getattr(config, "sliding_window", None)
    if kind == "full_attention" or not window:
        return None
    return int(window)


def tree_masks(model: torch.nn.Module, tree: DraftTree, prefix_length: int, dtype: torch.dtype,
               fresh: int = 0) -> Any:
    """The ``attention_mask=`` argument for verifying ``tree`` after ``prefix_length`` tokens, the last
    ``fresh`` of them not cached yet: one ``[1, 1, fresh + 1 + n, prefix_length + 1 + n]`` float mask, or
    a dict of them by layer type."""
    config = compat.text_config(model.config)
    kinds = getattr(config, "layer_types", None)

    def mask(kind: str) -> torch.Tensor:
        return additive_mask(visibility(tree, prefix_length, _window(config, kind), fresh), dtype)

    if kinds and len(set(kinds)) > 1:
        return {kind: mask(kind) for kind in sorted(set(kinds))}
    # One kind of layer: Mistral-style models apply `sliding_window` to every layer when it is set
    # (and Qwen2 only with `use_sliding_window`, which its layer_types already say).
    return mask(kinds[0] if kinds else ("sliding_attention" if getattr(config, "use_sliding_window", True)
                                        else "full_attention"))


def prefill_room(model: torch.nn.Module, fresh_tokens: int) -> int | None:
    """The most draft nodes a first forward of ``fresh_tokens`` uncached tokens may carry and still run as one forward
    (``None``: any number). On a model whose forwards of up to ``sdpa.CPU_ROWWISE_TOKENS`` tokens compute each row as a
    one-token forward does (bf16 on the CPU kernel) a longer first forward runs as two (:func:`_prefill_apart`), and
    a draft there is then never worth drafting: its own forward costs a step, which the next step's draft, made
    knowing the prefill's token, gets for the same price. So the loop drafts at most this many there (rows.SoloWidth)."""
    if fresh_tokens > 1 and getattr(model.config, "_attn_implementation", None) == sdpa.CPU_ATTENTION:
        return max(sdpa.CPU_ROWWISE_TOKENS - fresh_tokens, 0)
    return None


def _prefill_apart(model: torch.nn.Module, fresh_tokens: int, nodes: int) -> bool:
    """Whether a first forward (a prompt and a draft) runs as two: on a model whose forwards of up to
    ``sdpa.CPU_ROWWISE_TOKENS`` tokens compute each row as a one-token forward does (bf16 on the CPU kernel), a
    longer one would not, so the prompt runs alone, as plain decoding's prefill, and the draft after it (a draft
    the loop itself made stays within :func:`prefill_room`; a caller's transformers loop may not)."""
    room = prefill_room(model, fresh_tokens)
    return nodes > 0 and room is not None and nodes > room


def _prefill_then_nodes(model: torch.nn.Module, cache: Any, ids: torch.Tensor, m: int, tree: DraftTree,
                        prefix_length: int, fresh: int) -> torch.Tensor:
    """``forward_tree``'s logits `[1 + n, V]` from two forwards: the ``m`` uncached tokens (`ids[:, :m]`, the root
    last) with the model's causal mask, as plain decoding's prefill runs them, then the ``n`` nodes."""
    cached = {compat.cache_kwarg(): cache}
    root = model(input_ids=ids[:, :m], use_cache=True, **cached, **compat.logits_to_keep_kwargs(model, 1)).logits
    keep = compat.logits_to_keep_kwargs(model, tree.size)
    if tree.is_chain():
        nodes = model(input_ids=ids[:, m:], use_cache=True, **cached, **keep).logits
    else:  # the nodes' rows of the whole forward's positions and masks
        dtype = model.get_input_embeddings().weight.dtype
        masks = tree_masks(model, tree, prefix_length, dtype, fresh)
        masks = {k: v[:, :, m:] for k, v in masks.items()} if isinstance(masks, dict) else masks[:, :, m:]
        nodes = model(input_ids=ids[:, m:], position_ids=position_ids(tree, prefix_length, fresh)[:, m:],
                      attention_mask=masks, use_cache=True, **cached, **keep).logits
    return torch.cat([root[0, -1:], nodes[0, -tree.size:]])  # [1 + n, V]


def forward_tree(model: torch.nn.Module, cache: Any, uncached: torch.Tensor | int, tree: DraftTree) -> torch.Tensor:
    """Run the target once over the tokens ``uncached`` (``[m]``, ``m >= 1``: the tokens after the cache's
    end; the last one is the tree's root) and every node of ``tree``.

    Returns ``[1 + n, V]`` logits: row 0 the root's, row ``1 + i`` node ``i``'s (the lm_head runs on those
    rows only). ``cache`` grows by ``m + n`` positions.
    """
    device = model.get_input_embeddings().weight.device
    uncached = torch.as_tensor(uncached, dtype=torch.long, device=device).reshape(-1)  # [m]
    fresh = uncached.numel() - 1
    prefix_length = kv_cache.cache_length(cache) + fresh  # tokens before the root
    if tree.tokens.device != device:
        tree = DraftTree(tree.tokens.to(device), tree.parents.to(device))
    ids = torch.cat([uncached, tree.tokens]).unsqueeze(0)  # [1, m + n]
    keep = compat.logits_to_keep_kwargs(model, 1 + tree.size)
    if _prefill_apart(model, uncached.numel(), tree.size):
        return _prefill_then_nodes(model, cache, ids, uncached.numel(), tree, prefix_length, fresh)
    if tree.is_chain():  # the fast path: the model's own causal masks (and SDPA's causal kernel)
        out = model(input_ids=ids, use_cache=True, **{compat.cache_kwarg(): cache}, **keep)
    else:
        dtype = model.get_input_embeddings().weight.dtype
        out = model(input_ids=ids, position_ids=position_ids(tree, prefix_length, fresh),
                    attention_mask=tree_masks(model, tree, prefix_length, dtype, fresh),
                    use_cache=True, **{compat.cache_kwarg(): cache}, **keep)
    return out.logits[0, -(1 + tree.size):]  # [1 + n, V]


def keep_path(cache: Any, prefix_length: int, tree: DraftTree, path: Sequence[int]) -> None:
    """After :func:`forward_tree` at ``prefix_length``: keep the prefix, the root and ``path``'s nodes."""
    kv_cache.keep_tree_path(cache, prefix_length + 1, path, tree.size)


class RowVerifier:
    """The one verifier protocol of the loop's ladder, for a verifier of one row (:class:`DynamicVerifier`, a
    static-cache one): ``forward(pending [1, m], mask, [tree]) -> [1, 1 + n, V]``, ``keep([path])``, ``tidy()``,
    ``close()`` (no ``select``: one row never leaves half of a batch), as ``batch_verify.BatchVerifier`` speaks it
    for several rows. ``length``: the verified tokens in its cache (a cache the caller passed may hold some).
    Subclasses implement ``forward_row(uncached, tree) -> [1 + n, V]`` and ``keep_row(prefix_length, tree, path)``."""

    length = 0
    _tree: DraftTree | None = None
    _prefix = 0

    def forward(self, pending: torch.Tensor, pending_mask: torch.Tensor, trees: Sequence[DraftTree]) -> torch.Tensor:
        self._tree, self._prefix = trees[0], self.length + pending.shape[1] - 1  # the new root's position
        return self.forward_row(pending[0], trees[0])[None]

    def keep(self, paths: Sequence[Sequence[int]]) -> None:
        self.keep_row(self._prefix, self._tree, paths[0])
        self.length = self._prefix + 1 + len(paths[0])

    def tidy(self) -> None:
        pass


class DynamicVerifier(RowVerifier):
    """The default: a ``DynamicCache`` grown by each forward and cropped to the accepted path.

    Chains verify with the model's own causal masks, so any attention implementation serves them; the
    model's attention is checked for tree masks at the first branching tree (``trees=True``: at once, for a
    call whose strategy drafts trees, so that it fails before generating). ``cache``: a dynamic cache to fill
    (the caller's), else a new one, whose layers then write new positions in place (kv_room.py) after the
    first forward made them."""

    budget = 64  # the most draft nodes a step verifies
    cost_key = None  # verification costs are the dynamic forward's own (not a padded one's)

    def __init__(self, model: torch.nn.Module, trees: bool = False, cache: Any = None, cached: int = 0):
        self.length = cached  # the prompt's first tokens in the caller's cache
        if trees:
            check_tree_attention(model)
        self.model, self._checked = model, trees
        self.view = TargetView()  # drafters that read the target's hidden states take them from forward hooks
        self.cache = kv_cache.new_dynamic_cache() if cache is None else cache
        self._roomy = cache is not None  # a cache of our own writes in place once its layers exist (kv_room.py)

    def forward_row(self, uncached: torch.Tensor, tree: DraftTree) -> torch.Tensor:
        if not self._checked and not tree.is_chain():
            check_tree_attention(self.model)
            self._checked = True
        logits = forward_tree(self.model, self.cache, uncached, tree)  # [1 + n, V]
        if not self._roomy:
            make_room(self.cache)
            self._roomy = True
        return logits

    def keep_row(self, prefix_length: int, tree: DraftTree, path: Sequence[int]) -> None:
        keep_path(self.cache, prefix_length, tree, path)

    def close(self) -> None:
        self.cache = None
