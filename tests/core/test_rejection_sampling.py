"""The rejection rule (``speculative_sampling="rejection"``, accept.py) keeps the target's distribution: chi-square
tests of the emitted tokens for chains and trees drafted from a distribution q (siblings drawn independently) and
for deterministic guesses (point masses), with negative controls that must fail (a residual that ignores q, a
rejected guess left in the residual, a residual not renormalised); end to end through generate() for chains, trees
and a batch, and against the seeded rule's acceptance."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

import hf_speculative as hfs
from hf_speculative.core import accept as accept_module
from hf_speculative.core.accept import accept_rejection
from hf_speculative.core.draft_guide import DraftGuide
from hf_speculative.core.sampling import RejectionSampler, check_mode
from hf_speculative.core.tree import DraftTree
from hf_speculative.core import tree_shapes
from hf_speculative.core.tree_shapes import DynamicTree
from tests.core.test_sampling import (  # noqa: F401 - fixtures
    ALPHA as E2E_ALPHA, NEW, PROMPT, assert_same_distribution, cell, close_drafter, far_drafter, inputs,
    lookup_prompt, references, target)

V = 6
P_ROOT = torch.tensor([0.30, 0.05, 0.25, 0.10, 0.20, 0.10], dtype=torch.float64)
P_NEXT = torch.tensor([0.10, 0.40, 0.05, 0.25, 0.10, 0.10], dtype=torch.float64)  # after any first token
Q = torch.tensor([0.05, 0.30, 0.40, 0.05, 0.15, 0.05], dtype=torch.float64)       # the drafter's, unlike p
N = 6000
ALPHA = 1e-3
N_E2E = 400


def chi2_p(samples: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(samples), minlength=probs.numel()).double()
    return float(chisquare(counts.numpy(), (probs * counts.sum()).numpy()).pvalue)


def make_tree(kind: str, generator: torch.Generator) -> DraftTree:
    """``chain``: two tokens drawn from Q; ``tree``: three siblings drawn from Q independently, two drawn from Q under
    the first; ``point``: the same shape, Q's top ranks (deterministic); ``repeat``: point masses that repeat a
    sibling."""
    if kind == "chain":
        tokens = torch.multinomial(Q, 2, replacement=True, generator=generator)
        return DraftTree(tokens, torch.tensor([-1, 0]), Q.float().expand(2, V).clone())
    parents = torch.tensor([-1, -1, -1, 0, 0])
    if kind == "tree":
        tokens = torch.multinomial(Q, 5, replacement=True, generator=generator)
        return DraftTree(tokens, parents, Q.float().expand(5, V).clone())
    if kind in ("tree-without", "tree-without-as-with"):  # each node's children drawn without replacement
        tokens = torch.cat([torch.multinomial(Q, 3, generator=generator), torch.multinomial(Q, 2, generator=generator)])
        if kind == "tree-without-as-with":  # each recorded as drawn from Q itself: the rule then over-accepts
            return DraftTree(tokens, parents, Q.float().expand(5, V).clone())
        rows, q = [], Q.clone()
        for i, token in enumerate(tokens.tolist()):
            q = Q.clone() if i in (0, 3) else q  # a new sibling group
            rows.append(q / q.sum())
            q = q.clone()
            q[token] = 0.0
        return DraftTree(tokens, parents, torch.stack(rows).float())
    if kind == "top-then-drawn":  # what a DynamicTree drafts: the top guess (one-hot), then draws without it
        rows, tokens = [], []
        for group in (3, 2):
            q = Q.clone()
            for i in range(group):
                token = int(q.argmax()) if i == 0 else int(torch.multinomial(q, 1, generator=generator))
                rows.append(torch.nn.functional.one_hot(torch.tensor(token), V).double() if i == 0 else q / q.sum())
                tokens.append(token)
                q = q.clone()
                q[token] = 0.0
        return DraftTree(torch.tensor(tokens), parents, torch.stack(rows).float())
    if kind == "point":
        return DraftTree(torch.tensor([2, 1, 4, 1, 2]), parents)
    return DraftTree(torch.tensor([2, 2, 0, 1, 1]), parents)  # "repeat"


def run_rule(kind: str, seed: int = 0) -> tuple[list[int], list[int], int]:
    generator = torch.Generator().manual_seed(seed)
    sampler = RejectionSampler(generator)
    first, second, accepted = [], [], 0
    for _ in range(N):
        tree = make_tree(kind, generator)
        scores = torch.cat([P_ROOT.log()[None]] + [P_NEXT.log()[None]] * tree.size).float()  # [1 + n, V]
        verdict = accept_rejection(tree, scores, sampler)
        tokens = tree.path_tokens(verdict.path) + [verdict.next_token]
        first.append(tokens[0])
        second += tokens[1:2]
        accepted += verdict.num_accepted
    return first, second, accepted


@pytest.mark.parametrize("kind", ["chain", "tree", "tree-without", "top-then-drawn", "point", "repeat"])
def test_the_rule_keeps_the_target_distribution(kind):
    first, second, accepted = run_rule(kind)
    assert chi2_p(first, P_ROOT) > ALPHA
    assert chi2_p(second, P_NEXT) > ALPHA  # the token after an accepted first one is the target's too
    assert len(second) > N * 0.3  # drafts were accepted often enough to test the second position


@pytest.mark.single_version  # the rule on synthetic distributions: no transformers in it
def test_a_chain_from_q_is_accepted_at_one_minus_tv():
    """One drafted token x ~ q is kept with probability sum_x min(p(x), q(x)) = 1 - TV(p, q)."""
    generator = torch.Generator().manual_seed(3)
    sampler, kept = RejectionSampler(generator), 0
    for _ in range(N):
        token = torch.multinomial(Q, 1, generator=generator)
        tree = DraftTree(token, torch.tensor([-1]), Q.float()[None])
        kept += accept_rejection(tree, torch.stack([P_ROOT.log(), P_NEXT.log()]).float(), sampler).num_accepted
    expected = float(torch.minimum(P_ROOT, Q).sum())
    assert abs(kept / N - expected) < 4 * (expected * (1 - expected) / N) ** 0.5


def _ignores_q(p, q, x):  # the residual of a point mass, for a token drawn from q
    residual = p.clone()
    residual[x] = 0.0
    return residual / residual.sum()


def _keeps_the_rejected(p, q, x):  # a rejected guess stays in the residual: it can be tried (and kept) again
    return p if q is None else torch.clamp(p - q, min=0.0) / torch.clamp(p - q, min=0.0).sum()


def _not_renormalised(p, q, x):  # the next sibling is weighed against an unnormalised residual
    residual = p.clone()
    if q is None:
        residual[x] = 0.0
    else:
        residual = torch.clamp(residual - q, min=0.0)
    return residual


@pytest.mark.single_version  # the rule on synthetic distributions: no transformers in it
@pytest.mark.parametrize("broken, kind", [(_ignores_q, "tree"), (_keeps_the_rejected, "repeat"),
                                          (_not_renormalised, "tree"), (None, "tree-without-as-with")],
                         ids=["q-ignored", "sibling-tried-twice", "not-renormalised", "drawn-without-as-with"])
def test_negative_control_a_broken_rule_is_caught(monkeypatch, broken, kind):
    if broken is not None:
        monkeypatch.setattr(accept_module, "_residual", broken)
    first, second, _ = run_rule(kind)
    assert min(chi2_p(first, P_ROOT), chi2_p(second, P_NEXT)) < ALPHA


# -- the mode, end to end ------------------------------------------------------------------------
def test_the_mode_is_checked():
    assert check_mode(None) == "seeded" and check_mode("rejection") == "rejection"
    with pytest.raises(ValueError, match="choose 'seeded'"):
        check_mode("greedy")
    with pytest.raises(ValueError, match="sampling_seed= fixes the text of the seeded rule"):
        check_mode("rejection", seed=3)


def rejection_samples(target, strategy, prompt, n: int = N_E2E, seed: int = 99, **extra):
    torch.manual_seed(seed)
    counts, total = Counter(), Counter()
    for _ in range(n):
        out = target.generate(**inputs(prompt), do_sample=True, temperature=1.0, max_new_tokens=NEW,
                              candidate_generator=strategy, **extra)
        counts[cell(out[0, len(prompt):].tolist(), None)] += 1
        st = hfs.last_stats(target)
        total.update(drafted=st.drafted_tokens, accepted=st.accepted_tokens)
    return counts, total


def test_draft_model_chains_follow_the_target_and_accept_more_than_the_seeded_rule(target, close_drafter):
    exact, plain = references(target, PROMPT)
    strategy = hfs.DraftModel(close_drafter, confidence_threshold=0.0, adaptive=False)
    samples, rejection = rejection_samples(target, strategy, PROMPT, speculative_sampling="rejection")
    assert 0.3 * rejection["drafted"] < rejection["accepted"] < rejection["drafted"], rejection
    assert_same_distribution(samples, exact, plain)
    _, seeded = rejection_samples(target, strategy, PROMPT)
    assert rejection["accepted"] / rejection["drafted"] > seeded["accepted"] / seeded["drafted"], (rejection, seeded)


@pytest.mark.parametrize("which", ["far-drafter", "prompt-lookup", "draft-model-tree", "medusa-tree", "static-cache",
                                   "transformers-loop"])
def test_other_drafts_follow_the_target(target, close_drafter, far_drafter, lookup_prompt, which):
    """Mostly rejected drafts (the residual does the work), point-mass chains, a tree drawn from q, a point-mass tree
    (Medusa's static tree), a static cache, and transformers' own loop (which samples by its own rule)."""
    prompt = lookup_prompt if which == "prompt-lookup" else PROMPT
    strategy = {
        "far-drafter": lambda: hfs.DraftModel(far_drafter, adaptive=False),
        "prompt-lookup": lambda: hfs.PromptLookup(adaptive=False),
        "draft-model-tree": lambda: hfs.DraftModel(close_drafter, tree=DynamicTree(nodes=6, depth=3, top_k=2),
                                                   adaptive=False),
        "medusa-tree": lambda: _echo_medusa(target),
        "static-cache": lambda: hfs.DraftModel(close_drafter, confidence_threshold=0.0, adaptive=False),
        "transformers-loop": lambda: hfs.DraftModel(close_drafter, confidence_threshold=0.0, adaptive=False),
    }[which]()
    extra = {"static-cache": {"cache_implementation": "static"},
             "transformers-loop": {"speculative_loop": "transformers"}}.get(which, {})
    exact, plain = references(target, prompt)
    samples, total = rejection_samples(target, strategy, prompt, speculative_sampling="rejection", **extra)
    assert 0 < total["accepted"] < total["drafted"], total
    assert_same_distribution(samples, exact, plain)


def test_a_batch_draws_each_row_from_the_target(target, close_drafter):
    """Two identical rows of one call: each row's tokens follow the target (the first position's marginal), and
    the rows draw independently (they differ)."""
    exact, _ = references(target, PROMPT)
    first = Counter()
    p_first = Counter()
    for sample, p in exact.items():
        p_first[sample[0]] += p
    torch.manual_seed(5)
    differ = 0
    strategy = hfs.DraftModel(close_drafter, confidence_threshold=0.0, adaptive=False)
    for _ in range(N_E2E // 2):
        out = target.generate(**inputs(PROMPT, batch=2), do_sample=True, max_new_tokens=NEW, pad_token_id=0,
                              candidate_generator=strategy, speculative_sampling="rejection")
        first.update(out[:, len(PROMPT)].tolist())
        differ += int(out[0].tolist() != out[1].tolist())
    observed = [first.get(t, 0) for t in range(16)]
    expected = [p_first.get(t, 0.0) * N_E2E for t in range(16)]
    keep = [i for i, e in enumerate(expected) if e >= 5]
    rest_o, rest_e = sum(observed) - sum(observed[i] for i in keep), sum(expected) - sum(expected[i] for i in keep)
    p_value = chisquare([observed[i] for i in keep] + [rest_o], [expected[i] for i in keep] + [rest_e]).pvalue
    assert p_value > E2E_ALPHA and differ > N_E2E // 4


def test_scores_are_the_processed_scores_and_the_streamer_gets_every_token(target, close_drafter):
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.tokens = []

        def put(self, value):
            self.tokens += value.reshape(-1).tolist()

        def end(self):
            pass

    streamer = Collect()
    strategy = hfs.DraftModel(close_drafter, confidence_threshold=0.0, adaptive=False)
    out = target.generate(**inputs(PROMPT), do_sample=True, temperature=0.7, max_new_tokens=6, streamer=streamer,
                          candidate_generator=strategy, speculative_sampling="rejection", output_scores=True,
                          return_dict_in_generate=True)
    new = out.sequences[0, len(PROMPT):].tolist()
    assert streamer.tokens[len(PROMPT):] == new and len(out.scores) == len(new)
    assert all(torch.isfinite(score).sum() > 1 for score in out.scores)  # a distribution, not a point mass


def test_the_mode_is_saved_with_the_model(target, close_drafter, tmp_path):
    from transformers import AutoModelForCausalLM

    model = hfs.enable(AutoModelForCausalLM.from_pretrained(_saved(target, tmp_path)))
    assert model.generation_config.speculative_sampling == "rejection"
    strategy = hfs.DraftModel(close_drafter, confidence_threshold=0.0, adaptive=False)
    torch.manual_seed(0)
    a = model.generate(**inputs(PROMPT), do_sample=True, max_new_tokens=NEW, candidate_generator=strategy)
    torch.manual_seed(0)
    b = model.generate(**inputs(PROMPT), do_sample=True, max_new_tokens=NEW, candidate_generator=strategy,
                       speculative_sampling="rejection")
    assert a.tolist() == b.tolist()


def _saved(target, folder):
    target.generation_config.speculative_sampling = "rejection"
    try:
        target.save_pretrained(folder)
    finally:
        del target.generation_config.speculative_sampling
    return folder


def test_the_mode_is_the_model_s_default_from_its_generation_config(target, close_drafter):
    strategy = hfs.DraftModel(close_drafter, confidence_threshold=0.0, adaptive=False)
    target.generation_config.speculative_sampling = "rejection"
    try:
        torch.manual_seed(0)
        a = target.generate(**inputs(PROMPT), do_sample=True, max_new_tokens=NEW, candidate_generator=strategy)
        torch.manual_seed(0)
        b = target.generate(**inputs(PROMPT), do_sample=True, max_new_tokens=NEW, candidate_generator=strategy,
                            speculative_sampling="rejection")
        assert a.tolist() == b.tolist()  # the same draws: the same rule
        seeded = target.generate(**inputs(PROMPT), do_sample=True, max_new_tokens=NEW, candidate_generator=strategy,
                                 sampling_seed=1)  # sampling_seed= implies the seeded rule
        assert seeded.tolist() == target.generate(**inputs(PROMPT), do_sample=True, max_new_tokens=NEW,
                                                  candidate_generator=None, sampling_seed=1).tolist()
        with pytest.raises(ValueError, match="sampling_seed= fixes the text of the seeded rule"):
            target.generate(**inputs(PROMPT), do_sample=True, max_new_tokens=NEW, candidate_generator=strategy,
                            sampling_seed=1, speculative_sampling="rejection")
    finally:
        del target.generation_config.speculative_sampling


@pytest.mark.single_version  # the rule on synthetic distributions: no transformers in it
def test_a_dynamic_tree_keeps_its_top_guess_then_draws_the_others():
    """Under the rejection rule a DynamicTree's first guess at a node is the drafter's top one (a point mass: a
    one-hot q), the next ones draws without replacement from the rest (each with the q it was drawn from), and every
    node's kept children are the first ones drafted."""
    torch.manual_seed(0)
    logits = torch.randn(40)
    sampler = RejectionSampler(torch.Generator().manual_seed(1))

    def expand(frontier, tokens, parents):
        return torch.log_softmax(torch.randn(len(frontier), 40, generator=torch.Generator().manual_seed(len(tokens))),
                                 dim=-1)

    shape = DynamicTree(nodes=9, depth=3, top_k=4)
    q = torch.softmax(logits, -1)
    top = int(q.argmax())
    seen = Counter()
    for _ in range(300):
        tree = shape.grow(torch.log_softmax(logits, -1), expand, sampler=sampler)
        assert tree.q is not None and tree.q.shape == (tree.size, 40)
        roots = tree.children(-1)
        assert int(tree.tokens[roots[0]]) == top and float(tree.q[roots[0], top]) == 1.0
        assert len(roots) > 1 and float(tree.q[roots[1], top]) == 0.0  # the second one drawn without the first
        for node in range(tree.size):  # kept children: a prefix of the ones drafted (drafting order = index order)
            kids = tree.children(node)
            assert kids == list(range(kids[0], kids[0] + len(kids))) if kids else True
        seen[int(tree.tokens[roots[1]])] += 1
    rest = q.clone()
    rest[top] = 0.0
    expected = [float(rest[t] / rest.sum()) * 300 for t in range(40)]  # the second guess is a draw from the rest
    keep = [t for t in range(40) if expected[t] >= 5]
    observed = [seen[t] for t in keep] + [300 - sum(seen[t] for t in keep)]
    assert chisquare(observed, [expected[t] for t in keep] + [300 - sum(expected[t] for t in keep)]).pvalue > ALPHA
    deterministic = shape.grow(torch.log_softmax(logits, -1), expand)
    assert deterministic.q is None and int(deterministic.tokens[0]) == top


def test_a_draft_model_tree_accepts_at_least_as_much_as_under_the_seeded_rule(target, close_drafter):
    strategy = hfs.DraftModel(close_drafter, tree=DynamicTree(nodes=6, depth=3, top_k=2), adaptive=False)
    _, rejection = rejection_samples(target, strategy, PROMPT, speculative_sampling="rejection")
    _, seeded = rejection_samples(target, strategy, PROMPT)
    assert rejection["accepted"] / rejection["drafted"] > seeded["accepted"] / seeded["drafted"], (rejection, seeded)


@pytest.mark.single_version  # the rule on synthetic distributions: no transformers in it
def test_guesses_are_drawn_from_the_drafters_likeliest_tokens_and_q_says_so(monkeypatch):
    """A dynamic tree's draws come from the drafter's ``PROPOSAL_TOKENS`` likeliest tokens, renormalised, and each
    node's ``q`` is exactly that distribution (less the siblings drawn before it): what the rule must be told."""
    monkeypatch.setattr(tree_shapes, "PROPOSAL_TOKENS", 5)
    logits = torch.randn(40, generator=torch.Generator().manual_seed(0))
    sampler = RejectionSampler(torch.Generator().manual_seed(1))
    shape = DynamicTree(nodes=4, depth=1, top_k=4)
    top5 = torch.softmax(logits, -1).topk(5).indices.tolist()
    truncated = torch.zeros(40)
    truncated[top5] = torch.softmax(logits[top5], -1)
    seen = Counter()
    for _ in range(300):
        tree = shape.grow(torch.log_softmax(logits, -1), lambda *a: None, sampler=sampler)
        assert set(tree.tokens.tolist()) <= set(top5) and int(tree.tokens[0]) == top5[0]
        assert torch.equal(tree.q[0], torch.nn.functional.one_hot(torch.tensor(top5[0]), 40).float())
        rest = truncated.clone()
        for i in range(1, tree.size):
            rest[int(tree.tokens[i - 1])] = 0.0
            assert torch.allclose(tree.q[i], rest / rest.sum())
        seen[int(tree.tokens[1])] += 1
    second = truncated.clone()
    second[top5[0]] = 0.0
    expected = [float(second[t] / second.sum()) * 300 for t in top5[1:]]
    expected = [e * 300 / sum(expected) for e in expected]  # (float32 sums: chisquare wants them equal)
    assert chisquare([seen[t] for t in top5[1:]], expected).pvalue > ALPHA


def test_a_truncated_proposal_keeps_the_target_distribution(monkeypatch, target, close_drafter):
    """End to end through the rule with draws from only the drafter's 3 likeliest tokens (most drafts then miss)."""
    monkeypatch.setattr(tree_shapes, "PROPOSAL_TOKENS", 3)
    strategy = hfs.DraftModel(close_drafter, tree=DynamicTree(nodes=6, depth=3, top_k=3), adaptive=False)
    exact, plain = references(target, PROMPT)
    samples, total = rejection_samples(target, strategy, PROMPT, speculative_sampling="rejection")
    assert 0 < total["accepted"] < total["drafted"], total
    assert_same_distribution(samples, exact, plain)


# -- point-mass drafts: the same forwards per text under both rules -----------------------------
class _Force:
    """A logits processor that makes greedy decoding write ``text`` after a prompt of ``length`` tokens."""

    def __init__(self, length: int, text: list[int]):
        self.length, self.text = length, text

    def __call__(self, input_ids, scores):
        position = input_ids.shape[-1] - self.length
        if position >= len(self.text):
            return scores
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.text[position]] = 0.0
        return forced


def _echo_medusa(target) -> hfs.Medusa:
    """Medusa heads that guess the target's ranking of the token just written (zero blocks before the target's own
    lm_head): right often on this target's repetitive texts, and wrong often enough, as a tree 3 wide at the top."""
    from hf_speculative.drafters.medusa.config import MedusaConfig
    from hf_speculative.drafters.medusa.model import MedusaHeads

    heads = MedusaHeads(MedusaConfig.for_target(target.config, 3, lm_head="target", num_layers=1))
    with torch.no_grad():
        for weight in heads.parameters():
            weight.zero_()
    tree = tree_shapes.StaticTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    return hfs.Medusa(heads.eval(), tree=tree, adaptive=False)


def _raw(guide, logits, branches):
    """A tree's guesses from the drafter's own distribution, without the call's processors."""
    return torch.log_softmax(logits.float(), dim=-1)


def _forwards_per_text(target, mode: str, seeds: range) -> list[tuple[int, int]]:
    """(forwards of the sampled call, forwards of greedy decoding forced to write its text) for each seed."""
    from transformers import LogitsProcessorList

    medusa, pairs = _echo_medusa(target), []
    for seed in seeds:
        torch.manual_seed(seed)
        out = target.generate(**inputs(PROMPT), do_sample=True, temperature=1.0, max_new_tokens=12,
                              candidate_generator=medusa, speculative_sampling=mode)
        text, sampled = out[0, len(PROMPT):].tolist(), hfs.last_stats(target).target_forwards
        with pytest.MonkeyPatch.context() as patch:  # trees apply the call's processors to their guesses: the
            patch.setattr(DraftGuide, "logprobs", _raw)  # replay's drafter must not see the forcing one
            replay = target.generate(**inputs(PROMPT), do_sample=False, max_new_tokens=len(text),
                                     candidate_generator=medusa,
                                     logits_processor=LogitsProcessorList([_Force(len(PROMPT), text)]))
        assert replay[0, len(PROMPT):].tolist() == text
        pairs.append((sampled, hfs.last_stats(target).target_forwards))
    return pairs


@pytest.mark.parametrize("mode", ["seeded", "rejection"])
def test_point_mass_trees_take_the_forwards_their_text_implies(target, mode):
    """With point-mass guesses (a Medusa static tree) a guess is kept exactly when the target's token is that guess,
    under either rule: so a text's forwards are those of greedy decoding forced to write it, and the two rules,
    sampling the same distribution, have the same τ in expectation (the issue-45 grid's Medusa rows)."""
    pairs = _forwards_per_text(target, mode, range(12))
    assert all(sampled == replayed for sampled, replayed in pairs), pairs
    assert sum(replayed < 12 for _, replayed in pairs) >= 6, pairs  # guesses were kept: something to compare


def test_negative_control_a_rejected_guess_drawn_again_shows_in_the_forwards(monkeypatch, target):
    """The residual keeps a rejected point mass: the target can then write a guess it did not keep, and the text's
    forwards (a kept guess saves one) no longer match."""
    monkeypatch.setattr(accept_module, "_residual", _keeps_the_rejected)
    pairs = _forwards_per_text(target, "rejection", range(12))
    assert any(sampled != replayed for sampled, replayed in pairs), pairs
