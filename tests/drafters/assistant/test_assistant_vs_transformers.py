"""``hfs.Assistant`` against transformers' own Gemma-4 assisted loop (``generate(assistant_model=assistant)``,
``SinglePositionMultiTokenCandidateGenerator``) on the same weights: the same text, the same drafts (and first-step
logits) after the prefill and after whole drafts were kept, and the target forwards each takes."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, GenerationConfig
from transformers.generation import candidate_generator as tf_candidates

import hf_speculative as hfs
from hf_speculative.core.call import CallContext
from hf_speculative.core.tree import DraftTree, Verdict
from tests.conftest import draft_once, stock_generate
from tests.drafters.assistant.conftest import HAS_GEMMA4, PROMPTS, SEED_RUNS, copy_assistant, random_assistant, target

pytestmark = pytest.mark.skipif(not HAS_GEMMA4, reason="transformers without Gemma-4 assistants (5.24+)")
K = 4
FIXED = dict(num_tokens=K, confidence_threshold=0.0, adaptive=False)


def record_transformers(monkeypatch):
    """transformers' rounds: ``(input_ids, drafted tokens, their logits, kept in the round before)``."""
    rounds, original = [], tf_candidates.SinglePositionMultiTokenCandidateGenerator.get_candidates

    def recording(self, input_ids, model_kwargs, model_outputs, is_first_iteration, n_last_matches, **kwargs):
        after_prefill = self.is_main_model_prefill
        ids, logits = original(self, input_ids, model_kwargs, model_outputs, is_first_iteration, n_last_matches,
                               **kwargs)
        if not is_first_iteration and logits is not None:
            rounds.append((input_ids.clone(), ids[0, input_ids.shape[1]:].tolist(), logits[0].clone(),
                           "prefill" if after_prefill else n_last_matches))
        return ids, logits

    monkeypatch.setattr(tf_candidates.SinglePositionMultiTokenCandidateGenerator, "get_candidates", recording)
    return rounds


def our_draft(model, assistant, input_ids):
    """Our chain after ``input_ids`` (its verified prefix computed by one target forward, as the loop leaves it) and
    the assistant's logits of its first step."""
    ctx = CallContext(model, GenerationConfig(do_sample=False, max_length=1000), None, None, hfs.SpeculativeStats())
    generator = hfs.Assistant(assistant, **FIXED).open(ctx)
    try:
        with torch.no_grad():
            model(input_ids=input_ids[:, :-1], use_cache=True, cache=DynamicCache())  # the root is not cached
            generator.observe(input_ids, DraftTree.empty(), Verdict((), 0), None)
            tokens = draft_once(generator, input_ids, K).tokens.tolist()
            logits = generator._start(input_ids)[2]
        return tokens, logits
    finally:
        generator.close()


def count_forwards(model):
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls, handle


@pytest.mark.parametrize("kind", ["random", "copy"])
def test_same_text_same_drafts_after_the_prefill_and_whole_accepts(monkeypatch, kind):
    model = hfs.enable(target(SEED_RUNS))
    assistant = random_assistant(model) if kind == "random" else copy_assistant(model)
    assistant.generation_config.num_assistant_tokens = K
    whole = 0
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        expected = stock_generate(model, input_ids=ids, do_sample=False, max_new_tokens=30)
        rounds = record_transformers(monkeypatch)
        theirs = stock_generate(model, input_ids=ids, do_sample=False, max_new_tokens=30, assistant_model=assistant)
        ours = model.generate(input_ids=ids, do_sample=False, max_new_tokens=30,
                              candidate_generator=hfs.Assistant(assistant, **FIXED))
        assert theirs.tolist() == expected.tolist() == ours.tolist()
        compared = [r for r in rounds if r[3] == "prefill" or r[3] == K]
        assert compared[0][3] == "prefill"
        for input_ids, drafted, logits, when in compared:
            tokens, first = our_draft(model, assistant, input_ids)
            assert tokens == drafted[: len(tokens)] and len(tokens) == min(K, len(drafted)), when
            assert torch.allclose(first, logits[0].float(), atol=1e-5), when
        whole += sum(1 for r in compared if r[3] == K)
        monkeypatch.undo()
    if kind == "copy":
        assert whole >= 1  # whole drafts were kept, and the drafts after them compared


def test_target_forwards_against_transformers():
    """The copying assistant saves target forwards in both loops. transformers drafts 4 every round, and so do our
    chains with adaptive=False (a fixed budget; they took 2 forwards more while the chain rule shortened them after
    each partial accept), so they take no more forwards than transformers', nor do our trees (measured here:
    transformers 15, chains 15, trees 15)."""
    model = hfs.enable(target(SEED_RUNS))
    assistant = copy_assistant(model)
    assistant.generation_config.num_assistant_tokens = K
    ids = torch.tensor([PROMPTS[0]])
    counts = {}
    calls, handle = count_forwards(model)
    try:
        for name, run in {
            "greedy": lambda: stock_generate(model, input_ids=ids, do_sample=False, max_new_tokens=30),
            "transformers": lambda: stock_generate(model, input_ids=ids, do_sample=False, max_new_tokens=30,
                                                   assistant_model=assistant),
            "chain": lambda: model.generate(input_ids=ids, do_sample=False, max_new_tokens=30,
                                            candidate_generator=hfs.Assistant(assistant, **FIXED)),
            "tree": lambda: model.generate(input_ids=ids, do_sample=False, max_new_tokens=30, candidate_generator=(
                hfs.Assistant(assistant, **FIXED, tree=hfs.DynamicTree(nodes=8, depth=4, top_k=2)))),
        }.items():
            calls.clear()
            run()
            counts[name] = len(calls)
    finally:
        handle.remove()
    assert counts["greedy"] == 30
    assert counts["transformers"] < 30 and counts["chain"] <= counts["transformers"], counts
    assert counts["tree"] <= counts["transformers"], counts
