"""Sampling stays exact: with ``do_sample=True`` the speculative output follows the target's own
distribution.

A tiny model with a 16-token vocabulary samples 3 new tokens many times. The empirical joint
distribution of the 3 tokens is compared (chi-square, cells with few expected counts merged) with
(a) the exact distribution computed from the target's logits and (b) plain ``generate`` sampling
(batched, so cheap). Speculative sampling draws each position with the Gumbel-max trick from noise
keyed by (seed, position) (hf_speculative.core.sampling); a sampler whose noise is wrong (not Gumbel, or not
fresh per position) must be caught by the same test. Everything is seeded, so the p-values are
deterministic for a given torch/transformers.
"""

from __future__ import annotations

import copy
import itertools
from collections import Counter

import pytest
import torch
from scipy import stats as scipy_stats
from transformers import LlamaConfig, LlamaForCausalLM

import hf_speculative as hfs
from hf_speculative.drafters.draft_model.drafter import DraftModelCandidateGenerator
from hf_speculative.core.sampling import SeededSampler, position_key
from tests.conftest import random_exit_adapter, stock_generate

V = 16
NEW = 3
N_SPECULATIVE = 500
N_NEGATIVE = N_SPECULATIVE  # the same test, so the same power
N_PLAIN = 20000
ALPHA = 1e-3
# For the draft models; the target's first token has p_max ~ 0.66 here.
PROMPT = (3, 4, 5, 3, 4, 5, 3, 4)


def tiny(seed: int, init: float, layers: int = 1) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, initializer_range=init,
                         eos_token_id=None, bos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def target():
    # A large init makes the distributions peaked: few cells carry the mass, so the test has power.
    return hfs.enable(tiny(0, init=1.0))


@pytest.fixture(scope="module")
def close_drafter(target):
    """The target with a flattened head: q = softmax(logits / 2), accepted about 70% of the time."""
    model = copy.deepcopy(target)
    hfs.disable(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.5)
    return model


@pytest.fixture(scope="module")
def far_drafter():
    """An unrelated random model: nearly every draft is rejected, so the resampling path does the work."""
    return tiny(1, init=0.5)


@pytest.fixture(scope="module")
def lookup_prompt(target) -> tuple:
    """A prompt ``a b a b a`` whose prompt-lookup draft ``b a`` the target samples about half of the
    time at both positions (searched over all pairs, so it does not depend on the random init)."""
    pairs = [(a, b) for a in range(V) for b in range(V) if a != b]
    odd = torch.tensor([[a, b, a, b, a] for a, b in pairs])
    even = torch.tensor([[a, b, a, b, a, b] for a, b in pairs])
    with torch.no_grad():
        p_b = torch.softmax(target(odd).logits[:, -1], -1)[torch.arange(len(pairs)), odd[:, 1]]
        p_a = torch.softmax(target(even).logits[:, -1], -1)[torch.arange(len(pairs)), even[:, 0]]
    score = torch.stack([p_b, p_a, 1 - p_b, 1 - p_a]).min(dim=0).values
    best = int(score.argmax())
    assert score[best] > 0.2, "no pair gives a useful prompt-lookup test"
    a, b = pairs[best]
    return (a, b, a, b, a)


def inputs(prompt, batch: int = 1) -> dict:
    ids = torch.tensor([list(prompt)] * batch)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


_REFERENCES: dict = {}


def cell(tokens: list[int], eos: int | None) -> tuple:
    """The sample as a tuple, cut after its first EOS (what follows is padding)."""
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    return tuple(tokens)


def references(target, prompt, eos: int | None = None) -> tuple[dict, Counter]:
    """(exact P(t1, t2, t3) from the target's logits, ``N_PLAIN`` plain samples), cached."""
    key = (id(target), prompt, eos)
    if key not in _REFERENCES:
        pairs = torch.tensor(list(itertools.product(range(V), repeat=2)))
        ids = torch.cat([torch.tensor([prompt]).repeat(len(pairs), 1), pairs], dim=-1)
        with torch.no_grad():
            logp = torch.log_softmax(target(ids).logits.double(), dim=-1)
        L = len(prompt)
        p1, p2, p3 = logp[:, L - 1].exp(), logp[:, L].exp(), logp[:, L + 1].exp()  # rows: (t1, t2)
        exact = Counter()
        for row, (t1, t2) in enumerate(pairs.tolist()):
            for t3 in range(V):
                exact[cell([t1, t2, t3], eos)] += float(p1[row, t1] * p2[row, t2] * p3[row, t3])
        assert abs(sum(exact.values()) - 1.0) < 1e-9
        out = stock_generate(target, **inputs(prompt, N_PLAIN), do_sample=True, temperature=1.0, max_new_tokens=NEW,
                             eos_token_id=eos)
        plain = Counter(cell(row, eos) for row in out[:, L:].tolist())
        _REFERENCES[key] = dict(exact), plain
    return _REFERENCES[key]


def speculative_samples(target, strategy, prompt, n: int = N_SPECULATIVE, seed: int = 1234, eos: int | None = None):
    """``n`` speculative samples, and the summed statistics of the calls."""
    torch.manual_seed(seed)
    counts, total = Counter(), Counter()
    for _ in range(n):
        out = target.generate(**inputs(prompt), do_sample=True, temperature=1.0, max_new_tokens=NEW,
                              eos_token_id=eos, candidate_generator=strategy)
        tokens = out[0, len(prompt):].tolist()
        assert eos not in tokens[:-1], "tokens after EOS"
        counts[cell(tokens, eos)] += 1
        st = hfs.last_stats(target)
        total.update(drafted=st.drafted_tokens, accepted=st.accepted_tokens, forwards=st.target_forwards)
    return counts, total


def goodness_of_fit(counts: Counter, probs: dict, min_expected: float = 5.0) -> float:
    """Chi-square p-value of ``counts`` against ``probs``; cells expected < ``min_expected`` merged."""
    n = sum(counts.values())
    assert set(counts) <= set(probs)
    observed, expected, rest_obs, rest_exp = [], [], 0.0, 0.0
    for cell, p in probs.items():
        if n * p >= min_expected:
            observed.append(counts.get(cell, 0))
            expected.append(n * p)
        else:
            rest_obs += counts.get(cell, 0)
            rest_exp += n * p
    observed.append(rest_obs)
    expected.append(rest_exp)
    return float(scipy_stats.chisquare(observed, expected).pvalue)


def two_sample(a: Counter, b: Counter, min_count: int = 10) -> float:
    """Chi-square test of homogeneity of two samples; cells with fewer than ``min_count`` pooled merged."""
    rows, rest = [], [0, 0]
    for cell in set(a) | set(b):
        if a.get(cell, 0) + b.get(cell, 0) >= min_count:
            rows.append([a.get(cell, 0), b.get(cell, 0)])
        else:
            rest[0] += a.get(cell, 0)
            rest[1] += b.get(cell, 0)
    rows.append(rest)
    return float(scipy_stats.chi2_contingency(torch.tensor(rows).T.numpy()).pvalue)


def marginal(counts: Counter, position: int) -> Counter:
    out = Counter()
    for sample, n in counts.items():
        out[sample[position] if position < len(sample) else None] += n
    return out


def marginal_probs(exact: dict, position: int) -> dict:
    out = Counter()
    for sample, p in exact.items():
        out[sample[position] if position < len(sample) else None] += p
    return dict(out)


def assert_same_distribution(samples, exact, plain):
    p_exact = goodness_of_fit(samples, exact)
    p_plain = two_sample(samples, plain)
    positions = [goodness_of_fit(marginal(samples, i), marginal_probs(exact, i)) for i in range(NEW)]
    assert p_exact > ALPHA and p_plain > ALPHA and min(positions) > ALPHA, (p_exact, p_plain, positions)


@pytest.mark.parametrize("which", ["draft-models", "prompt-lookup"])
def test_the_references_agree(target, lookup_prompt, which):
    """Plain sampling agrees with the exact distribution (so the exact one is computed right), and
    the target is peaked enough for the tests to have power."""
    exact, plain = references(target, PROMPT if which == "draft-models" else lookup_prompt)
    assert goodness_of_fit(plain, exact) > ALPHA
    assert max(exact.values()) > 0.05


def test_draft_model_sampling_follows_the_target(target, close_drafter):
    exact, plain = references(target, PROMPT)
    strategy = hfs.DraftModel(close_drafter, confidence_threshold=0.0, adaptive=False)
    samples, total = speculative_samples(target, strategy, PROMPT)
    # Preconditions: full drafts, some accepted and some rejected (both paths exercised).
    assert total["drafted"] >= 2 * N_SPECULATIVE * 0.9, total
    assert 0.3 * total["drafted"] < total["accepted"] < 0.95 * total["drafted"], total
    assert_same_distribution(samples, exact, plain)


def test_draft_model_sampling_with_adaptive_draft_length(target, close_drafter, cheap_verification):
    """Confidence threshold and adaptive draft length: the decision to draft (and to stop) must not
    bias the sample. Costs are fixed (a cheap drafter, verification as on a GPU) so that
    what is drafted does not depend on this machine's load."""
    cheap_verification(target)
    exact, plain = references(target, PROMPT)
    samples, total = speculative_samples(target, hfs.DraftModel(close_drafter, draft_cost=0.05), PROMPT)
    assert total["drafted"] >= N_SPECULATIVE // 2, total
    assert 0.3 * total["drafted"] < total["accepted"] < 0.95 * total["drafted"], total
    assert_same_distribution(samples, exact, plain)


def test_draft_model_sampling_with_mostly_rejected_drafts(target, far_drafter):
    """An unrelated drafter: nearly every draft is rejected, so the output comes from the target's own draws."""
    exact, plain = references(target, PROMPT)
    samples, total = speculative_samples(target, hfs.DraftModel(far_drafter, adaptive=False), PROMPT)
    assert total["drafted"] > N_SPECULATIVE and 0 < total["accepted"] < 0.2 * total["drafted"], total
    assert_same_distribution(samples, exact, plain)


def test_draft_model_sampling_with_eos_in_drafts(target, close_drafter):
    """EOS is a token the target samples ~20% of the time: drafts that contain it are cut before it (the
    target draws it itself when its seeded draw is EOS), and the samples that end early must still follow
    the target's distribution."""
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([PROMPT])).logits[0, -1], -1)
    eos = int((p1 - 0.2).abs().argmin())
    assert 0.05 < float(p1[eos]) < 0.5
    exact, plain = references(target, PROMPT, eos=eos)
    strategy = hfs.DraftModel(close_drafter, confidence_threshold=0.0, adaptive=False)
    samples, total = speculative_samples(target, strategy, PROMPT, eos=eos)
    assert sum(n for sample, n in samples.items() if len(sample) < NEW) > 0.1 * N_SPECULATIVE
    assert 0.3 * total["drafted"] < total["accepted"] < 0.95 * total["drafted"], total
    assert_same_distribution(samples, exact, plain)


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_prompt_lookup_sampling_follows_the_target(target, lookup_prompt, adaptive, cheap_verification):
    cheap_verification(target)  # the adaptive policy then drafts whatever this machine's load
    exact, plain = references(target, lookup_prompt)
    samples, total = speculative_samples(target, hfs.PromptLookup(adaptive=adaptive), lookup_prompt)
    assert total["drafted"] >= N_SPECULATIVE, total
    assert 0.2 * total["drafted"] < total["accepted"] < 0.9 * total["drafted"], total
    assert_same_distribution(samples, exact, plain)


def test_hybrid_sampling_follows_the_target(target, lookup_prompt, close_drafter):
    """Lookup drafts (no logits: checked against a token the target samples) and draft-model drafts
    (the drafter's own seeded draws) in the same calls: trigram matches only, so the draft
    model drafts whenever the sampled text breaks the pattern."""
    exact, plain = references(target, lookup_prompt)
    strategy = hfs.Hybrid(hfs.PromptLookup(min_ngram=3, max_ngram=3, adaptive=False),
                          hfs.DraftModel(close_drafter, confidence_threshold=0.0, adaptive=False))
    torch.manual_seed(1234)
    counts, members = Counter(), Counter()
    for _ in range(N_SPECULATIVE):
        out = target.generate(**inputs(lookup_prompt), do_sample=True, temperature=1.0, max_new_tokens=NEW,
                              candidate_generator=strategy)
        counts[cell(out[0, len(lookup_prompt):].tolist(), None)] += 1
        for name, figures in hfs.last_stats(target).extra["hybrid"].items():
            members.update({f"{name} drafted": figures["drafted"], f"{name} accepted": figures["accepted"]})
    for name in ("prompt-lookup", "draft-model"):  # both kinds of draft, both accepted and rejected
        assert 0 < members[f"{name} accepted"] < members[f"{name} drafted"], members
    assert_same_distribution(counts, exact, plain)


def _uniform_noise(self, row, position, vocab, device="cpu"):
    generator = torch.Generator(device=device).manual_seed(position_key(self.seed, row, position))
    return torch.rand(vocab, generator=generator, device=device)  # uniform, not Gumbel: favours likely tokens


def _noise_shared_by_positions(self, row, position, vocab, device="cpu"):
    generator = torch.Generator(device=device).manual_seed(position_key(self.seed, row, 0))
    return -torch.log(-torch.log(torch.rand(vocab, generator=generator, device=device)))  # one g for every t


# that the checks can fail is the statistics' property, whatever transformers' version (the checks run on both)
@pytest.mark.single_version
@pytest.mark.parametrize("noise", [_uniform_noise, _noise_shared_by_positions], ids=["uniform", "shared-by-positions"])
def test_negative_control_a_broken_sampler_is_detected(target, close_drafter, noise, monkeypatch):
    """The same checks must reject a seeded sampler whose noise is not i.i.d. Gumbel per position: uniform
    noise (each position's draw biased) or one noise vector for every position (each position's draw right
    on its own, the joint distribution wrong)."""
    monkeypatch.setattr(SeededSampler, "noise", noise)
    exact, plain = references(target, PROMPT)
    samples, total = speculative_samples(target, hfs.DraftModel(close_drafter, confidence_threshold=0.0,
                                                                adaptive=False), PROMPT, n=N_NEGATIVE)
    assert total["drafted"] > N_NEGATIVE
    assert goodness_of_fit(samples, exact) < ALPHA and two_sample(samples, plain) < ALPHA


def test_a_drafter_s_reported_logits_do_not_matter(target, close_drafter):
    """Drafts are checked against the target's seeded draw, not by a rejection sampler reading the drafter's
    logits: a drafter that reports logits other than its own (the classic way to break speculative sampling)
    gives the text of plain seeded sampling, token for token."""

    class Lying(DraftModelCandidateGenerator):
        def draft(self, input_ids, plan):
            tree = super().draft(input_ids, plan)
            self.draft_logits = torch.zeros(tree.size, V) if tree.size else None  # what transformers' loop reads
            return tree

    class LyingDraftModel(hfs.DraftModel):
        def open(self, ctx):
            return Lying(ctx, self)

    strategy = LyingDraftModel(close_drafter, confidence_threshold=0.0, adaptive=False)
    for seed in range(40):
        plain = target.generate(**inputs(PROMPT), do_sample=True, max_new_tokens=NEW, sampling_seed=seed)
        out = target.generate(**inputs(PROMPT), do_sample=True, max_new_tokens=NEW, sampling_seed=seed,
                              candidate_generator=strategy)
        assert out.tolist() == plain.tolist(), seed
    assert hfs.last_stats(target).drafted_tokens > 0


@pytest.fixture(scope="module")
def deep_target():
    """A peaked two-layer target for the self-speculative drafters (they draft with part of it)."""
    return hfs.enable(tiny(5, init=1.0, layers=2))


@pytest.mark.parametrize("kind", ["early-exit", "early-exit-adapter", "layer-skip"])
def test_self_speculative_sampling_follows_the_target(deep_target, kind):
    exact, plain = references(deep_target, PROMPT)
    assert goodness_of_fit(plain, exact) > ALPHA
    options = dict(confidence_threshold=0.0, adaptive=False)
    strategy = {"early-exit": lambda: hfs.EarlyExit(exit_layer=1, **options),
                "early-exit-adapter": lambda: hfs.EarlyExit(adapter=random_exit_adapter(deep_target, 1), **options),
                "layer-skip": lambda: hfs.LayerSkip(skip=[0], **options)}[kind]()
    samples, total = speculative_samples(deep_target, strategy, PROMPT)
    # drafts of up to 2 tokens after the prefill, some accepted and some rejected
    assert total["drafted"] >= N_SPECULATIVE, total
    assert 0.1 * total["drafted"] < total["accepted"] < 0.95 * total["drafted"], total
    assert_same_distribution(samples, exact, plain)


def test_tree_sampling_follows_the_target(target, lookup_prompt, close_drafter):
    """Draft trees in our loop under sampling: n-gram trees and draft-model chains share the rule."""
    exact, plain = references(target, lookup_prompt)
    strategy = hfs.PromptLookup(tree=hfs.DynamicTree(nodes=8, top_k=2), adaptive=False)
    samples, total = speculative_samples(target, strategy, lookup_prompt)
    assert total["drafted"] >= N_SPECULATIVE, total
    assert 0 < total["accepted"] < total["drafted"], total
    assert_same_distribution(samples, exact, plain)
