"""Tree shapes: static rank-path trees (built, calibrated, saved) and EAGLE-2's dynamic trees."""

from __future__ import annotations

import pytest
import torch

from hf_speculative.core.tree_shapes import DynamicTree, StaticTree


def test_static_tree_orders_paths_and_finds_parents():
    tree = StaticTree([(0, 0), (1,), (0,), (0, 1), (0, 0, 0)])
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (0, 0, 0))
    assert tree.parents() == [-1, -1, 0, 0, 2]
    assert (tree.size, tree.depth, tree.top_k) == (5, 3, 2)
    assert StaticTree.chain(3).paths == ((0,), (0, 0), (0, 0, 0))
    assert tree.kept((0, 0, 0, 4)) == 3 and tree.kept((1, 0)) == 1 and tree.kept((2,)) == 0


def test_static_tree_fills_tokens_by_rank():
    """``grow_static`` gives node ``p + (r,)`` the drafter's guess of rank ``r`` after ``p``, one expansion per
    depth over the nodes that have children (a drafter whose guesses after a token are fixed lists)."""
    from hf_speculative.core.tree_shapes import grow_static

    vocab = 20
    guesses = {7: [10, 11, 3], 8: [12, 3, 4], 10: [13, 3, 4]}  # after a token, its guesses best first

    def ranked(tokens):  # log-probabilities ranking each token's guesses first, second, third
        out = torch.full((len(tokens), vocab), -30.0)
        for row, token in enumerate(tokens.tolist()):
            for rank, guess in enumerate(guesses[token]):
                out[row, guess] = -float(rank)
        return out

    expanded = []

    def expand(frontier, tokens, parents):
        expanded.append(frontier)
        return ranked(tokens)

    root = torch.full((vocab,), -30.0)
    root[[7, 8, 9]] = torch.tensor([0.0, -1.0, -2.0])
    tree = StaticTree([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    draft = grow_static(tree, root, expand, max_depth=8)
    assert draft.tokens.tolist() == [7, 8, 10, 11, 12, 13]
    assert draft.parents.tolist() == [-1, -1, 0, 0, 1, 2]
    assert expanded == [[0, 1], [2]]  # one drafter forward per depth, only nodes with children


def test_calibration_keeps_the_most_frequent_prefixes():
    measured = [(0, 0, 0)] * 5 + [(1, 0)] * 3 + [(0, 1)] * 2 + [(2,)]
    # prefix counts: (0,) 7, (0,0) 5, (0,0,0) 5, (1,) 3, (1,0) 3, (0,1) 2, (2,) 1
    assert StaticTree.calibrate(measured, 3).paths == ((0,), (0, 0), (0, 0, 0))
    assert set(StaticTree.calibrate(measured, 5).paths) == {(0,), (0, 0), (0, 0, 0), (1,), (1, 0)}
    assert StaticTree.calibrate(measured, 100).size == 7  # no more nodes than measured paths


def test_static_tree_round_trips_through_json(tmp_path):
    tree = StaticTree([(0,), (1,), (0, 0)])
    assert StaticTree.load(tree.save(tmp_path / "t.json")) == tree
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a StaticTree file"):
        StaticTree.load(tmp_path / "bad.json")


@pytest.mark.parametrize("paths, message", [
    ([], "give 1 to 256"), ([(0, 1)], "lacks its parent"), ([(-1,)], "ranks from 0 to 63"), ([()], "1 to 64 integer"),
    ([(64,)], "ranks from 0 to 63"), ([(0.5,)], "integer ranks"), ([(0,) * 65], "1 to 64 integer ranks"),
    ([(i,) for i in range(17)] + [(i, j) for i in range(17) for j in range(17)], "give 1 to 256"),
])
def test_bad_static_trees_name_the_problem(paths, message):
    with pytest.raises(ValueError, match=message):
        StaticTree(paths)


@pytest.mark.parametrize("kwargs, message", [
    (dict(nodes=0), r"nodes=0\): must be an integer from 1 to 256"), (dict(nodes=10**9), "from 1 to 256"),
    (dict(depth=2.5), r"depth=2.5\)"), (dict(top_k="8"), r"top_k='8'\)"), (dict(nodes=True), "nodes=True"),
])
def test_bad_dynamic_trees_are_refused_before_anything_is_allocated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicTree(**kwargs)


def _paths(tree) -> dict[tuple[int, ...], int]:
    """Each node's token path from the root -> node index."""
    tokens, parents, out = tree.tokens.tolist(), tree.parents.tolist(), {}
    for i in range(tree.size):
        chain, node = [], i
        while node != -1:
            chain.append(tokens[node])
            node = parents[node]
        out[tuple(reversed(chain))] = i
    return out


def test_dynamic_tree_expands_the_likeliest_and_keeps_the_best_nodes():
    """A drafter over 6 tokens whose next-token log-probabilities depend on the last token only."""
    table = torch.log_softmax(torch.tensor([[float((a * 7 + b * 3) % 6) for b in range(6)] for a in range(6)]), -1)
    calls = []

    def expand(frontier, tokens, parents):
        calls.append(list(frontier))
        return table[tokens]

    def score(path):
        prev, total = 0, 0.0
        for t in path:
            total, prev = total + float(table[prev, t]), t
        return total

    shape = DynamicTree(nodes=7, depth=3, top_k=2)
    everything = _paths(shape.grow(table[0], expand, nodes=256))  # every drafted node
    assert len(everything) == 2 + 2 * 2 + 2 * 2 and len(calls) == 2 and all(len(c) == 2 for c in calls)
    # the frontier of each depth: the top_k new nodes by cumulative score
    depth1 = sorted((p for p in everything if len(p) == 1), key=score, reverse=True)
    assert {p[:1] for p in everything if len(p) == 2} == set(depth1[:2])
    tree = shape.grow(table[0], expand)
    kept = _paths(tree)
    assert tree.size == 7 and all(p < i for i, p in enumerate(tree.parents.tolist()))
    best = sorted(everything, key=lambda p: (-score(p), everything[p]))[:7]
    assert set(kept) == set(best)  # the 7 drafted nodes of highest cumulative score, ancestors included
    assert all(p[:-1] in kept for p in kept if len(p) > 1)


def test_dynamic_tree_budget_zero_drafts_nothing():
    assert DynamicTree().grow(torch.zeros(10), lambda f, t, p: torch.zeros(len(f), 10), nodes=0).size == 0
