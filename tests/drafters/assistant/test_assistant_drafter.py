"""``hfs.Assistant`` on tiny Gemma-4 pairs: token for token plain greedy (prompts, EOS, lengths, stop strings inside
accepted paths; chains in both loops, trees), assistants always wrong or often right, seeded and rejection sampling."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList

import hf_speculative as hfs
from hf_speculative.core.call import CallContext
from hf_speculative.core.sampling import RejectionSampler
from tests.conftest import char_tokenizer, draft_once, stock_generate
from tests.drafters.assistant.conftest import (
    HAS_GEMMA4,
    PROMPTS,
    SEED_EOS,
    SEED_RUNS,
    bigram_assistant,
    copy_assistant,
    random_assistant,
    target,
    wrong_assistant,
)

pytestmark = pytest.mark.skipif(not HAS_GEMMA4, reason="transformers without Gemma-4 assistants (5.24+)")
FIXED = dict(num_tokens=4, confidence_threshold=0.0, adaptive=False)
TREE = hfs.DynamicTree(nodes=8, depth=4, top_k=3)
SHAPES = {"chain": {}, "tree": {"tree": TREE}, "static-tree": {"tree": hfs.StaticTree([(0,), (1,), (0, 0), (0, 0, 0)])}}


def ids_of(prompt):
    ids = torch.tensor([prompt])
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids))


@pytest.fixture(scope="module")
def runs():
    model = hfs.enable(target(SEED_RUNS))
    return model, copy_assistant(model)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("seed", [SEED_EOS, SEED_RUNS])
def test_identical_to_greedy_on_every_prompt(shape, seed):
    model = hfs.enable(target(seed))
    for assistant in (random_assistant(model), copy_assistant(model)):
        strategy = hfs.Assistant(assistant, **FIXED, **SHAPES[shape])
        for prompt in PROMPTS:
            expected = stock_generate(model, **ids_of(prompt), do_sample=False, max_new_tokens=30)
            out = model.generate(**ids_of(prompt), do_sample=False, max_new_tokens=30, candidate_generator=strategy)
            assert out.tolist() == expected.tolist(), (shape, prompt)
            assert hfs.last_stats(model).drafted_tokens > 0


def test_the_eos_target_stops_where_greedy_stops():
    model = hfs.enable(target(SEED_EOS))
    expected = stock_generate(model, **ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=40)
    assert expected[0, -1] == 1 and expected.shape[1] < len(PROMPTS[0]) + 40  # it ends with EOS
    for shape in SHAPES:
        out = model.generate(**ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=40,
                             candidate_generator=hfs.Assistant(copy_assistant(model), **FIXED, **SHAPES[shape]))
        assert out.tolist() == expected.tolist(), shape


@pytest.mark.parametrize("shape", list(SHAPES))
def test_an_eos_inside_an_accepted_path_ends_the_text_there(runs, shape):
    model, _ = runs
    free = stock_generate(model, **ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=30)
    new = free[0, len(PROMPTS[0]):].tolist()
    token = new[9]  # the first 11, after the first 12: the bigram assistant drafts 11, 11, 11 after that 12
    assert new[8:13] == [12, token, token, token, token] and token not in new[:9]
    assistant = bigram_assistant(model, free[0].tolist())
    kwargs = dict(**ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=30, eos_token_id=token)
    expected = stock_generate(model, **kwargs)
    assert expected.shape[1] == len(PROMPTS[0]) + 10
    out = model.generate(**kwargs, candidate_generator=hfs.Assistant(assistant, **FIXED, **SHAPES[shape]))
    assert out.tolist() == expected.tolist()
    assert hfs.last_stats(model).accepted_tokens >= 5


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_length_limit(runs, shape):
    model, assistant = runs
    strategy = hfs.Assistant(assistant, **FIXED, **SHAPES[shape])
    for new in (1, 2, 3, 7, 13):
        expected = stock_generate(model, **ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=new)
        out = model.generate(**ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=new, candidate_generator=strategy)
        assert out.tolist() == expected.tolist(), new


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_a_stop_string_inside_an_accepted_run(runs, shape):
    model, assistant = runs
    tokenizer = char_tokenizer()
    free = stock_generate(model, **ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=30, eos_token_id=None)
    start = len(PROMPTS[0])
    for at in (2, 10):  # inside the runs of 10s and 11s
        stop = tokenizer.decode(free[0, start + at: start + at + 2])
        kwargs = dict(**ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=30, eos_token_id=None,
                      stop_strings=[stop], tokenizer=tokenizer)
        expected = stock_generate(model, **kwargs)
        out = model.generate(**kwargs, candidate_generator=hfs.Assistant(assistant, **FIXED, **SHAPES[shape]))
        assert out.tolist() == expected.tolist(), at


def test_the_transformers_loop_runs_the_chains_too(runs):
    model, assistant = runs
    expected = stock_generate(model, **ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=30)
    out = model.generate(**ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=30, speculative_loop="transformers",
                         candidate_generator=hfs.Assistant(assistant, **FIXED))
    assert out.tolist() == expected.tolist()
    stats = hfs.last_stats(model)
    assert stats.accepted_tokens > 0 and stats.target_forwards < 30


def test_an_assistant_always_wrong_still_writes_greedy():
    model = hfs.enable(target(SEED_RUNS))
    expected = stock_generate(model, **ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=20)
    for shape in ("chain", "tree"):
        strategy = hfs.Assistant(wrong_assistant(model), **FIXED, **SHAPES[shape])
        out = model.generate(**ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=20, candidate_generator=strategy)
        stats = hfs.last_stats(model)
        assert out.tolist() == expected.tolist()
        assert stats.drafted_tokens >= 19 and stats.accepted_tokens == 0 and stats.target_forwards == 20


def test_an_assistant_right_along_runs_accepts_whole_drafts(runs):
    model, assistant = runs
    expected = stock_generate(model, **ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=30)
    for shape in ("chain", "tree"):
        out = model.generate(**ids_of(PROMPTS[0]), do_sample=False, max_new_tokens=30,
                             candidate_generator=hfs.Assistant(assistant, **FIXED, **SHAPES[shape]))
        stats = hfs.last_stats(model)
        assert out.tolist() == expected.tolist()
        assert max(stats.accepted_lengths) >= 3 and stats.target_forwards <= 20, (shape, stats)


def test_tree_nodes_follow_their_parents(runs):
    """The tree's nodes below the root's children are drafted from their parent's token and state: the copying
    assistant's top child of every node repeats the node's token."""
    model, assistant = runs
    with first_draft(model, hfs.Assistant(assistant, **FIXED, tree=TREE)) as (_, _, tree):
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        assert tokens[0] == PROMPTS[0][-1] and len(tokens) == 8
        for node, parent in enumerate(parents):
            if parent >= 0 and node == min(i for i, p in enumerate(parents) if p == parent):
                assert tokens[node] == tokens[parent]


@contextlib.contextmanager
def first_draft(model, strategy, processors=None):
    """``strategy`` opened on ``model`` for a call on ``PROMPTS[0]`` (sampling when ``processors`` are given), after
    the target's prefill of all but the last prompt token (the root is not cached yet): ``(generator, ids, tree)``
    with its first draft of up to 4 tokens; the generator is closed on exit."""
    config = GenerationConfig(do_sample=processors is not None, max_length=100)
    generator = strategy.open(CallContext(model, config, processors, None, hfs.SpeculativeStats()))
    try:
        ids = torch.tensor([PROMPTS[0]])
        with torch.no_grad():
            model(input_ids=ids[:, :-1], use_cache=True, cache=hfs_cache())  # the root is not cached yet
        generator.observe(ids, hfs_empty(), hfs_verdict(), None)
        yield generator, ids, draft_once(generator, ids, 4)
    finally:
        generator.close()


def hfs_cache():
    from transformers import DynamicCache

    return DynamicCache()


def hfs_empty():
    from hf_speculative.core.tree import DraftTree

    return DraftTree.empty()


def hfs_verdict():
    from hf_speculative.core.tree import Verdict

    return Verdict((), 0)


# -- sampling ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_seeded_sampling_writes_the_plain_seeded_text(runs, shape):
    from tests.drafters import tree_battery

    model, assistant = runs
    strategy = hfs.Assistant(assistant, **FIXED, **SHAPES[shape])
    tree_battery.check_seeded_sampling(lambda: strategy, target=model, inputs=ids_of(PROMPTS[0]))


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_rejection_sampling_records_the_assistant_distribution(runs, shape):
    """Under the rejection rule each node keeps the q it was drawn from: for a chain, the softmax of the assistant's
    logits at that step (what transformers returns as candidate_logits)."""
    model, assistant = runs
    strategy = hfs.Assistant(assistant, **FIXED, **SHAPES[shape])
    processors = LogitsProcessorList([RejectionSampler(torch.Generator().manual_seed(0))])
    with first_draft(model, strategy, processors) as (generator, ids, tree):
        assert tree.size > 0 and tree.q is not None and tree.q.shape == (tree.size, model.config.vocab_size)
        assert torch.allclose(tree.q.sum(-1), torch.ones(tree.size), atol=1e-5)
        if shape == "chain":
            kv = generator.cache
            assert kv is not None
            logits, _ = generator._run(ids[0, -1:], generator.last, _kv(generator, ids), ids.shape[1] - 1)
            assert torch.allclose(tree.q[0], torch.softmax(logits[0], -1), atol=1e-6)


def _kv(generator, ids):
    from hf_speculative.drafters.assistant.pairing import shared_kv

    return shared_kv(generator.cache, generator.store, ids.shape[1] - 1, generator.reach)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_rejection_sampling_runs_and_accepts(runs, shape):
    model, assistant = runs
    strategy = hfs.Assistant(assistant, **FIXED, **SHAPES[shape])
    accepted = 0
    for seed in range(3):
        torch.manual_seed(seed)
        out = model.generate(**ids_of(PROMPTS[0]), do_sample=True, temperature=0.3, max_new_tokens=16,
                             eos_token_id=None, candidate_generator=strategy, speculative_sampling="rejection")
        assert out.shape[1] == len(PROMPTS[0]) + 16
        accepted += hfs.last_stats(model).accepted_tokens
    assert accepted > 0


# (the tree, ~28 s: slow; the tree's recorded q is the assistant's own in the fast test above, and the tree rule's
# statistics are tests/core/test_tree_sampling.py's)
@pytest.mark.parametrize("shape", ["chain", pytest.param("tree", marks=pytest.mark.slow)])
def test_rejection_sampling_keeps_the_target_distribution(shape):
    """Chi-square of the first two sampled tokens under the rejection rule (the second is the first a draft decides:
    the assistant reads the prefill's hidden state) against the target's distributions (tree_battery)."""
    from tests.drafters import tree_battery

    model = target(SEED_RUNS, initializer_range=0.3)
    tree = hfs.DynamicTree(nodes=6, depth=3, top_k=2) if shape == "tree" else None
    strategy = hfs.Assistant(copy_assistant(model), tree=tree, **FIXED)
    accepted = tree_battery.check_sampling_distribution(lambda: strategy, seeds=600, rule="rejection", target=model)
    assert accepted > 0


def test_negative_control_a_wrong_q_is_caught(monkeypatch):
    """The same check fails when the drafts record another q than the one they were drawn from (a flat one)."""
    import dataclasses

    from hf_speculative.drafters.assistant.drafter import AssistantCandidateGenerator
    from tests.drafters import tree_battery

    original = AssistantCandidateGenerator.draft

    def flat_q(self, sequence, plan):
        tree = original(self, sequence, plan)
        return tree if tree.q is None else dataclasses.replace(tree, q=torch.full_like(tree.q, 1.0 / tree.q.shape[-1]))

    monkeypatch.setattr(AssistantCandidateGenerator, "draft", flat_q)
    model = target(SEED_RUNS, initializer_range=0.3)
    strategy = hfs.Assistant(copy_assistant(model), **FIXED)
    with pytest.raises(AssertionError):
        tree_battery.check_sampling_distribution(lambda: strategy, seeds=600, rule="rejection", target=model)
