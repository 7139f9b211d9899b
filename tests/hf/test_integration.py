"""``hfs.enable`` + ``candidate_generator=`` on transformers' own assisted loop.

Every drafter is checked token for token against transformers' plain greedy ``generate`` on the
same model, across architectures (Llama, Qwen2 without EOS, Gemma3 with sliding-window layers) and
the features that interact with drafting: EOS and ``max_new_tokens`` inside a draft, stop strings,
custom stopping criteria, logits processors, streamers, ``return_dict_in_generate``. Then the error
messages, enable/disable, the ``custom_generate`` route and the real smollm2 model.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

import hf_speculative as hfs
from hf_speculative import compat
from hf_speculative.core import kv_cache
from hf_speculative.drafters.generator import SpeculativeCandidateGenerator
from hf_speculative.core.state import state_of
from hf_speculative.hf.checks import drafts_trees
from tests.conftest import (
    DRAFTERS,
    EOS,
    PROMPT,
    SLIDING_WINDOW,
    VOCAB,
    OracleCandidateGenerator,
    assert_drafter_worked,
    build_model,
    make_drafter,
    prompt_inputs,
    recurring_token,
    sibling_model,
    stock_generate,
)

L = len(PROMPT)
GREEDY = dict(do_sample=False, max_new_tokens=40)


def speculate(model, drafter, prompt=PROMPT, **kwargs):
    torch.manual_seed(0)
    return model.generate(**prompt_inputs(prompt), **kwargs, candidate_generator=drafter)


def check_identity(model, name, drafter_reference=None, drafter=None, prompt=PROMPT, speculative_loop=None,
                   **kwargs):
    """Plain greedy vs the drafter ``name`` (in ``speculative_loop``: ours by default): same ids. Returns
    (reference, drafter, stats)."""
    ref = stock_generate(model, **prompt_inputs(prompt), **kwargs)
    if drafter is None:
        drafter = make_drafter(name, model, ref if drafter_reference is None else drafter_reference)
    loop = {} if speculative_loop is None else {"speculative_loop": speculative_loop}
    out = speculate(model, drafter, prompt, **kwargs, **loop)
    assert out.tolist() == ref.tolist(), f"{name} differs from plain greedy"
    stats = hfs.last_stats(model)
    assert stats.new_tokens == ref.shape[1] - len(prompt)
    assert_drafter_worked(name, drafter, stats)
    return ref, drafter, stats


class Cuts(list):
    """``(block length, kept length)`` of every cut a stop made inside a draft, and the loop the call ran."""

    def __init__(self, loop: str):
        super().__init__()
        self.loop = loop


@pytest.fixture(params=["hf_speculative", "transformers"])
def cuts(request, monkeypatch):
    """Records where stops cut drafts, in either loop: transformers' assisted loop checks stopping criteria only
    at the end of an accepted block, so there the base generator cuts a draft before a stopping token
    (``(draft length, kept length)``); hf_speculative's loop verifies the whole draft and ends the text at the
    first stop inside the accepted path (``(new tokens of the step, kept of them)``)."""
    from hf_speculative.core import loop as our_loop

    records = Cuts(request.param)
    original = SpeculativeCandidateGenerator._length_before_stop
    original_stop = our_loop.stop_index

    def spy(self, input_ids, tokens):
        keep = original(self, input_ids, tokens)
        records.append((int(tokens.numel()), keep))
        return keep

    def stop_spy(sequence, start, stopping_criteria, *new_tokens):
        end = original_stop(sequence, start, stopping_criteria, *new_tokens)
        if end is not None:
            records.append((sequence.shape[1] - start, end - start))
        return end

    monkeypatch.setattr(SpeculativeCandidateGenerator, "_length_before_stop", spy)
    monkeypatch.setattr(our_loop, "stop_index", stop_spy)
    return records


# Drafters whose drafts follow the greedy text (and so must run into the stopping token).
FOLLOWERS = ("oracle", "draft-model-copy", "prompt-lookup-fixed")
ALWAYS_ACCEPTED = ("oracle", "draft-model-copy")


def check_stop_inside_draft(model, drafter_name, cuts, prompt, step, free, **kwargs):
    """The stopping condition fires at new token ``step``: drafts that follow the greedy text contain
    that token in their middle and must be cut before it, and the output equals plain greedy's."""
    drafter = OracleCandidateGenerator(free, num_tokens=step + 4) if drafter_name == "oracle" else None
    if cuts.loop == "transformers":
        drafter = drafter or make_drafter(drafter_name, model, free)
        if drafts_trees(drafter):
            pytest.skip("transformers' assisted loop verifies chains only")
    ref, drafter, _ = check_identity(model, drafter_name, drafter_reference=free, drafter=drafter, prompt=prompt,
                                     do_sample=False, max_new_tokens=30, speculative_loop=cuts.loop, **kwargs)
    assert ref.shape[1] == len(prompt) + step + 1, "plain generate did not stop where the test expects"
    # transformers' loop: every following draft that reaches the stop is cut; ours: an accepted path that runs past
    # it is (prompt lookup's drafts reach it, but whether the target accepts past it depends on the n-grams)
    if drafter_name in (FOLLOWERS if cuts.loop == "transformers" else ALWAYS_ACCEPTED):
        assert any(keep < drafted for drafted, keep in cuts), f"no draft was cut: {cuts}"
    if drafter_name == "oracle":
        assert any(keep > 0 for drafted, keep in cuts if keep < drafted), "the stop was not in the middle of a draft"
    return ref


# -- greedy identity -------------------------------------------------------------------------
@pytest.mark.parametrize("drafter_name", DRAFTERS + ("draft-model-defaults",))
def test_greedy_identity(model, arch, drafter_name):
    ref, _, _ = check_identity(model, drafter_name, **GREEDY)
    if arch == "gemma3":
        assert "sliding_attention" in model.config.layer_types and "full_attention" in model.config.layer_types
        assert ref.shape[1] > 3 * SLIDING_WINDOW


def test_eos_inside_a_draft(model, drafter_name, cuts):
    prompt, token, step, free = recurring_token(model)
    eos = [token] + ([model.generation_config.eos_token_id] if model.generation_config.eos_token_id else [])
    check_stop_inside_draft(model, drafter_name, cuts, prompt, step, free, eos_token_id=eos)


@pytest.mark.parametrize("max_new_tokens", [5, 13, 22])
def test_max_new_tokens_inside_a_draft(model, drafter_name, max_new_tokens):
    """The oracle proposes 8 tokens and keeps proposing (EOS or filler) past the end of the reference."""
    kwargs = dict(do_sample=False, max_new_tokens=max_new_tokens)
    drafter = None
    if drafter_name == "oracle":
        ref = stock_generate(model, **prompt_inputs(), **kwargs)
        tail = model.generation_config.eos_token_id or 4
        drafter = OracleCandidateGenerator(ref, num_tokens=8, tail=tail)
    ref, drafter, _ = check_identity(model, drafter_name, drafter=drafter, **kwargs)
    if model.generation_config.eos_token_id not in ref[0, L:].tolist():
        assert ref.shape[1] == L + max_new_tokens
    if drafter_name == "oracle":
        limit = L + max_new_tokens
        assert any(at + len(p) > limit for at, p in zip(drafter.asked_at, drafter.proposals)), \
            "the oracle never proposed past max_new_tokens"


def test_stop_strings(model, drafter_name, tokenizer, cuts):
    prompt, token, step, free = recurring_token(model)
    stop = tokenizer.decode(free[0, len(prompt) + step - 1: len(prompt) + step + 1])  # two tokens, two characters
    assert len(stop) == 2
    ref = check_stop_inside_draft(model, drafter_name, cuts, prompt, step, free, stop_strings=[stop],
                                  tokenizer=tokenizer)
    assert tokenizer.decode(ref[0, len(prompt):]).endswith(stop)


class StopOnToken(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


class StopAtLength(StoppingCriteria):
    def __init__(self, length):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


def test_custom_stopping_criterion_on_a_token(model, drafter_name, cuts):
    prompt, token, step, free = recurring_token(model)
    check_stop_inside_draft(model, drafter_name, cuts, prompt, step, free,
                            stopping_criteria=StoppingCriteriaList([StopOnToken(token)]))


def test_custom_stopping_criterion_on_length(model, drafter_name, cuts):
    free = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None)
    if model.generation_config.eos_token_id in free[0, L: L + 12].tolist():
        pytest.fail("the model's greedy text hits EOS before the criterion: pick another seed")
    check_stop_inside_draft(model, drafter_name, cuts, PROMPT, 11, free,
                            stopping_criteria=StoppingCriteriaList([StopAtLength(L + 12)]))


class FavourSuccessor(LogitsProcessor):
    """A context-dependent custom processor: boosts the token after the last one."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        rows = torch.arange(scores.shape[0])
        scores[rows, (input_ids[:, -1] + 1) % scores.shape[-1]] += 0.5
        return scores


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # processors are architecture-agnostic; Gemma3 is slow
@pytest.mark.parametrize(
    "processor",
    [dict(repetition_penalty=1.3), dict(no_repeat_ngram_size=3), "custom"],
    ids=["repetition_penalty", "no_repeat_ngram_size", "custom"],
)
def test_logits_processors(model, drafter_name, processor):
    if processor == "custom":
        kwargs = dict(logits_processor=LogitsProcessorList([FavourSuccessor()]))
    else:
        kwargs = dict(processor)
    ref, _, _ = check_identity(model, drafter_name, **GREEDY, **kwargs)
    plain = stock_generate(model, **prompt_inputs(), **GREEDY)
    assert ref.tolist() != plain.tolist(), "the processor changed nothing: the test would prove nothing"


class Collector(BaseStreamer):
    def __init__(self):
        self.tokens: list[int] = []
        self.puts = 0
        self.ended = 0

    def put(self, value):
        self.tokens.extend(value.reshape(-1).tolist())
        self.puts += 1

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("arch", ["llama"])
def test_streamer(model, drafter_name):
    plain = Collector()
    ref = stock_generate(model, **prompt_inputs(), **GREEDY, streamer=plain)
    drafter = make_drafter(drafter_name, model, ref)
    streamed = Collector()
    out = speculate(model, drafter, **GREEDY, streamer=streamed)
    assert out.tolist() == ref.tolist()
    assert streamed.tokens == plain.tokens == ref[0].tolist()
    assert streamed.ended == plain.ended == 1
    assert_drafter_worked(drafter_name, drafter, hfs.last_stats(model))


@pytest.mark.parametrize("arch", ["llama"])
def test_return_dict_with_scores(model, drafter_name):
    kwargs = dict(GREEDY, return_dict_in_generate=True, output_scores=True)
    ref = stock_generate(model, **prompt_inputs(), **kwargs)
    drafter = make_drafter(drafter_name, model, ref.sequences)
    out = speculate(model, drafter, **kwargs)
    assert out.sequences.tolist() == ref.sequences.tolist()
    assert isinstance(out.scores, tuple) and len(out.scores) == len(ref.scores) == out.sequences.shape[1] - L
    for step, (mine, theirs) in enumerate(zip(out.scores, ref.scores)):
        assert mine.shape == theirs.shape == (1, VOCAB)
        assert int(mine.argmax()) == int(out.sequences[0, L + step])
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
    assert_drafter_worked(drafter_name, drafter, hfs.last_stats(model))


@pytest.mark.parametrize("arch", ["llama"])  # (Qwen2 has no EOS in every other test)
def test_model_without_eos(arch, drafter_name):
    model = hfs.enable(build_model(arch, eos=None))
    assert model.generation_config.eos_token_id is None and model.config.eos_token_id is None
    check_identity(model, drafter_name, **GREEDY)


@pytest.mark.parametrize("stop", ["eos", "stop_string", "criterion"])
def test_prompt_ending_with_a_stop_token_and_an_empty_draft(stop, tokenizer):
    """The prompt already ends with a token that satisfies a stopping criterion (a chat turn ending
    with EOS or a newline), and prompt lookup has no match for it (empty draft). Stopping criteria
    only look at new tokens, so plain generate goes on. transformers < 5.18 drops the target's own
    token when the *candidate* sequence (here the unchanged prompt) is "done" (`is_done_candidate`),
    so speculation must not hand it an empty draft in that state."""
    model = hfs.enable(build_model("llama"))
    prompt = PROMPT + [EOS["llama"] if stop == "eos" else 90]
    kwargs = dict(do_sample=False, max_new_tokens=10)
    if stop == "stop_string":
        kwargs.update(stop_strings=[tokenizer.decode([90])], tokenizer=tokenizer)
    elif stop == "criterion":
        kwargs.update(stopping_criteria=StoppingCriteriaList([StopOnToken(90)]))
    ref = stock_generate(model, **prompt_inputs(prompt), **kwargs)
    assert ref.shape[1] > len(prompt) + 1, "plain generate should go on after the prompt"
    for strategy in (hfs.PromptLookup(), hfs.PromptLookup(adaptive=False)):
        out = speculate(model, strategy, prompt, **kwargs)
        assert out.tolist() == ref.tolist()


def test_model_default_static_cache_is_replaced(drafter_name):
    """A model whose generation config asks for a static cache (e.g. Gemma checkpoints) still works:
    the call falls back to the dynamic cache that drafts can be rolled back in."""
    model = hfs.enable(build_model("llama"))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    model.generation_config.cache_implementation = "static"
    drafter = make_drafter(drafter_name, model, ref)
    out = speculate(model, drafter, **GREEDY)
    assert out.tolist() == ref.tolist()
    assert model.generation_config.cache_implementation == "static"


# -- bad input -> clear errors ---------------------------------------------------------------
@pytest.fixture
def llama():
    return hfs.enable(build_model("llama"))


def test_error_batch_size_two_with_a_drafter_batches_do_not_support(llama):
    ids = torch.tensor([PROMPT, PROMPT])  # (batches themselves: tests/core/test_batch.py)
    with pytest.raises(ValueError, match=r"batch size > 1\) supports hfs.MagicDec\(\), hfs.MTP\(\), hfs.PromptLookup\(\), hfs.DFlash\(...\), "
                                          r"hfs.DraftModel\(...\) and hfs.Eagle"):
        llama.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                       candidate_generator=hfs.EarlyExit(exit_layer=1))


def test_error_beam_search(llama):
    with pytest.raises(ValueError, match=r"num_beams.*use num_beams=1"):
        llama.generate(**prompt_inputs(), num_beams=2, max_new_tokens=4, candidate_generator=hfs.PromptLookup())


def test_error_num_return_sequences(llama):
    with pytest.raises(ValueError, match=r"num_return_sequences=1"):
        llama.generate(**prompt_inputs(), do_sample=True, num_return_sequences=2, max_new_tokens=4,
                       candidate_generator=hfs.PromptLookup())


@pytest.mark.parametrize("conflict", ["assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit"])
def test_error_two_drafters(llama, conflict):
    values = {"assistant_model": sibling_model(llama), "prompt_lookup_num_tokens": 3, "assistant_early_exit": 1}
    value = values[conflict]
    with pytest.raises(ValueError, match=rf"`candidate_generator=` and `{conflict}=`.*pass only one"):
        llama.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=hfs.PromptLookup(), **{conflict: value})


def test_error_custom_generate_on_enabled_model(llama):
    with pytest.raises(ValueError, match="custom_generate"):
        llama.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=hfs.PromptLookup(),
                       custom_generate=hfs.speculative_generate)


def test_static_cache_runs_in_our_loop_and_other_fixed_caches_are_refused(llama):
    """``cache_implementation="static"`` (as an argument or in the config passed) verifies on a static cache in
    our loop (tests/core/test_static_cache.py); caches that can neither be rolled back nor written at a chosen
    position are refused with the fix named."""
    expected = stock_generate(llama, **prompt_inputs(), do_sample=False, max_new_tokens=8)
    out = llama.generate(**prompt_inputs(), max_new_tokens=8, do_sample=False, cache_implementation="static",
                         candidate_generator=hfs.PromptLookup())
    assert out.tolist() == expected.tolist()
    config = copy.deepcopy(llama.generation_config)
    config.cache_implementation, config.max_new_tokens, config.do_sample = "static", 8, False
    out = llama.generate(**prompt_inputs(), generation_config=config, candidate_generator=hfs.PromptLookup())
    assert out.tolist() == expected.tolist() and config.cache_implementation == "static"  # the user's config untouched
    for fixed in ("offloaded", "sliding_window"):
        with pytest.raises(ValueError, match=rf"cache_implementation='{fixed}'.*drop cache_implementation"):
            llama.generate(**prompt_inputs(), max_new_tokens=4, cache_implementation=fixed,
                           candidate_generator=hfs.PromptLookup())


@pytest.mark.parametrize("name", sorted({"past_key_values", compat.cache_kwarg()}))
@pytest.mark.parametrize("drafter_name", ["early-exit", "prompt-lookup-fixed"])
def test_a_cache_the_caller_passes(llama, name, drafter_name):
    """A ``DynamicCache`` passed to ``generate()`` (``cache=`` from transformers 5.24, ``past_key_values=``
    before, and still accepted there) is the one the call fills: the drafts go on, self-speculation
    drafts on its layers, and the ids are plain greedy's. A cache that cannot be cropped is refused."""
    from transformers import DynamicCache

    ref = stock_generate(llama, **prompt_inputs(), **GREEDY)
    cache = DynamicCache()
    drafter = make_drafter(drafter_name, llama, ref)
    out = speculate(llama, drafter, **GREEDY, **{name: cache})
    assert out.tolist() == ref.tolist()
    assert_drafter_worked(drafter_name, drafter, hfs.last_stats(llama))
    assert kv_cache.cache_length(cache) == out.shape[1] - 1  # every token but the last one, verified
    with pytest.raises(ValueError, match=r"a cache of type object cannot be rolled back; pass a DynamicCache"):
        llama.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=hfs.PromptLookup(), **{name: object()})


@pytest.mark.parametrize("bad", ["prompt-lookup", 3, hfs.SpeculativeStats()], ids=["str", "int", "stats"])
def test_error_not_a_strategy(llama, bad):
    with pytest.raises(TypeError, match=r"must be a hf_speculative strategy \(hfs.PromptLookup\(\)"):
        llama.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=bad)


@pytest.mark.parametrize("cls", [hfs.PromptLookup, hfs.DraftModel])
def test_error_strategy_class_instead_of_instance(llama, cls):
    with pytest.raises(TypeError, match=rf"got the class {cls.__name__}; pass an instance"):
        llama.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=cls)


def test_error_draft_model_vocabulary_size(llama):
    other = build_model("llama", seed=1, vocab_size=VOCAB + 32)
    with pytest.raises(ValueError, match=r"differ in size \(96 vs 128\).*tokenizer=draft_tok, target_tokenizer="):
        llama.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=hfs.DraftModel(other))


def test_draft_model_tokenizers_differ_drafts_across_them(llama, tokenizer):
    """Two tokenizers given that differ: the drafter drafts across them (tests/drafters/test_draft_model_tokenizers.py)
    and the output stays greedy's."""
    shuffled = tokenizer.__class__(tokenizer_object=copy.deepcopy(tokenizer.backend_tokenizer), pad_token=" ")
    shuffled.backend_tokenizer.add_tokens(["<extra>"])  # a token the target's tokenizer does not have
    drafter = hfs.DraftModel(sibling_model(llama), tokenizer=shuffled, target_tokenizer=tokenizer)
    assert drafter.other_tokenizer() is not None
    out = llama.generate(**prompt_inputs(), do_sample=False, max_new_tokens=12, candidate_generator=drafter)
    assert out.tolist() == stock_generate(llama, **prompt_inputs(), do_sample=False, max_new_tokens=12).tolist()


def test_error_draft_model_other_device(llama):
    """A drafter on another device (``meta`` stands in for a GPU on this CPU-only machine)."""
    with torch.device("meta"):
        other = type(llama)(copy.deepcopy(llama.config))
    with pytest.raises(ValueError, match=r"draft model is on meta and the target on cpu.*draft.to\('cpu'\)"):
        llama.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=hfs.DraftModel(other))


def test_error_draft_model_is_the_target(llama):
    with pytest.raises(ValueError, match="target itself"):
        llama.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=hfs.DraftModel(llama))


def test_error_strategy_arguments():
    with pytest.raises(ValueError, match=r"DraftModel\(num_tokens=0\): must be an integer from 1 to 64"):
        hfs.DraftModel(build_model("llama"), num_tokens=0)
    with pytest.raises(ValueError, match=r"confidence_threshold"):
        hfs.DraftModel(build_model("llama"), confidence_threshold=1.0)
    with pytest.raises(TypeError, match="needs a transformers causal LM"):
        hfs.DraftModel("HuggingFaceTB/SmolLM2-135M")
    with pytest.raises(ValueError, match=r"min_ngram=3, max_ngram=2\).*1 <= min_ngram <= max_ngram"):
        hfs.PromptLookup(min_ngram=3, max_ngram=2)
    with pytest.raises(ValueError, match=r"num_tokens=0"):
        hfs.PromptLookup(num_tokens=0)


def test_error_inputs_embeds_only(llama):
    embeds = llama.get_input_embeddings()(torch.tensor([PROMPT]))
    with pytest.raises(ValueError, match=r"needs `input_ids`.*`inputs_embeds` alone is not supported"):
        llama.generate(inputs_embeds=embeds, max_new_tokens=4, candidate_generator=hfs.PromptLookup())


def test_error_enable_non_generative_model():
    with pytest.raises(TypeError, match=r"needs a transformers model with `generate\(\)`"):
        hfs.enable(torch.nn.Linear(2, 2))


# -- enable / disable ------------------------------------------------------------------------
def test_enable_is_idempotent_and_disable_restores():
    model = build_model("llama")
    assert not hfs.is_enabled(model)
    assert hfs.enable(model) is model
    installed = model.__dict__["generate"]
    assert hfs.enable(model) is model and model.__dict__["generate"] is installed
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    assert speculate(model, hfs.PromptLookup(), **GREEDY).tolist() == ref.tolist()
    before = set(model.__dict__)
    assert hfs.disable(model) is model
    hfs.disable(model)
    assert not hfs.is_enabled(model)
    hooks = {"generate", "save_pretrained", "_get_candidate_generator", "_get_stopping_criteria",
             "_get_logits_processor"}
    assert not hooks & set(model.__dict__)
    assert before - set(model.__dict__) == hooks | {"_hf_speculative_enabled"}
    # transformers' own error for the unknown kwarg, as on any model
    with pytest.raises(ValueError, match=r"are not used by the model: \['candidate_generator'\]"):
        model.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=hfs.PromptLookup())
    assert model.generate(**prompt_inputs(), **GREEDY).tolist() == ref.tolist()


def test_disabled_model_rejects_candidate_generator():
    model = build_model("qwen2")
    with pytest.raises(ValueError, match=r"are not used by the model: \['candidate_generator'\]"):
        model.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=hfs.PromptLookup())


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sample"])
def test_enabled_model_without_candidate_generator_is_unchanged(arch, sampling):
    kwargs = dict(max_new_tokens=20, do_sample=sampling)
    plain = build_model(arch)
    ref = stock_generate(plain, **prompt_inputs(), **kwargs)
    enabled = hfs.enable(build_model(arch))
    torch.manual_seed(0)
    assert enabled.generate(**prompt_inputs(), **kwargs).tolist() == ref.tolist()
    assert hfs.last_stats(enabled) is None  # a plain call publishes no statistics


def test_deepcopy_binds_generate_to_the_copy():
    model = hfs.enable(build_model("llama"))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    speculate(model, hfs.PromptLookup(), **GREEDY)
    original_stats = hfs.last_stats(model)
    clone = copy.deepcopy(model)
    assert hfs.is_enabled(clone)
    for name in ("generate", "_get_candidate_generator", "_get_stopping_criteria"):
        assert getattr(clone, name).__self__ is clone, name
    assert hfs.last_stats(clone) is None
    out = speculate(clone, hfs.PromptLookup(adaptive=False), **GREEDY)
    assert out.tolist() == ref.tolist()
    assert hfs.last_stats(clone) is not None and hfs.last_stats(clone).drafted_tokens > 0
    assert hfs.last_stats(model) is original_stats
    assert hfs.last_stats(clone) is not original_stats


def test_save_pretrained_records_the_real_architecture(tmp_path):
    model = hfs.enable(build_model("qwen2"))
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    reloaded = type(model).from_pretrained(tmp_path).eval()
    assert not hfs.is_enabled(reloaded)
    assert stock_generate(reloaded, **prompt_inputs(), **GREEDY).tolist() == \
        stock_generate(model, **prompt_inputs(), **GREEDY).tolist()


def test_user_generation_config_is_not_modified(tmp_path):
    model = hfs.enable(build_model("llama"))
    config = copy.deepcopy(model.generation_config)
    config.max_new_tokens = 20
    config.do_sample = False
    before = config.to_dict()
    ref = stock_generate(model, **prompt_inputs(), generation_config=copy.deepcopy(config))
    out = model.generate(**prompt_inputs(), generation_config=config, candidate_generator=hfs.PromptLookup())
    assert out.tolist() == ref.tolist()
    assert config.to_dict() == before


# -- custom_generate route -------------------------------------------------------------------
needs_custom_generate = pytest.mark.skipif(
    not compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE,
    reason=f"custom_generate=<callable> with extra kwargs needs transformers >= 4.57 ({compat.TRANSFORMERS_VERSION})",
)


def check_custom_generate_route(model, strategy):
    before = dict(model.__dict__)
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    drafter = hfs.PromptLookup(adaptive=False) if strategy == "prompt-lookup" else \
        hfs.DraftModel(sibling_model(model), adaptive=False)
    torch.manual_seed(0)
    out = model.generate(**prompt_inputs(), **GREEDY, custom_generate=hfs.speculative_generate,
                         candidate_generator=drafter)
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats is not None and stats.new_tokens == ref.shape[1] - L
    assert stats.drafted_tokens > 0 and stats.method == drafter.name
    assert not hfs.is_enabled(model)
    assert model.__dict__.keys() == before.keys(), "custom_generate left instance attributes behind"
    assert all(model.__dict__[k] is v for k, v in before.items())


@needs_custom_generate
@pytest.mark.parametrize("strategy", ["prompt-lookup", "draft-model"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_custom_generate_route(arch, strategy):
    check_custom_generate_route(build_model(arch), strategy)


@needs_custom_generate
@pytest.mark.parametrize("strategy", ["prompt-lookup", "draft-model"])
def test_custom_generate_route_sliding_window_model(strategy):
    """Gemma3 (sliding-window layers), prompt + generation longer than the window. On this route
    generate() builds the cache before the callable runs, for a greedy call: on transformers 4.x that
    cache has sliding-window layers, which cannot be rolled back once past the window."""
    check_custom_generate_route(build_model("gemma3"), strategy)


@needs_custom_generate
def test_custom_generate_route_validates_like_enable():
    model = build_model("llama")
    with pytest.raises(ValueError, match=r"batch size > 1\) supports .*hfs.PromptLookup"):
        ids = torch.tensor([PROMPT, PROMPT])
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                       custom_generate=hfs.speculative_generate, candidate_generator=hfs.EarlyExit(exit_layer=1))
    with pytest.raises(ValueError, match=r"needs candidate_generator="):
        model.generate(**prompt_inputs(), max_new_tokens=4, custom_generate=hfs.speculative_generate)
    with pytest.raises(TypeError, match="pass an instance"):
        model.generate(**prompt_inputs(), max_new_tokens=4, custom_generate=hfs.speculative_generate,
                       candidate_generator=hfs.PromptLookup)
    leftovers = {"_get_candidate_generator", "_get_stopping_criteria", "_get_logits_processor"}
    assert not leftovers & set(model.__dict__)
    assert not [name for name in model.__dict__ if name.startswith("_hf_speculative")]
    assert state_of(model).hook_users.count == 0  # the calls that held the hooks are counted in its state


def test_custom_generate_route_refuses_old_transformers(monkeypatch):
    monkeypatch.setattr(compat, "SUPPORTS_CUSTOM_GENERATE_CALLABLE", False)
    model = build_model("llama")
    with pytest.raises(RuntimeError, match=r"transformers >= 4.57.*hf_speculative.enable\(model\)"):
        hfs.speculative_generate(model, torch.tensor([PROMPT]), candidate_generator=hfs.PromptLookup())


# -- the real model --------------------------------------------------------------------------
ARTICLE = (
    "The city council met on Tuesday evening to discuss the new public library. The library will open in "
    "March and will have three floors, a children's reading room, a cafe and forty computers. The council "
    "approved a budget of two million dollars for the library. The mayor said that the library will be "
    "open every day from nine in the morning to eight in the evening, and that library cards will be free "
    "for all residents of the city."
)
MESSAGES = [
    {"role": "user", "content": f"Rewrite the following text in simpler words, keeping every fact:\n\n{ARTICLE}"},
]


def chat_inputs(tokenizer):
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt")


@pytest.mark.integration
def test_smollm2_prompt_lookup_rewrite(integration):
    model, tokenizer = integration
    hfs.enable(model)
    inputs = chat_inputs(tokenizer)
    kwargs = dict(do_sample=False, max_new_tokens=64)
    ref = stock_generate(model, **inputs, **kwargs)
    out = model.generate(**inputs, **kwargs, candidate_generator=hfs.PromptLookup())
    assert out.tolist() == ref.tolist(), tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])
    stats = hfs.last_stats(model)
    assert stats.new_tokens == ref.shape[1] - inputs["input_ids"].shape[1] == 64
    assert stats.accepted_tokens > 0, stats  # a rewrite copies from its input: lookup must pay off
    assert stats.target_forwards < stats.new_tokens


@pytest.mark.integration
def test_smollm2_pipeline(integration):
    from transformers import pipeline

    model, tokenizer = integration
    hfs.enable(model)
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)
    kwargs = dict(do_sample=False, max_new_tokens=32)
    plain = pipe(copy.deepcopy(MESSAGES), **kwargs)
    fast = pipe(copy.deepcopy(MESSAGES), **kwargs, candidate_generator=hfs.PromptLookup())
    assert fast == plain
    stats = hfs.last_stats(model)
    assert stats is not None and stats.accepted_tokens > 0


@pytest.mark.integration
def test_smollm2_draft_model_copy_is_always_accepted(integration, cheap_verification):
    model, tokenizer = integration
    hfs.enable(model)
    # A copy of the target costs a whole forward per draft step, so on measured costs the policy
    # rightly pauses drafting; fixed costs make this a test of acceptance, not of the clock.
    cheap_verification(model)
    drafter = copy.deepcopy(model)
    hfs.disable(drafter)
    inputs = chat_inputs(tokenizer)
    kwargs = dict(do_sample=False, max_new_tokens=32)
    ref = stock_generate(model, **inputs, **kwargs)
    out = model.generate(**inputs, **kwargs, candidate_generator=hfs.DraftModel(drafter, tokenizer=tokenizer,
                                                                                 target_tokenizer=tokenizer, draft_cost=0.01))
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0 and stats.acceptance_rate == 1.0, stats
    assert stats.target_forwards < stats.new_tokens


@pytest.mark.integration
@pytest.mark.single_version  # that the shipped weights are trained; each drafter's exactness on 4.x: the matrix's
def test_smollm2_shipped_exit_adapter(integration):
    """The exit adapter shipped for the default model loads by name, drafts exactly, and is trained:
    a random adapter's drafts are almost never accepted."""
    from hf_speculative.drafters.self_speculative.exit_adapter import shipped_adapters

    model, tokenizer = integration
    hfs.enable(model)
    assert "smollm2-135m-instruct" in shipped_adapters()
    strategy = hfs.EarlyExit(adapter="smollm2-135m-instruct", num_tokens=4, confidence_threshold=0.0, adaptive=False)
    assert strategy.exit_layer == 4
    inputs = chat_inputs(tokenizer)
    kwargs = dict(do_sample=False, max_new_tokens=64)
    ref = stock_generate(model, **inputs, **kwargs)
    out = model.generate(**inputs, **kwargs, candidate_generator=strategy)
    assert out.tolist() == ref.tolist()
    trained = hfs.last_stats(model)
    # the same network untrained (same shape, same vocabulary map) for contrast
    from hf_speculative.drafters.eagle.model import EagleDraftModel

    torch.manual_seed(0)
    untrained = EagleDraftModel(strategy._adapter_net.config)
    untrained.d2t.copy_(strategy._adapter_net.d2t)
    untrained.t2d.copy_(strategy._adapter_net.t2d)
    out = model.generate(**inputs, **kwargs, candidate_generator=hfs.EarlyExit(
        adapter=untrained.eval().requires_grad_(False), num_tokens=4, confidence_threshold=0.0, adaptive=False))
    assert out.tolist() == ref.tolist()
    random = hfs.last_stats(model)
    # (measured on this prompt: 8.7% of fixed 4-token drafts accepted, 16 of 183, tau 1.33; untrained: ~0%. Before
    # fixed budgets were fixed, the chain shrank after rejections: 17% of fewer drafts, tau 1.28)
    assert trained.acceptance_rate > 0.05 and trained.tau > 1.15, trained
    assert trained.acceptance_rate > 3 * random.acceptance_rate + 0.05, (trained, random)
    assert model.config.num_hidden_layers == 30


@pytest.mark.integration
@pytest.mark.single_version  # that the shipped weights are trained; each drafter's exactness on 4.x: the matrix's
def test_smollm2_shipped_eagle(integration):
    """The EAGLE-3 drafter shipped for the default model loads by name, drafts exactly, and is trained:
    the same network untrained has its drafts almost never accepted."""
    from hf_speculative.drafters.eagle.drafter import pretrained_names
    from hf_speculative.drafters.eagle.model import EagleDraftModel

    model, tokenizer = integration
    hfs.enable(model)
    assert "smollm2-135m-instruct" in pretrained_names()
    strategy = hfs.Eagle.from_pretrained("smollm2-135m-instruct", target=model, num_tokens=4, confidence_threshold=0.0,
                                         adaptive=False)
    assert strategy.drafter.config.version == 3 and strategy.drafter.config.reduced_vocab
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Explain how a bicycle's gears work, in a short paragraph."}],
                                         tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(text, return_tensors="pt")
    kwargs = dict(do_sample=False, max_new_tokens=64)
    ref = stock_generate(model, **inputs, **kwargs)
    assert model.generate(**inputs, **kwargs, candidate_generator=strategy).tolist() == ref.tolist()
    trained = hfs.last_stats(model)

    torch.manual_seed(0)
    untrained = EagleDraftModel(strategy.drafter.config)
    untrained.d2t.copy_(strategy.drafter.d2t)
    untrained.t2d.copy_(strategy.drafter.t2d)
    blank = hfs.Eagle(drafter=untrained.eval().requires_grad_(False), num_tokens=4, confidence_threshold=0.0, adaptive=False)
    assert model.generate(**inputs, **kwargs, candidate_generator=blank).tolist() == ref.tolist()
    random = hfs.last_stats(model)
    # (measured on this prompt with fixed 4-token drafts: 27% accepted, tau 1.52 (stage 8; stage 5: 19%, 1.31); untrained: 0%)
    assert trained.acceptance_rate > 0.12 and trained.tau > 1.15, trained
    assert trained.acceptance_rate > 3 * random.acceptance_rate + 0.05, (trained, random)
