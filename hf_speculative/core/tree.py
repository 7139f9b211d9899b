"""Draft trees, what verification decides about them, and the mask and positions that verify them.

A drafter proposes a :class:`DraftTree`: ``n`` tokens, each with the index of its parent (``-1``: a child
of the *root*, the last verified token, whose KV is not in the cache yet). Nodes are in topological
order (a parent comes before its children), so a chain of ``k`` tokens is the tree with parents
``[-1, 0, 1, ..., k-2]``.

The target verifies the root and every node in one forward of ``1 + n`` tokens::

      prefix (in the cache)     root   a    b    c    d          tree:   root ─ a ─ b
                                                                                └─ c ─ d
    row root :  x x x x x        x                                (a, c children of the root;
    row a    :  x x x x x        x     x                           b of a; d of c)
    row b    :  x x x x x        x     x    x
    row c    :  x x x x x        x               x
    row d    :  x x x x x        x               x    x

Each node sees the prefix, the root, its ancestors and itself; its position id is the prefix length
plus one plus its depth, so siblings share a position exactly as they would in a chain. After the
verdict the cache keeps the prefix, the root and the accepted path only (``kv_cache.keep_tree_path``).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

ROOT = -1  # the parent index of the root's children
_EMPTY: dict[torch.device, torch.Tensor] = {}  # DraftTree.empty's tensor per device


@dataclasses.dataclass(frozen=True)
class DraftTree:
    """Draft tokens with their parents; a chain is the tree with one branch.

    Attributes:
        tokens: ``[n]`` int64, the drafted token of each node.
        parents: ``[n]`` int64, each node's parent index (``-1`` for children of the root), every parent
            before its children.
        q: ``[n, V]`` float, *optional*: the distribution each node's token was drawn from, given its parent and
            the siblings drafted before it (a drafter sampling under the rejection rule: siblings drawn without
            replacement each have ``q`` without the ones before; a deterministic guess in such a tree is a one-hot
            row). ``None``: every node is a point mass (an argmax, a top-k rank, copied text). See accept.py.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    q: torch.Tensor | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        tokens, parents = self.tokens, self.parents
        if tokens.dim() != 1 or parents.shape != tokens.shape:
            raise ValueError(f"DraftTree: tokens and parents must be 1-D of one length, got {tuple(tokens.shape)} "
                             f"and {tuple(parents.shape)}.")
        if tokens.dtype != torch.long or parents.dtype != torch.long:
            raise ValueError("DraftTree: tokens and parents must be int64 (torch.long) tensors.")
        if self.q is not None and (self.q.dim() != 2 or self.q.shape[0] != tokens.numel()):
            raise ValueError(f"DraftTree: q must be [n, V] with one row per node, got {tuple(self.q.shape)} for "
                             f"{tokens.numel()} nodes.")
        if tokens.numel():  # the structure is checked on the host, where the loop reads it anyway: one read for both
            both = torch.stack([tokens, parents]).tolist() if tokens.device == parents.device else None
            if both is not None:
                object.__setattr__(self, "_tokens", both[0])
                object.__setattr__(self, "_parents", both[1])
            self._check(self.parent_list())

    @staticmethod
    def _check(parents: list[int]) -> None:
        if any(p < ROOT or p >= i for i, p in enumerate(parents)):
            raise ValueError("DraftTree: every parent must come before its child (-1 for the root's children); "
                             f"got parents {parents}.")

    # The loop reads a tree's structure on the host (the rule walks it, the cache keeps a path): read once, from the
    # device or from the lists a drafter built it from, and kept beside the tensors (a frozen tree never changes).
    def token_list(self) -> list[int]:
        """``tokens`` as python ints (one read of the device, once)."""
        known = self.__dict__.get("_tokens")
        if known is None:
            known = self.tokens.tolist()
            object.__setattr__(self, "_tokens", known)
        return known

    def parent_list(self) -> list[int]:
        """``parents`` as python ints (one read of the device, once)."""
        known = self.__dict__.get("_parents")
        if known is None:
            known = self.parents.tolist()
            object.__setattr__(self, "_parents", known)
        return known

    @classmethod
    def _built(cls, tokens: torch.Tensor, parents: torch.Tensor, token_list: list[int] | None,
               parent_list: list[int]) -> DraftTree:
        """A tree valid by construction (a chain, no draft), its host lists known: nothing checked, nothing read."""
        tree = object.__new__(cls)
        for name, value in (("tokens", tokens), ("parents", parents), ("q", None), ("_parents", parent_list)):
            object.__setattr__(tree, name, value)
        if token_list is not None:
            object.__setattr__(tree, "_tokens", token_list)
        return tree

    @classmethod
    def chain(cls, tokens: torch.Tensor | Sequence[int]) -> DraftTree:
        """The tree of one branch: ``tokens[i]`` follows ``tokens[i - 1]``."""
        known = [int(t) for t in tokens] if not isinstance(tokens, torch.Tensor) else None
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        n = tokens.numel()
        return cls._built(tokens, torch.arange(-1, n - 1, device=tokens.device), known, list(range(-1, n - 1)))

    @classmethod
    def from_tokens(cls, tokens: Sequence[int], device: torch.device | str | None = None) -> DraftTree:
        """A drafted chain of python ints as a tree on ``device`` (empty for no tokens)."""
        if not tokens:
            return cls.empty(device)
        known = [int(t) for t in tokens]
        return cls.chain(torch.tensor(known, dtype=torch.long, device=device))._known_tokens(known)

    def _known_tokens(self, known: list[int]) -> DraftTree:
        object.__setattr__(self, "_tokens", known)
        return self

    @classmethod
    def empty(cls, device: torch.device | str | None = None) -> DraftTree:
        """No draft: the step is a plain decoding step."""
        device = torch.device(device if device is not None else "cpu")
        none = _EMPTY.get(device)
        if none is None:  # one per device, shared: an empty tensor has nothing to change
            none = _EMPTY[device] = torch.empty(0, dtype=torch.long, device=device)
        return cls._built(none, none, [], [])

    @property
    def size(self) -> int:
        return int(self.tokens.numel())

    def is_chain(self) -> bool:
        return self.parent_list() == list(range(-1, self.size - 1))

    def depth_list(self) -> list[int]:
        """The depth of each node (0 for the root's children), as python ints (parents come before children)."""
        depth = [0] * self.size
        for i, p in enumerate(self.parent_list()):
            depth[i] = 0 if p == ROOT else depth[p] + 1
        return depth

    def depths(self) -> torch.Tensor:
        """``[n]`` the depth of each node (0 for the root's children)."""
        return torch.tensor(self.depth_list(), dtype=torch.long, device=self.tokens.device)

    def ancestors(self) -> torch.Tensor:
        """``[n, n]`` bool: ``[i, j]`` is True when node ``j`` is node ``i`` or one of its ancestors."""
        n = self.size
        lines: list[list[int]] = []  # each node's ancestors and itself, root side first
        for i, p in enumerate(self.parent_list()):
            lines.append((lines[p] if p != ROOT else []) + [i])
        rows = [i for i, line in enumerate(lines) for _ in line]
        cols = [j for line in lines for j in line]
        # built on the host in one go: a kernel per node would cost a launch each on a GPU
        seen = torch.zeros(n, n, dtype=torch.bool)
        seen[rows, cols] = True
        return seen.to(self.tokens.device)

    def children(self, node: int) -> list[int]:
        """The nodes whose parent is ``node`` (``-1``: the root's children), in drafting order."""
        return [i for i, p in enumerate(self.parent_list()) if p == node]

    def path_tokens(self, path: Sequence[int]) -> list[int]:
        tokens = self.token_list() if path else []
        return [tokens[i] for i in path]

    def first_branch(self) -> DraftTree:
        """The branch through every node's first child (a best-first tree's likeliest path), as a chain: what a loop
        that verifies chains only (transformers') takes of a tree."""
        if self.is_chain():
            return self
        path, node = [], ROOT
        for i, parent in enumerate(self.parent_list()):
            if parent == node:
                path.append(i)
                node = i
        if not path:
            return DraftTree.empty(self.tokens.device)
        return dataclasses.replace(DraftTree.chain(self.tokens[path]), q=None if self.q is None else self.q[path])

    def within(self, depth: int) -> DraftTree:
        """The nodes at most ``depth`` deep (1: the root's children), in their order: a tree drafted for a longer
        room cut to this step's (a node's ancestors are shallower than it)."""
        if depth <= 0:
            return DraftTree.empty(self.tokens.device)
        depths = self.depth_list()  # 0: the root's children, so a node is kept below ``depth``
        if max(depths, default=0) < depth:
            return self
        keep = [i for i, d in enumerate(depths) if d < depth]
        index = {old: new for new, old in enumerate(keep)}
        parent_list = self.parent_list()
        parents = [ROOT if parent_list[i] == ROOT else index[parent_list[i]] for i in keep]
        rows = torch.tensor(keep, dtype=torch.long, device=self.tokens.device)
        known = self.__dict__.get("_tokens")
        tree = DraftTree._built(self.tokens[rows], torch.tensor(parents, dtype=torch.long, device=self.tokens.device),
                                None if known is None else [known[i] for i in keep], parents)
        return tree if self.q is None else dataclasses.replace(tree, q=self.q[rows])

    def first(self, n: int) -> DraftTree:
        """The first ``n`` nodes (every parent comes before its children, so they are a tree)."""
        if n >= self.size:
            return self
        return DraftTree(self.tokens[:n], self.parents[:n], None if self.q is None else self.q[:n])


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What one verification decided.

    Attributes:
        path: the accepted nodes' indices, root to leaf (empty when the first draft token was rejected).
        next_token: the target's own token after the accepted path (greedy: its argmax there; sampling: the
            residual or bonus sample).
    """

    path: tuple[int, ...]
    next_token: int

    @property
    def num_accepted(self) -> int:
        return len(self.path)


def position_ids(tree: DraftTree, prefix_length: int, fresh: int = 0) -> torch.Tensor:
    """``[1, fresh + 1 + n]`` position ids: ``fresh`` uncached prefix tokens at their own positions (the
    prompt, in the first forward), the root at ``prefix_length``, a node at ``prefix_length + 1 + depth``."""
    device = tree.tokens.device
    before = torch.arange(prefix_length - fresh, prefix_length + 1, device=device)  # [fresh + 1]
    return torch.cat([before, prefix_length + 1 + tree.depths()]).unsqueeze(0)


def visibility(tree: DraftTree, prefix_length: int, window: int | None = None, fresh: int = 0) -> torch.Tensor:
    """``[fresh + 1 + n, prefix_length + 1 + n]`` bool: which keys each query attends to.

    ``prefix_length`` tokens come before the root; the last ``fresh`` of them are not in the cache yet
    and are queries too (causal among themselves: the prompt, when the first forward also prefills).
    Every query sees the prefix up to itself; the root sees the prefix and itself; a node also sees its
    ancestors and itself. With a sliding ``window`` (Gemma3's and Mistral's local layers), a query at
    position ``q`` sees only keys at positions ``k > q - window``, the rule of transformers' own masks.
    """
    n, device = tree.size, tree.tokens.device
    keys = prefix_length + 1 + n
    seen = torch.zeros(fresh + 1 + n, keys, dtype=torch.bool, device=device)
    before = torch.arange(prefix_length - fresh, prefix_length + 1, device=device)  # [fresh + 1] positions
    seen[: fresh + 1, : prefix_length + 1] = torch.arange(prefix_length + 1, device=device) <= before[:, None]
    seen[fresh + 1:, : prefix_length + 1] = True
    seen[fresh + 1:, prefix_length + 1:] = tree.ancestors()
    if window is not None:
        query = position_ids(tree, prefix_length, fresh)[0]  # [fresh + 1 + n]
        key = torch.cat([torch.arange(prefix_length + 1, device=device), query[fresh + 1:]])  # [keys]
        seen &= key.unsqueeze(0) > query.unsqueeze(1) - window
    return seen


def additive_mask(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[1, 1, Q, K]`` float mask: 0 where ``seen``, the dtype's minimum elsewhere. Eager attention adds
    it to the scores and SDPA accepts it as is; the minimum, not -inf, keeps no row all -inf."""
    mask = torch.zeros(seen.shape, dtype=dtype, device=seen.device)
    mask.masked_fill_(~seen, torch.finfo(dtype).min)
    return mask[None, None]
