"""``hfs.Assistant``'s clear errors (not a Gemma-4 target, sizes, vocabulary, layer kinds, transformers 4.x), what it
declares (no batches, no static cache), the matrix example, a target with KV-shared layers and per-layer inputs
like the published ones, and the saved spec."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.drafters import registry
from hf_speculative.drafters.registry import ExampleNotApplicable, capabilities_of
from tests.conftest import build_model, stock_generate
from tests.drafters.assistant.conftest import HAS_GEMMA4, PROMPTS, copy_assistant, random_assistant, target

GREEDY = dict(do_sample=False, max_new_tokens=20)


def ids_of(prompt=PROMPTS[0]):
    ids = torch.tensor([prompt])
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids))


def test_a_target_that_is_not_gemma4_is_refused_naming_what_is_needed():
    from hf_speculative.drafters.assistant.pairing import AssistantMismatch

    llama = build_model("llama")
    strategy = hfs.Assistant(random_assistant(target()))
    with pytest.raises(AssistantMismatch, match=r"Gemma-4 targets .*kv_sharing_modes.*LlamaForCausalLM"):
        strategy.validate_target(llama)
    with pytest.raises(AssistantMismatch, match="Gemma-4 targets"):
        hfs.enable(llama).generate(**ids_of(), **GREEDY, candidate_generator=strategy)
    with pytest.raises(ExampleNotApplicable, match="Gemma-4 targets"):
        hfs.Assistant.example(llama)


def test_sizes_vocabulary_and_layer_kinds_are_checked_naming_both_sides():
    from hf_speculative.drafters.assistant.pairing import AssistantMismatch, check_pair

    model = target()
    with pytest.raises(AssistantMismatch, match="hidden size 32 .*backbone_hidden_size.* hidden_size 48"):
        check_pair(random_assistant(model), target(hidden_size=48))
    with pytest.raises(AssistantMismatch, match="vocabulary of 96 tokens .* 128"):
        check_pair(random_assistant(model), target(vocab_size=128))
    full_only = target(layer_types=["full_attention"] * 4)
    with pytest.raises(AssistantMismatch, match="stores \\['full_attention'\\].*sliding_attention"):
        check_pair(random_assistant(model), full_only)
    with pytest.raises(AssistantMismatch, match="K/V heads of size 16.* size 8"):
        check_pair(random_assistant(model), target(head_dim=8, global_head_dim=8))
    with pytest.raises(TypeError, match="Gemma4AssistantForCausalLM.*got LlamaForCausalLM"):
        hfs.Assistant(build_model("llama"))


def test_it_declares_trees_but_no_batches_and_no_static_cache():
    model = hfs.enable(target())
    chain, tree = (hfs.Assistant.example(model, label) for label in hfs.Assistant.examples)
    assert not capabilities_of(chain).trees and capabilities_of(tree).trees
    for strategy in (chain, tree):
        got = capabilities_of(strategy)
        assert (got.batch, got.reads_target, got.static_cache, got.compile) == (False, "features", False, False)
    with pytest.raises(ValueError, match="cannot draft for a static cache"):
        model.generate(**ids_of(), **GREEDY, candidate_generator=chain, cache_implementation="static")
    batch = torch.tensor([[0, 2, 5, 6], [2, 7, 8, 9]])
    with pytest.raises(ValueError, match="Batched speculative decoding"):
        model.generate(input_ids=batch, attention_mask=batch.ne(0).long(), **GREEDY, candidate_generator=chain)


def test_the_examples_build_on_the_example_target_and_draft():
    model = hfs.enable(hfs.Assistant.example_target())
    expected = stock_generate(model, **ids_of(), **GREEDY)
    for label in hfs.Assistant.examples:
        strategy = registry.example(label, model)
        assert type(strategy) is hfs.Assistant
        assert model.generate(**ids_of(), **GREEDY, candidate_generator=strategy).tolist() == expected.tolist()
        assert hfs.last_stats(model).drafted_tokens > 0


@pytest.mark.parametrize("tree", [None, hfs.DynamicTree(nodes=8, depth=4, top_k=3)])
def test_a_target_with_kv_shared_layers_and_per_layer_inputs(tree):
    """Like the published Gemma-4 models: the last layers reuse the K/V of the store layers, per-layer inputs on."""
    model = hfs.enable(target(layers=6, shared=2, hidden_size_per_layer_input=8, vocab_size_per_layer_input=96))
    assert model.config.kv_sharing_modes == [None, None, "store", "store", "reuse", "reuse"]
    for assistant in (random_assistant(model), copy_assistant(model)):
        expected = stock_generate(model, **ids_of(), do_sample=False, max_new_tokens=24)
        assert stock_generate(model, **ids_of(), do_sample=False, max_new_tokens=24,
                              assistant_model=assistant).tolist() == expected.tolist()
        out = model.generate(**ids_of(), do_sample=False, max_new_tokens=24,
                             candidate_generator=hfs.Assistant(assistant, num_tokens=4, adaptive=False,
                                                               confidence_threshold=0.0, tree=tree))
        assert out.tolist() == expected.tolist() and hfs.last_stats(model).drafted_tokens > 0


def test_saved_as_the_model_default_and_loaded_back(tmp_path):
    from transformers import AutoModelForCausalLM

    model = hfs.enable(target())
    expected = stock_generate(model, **ids_of(), **GREEDY)
    copy_assistant(model).save_pretrained(tmp_path / "model" / "assistant")
    strategy = hfs.Assistant.from_pretrained(tmp_path / "model" / "assistant", target=model, num_tokens=3,
                                             tree=hfs.DynamicTree(nodes=6, depth=3, top_k=2))
    model.generation_config.candidate_generator = strategy
    model.save_pretrained(tmp_path / "model")
    reloaded = hfs.enable(AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval())
    restored = reloaded.generation_config.candidate_generator
    assert type(restored) is hfs.Assistant and restored.num_tokens == 3 and restored.tree == strategy.tree
    assert reloaded.generate(**ids_of(), **GREEDY).tolist() == expected.tolist()
    assert hfs.last_stats(reloaded).accepted_tokens > 0


@pytest.mark.skipif(HAS_GEMMA4, reason="transformers 4.x behaviour")
def test_tf4_names_the_transformers_version_needed():
    from hf_speculative.drafters.assistant.drafter import Assistant

    with pytest.raises(ImportError, match=r'pip install "transformers>=5.24"'):
        Assistant(torch.nn.Linear(1, 1))
    with pytest.raises(ExampleNotApplicable, match="5.24"):
        Assistant.example(build_model("llama"))
