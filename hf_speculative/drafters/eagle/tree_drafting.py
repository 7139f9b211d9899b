"""EAGLE drafting a tree: one drafter forward per depth over the nodes chosen for expansion.

A node's drafter input pairs its token with the drafter's output hidden state at its parent (the
predicted target feature there), at position ``root + depth``, as a chain step does. The nodes expanded
at one depth run together in one forward; each attends to the drafter's cache of true features (the
verified prefix), to the cache entries its ancestors wrote when they were expanded, and to itself. The
speculative entries stay in the drafter's cache until the next step's catch-up crops them.
"""

from __future__ import annotations

from typing import Callable

import torch

from ...tree import ROOT
from .model import DraftKVCache, EagleDraftModel


def tree_expander(net: EagleDraftModel, embed: torch.nn.Module, cache: DraftKVCache, n_true: int, root_position: int,
                  root_hidden: torch.Tensor, logits_of: Callable[[torch.Tensor], torch.Tensor]):
    """An ``expand(frontier, tokens, parents) -> [k, V] log-probabilities`` over ``net``'s cache.

    ``cache`` holds the true prefix ``[0, n_true)``; ``root_position`` is the root's position (the last
    verified token); ``root_hidden`` `[H]` the drafter's output predicting the root's children;
    ``logits_of`` maps output hidden states ``[k, H]`` to logits over the target's vocabulary ``[k, V]``.
    """
    hidden_of: dict[int, torch.Tensor] = {ROOT: root_hidden}  # node -> drafter output at the node
    slot_of: dict[int, int] = {}  # expanded node -> its entry in the drafter's cache
    depth_of: dict[int, int] = {ROOT: -1}
    ancestors: dict[int, list[int]] = {ROOT: []}  # expanded node -> cache slots of its expanded ancestors

    def expand(frontier: list[int], tokens: torch.Tensor, parents: list[int]) -> torch.Tensor:
        device = root_hidden.device
        k, past = len(frontier), cache.length
        for node, parent in zip(frontier, parents):
            depth_of[node] = depth_of[parent] + 1
            ancestors[node] = ancestors[parent] + ([slot_of[parent]] if parent != ROOT else [])
        mask = torch.zeros(k, past + k, dtype=torch.bool, device=device)  # [k, past + k]
        mask[:, :n_true] = True
        for i, node in enumerate(frontier):
            mask[i, ancestors[node]] = True
            mask[i, past + i] = True
        hidden_in = torch.stack([hidden_of[p] for p in parents])[None]  # [1, k, H]
        positions = torch.tensor([[root_position + depth_of[n] for n in frontier]], device=device)  # [1, k]
        out = net(embed(tokens.to(device)[None]), hidden_in, positions, cache, fused=False, attn_mask=mask)  # [1, k, H]
        for i, node in enumerate(frontier):
            hidden_of[node] = out[0, i]
            slot_of[node] = past + i
        return torch.log_softmax(logits_of(out[0]).float(), dim=-1)  # [k, V]

    return expand
