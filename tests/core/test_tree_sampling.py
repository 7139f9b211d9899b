"""Sampling through draft trees is lossless: chi-square tests of the emitted tokens against the target's own
distribution when trees are verified against the seeded draw (hf_speculative.core.sampling), for fixed trees,
trees drafted from another distribution with the same noise (coupled), and end to end through the loop;
negative controls show the tests can fail."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import PROMPT, build_model
from scipy.stats import chisquare
from transformers import LogitsProcessorList
from transformers.generation.stopping_criteria import MaxLengthCriteria, StoppingCriteriaList

from hf_speculative.core.accept import accept_greedy
from hf_speculative.core.budget import FIXED
from tests.core.loop_harness import run
from hf_speculative.core.sampling import SeededSampler
from hf_speculative.core.tree import DraftTree

V = 6
P_ROOT = torch.tensor([0.30, 0.05, 0.25, 0.10, 0.20, 0.10], dtype=torch.float64)
P_NEXT = torch.tensor([0.10, 0.40, 0.05, 0.25, 0.10, 0.10], dtype=torch.float64)  # after any first token
Q = torch.tensor([0.05, 0.30, 0.40, 0.05, 0.15, 0.05], dtype=torch.float64)  # the drafter's, unlike the target
N = 6000
ALPHA = 1e-3
L = 7  # the prompt's length: the root's token is drawn at position L, its children's at L + 1


def first_two(verdict, tree) -> tuple[int, int | None]:
    tokens = tree.path_tokens(verdict.path) + [verdict.next_token]
    return tokens[0], (tokens[1] if len(tokens) > 1 else None)


def chi2_p(samples: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(samples), minlength=probs.numel()).double()
    expected = probs * counts.sum()
    return float(chisquare(counts.numpy(), expected.numpy()).pvalue)


def coupled_top(sampler: SeededSampler, q: torch.Tensor, position: int, k: int) -> list[int]:
    """The ``k`` tokens a drafter with distribution ``q`` ranks first under the call's noise at ``position``."""
    return (q.log().float() + sampler.noise(0, position, V)).topk(k).indices.tolist()


def make_tree(kind: str, sampler: SeededSampler) -> DraftTree:
    """Three children of the root, and two children under the first child."""
    if kind == "fixed":
        return DraftTree(torch.tensor([2, 0, 5, 1, 3]), torch.tensor([-1, -1, -1, 0, 0]))
    top, low = coupled_top(sampler, Q, L, 3), coupled_top(sampler, Q, L + 1, 2)
    return DraftTree(torch.tensor(top + low), torch.tensor([-1, -1, -1, 0, 0]))


def verify(tree: DraftTree, sampler: SeededSampler):
    """The rule on one tree: each row through the sampler at its node's position, then the greedy walk."""
    depth = [0] * tree.size
    for node, parent in enumerate(tree.parents.tolist()):
        depth[node] = 0 if parent < 0 else depth[parent] + 1
    rows = [P_ROOT] + [P_NEXT] * tree.size  # [1 + n] distributions: the root's, then after each node
    scores = torch.cat([sampler(torch.zeros(1, L + (0 if i == 0 else depth[i - 1] + 1), dtype=torch.long),
                                rows[i].log().float()[None]) for i in range(1 + tree.size)])
    return accept_greedy(tree, scores)


def run_rule(kind: str) -> tuple[list[int], list[int]]:
    first, second = [], []
    for seed in range(N):
        sampler = SeededSampler(seed)
        tree = make_tree(kind, sampler)
        a, b = first_two(verify(tree, sampler), tree)
        first.append(a)
        if b is not None:
            second.append(b)
    return first, second


@pytest.mark.single_version  # the rule on synthetic distributions: no transformers in it
@pytest.mark.parametrize("kind", ["fixed", "coupled"])
def test_tree_rule_keeps_the_target_distribution(kind):
    first, second = run_rule(kind)
    assert chi2_p(first, P_ROOT) > ALPHA
    assert chi2_p(second, P_NEXT) > ALPHA  # the token after an accepted first one is the target's too
    assert len(second) > N * 0.3  # drafts were accepted often enough to test the second position


@pytest.mark.single_version  # the rule on synthetic distributions: no transformers in it
def test_coupled_drafts_are_accepted_more_often_than_fixed_ones():
    """The drafter's noise is the target's: its top guesses under that noise hit the target's draw more often."""
    fixed, coupled = len(run_rule("fixed")[1]), len(run_rule("coupled")[1])
    assert coupled > fixed


@pytest.mark.single_version  # the rule on synthetic distributions: no transformers in it
def test_negative_control_uniform_noise_is_caught(monkeypatch):
    def uniform(self, row, position, vocab, device="cpu"):
        return torch.rand(vocab, generator=torch.Generator().manual_seed(self.seed * 1000 + position))

    monkeypatch.setattr(SeededSampler, "noise", uniform)
    first, _ = run_rule("fixed")
    assert chi2_p(first, P_ROOT) < ALPHA


class RandomTrees:
    """Deterministic (point-mass) trees of tokens drawn at random from ``pool`` (the model's likeliest
    tokens): often right, often wrong."""

    def __init__(self, pool: torch.Tensor, seed: int = 0):
        self.pool, self.generator = pool, torch.Generator().manual_seed(seed)

    sizing = FIXED  # no sizing of its own: it drafts what it drafts

    def draft(self, sequence, plan):
        tokens = self.pool[torch.randint(0, self.pool.numel(), (4,), generator=self.generator)]
        return DraftTree(tokens, torch.tensor([-1, -1, 0, 1]))

    def close(self):
        pass

    def observe(self, sequence, tree, verdict, scores):
        pass


@pytest.mark.slow
def test_loop_sampling_matches_the_model_end_to_end():
    model = build_model("llama", init=0.3)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        p1 = torch.softmax(model(ids).logits[0, -1].double(), -1)
    drafter = RandomTrees(p1.topk(4).indices)
    stop = StoppingCriteriaList([MaxLengthCriteria(len(PROMPT) + 2)])
    firsts, seconds, accepted = [], [], 0
    with torch.no_grad():
        for seed in range(3000):
            out = run(model, ids, drafter, stopping_criteria=stop, logits_processor=LogitsProcessorList([SeededSampler(seed)]))
            firsts.append(int(out.sequences[0, -2]))
            seconds.append(int(out.sequences[0, -1]))
            accepted += out.stats.accepted_tokens
    assert accepted > 500  # the trees were kept often: the test reaches the rule's accept branch
    top = int(p1.argmax())  # the second token, after the most common first one
    with torch.no_grad():
        p2 = torch.softmax(model(torch.tensor([PROMPT + [top]])).logits[0, -1].double(), -1)
    keep = p1 * 3000 >= 5  # chi-square needs expected counts of 5 or more: merge the rest into one bin
    counts = torch.bincount(torch.tensor(firsts), minlength=p1.numel()).double()
    observed = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    expected = torch.cat([p1[keep], p1[~keep].sum(0, keepdim=True)]) * 3000
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > ALPHA
    after_top = [b for a, b in zip(firsts, seconds) if a == top]
    keep2 = p2 * len(after_top) >= 5
    counts2 = torch.bincount(torch.tensor(after_top), minlength=p2.numel()).double()
    observed2 = torch.cat([counts2[keep2], counts2[~keep2].sum(0, keepdim=True)])
    expected2 = torch.cat([p2[keep2], p2[~keep2].sum(0, keepdim=True)]) * len(after_top)
    assert chisquare(observed2.numpy(), expected2.numpy()).pvalue > ALPHA
