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

from ...core.tree import ROOT
from .model import DraftKVCache, EagleDraftModel


class Branches:
    """What one step's expansions know of the nodes drafted so far: each expanded node's drafter output, cache
    slot and depth, and the cache slots of its expanded ancestors (shared with the fixed-shape expander,
    ``static_drafting``)."""

    def __init__(self, root_hidden: torch.Tensor):
        self.hidden_of: dict[int, torch.Tensor] = {ROOT: root_hidden}  # node -> drafter output at the node
        self.slot_of: dict[int, int] = {}  # expanded node -> its entry in the drafter's cache
        self.depth_of: dict[int, int] = {ROOT: -1}
        self.ancestors: dict[int, list[int]] = {ROOT: []}  # node -> cache slots of its expanded ancestors

    def enter(self, frontier: list[int], parents: list[int], root_position: int):
        """Place the frontier under its parents. Returns each node's ancestors' slots, its position, and the
        parents' outputs ``[k, H]`` (the drafter's input beside the nodes' tokens)."""
        for node, parent in zip(frontier, parents):
            self.depth_of[node] = self.depth_of[parent] + 1
            self.ancestors[node] = self.ancestors[parent] + ([self.slot_of[parent]] if parent != ROOT else [])
        return ([self.ancestors[n] for n in frontier], [root_position + self.depth_of[n] for n in frontier],
                torch.stack([self.hidden_of[p] for p in parents]))

    def expanded(self, frontier: list[int], out: torch.Tensor, past: int) -> None:
        """The frontier's outputs ``[k, H]``, written to the cache from slot ``past`` on."""
        for i, node in enumerate(frontier):
            self.hidden_of[node] = out[i]
            self.slot_of[node] = past + i


def tree_expander(net: EagleDraftModel, embed: torch.nn.Module, cache: DraftKVCache, n_true: int, root_position: int,
                  root_hidden: torch.Tensor, logits_of: Callable[[torch.Tensor], torch.Tensor]):
    """An ``expand(frontier, tokens, parents) -> [k, V] logits`` over ``net``'s cache.

    ``cache`` holds the true prefix ``[0, n_true)``; ``root_position`` is the root's position (the last
    verified token); ``root_hidden`` `[H]` the drafter's output predicting the root's children;
    ``logits_of`` maps output hidden states ``[k, H]`` to logits over the target's vocabulary ``[k, V]``.
    """
    branches = Branches(root_hidden)

    def expand(frontier: list[int], tokens: torch.Tensor, parents: list[int]) -> torch.Tensor:
        device = root_hidden.device
        k, past = len(frontier), cache.length
        ancestors, positions, hidden_in = branches.enter(frontier, parents, root_position)
        mask = torch.zeros(k, past + k, dtype=torch.bool, device=device)  # [k, past + k]
        mask[:, :n_true] = True
        for i, slots in enumerate(ancestors):
            mask[i, slots] = True
            mask[i, past + i] = True
        positions = torch.tensor([positions], device=device)  # [1, k]
        out = net(embed(tokens.to(device)[None]), hidden_in[None], positions, cache, fused=False, attn_mask=mask)
        branches.expanded(frontier, out[0], past)  # out: [1, k, H]
        return logits_of(out[0]).float()  # [k, V]: the grower processes and normalises them per branch

    return expand


def device_tree_expander(net: EagleDraftModel, embed: torch.nn.Module, cache: DraftKVCache, n_true: int,
                         root_position: int, root_hidden: torch.Tensor,
                         logits_of: Callable[[torch.Tensor], torch.Tensor], nodes: int):
    """:func:`tree_expander` for :func:`~hf_speculative.core.tree_shapes.grow_dynamic_on_device`: an
    ``expand(frontier [W], tokens [W], parents [W], level) -> [W, V]`` whose bookkeeping stays on the device: each
    drafted node's drafter output, and each expanded node's row of the attention mask (the true prefix, the entries
    its ancestors wrote, its own), from which its children's rows start. ``nodes``: the most nodes the growth
    drafts. The cache holds the true prefix ``[0, n_true)`` when the tree starts (after the catch-up)."""
    device = root_hidden.device
    hidden = root_hidden.new_zeros(nodes + 1, root_hidden.shape[-1])  # [N + 1, H]: row 0 the root, row n + 1 node n
    hidden[0] = root_hidden
    # [N + 1, N] each node's row of the mask over this step's entries (the cache holds the true prefix [0, n_true)
    # when the tree starts, then the entries its expansions write); every row sees the whole prefix besides
    seen = torch.zeros(nodes + 1, nodes, dtype=torch.bool, device=device)
    prefix = torch.ones(1, n_true, dtype=torch.bool, device=device)

    def expand(frontier: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
        width, drafted = frontier.shape[0], cache.length - n_true
        rows = seen[parents + 1, :drafted + width]  # [W, drafted + W]: its parent's row (a copy) ...
        rows.diagonal(offset=drafted).fill_(True)  # ... and its own entry
        mask = torch.cat([prefix.expand(width, -1), rows], dim=1)  # [W, n_true + drafted + W]
        positions = torch.full((1, width), root_position + level, device=device)  # [1, W]
        out = net(embed(tokens[None]), hidden[parents + 1][None], positions, cache, fused=False, attn_mask=mask)
        seen[frontier + 1, :drafted + width] = rows
        hidden[frontier + 1] = out[0]  # out: [1, W, H]
        return logits_of(out[0]).float()  # [W, V]

    return expand
