"""Sampling through draft trees is lossless: chi-square tests of the emitted tokens against the target's own
distribution, for deterministic siblings (point masses, as top-k trees draft), siblings sampled with and
without replacement, and end to end through the loop; negative controls show the tests can fail."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import PROMPT, build_model
from scipy.stats import chisquare
from transformers.generation.stopping_criteria import MaxLengthCriteria, StoppingCriteriaList

from hf_speculative.loop import accept_sampling, run
from hf_speculative.tree import DraftTree

V = 6
P_ROOT = torch.tensor([0.30, 0.05, 0.25, 0.10, 0.20, 0.10], dtype=torch.float64)
P_NEXT = torch.tensor([0.10, 0.40, 0.05, 0.25, 0.10, 0.10], dtype=torch.float64)  # after any first token
Q = torch.tensor([0.05, 0.30, 0.40, 0.05, 0.15, 0.05], dtype=torch.float64)  # the drafter's, unlike the target
N = 12000
ALPHA = 1e-3


def first_two(verdict, tree) -> tuple[int, int | None]:
    tokens = tree.path_tokens(verdict.path) + [verdict.next_token]
    return tokens[0], (tokens[1] if len(tokens) > 1 else None)


def chi2_p(samples: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(samples), minlength=probs.numel()).double()
    expected = probs * counts.sum()
    return float(chisquare(counts.numpy(), expected.numpy()).pvalue)


def draw_siblings(k: int, q: torch.Tensor, generator, replace: bool) -> tuple[list[int], torch.Tensor]:
    """``k`` tokens from ``q`` and the distribution each was drawn from (given the earlier ones)."""
    tokens, rows, left = [], [], q.clone()
    for _ in range(k):
        dist = left / left.sum()
        token = int(torch.multinomial(dist, 1, generator=generator))
        tokens.append(token)
        rows.append(dist)
        if not replace:
            left[token] = 0
    return tokens, torch.stack(rows)


def make_tree(kind: str, generator, lie: bool = False) -> DraftTree:
    """Three children of the root, and two children under the first child."""
    if kind == "point":
        return DraftTree(torch.tensor([2, 0, 5, 1, 3]), torch.tensor([-1, -1, -1, 0, 0]))
    replace = kind == "with-replacement"
    top, top_q = draw_siblings(3, Q, generator, replace)
    low, low_q = draw_siblings(2, Q, generator, replace)
    probs = torch.cat([top_q, low_q]).float()
    if lie:  # a drafter that reports another distribution than the one it drew from
        probs = torch.full_like(probs, 1.0 / V)
    return DraftTree(torch.tensor(top + low), torch.tensor([-1, -1, -1, 0, 0]), probs)


def run_rule(kind: str, lie: bool = False, seed: int = 0) -> tuple[list[int], list[int]]:
    generator = torch.Generator().manual_seed(seed)
    first, second = [], []
    for _ in range(N):
        tree = make_tree(kind, generator, lie)
        target = torch.stack([P_ROOT] + [P_NEXT] * tree.size)  # [1 + n, V]
        a, b = first_two(accept_sampling(tree, target, generator), tree)
        first.append(a)
        if b is not None:
            second.append(b)
    return first, second


@pytest.mark.parametrize("kind", ["point", "with-replacement", "without-replacement"])
def test_tree_rule_keeps_the_target_distribution(kind):
    first, second = run_rule(kind)
    assert chi2_p(first, P_ROOT) > ALPHA
    assert chi2_p(second, P_NEXT) > ALPHA  # the token after an accepted first one is the target's too
    assert len(second) > N * 0.3  # drafts were accepted often enough to test the second position


def test_negative_control_a_lying_drafter_is_caught():
    first, _ = run_rule("without-replacement", lie=True)
    assert chi2_p(first, P_ROOT) < ALPHA


def test_negative_control_accepting_every_draft_is_caught():
    generator = torch.Generator().manual_seed(1)
    tree = make_tree("point", generator)
    target = torch.stack([P_ROOT] + [P_NEXT] * tree.size)
    certain = target.clone()
    certain[0] = 0
    certain[0, 2] = 1  # what a rule that always kept the first draft would emit
    first = [first_two(accept_sampling(tree, certain, generator), tree)[0] for _ in range(2000)]
    assert chi2_p(first, P_ROOT) < ALPHA


class RandomTrees:
    """Deterministic (point-mass) trees of tokens drawn at random from ``pool`` (the model's likeliest
    tokens): often right, often wrong."""

    def __init__(self, pool: torch.Tensor, seed: int = 0):
        self.pool, self.generator = pool, torch.Generator().manual_seed(seed)

    def propose_tree(self, sequence, max_depth):
        tokens = self.pool[torch.randint(0, self.pool.numel(), (4,), generator=self.generator)]
        return DraftTree(tokens, torch.tensor([-1, -1, 0, 1]))

    def observe(self, sequence, tree, verdict, scores):
        pass


@pytest.mark.slow
def test_loop_sampling_matches_the_model_end_to_end():
    model = build_model("llama", init=0.3)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        p1 = torch.softmax(model(ids).logits[0, -1].double(), -1)
    generator = torch.Generator().manual_seed(0)
    drafter = RandomTrees(p1.topk(4).indices)
    stop = StoppingCriteriaList([MaxLengthCriteria(len(PROMPT) + 2)])
    firsts, seconds, accepted = [], [], 0
    with torch.no_grad():
        for _ in range(3000):
            out = run(model, ids, drafter, stopping_criteria=stop, do_sample=True, generator=generator)
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
