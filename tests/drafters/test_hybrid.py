"""hfs.Hybrid: the first member that drafts proposes; every member follows every forward. The whole
drafter battery (greedy identity, EOS / max length / stop strings inside a draft, sampling) runs on
``"hybrid"`` through ``tests/conftest.py``; these tests check what is particular to it."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core.tree import DraftTree
from hf_speculative.drafters.generator import SpeculativeCandidateGenerator
from hf_speculative.drafters.eagle.drafter import EagleCandidateGenerator
from tests.conftest import PROMPT, build_model, prompt_inputs, stock_generate
from tests.drafters.eagle.test_drafter import _hook_count, train_on_own_text

L = len(PROMPT)
GREEDY = dict(do_sample=False, max_new_tokens=40, eos_token_id=None)


class EveryOther(hfs.DraftStrategy):
    """Proposes the true greedy continuation (``num_tokens`` tokens) at every other step, nothing
    in between: the next member drafts there, right after a forward it did not draft for."""

    name = "every-other"

    def __init__(self, reference, num_tokens: int = 3, silent: bool = False):
        self.reference = [int(t) for t in torch.as_tensor(reference).reshape(-1)]
        self.num_tokens, self.silent = num_tokens, silent

    def open(self, ctx):
        return _EveryOtherGenerator(ctx, self)


class _EveryOtherGenerator(SpeculativeCandidateGenerator):
    def __init__(self, ctx, config):
        super().__init__(ctx)
        self.config, self.asked = config, 0

    def draft(self, input_ids, plan):
        self.asked += 1
        if self.config.silent or self.asked % 2:
            return DraftTree.empty(input_ids.device)
        length = input_ids.shape[1]
        return DraftTree.from_tokens(self.config.reference[length : length + min(self.config.num_tokens, plan.depth)],
                                     input_ids.device)


@pytest.fixture(scope="module")
def trained():
    target = build_model("llama", layers=3, init=0.3)
    target.requires_grad_(False)
    hfs.enable(target)
    net, text = train_on_own_text(target, 3)
    return target, net, text


@pytest.fixture
def eagle_state(monkeypatch):
    """Records, when each call's EAGLE generator closes, whether its features still lined up."""
    seen = []
    close = EagleCandidateGenerator.close

    def recording_close(self):
        seen.append(self.features.lost)
        close(self)

    monkeypatch.setattr(EagleCandidateGenerator, "close", recording_close)
    return seen


def _eagle(net):
    return hfs.Eagle(net, num_tokens=6, confidence_threshold=0.0, adaptive=False)


def _spying(strategy_class, label, events):
    """``strategy_class`` whose generators append ``(label, length of input_ids, drafted tokens)``
    to ``events`` at every proposal."""

    class Spy(strategy_class):
        def open(self, ctx):
            generator = super().open(ctx)
            draft = generator.draft

            def spy(input_ids, plan):
                tree = draft(input_ids, plan)
                events.append((label, input_ids.shape[1], tree.tokens.tolist()))
                return tree

            generator.draft = spy
            return generator

    return Spy


def test_eagle_keeps_its_features_when_another_member_drafts(trained, eagle_state):
    """After forwards that verified another member's drafts, EAGLE drafts exactly what it drafts
    right after a prefill of the same text (its features and cache in line with the tokens)."""
    target, net, text = trained
    events = []
    eagle = _spying(hfs.Eagle, "eagle", events)(net, num_tokens=6, confidence_threshold=0.0, adaptive=False)
    out = target.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.Hybrid(EveryOther(text), eagle))
    stats = hfs.last_stats(target)
    assert out.tolist() == text.tolist()
    members = stats.extra["hybrid"]
    assert members["every-other"]["drafts"] > 0 and members["eagle"]["drafts"] > 0, members
    assert members["every-other"]["accepted"] == members["every-other"]["drafted"]
    assert stats.drafted_tokens == sum(m["drafted"] for m in members.values())
    assert stats.accepted_tokens == sum(m["accepted"] for m in members.values())
    in_hybrid = [(length, tokens) for _, length, tokens in events if tokens]
    compared = 0
    for length, tokens in in_hybrid:
        events.clear()
        prefix = text[:, : length - 1]  # its prefill, then the target's own token: the same `length`
        target.generate(input_ids=prefix, attention_mask=torch.ones_like(prefix), do_sample=False, max_new_tokens=9,
                        eos_token_id=None, candidate_generator=eagle)
        fresh = next(tokens for _, at, tokens in events if tokens and at == length)
        common = min(len(tokens), len(fresh))
        assert tokens[:common] == fresh[:common], (length, tokens, fresh)
        compared += common
    assert compared >= 10
    assert eagle_state and not any(eagle_state)  # never lost track of the target's forwards


def test_a_member_that_never_drafts_changes_nothing(trained):
    target, net, text = trained
    target.generate(**prompt_inputs(), **GREEDY, candidate_generator=_eagle(net))
    alone = hfs.last_stats(target)
    out = target.generate(**prompt_inputs(), **GREEDY,
                          candidate_generator=hfs.Hybrid(EveryOther(text, silent=True), _eagle(net)))
    hybrid = hfs.last_stats(target)
    assert out.tolist() == text.tolist()
    assert hybrid.accepted_lengths == alone.accepted_lengths
    assert hybrid.extra["hybrid"]["every-other"]["drafts"] == 0
    assert hybrid.method == "hybrid"


def test_later_members_are_asked_only_when_earlier_ones_draft_nothing(trained):
    target, net, text = trained
    events = []  # (member, length, tokens drafted) in the order asked
    lookup = _spying(hfs.PromptLookup, "lookup", events)(min_ngram=3, max_ngram=3, adaptive=False)
    eagle = _spying(hfs.Eagle, "eagle", events)(net, num_tokens=6, confidence_threshold=0.0, adaptive=False)
    out = target.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.Hybrid(lookup, eagle))
    assert out.tolist() == text.tolist()
    steps, labels = [], [label for label, _, _ in events]
    for label, _, tokens in events:  # every step starts by asking the lookup
        if label == "lookup":
            steps.append([])
        steps[-1].append((label, len(tokens)))
    assert labels[0] == "lookup" and all(step[0][0] == "lookup" for step in steps)
    assert all(len(step) == 1 for step in steps if step[0][1] > 0)  # the lookup drafted: EAGLE not asked
    assert all(len(step) == 2 for step in steps if step[0][1] == 0)  # it did not: EAGLE asked
    assert any(step[0][1] > 0 for step in steps) and any(len(step) == 2 and step[1][1] > 0 for step in steps)


def test_members_are_closed_after_the_call_and_after_an_error(trained):
    target, net, _ = trained
    before = _hook_count(target)
    target.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.Hybrid(hfs.PromptLookup(), _eagle(net)))
    assert _hook_count(target) == before

    class Broken(hfs.PromptLookup):
        def open(self, ctx):
            raise RuntimeError("cannot open")

    with pytest.raises(RuntimeError, match="cannot open"):
        target.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.Hybrid(_eagle(net), Broken()))
    assert _hook_count(target) == before  # the EAGLE member opened first had its hooks removed


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="two or more"):
        hfs.Hybrid(hfs.PromptLookup())
    with pytest.raises(TypeError, match="hf_speculative strategies"):
        hfs.Hybrid(hfs.PromptLookup(), object())
    with pytest.raises(TypeError, match="inner Hybrid"):
        hfs.Hybrid(hfs.PromptLookup(), hfs.Hybrid(hfs.PromptLookup(max_ngram=2), hfs.EarlyExit(exit_layer=1)))
    twice = hfs.Hybrid(hfs.PromptLookup(min_ngram=3), hfs.EarlyExit(exit_layer=1), hfs.PromptLookup())
    assert twice.labels() == ["prompt-lookup", "early-exit", "prompt-lookup#2"]


def test_members_are_checked_against_the_target():
    target = hfs.enable(build_model("llama"))
    other = build_model("llama", vocab_size=128)
    from tests.conftest import random_eagle

    eagle = hfs.Eagle(random_eagle(other), num_tokens=3)
    with pytest.raises(ValueError, match="vocabulary: drafter 128, target 96"):
        target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=5,
                        candidate_generator=hfs.Hybrid(hfs.PromptLookup(), eagle))
    ref = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=5)
    out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=5,
                          candidate_generator=hfs.Hybrid(hfs.PromptLookup(), hfs.DraftModel(build_model("llama", 5))))
    assert out.tolist() == ref.tolist()


def test_sampling_with_a_custom_stopping_criterion_drafts_and_keeps_the_seeded_text():
    """Sampling with a custom stopping criterion: the drafts are verified against the seeded draw like greedy
    drafts (no transformers version has to turn drafting off), and the text is the one plain seeded sampling
    writes, cut where the criterion fires."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class AfterToken(StoppingCriteria):  # stops once the text holds a given token id
        def __init__(self, token):
            self.token = token

        def __call__(self, input_ids, scores, **kwargs):
            return (input_ids[:, 5:] == self.token).any(dim=-1)

    target = hfs.enable(build_model("llama"))
    inputs = prompt_inputs()
    plain = target.generate(**inputs, do_sample=True, max_new_tokens=12, sampling_seed=7)
    stop = AfterToken(int(plain[0, inputs["input_ids"].shape[1] + 5]))
    kwargs = dict(do_sample=True, max_new_tokens=12, sampling_seed=7, stopping_criteria=StoppingCriteriaList([stop]))
    expected = target.generate(**inputs, **kwargs)
    out = target.generate(**inputs, **kwargs, candidate_generator=hfs.Hybrid(hfs.PromptLookup(adaptive=False),
                                                                               hfs.PromptLookup(min_ngram=2)))
    assert out.tolist() == expected.tolist()
    assert out.shape[1] <= plain.shape[1]
