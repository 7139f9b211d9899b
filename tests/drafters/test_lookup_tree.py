"""Prompt lookup's tree: every match's continuation merged into a trie, the best-supported nodes kept."""

from __future__ import annotations

from hf_speculative.drafters.prompt_lookup.tree import MultiNgramIndex, lookup_tree


def paths(tree) -> set[tuple[int, ...]]:
    tokens, parents, out = tree.tokens.tolist(), tree.parents.tolist(), set()
    for i in range(tree.size):
        chain, node = [], i
        while node != -1:
            chain.append(tokens[node])
            node = parents[node]
        out.add(tuple(reversed(chain)))
    return out


def test_matches_are_longest_first_then_most_recent():
    index = MultiNgramIndex(1, 2, occurrences=3)
    index.extend([1, 2, 7, 1, 2, 8, 5, 2, 9, 1, 2])
    # suffix (1, 2): ends at 2 and 5 (not 11: it has no continuation yet); suffix (2,): ends 2, 5, 8
    assert index.matches() == [(2, 5), (2, 2), (1, 8), (1, 5), (1, 2)]


def test_occurrences_are_bounded():
    index = MultiNgramIndex(1, 1, occurrences=2)
    index.extend([4, 1] * 50 + [4])
    assert len(index.matches()) == 2
    assert all(len(ends) <= 2 for ends in index._ends.values())


def test_tree_merges_agreeing_continuations_and_keeps_the_best_supported():
    index = MultiNgramIndex(1, 2, occurrences=4)
    index.extend([1, 2, 7, 7, 3, 1, 2, 8, 6, 0, 1, 2])
    tree = lookup_tree(index, nodes=100, depth=2)
    assert paths(tree) == {(8,), (8, 6), (7,), (7, 7)}
    assert all(p < i for i, p in enumerate(tree.parents.tolist()))
    small = lookup_tree(index, nodes=2, depth=2)  # the most recent match (weight 2) beats the older one (1)
    assert paths(small) == {(8,), (8, 6)}


def test_no_match_gives_an_empty_tree():
    index = MultiNgramIndex(2, 3)
    index.extend([1, 2, 3, 4])
    assert lookup_tree(index, nodes=8, depth=4).size == 0
