"""A draft model (any stock transformers causal LM) drafting a tree: one drafter forward per depth.

The drafter's cache holds the verified sequence, the root (the newest verified token) last. Growing a tree feeds
the nodes chosen for expansion, depth by depth, each frontier in one forward after the ones before: the cache
then holds the prefix followed by every expanded node in feeding order, which is itself a draft tree (each
expanded node's parent was expanded before it). A frontier's tokens attend to that tree as the target's do when it
verifies one (:func:`hf_speculative.core.verify.tree_masks`: the prefix, the root, their ancestors, themselves; a
sliding window where the model has one) at depth-based positions; their rows of the full mask are the last ones.
The speculative entries are cropped off once the tree is drafted, so the cache holds verified tokens only.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ... import compat
from ...core import kv_cache
from ...core.tree import ROOT, DraftTree, position_ids
from ...core.verify import tree_masks


def model_tree_expander(model: torch.nn.Module, cache: Any, logits_of: Callable[[torch.Tensor], torch.Tensor]):
    """An ``expand(frontier, tokens, parents) -> [k, V] logits`` over ``model``'s ``cache``.

    ``cache`` holds the verified sequence, the root last (``kv_cache.cache_length(cache)`` tokens); ``logits_of``
    maps the drafter's logits ``[k, V_draft]`` to the target's vocabulary ``[k, V]``. Returns the expander and a
    ``crop()`` that drops what the expansions wrote.
    """
    prefix_length = kv_cache.cache_length(cache) - 1  # tokens before the root
    fed_tokens: list[int] = []
    fed_parents: list[int] = []  # index into the fed nodes, ROOT for the root's children
    fed_index: dict[int, int] = {}  # the grower's node index -> its index among the fed nodes
    dtype = model.get_input_embeddings().weight.dtype

    def expand(frontier: list[int], tokens: torch.Tensor, parents: list[int]) -> torch.Tensor:
        k = len(frontier)
        for node, token, parent in zip(frontier, tokens.tolist(), parents):
            fed_index[node] = len(fed_tokens)
            fed_tokens.append(int(token))
            fed_parents.append(ROOT if parent == ROOT else fed_index[parent])
        device = next(model.parameters()).device
        fed = DraftTree(torch.tensor(fed_tokens, dtype=torch.long, device=device),
                        torch.tensor(fed_parents, dtype=torch.long, device=device))
        masks = tree_masks(model, fed, prefix_length, dtype)  # [1, 1, 1 + n, prefix + 1 + n] (or one per layer type)
        masks = ({kind: m[:, :, -k:] for kind, m in masks.items()} if isinstance(masks, dict)
                 else masks[:, :, -k:])  # the frontier's rows
        positions = position_ids(fed, prefix_length)[:, -k:]  # [1, k]
        out = model(input_ids=fed.tokens[-k:][None], position_ids=positions, attention_mask=masks, use_cache=True,
                    **{compat.cache_kwarg(): cache}, **compat.logits_to_keep_kwargs(model, k))
        return logits_of(out.logits[0, -k:]).float()  # [k, V]: the grower processes and normalises them

    def crop() -> None:
        if fed_tokens:
            compat.crop_cache(cache, len(fed_tokens))

    return expand, crop
