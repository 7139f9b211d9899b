"""Prompt lookup as a tree: several n-gram matches (sizes and occurrences) as the branches of one draft.

A chain follows one match: the most recent earlier occurrence of the longest suffix n-gram. When the
text repeats itself in several ways (a list, code, a table) the right continuation is often another
occurrence, or the continuation of a shorter n-gram. The tree drafts them all at once, merged where
they agree (a trie), and verification keeps whichever branch the target follows.

Nodes are ranked by *support*: every continuation adds its weight to the nodes on its path (a longer
n-gram and a more recent occurrence weigh more), so a node never has more support than its parent and
keeping the ``nodes`` best-supported nodes keeps a tree.
"""

from __future__ import annotations

from collections import defaultdict, deque

import torch

from ...core.tree import ROOT, DraftTree


class MultiNgramIndex:
    """The ``occurrences`` most recent end positions of every n-gram (``min_n <= n <= max_n``) of a
    growing token list; memory is bounded by ``occurrences`` per distinct n-gram."""

    def __init__(self, min_n: int, max_n: int, occurrences: int = 4):
        self.min_n, self.max_n, self.occurrences = min_n, max_n, occurrences
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], deque[int]] = defaultdict(lambda: deque(maxlen=occurrences))
        self._next_end = 1  # ends < this are indexed (an n-gram is indexed once it has a continuation)

    def extend(self, new_tokens: list[int]) -> None:
        self.tokens.extend(new_tokens)
        tokens = self.tokens
        for end in range(self._next_end, len(tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._ends[tuple(tokens[end - n: end])].append(end)
        self._next_end = max(self._next_end, len(tokens))

    def matches(self) -> list[tuple[int, int]]:
        """``(n, start of the continuation)`` for every indexed occurrence of every suffix n-gram, longest
        n-grams first, most recent occurrences first within a size."""
        tokens, out = self.tokens, []
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            ends = self._ends.get(tuple(tokens[len(tokens) - n:]))
            if ends:
                out += [(n, end) for end in reversed(ends)]
        return out


def lookup_tree(index: MultiNgramIndex, nodes: int, depth: int) -> DraftTree:
    """The best-supported ``nodes`` nodes of the trie of every match's continuation (``depth`` tokens each).

    A match of n-gram size ``n`` that is the ``i``-th most recent of its size weighs ``n / (1 + i)``; the
    support of a node is the sum over the continuations passing through it.
    """
    children: list[dict[int, int]] = [{}]  # trie node 0 is the root
    token_of, parent_of, support = [-1], [ROOT], [0.0]
    rank_in_size: dict[int, int] = defaultdict(int)
    for n, start in index.matches():
        weight = n / (1 + rank_in_size[n])
        rank_in_size[n] += 1
        node = 0
        for token in index.tokens[start: start + depth]:
            nxt = children[node].get(token)
            if nxt is None:
                nxt = len(token_of)
                children[node][token] = nxt
                children.append({})
                token_of.append(token)
                parent_of.append(node)
                support.append(0.0)
            support[nxt] += weight
            node = nxt
    order = sorted(range(1, len(token_of)), key=lambda i: (-support[i], i))[:nodes]
    order.sort()  # trie nodes are created after their parents: creation order is topological
    where = {old: new for new, old in enumerate(order)}
    tokens = [token_of[i] for i in order]
    parents = [ROOT if parent_of[i] == 0 else where[parent_of[i]] for i in order]
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))
