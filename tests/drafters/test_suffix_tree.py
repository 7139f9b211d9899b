"""The bounded-depth suffix trie of SuffixDecoding, against brute-force counts; its speculation trees; the
history of outputs (bounds, eviction, file)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from hf_speculative.drafters.suffix.history import SuffixHistory
from hf_speculative.drafters.suffix.tree import ROOT_NODE, SuffixTrie, best_speculation, speculate


def substrings(trie: SuffixTrie) -> Counter:
    """Every live node's substring and count."""
    out, stack = Counter(), [(ROOT_NODE, ())]
    while stack:
        node, text = stack.pop()
        for token, child in trie.children[node].items():
            out[text + (token,)] = trie.count[child]
            stack.append((child, text + (token,)))
    return out


def brute(sequences, depth: int) -> Counter:
    out = Counter()
    for seq in sequences:
        for i in range(len(seq)):
            for j in range(i + 1, min(i + depth, len(seq)) + 1):
                out[tuple(seq[i:j])] += 1
    return out


def check_continuations(trie: SuffixTrie) -> None:
    for node in range(1, len(trie.count)):
        if node not in trie._free:
            assert trie.cont[node] == sum(trie.count[c] for c in trie.children[node].values())


@pytest.mark.parametrize("depth", [1, 3, 6])
def test_add_and_extend_count_every_substring(depth):
    rng = random.Random(depth)
    seqs = [[rng.randrange(5) for _ in range(rng.randrange(1, 30))] for _ in range(4)]
    trie = SuffixTrie(depth)
    for seq in seqs:
        trie.add(seq)
    assert substrings(trie) == brute(seqs, depth)
    check_continuations(trie)
    grown = SuffixTrie(depth)
    for chunk in (seqs[0][:1], seqs[0][1:7], seqs[0][7:]):
        grown.extend(chunk)
    assert substrings(grown) == brute([seqs[0]], depth)
    check_continuations(grown)


def test_remove_restores_the_trie_and_reuses_nodes():
    rng = random.Random(0)
    a, b = [rng.randrange(4) for _ in range(40)], [rng.randrange(4) for _ in range(40)]
    trie = SuffixTrie(5)
    trie.add(a)
    nodes_a = trie.nodes
    trie.add(b)
    trie.remove(b)
    assert substrings(trie) == brute([a], 5) and trie.nodes == nodes_a
    size = len(trie.count)
    trie.add(b)  # freed nodes are reused: the lists do not grow
    assert len(trie.count) == size and substrings(trie) == brute([a, b], 5)
    trie.remove(a)
    trie.remove(b)
    assert trie.nodes == 0 and trie.children[ROOT_NODE] == {}


def test_remove_path_slides_a_window_over_a_growing_sequence():
    rng = random.Random(1)
    seq = [rng.randrange(6) for _ in range(200)]
    trie, depth, window = SuffixTrie(4), 4, 20
    forgotten = 0
    for i, token in enumerate(seq):
        trie.extend([token])
        while i + 1 - forgotten > window:
            trie.remove_path(seq[forgotten: forgotten + depth])
            forgotten += 1
        assert trie.nodes <= depth * window
    assert substrings(trie) == brute([seq[forgotten:]], depth)


def test_matches_are_longest_first_and_need_a_continuation():
    trie = SuffixTrie(6)
    trie.add([1, 2, 3, 4, 9, 2, 3, 5])
    found = trie.matches([7, 1, 2, 3], max_length=5)
    assert [length for _, length in found] == [3, 2, 1]
    assert trie.matches([4, 9, 2, 3, 5], max_length=5) == []  # 5 ends the text: nothing after it
    assert [length for _, length in trie.matches([7, 1, 2, 3], max_length=2)] == [2, 1]
    grown = SuffixTrie(6)
    grown.extend([1, 2, 3, 4, 9, 2, 3])
    assert [length for _, length in grown.open_matches(5)] == [2, 1]  # "2 3" and "3" occurred before


def test_speculate_ranks_by_frequency_and_cuts_by_probability():
    trie = SuffixTrie(8)
    for continuation in ([5, 6], [5, 6], [5, 7], [8, 9]):  # after "1": 5 (3 of 4), then 6 (2 of 3); 8 (1 of 4)
        trie.add([1] + continuation)
    node = trie.children[ROOT_NODE][1]
    tokens, parents, probs = speculate(trie, node, nodes=10, depth=5, min_prob=0.0)
    assert tokens[:2] == [5, 6] and parents[:2] == [-1, 0]
    named = {(tokens[i], tokens[p] if p >= 0 else None) for i, p in enumerate(parents)}
    assert named == {(5, None), (6, 5), (7, 5), (8, None), (9, 8)} and len(tokens) == 5
    assert probs == pytest.approx([0.75, 0.5, 0.25, 0.25, 0.25])  # best first
    assert all(p < i for i, p in enumerate(parents))
    tokens, parents, _ = speculate(trie, node, nodes=10, depth=5, min_prob=0.3)
    assert (tokens, parents) == ([5, 6], [-1, 0])
    assert speculate(trie, node, nodes=1, depth=5, min_prob=0.0)[0] == [5]
    assert speculate(trie, node, nodes=10, depth=1, min_prob=0.0)[0] == [5, 8]


def test_best_speculation_budget_grows_with_the_match():
    trie = SuffixTrie(10)
    trie.add([1, 2, 3, 4, 5, 6, 7, 8])
    matches = trie.matches([9, 2, 3], max_length=9)
    length, tokens, _, _ = best_speculation(trie, matches, lambda m: m, depth=10, min_prob=0.1)
    assert length == 2 and tokens == [4, 5]  # a 2-token match drafts 2 nodes
    length, tokens, _, _ = best_speculation(trie, trie.matches([1, 2, 3], 9), lambda m: m, depth=10, min_prob=0.1)
    assert length == 3 and tokens == [4, 5, 6]


def test_history_is_bounded_in_tokens_and_nodes_on_long_inputs():
    rng = random.Random(2)
    history = SuffixHistory(depth=8, max_tokens=1000)
    kept = []
    for _ in range(60):
        output = [rng.randrange(50) for _ in range(rng.randrange(50, 400))]
        history.add(output)
        kept.append(output[-1000:])
        assert history.tokens <= 1000 and history.trie.nodes <= 8 * 1000
    assert list(history.outputs) == kept[-len(history.outputs):]
    assert substrings(history.trie) == brute(history.outputs, 8)  # evicted outputs left no counts behind
    history.add(list(range(5000)))  # longer than the bound: its last 1000 tokens
    assert history.tokens == 1000 and list(history.outputs) == [list(range(4000, 5000))]


def test_history_file_round_trip_and_bad_files(tmp_path):
    path = tmp_path / "sub" / "history.json"
    history = SuffixHistory(depth=4, max_tokens=100, path=path)
    history.add([1, 2, 3])
    history.add([4, 5])
    assert json.loads(path.read_text())["outputs"] == [[1, 2, 3], [4, 5]]
    again = SuffixHistory(depth=4, max_tokens=4, path=path)  # a smaller bound keeps the newest
    assert list(again.outputs) == [[4, 5]] and substrings(again.trie) == brute([[4, 5]], 4)
    bad = tmp_path / "bad.json"
    bad.write_text('{"outputs": "nope"}')
    with pytest.raises(ValueError, match=r"SuffixDecoding\(history_file=.*bad.json'\): cannot read it as a suffix"):
        SuffixHistory(depth=4, max_tokens=100, path=bad)
