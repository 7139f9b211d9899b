"""core/processor_list.py: the call's processors applied as transformers' LogitsProcessorList applies them (the same
scores, the same errors), each processor class's signature read once instead of at every call."""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

import hf_speculative as hfs
from hf_speculative.core import processor_list as module
from hf_speculative.core.processor_list import ProcessorList
from hf_speculative.core.sampling import SeededSampler, seeded_processors, split_sampler
from tests.conftest import build_model, prompt_inputs


class WantsStep(LogitsProcessor):
    """A processor of transformers' extended form: it needs a keyword argument."""

    def __call__(self, input_ids, scores, step):
        return scores + step


def _processors():
    return [RepetitionPenaltyLogitsProcessor(1.3), NoRepeatNGramLogitsProcessor(2), TemperatureLogitsWarper(0.7),
            TopKLogitsWarper(5), SeededSampler(7)]


def test_the_same_scores_as_transformers_list_row_after_row():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (3, 12))
    scores = torch.randn(3, 50)
    ours, theirs = ProcessorList(_processors()), LogitsProcessorList(_processors())
    for row in range(3):
        got, expected = ours(ids[row:row + 1], scores[row:row + 1]), theirs(ids[row:row + 1], scores[row:row + 1])
        assert torch.equal(got, expected)
    assert torch.equal(ours(ids, scores), theirs(ids, scores))
    assert isinstance(ours, LogitsProcessorList)  # transformers' own checks of a list still hold


def test_each_class_is_read_once(monkeypatch):
    calls = []
    original = inspect.signature
    monkeypatch.setattr(module, "_WANTS_KWARGS", {})
    monkeypatch.setattr(module.inspect, "signature", lambda f: calls.append(f) or original(f))
    processors = ProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(5), TemperatureLogitsWarper(2.0)])
    ids, scores = torch.zeros(1, 3, dtype=torch.long), torch.randn(1, 10)
    for _ in range(5):
        processors(ids, scores)
    assert len(calls) == 2  # two classes, once each; transformers' list reads 3 signatures a call


def test_kwargs_and_processors_that_want_them_go_through_transformers_call():
    ids, scores = torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 4)
    wants = ProcessorList([TemperatureLogitsWarper(2.0), WantsStep()])
    assert torch.equal(wants(ids, scores + 4, step=1), LogitsProcessorList(list(wants))(ids, scores + 4, step=1))
    with pytest.raises(ValueError, match="Make sure that all the required parameters"):  # transformers' own error
        wants(ids, scores)
    with pytest.raises(ValueError, match="Make sure that all the required parameters"):
        LogitsProcessorList(list(wants))(ids, scores)

    class OwnCall(LogitsProcessor):  # a processor whose instance carries its own __call__: read every time
        def __call__(self, input_ids, scores):
            return scores

    own = OwnCall()
    own.__dict__["__call__"] = lambda input_ids, scores, step: scores
    assert module.wants_kwargs(own) and not module.wants_kwargs(OwnCall())


def test_the_call_s_lists_are_processor_lists():
    config = GenerationConfig(do_sample=True)
    prepared, sampler = seeded_processors([TemperatureLogitsWarper(0.7)], config, seed=3)
    assert isinstance(prepared, ProcessorList) and isinstance(sampler, SeededSampler) and prepared[-1] is sampler
    before, rule = split_sampler(prepared)
    assert isinstance(before, ProcessorList) and list(before) == list(prepared)[:-1] and rule is sampler
    again, _ = seeded_processors(prepared, config, seed=3)
    assert again is prepared and isinstance(seeded_processors(None, GenerationConfig(), seed=None)[0], ProcessorList)


def test_a_sampled_tree_call_under_processors_keeps_its_text():
    """Through the loop: a sampled call under processors with a tree gives the same text as transformers' sampling
    with the same seed (the seeded rule), as before the list changed."""
    model = hfs.enable(build_model("llama", init=0.3))
    inputs = prompt_inputs()
    options = {"do_sample": True, "temperature": 0.8, "top_k": 8, "repetition_penalty": 1.2, "max_new_tokens": 24,
               "sampling_seed": 11}
    plain = model.generate(**inputs, **options)
    lookup = hfs.PromptLookup(tree=hfs.DynamicTree(nodes=16, depth=4, top_k=4), adaptive=False)
    tree = model.generate(**inputs, **options, candidate_generator=lookup)
    assert plain.tolist() == tree.tolist() and hfs.last_stats(model).drafted_tokens > 0
