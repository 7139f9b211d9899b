"""Suffix tries of bounded depth: every substring of up to ``depth`` tokens with its number of occurrences, and
the speculation trees SuffixDecoding reads off them (Oliaro et al. 2024, arXiv 2411.04975).

A full suffix tree is unbounded; SuffixDecoding only ever matches the last few tokens and speculates a few
more, so a trie of the substrings of at most ``depth`` tokens holds everything it reads (ArcticInference
bounds its trees the same way, ``max_tree_depth``). Its size is at most ``depth`` nodes per token added.

- :class:`SuffixTrie`: ``add`` / ``remove`` whole sequences (the history of earlier outputs) and ``extend`` one
  growing sequence (this call's prompt and output) in ``O(depth)`` per token.
- :func:`speculate`: from the node of the longest matched suffix, the likeliest continuations, best first,
  each node's probability the product of ``count(child) / count(continuing parent)`` down its path.
"""

from __future__ import annotations

import heapq

ROOT_NODE = 0


class SuffixTrie:
    """Counts of every substring of at most ``depth`` tokens of the sequences added.

    Node ``i`` stands for one substring: ``count[i]`` occurrences, ``cont[i]`` of them followed by another token
    (the sum of its children's counts: the denominator of the continuation probabilities). Freed nodes are
    reused, so the lists never outgrow the largest live trie.

    Args:
        depth (`int`): the longest substring kept (the deepest node).
    """

    def __init__(self, depth: int):
        self.depth = depth
        self.children: list[dict[int, int]] = [{}]
        self.count = [0]
        self.cont = [0]
        self.level = [0]  # a node's depth = its substring's length
        self.parent = [-1]
        self.token = [-1]
        self._free: list[int] = []
        self._open: list[int] = []  # ``extend``: the nodes of the growing sequence's suffixes shorter than depth

    @property
    def nodes(self) -> int:
        """Live nodes, the root excluded."""
        return len(self.count) - 1 - len(self._free)

    def _new(self, parent: int, token: int) -> int:
        if self._free:
            node = self._free.pop()
            self.children[node], self.count[node], self.cont[node] = {}, 0, 0
            self.level[node], self.parent[node], self.token[node] = self.level[parent] + 1, parent, token
        else:
            node = len(self.count)
            self.children.append({})
            self.count.append(0)
            self.cont.append(0)
            self.level.append(self.level[parent] + 1)
            self.parent.append(parent)
            self.token.append(token)
        self.children[parent][token] = node
        return node

    def _step(self, node: int, token: int) -> int:
        """The child ``token`` of ``node`` (made if new), one more occurrence of it counted."""
        child = self.children[node].get(token)
        if child is None:
            child = self._new(node, token)
        self.count[child] += 1
        if node != ROOT_NODE:
            self.cont[node] += 1
        return child

    def add(self, tokens: list[int]) -> None:
        """Count every substring of ``tokens`` (up to ``depth`` long): ``O(len * depth)``."""
        for start in range(len(tokens)):
            node = ROOT_NODE
            for token in tokens[start: start + self.depth]:
                node = self._step(node, token)

    def remove(self, tokens: list[int]) -> None:
        """Undo :meth:`add` of the same ``tokens``: nodes whose count falls to 0 are freed."""
        for start in range(len(tokens)):
            self.remove_path(tokens[start: start + self.depth])

    def remove_path(self, tokens: list[int]) -> None:
        """Uncount one occurrence of ``tokens`` and of each of its prefixes (the substrings that start where it
        starts); also forgets the start of a sequence grown by :meth:`extend`, once it is ``depth`` tokens old."""
        path, node = [], ROOT_NODE
        for token in tokens[: self.depth]:
            child = self.children[node][token]  # KeyError: these tokens were never added
            self.count[child] -= 1
            if node != ROOT_NODE:
                self.cont[node] -= 1
            path.append(child)
            node = child
        for node in reversed(path):  # deepest first: a parent is freed after its children
            if self.count[node] == 0:
                del self.children[self.parent[node]][self.token[node]]
                self._free.append(node)

    def extend(self, tokens: list[int]) -> None:
        """Append ``tokens`` to the one growing sequence this trie indexes (``O(depth)`` per token); the same
        counts as :meth:`add` of the whole sequence."""
        for token in tokens:
            opened = []
            for node in (ROOT_NODE, *self._open):
                child = self._step(node, token)
                if self.level[child] < self.depth:
                    opened.append(child)
            self._open = opened

    def open_matches(self, max_length: int) -> list[tuple[int, int]]:
        """``(node, length)`` of every suffix (at most ``max_length`` long) of the sequence grown by :meth:`extend`
        that occurred before with a continuation, longest first."""
        return [(node, self.level[node]) for node in reversed(self._open)
                if self.level[node] <= max_length and self.cont[node]]

    def matches(self, context: list[int], max_length: int) -> list[tuple[int, int]]:
        """``(node, length)`` of every suffix of ``context`` (at most ``max_length`` tokens) that is a substring
        here with a continuation, longest first. ``O(max_length^2)`` look-ups at most."""
        length, out = min(max_length, self.depth - 1, len(context)), []
        for start in range(len(context) - length, len(context)):
            node = ROOT_NODE
            for token in context[start:]:
                node = self.children[node].get(token, -1)
                if node < 0:
                    break
            if node > 0 and self.cont[node]:
                out.append((node, len(context) - start))
        return out


def best_speculation(trie: SuffixTrie, matches: list[tuple[int, int]], nodes, depth: int,
                     min_prob: float) -> tuple[int, list[int], list[int], list[float]]:
    """The best-scoring :func:`speculate` over ``matches`` (``(node, match length)``, longest first): ``(match
    length, tokens, parents, probs)``, scored by ``sum(probs)``. ``nodes(length)`` is the node budget of a match
    of that length (it grows with the length: a long match predicts well). A longer match wins ties; shorter ones
    leave more depth."""
    best, best_score = (0, [], [], []), 0.0
    for node, length in matches:
        budget = nodes(length)
        if budget <= best_score:  # a score is at most its node count: this one cannot win
            continue
        tokens, parents, probs = speculate(trie, node, budget, min(depth, trie.depth - length), min_prob)
        if sum(probs) > best_score:
            best, best_score = (length, tokens, parents, probs), sum(probs)
    return best


def speculate(trie: SuffixTrie, node: int, nodes: int, depth: int,
              min_prob: float) -> tuple[list[int], list[int], list[float]]:
    """The likeliest continuations of ``node``: at most ``nodes`` tokens, ``depth`` deep, each with a path
    probability of at least ``min_prob``, best first (a child is never likelier than its parent, so best first
    is topological, and every prefix of the list is a tree). Returns ``(tokens, parents, probs)``:
    ``parents[i]`` is ``-1`` for a child of the root, ``probs[i]`` the path probability of node ``i`` (their
    sum is the expected number of accepted tokens, if the frequencies were calibrated: SuffixDecoding's score)."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    order = 0
    heap: list[tuple[float, int, int, int, int]] = []

    def push(trie_node: int, prob: float, draft_parent: int, draft_depth: int) -> None:
        nonlocal order
        total = trie.cont[trie_node]
        if not total or draft_depth >= depth:
            return
        for token, child in trie.children[trie_node].items():
            p = prob * trie.count[child] / total
            if p >= min_prob:
                heapq.heappush(heap, (-p, order, child, draft_parent, draft_depth + 1))
                order += 1

    push(node, 1.0, -1, 0)
    while heap and len(tokens) < nodes:
        neg, _, child, draft_parent, draft_depth = heapq.heappop(heap)
        tokens.append(trie.token[child])
        parents.append(draft_parent)
        probs.append(-neg)
        push(child, -neg, len(tokens) - 1, draft_depth)
    return tokens, parents, probs
