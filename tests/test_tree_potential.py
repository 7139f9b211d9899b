"""benchmarks/tree_potential.py: the rank paths must be what the drafter ranks while drafting along
the target's true path, and the trees and τ must follow from them as a tree verification would."""

from __future__ import annotations

import pytest
import torch

from hf_speculative.drafters.eagle.model import DraftKVCache
from hf_speculative.core.features import FeatureTap
from tests.conftest import build_model, fit_eagle, load_benchmark, random_eagle


def _script():
    return load_benchmark("tree_potential")


def _rank(net, target, hidden, token: int) -> int:
    """Rank of target id ``token`` among the drafter's guesses from ``hidden`` `[H]`, -1 if it cannot propose it."""
    logits = net.draft_logits(hidden, target.get_output_embeddings()).float()  # [V_d]
    ids = net.to_target_ids(torch.arange(logits.shape[0]))
    hit = (ids == token).nonzero()
    return -1 if len(hit) == 0 else int((logits > logits[hit[0, 0]]).sum())


def _expected(target, net, sequence, prompt_length, depth):
    """The drafting path, one anchor at a time: true pairs up to anchor ``p`` into a fresh cache, then
    chain steps that read the target's true tokens and the drafter's own hidden states."""
    tap = FeatureTap(target, net.config.target_layers)
    with torch.no_grad():
        target(input_ids=sequence)
    features = tap.take()
    tap.remove()
    embed = target.get_input_embeddings()
    t = sequence.shape[1]
    paths = []
    with torch.no_grad():
        for p in range(prompt_length - 1, t - 2):
            cache = DraftKVCache()
            hidden = net(embed(sequence[:, 1 : p + 2]), features[:, : p + 1], torch.arange(p + 1)[None], cache)[:, -1:]
            path = []
            for j in range(depth):
                if p + j + 2 > t - 2:  # the last token of an answer cut by max_new_tokens is the target's own
                    break
                rank = _rank(net, target, hidden[0, -1], int(sequence[0, p + j + 2]))
                if rank < 0:
                    break
                path.append(rank)
                token = sequence[:, p + j + 2 : p + j + 3]  # the true token, as on the tree's true path
                hidden = net(embed(token), hidden, torch.tensor([[p + j + 1]]), cache, fused=False)
            paths.append(tuple(path))
    return paths


@pytest.mark.parametrize("drafter", ["fitted", "reduced-vocabulary"])
def test_rank_paths_are_the_drafting_ranks_along_the_true_path(drafter):
    script = _script()
    target = build_model("llama", layers=3, init=0.3)
    prompt = torch.tensor([[5, 17, 9, 33, 2, 41, 8]])
    sequence = target.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                               do_sample=False)
    if drafter == "fitted":  # trained on this sequence: top guesses at several depths, not everywhere
        net, _, _ = fit_eagle(target, 3, sequence, iterations=25, unroll=3)
        net.eval().requires_grad_(False)
    else:  # the even target ids only: paths cut at the first odd token
        net = random_eagle(target)
    paths = script.rank_paths(target, net, sequence, prompt.shape[1], depth=4)
    expected = _expected(target, net, sequence, prompt.shape[1], 4)
    assert paths == expected
    assert len(paths) == sequence.shape[1] - prompt.shape[1] - 1
    assert max(map(len, paths)) > 0
    if drafter == "fitted":
        assert any(len(p) >= 2 and p[:2] == (0, 0) for p in paths), paths


def test_best_tree_takes_the_most_frequent_paths_with_their_parents():
    script = _script()
    paths = [(0, 0, 0)] * 5 + [(1, 0)] * 4 + [(0, 2)] * 3 + [(3,)] * 2 + [()] * 6
    assert script.best_tree(paths, 1) == {(0,)}
    # counts: (0,) 8, (0, 0) 5, (0, 0, 0) 5, (1,) 4, (1, 0) 4, (0, 2) 3, (3,) 2
    assert script.best_tree(paths, 3) == {(0,), (0, 0), (0, 0, 0)}
    five = script.best_tree(paths, 5)
    assert five == {(0,), (0, 0), (1,), (0, 0, 0), (1, 0)}
    assert all(p[:-1] in five or len(p) == 1 for p in five)  # every node's parent is in the tree
    assert len(script.best_tree(paths, 100)) == 7  # every path the target took, no more


def test_tau_decodes_each_answer_from_the_anchor_after_the_kept_tokens():
    script = _script()
    answer = [(0, 0, 1), (1, 0), (2,), (), (0,)]  # anchors in order, the first right after the prefill
    tree = {(0,), (0, 0), (0, 0, 1), (1,), (1, 0)}
    assert script.kept(answer[0], tree) == 3 and script.kept(answer[1], tree) == 2 and script.kept((2,), tree) == 0
    # chain of 1: anchor 0 keeps 1 (2 tokens), anchor 2 keeps 0, anchor 3 keeps 0, anchor 4 keeps 1
    assert script.tau([answer], script.chain(1)) == 6 / 4
    # the tree keeps 3 at anchor 0, so the next draft starts at anchor 4: anchors 1-3 are never drafted from
    assert script.tau([answer], tree) == 6 / 2
    assert script.tau([answer, [(1, 0)]], tree) == (6 + 3) / 3
    assert script.tau([], tree) == 1
    assert script.decode(answer, tree) == [3, 1]


def test_decoding_with_a_chain_of_one_is_what_real_decoding_keeps():
    """A one-token chain never changes length, so real speculative decoding with the drafter must keep
    exactly what the walk over the rank paths says, forward by forward (plus the prefill's forward)."""
    import collections

    import hf_speculative as hfs

    script = _script()
    target = build_model("llama", layers=3, init=0.3)
    prompt = torch.tensor([[5, 17, 9, 33, 2, 41, 8]])
    sequence = target.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24,
                               do_sample=False)
    net, _, _ = fit_eagle(target, 3, sequence, iterations=25, unroll=2)
    net.eval().requires_grad_(False)
    hfs.enable(target)
    eagle = hfs.Eagle(net, num_tokens=1, confidence_threshold=0.0, adaptive=False)
    out = target.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24,
                          do_sample=False, candidate_generator=eagle)
    assert torch.equal(out, sequence)
    walked = script.decode(script.rank_paths(target, net, sequence, prompt.shape[1], depth=1), script.chain(1))
    real = hfs.last_stats(target).accepted_lengths
    assert 0 < real[1] < sum(real.values())  # some drafts kept, some not
    assert collections.Counter(walked) + collections.Counter({0: 1}) == real
