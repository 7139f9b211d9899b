"""The drafter chosen through ``GenerationConfig``: passed to ``generate()``, or the model's own default.

Resolution order: the call's ``candidate_generator=`` keyword (``None``: off for the call), then the
``GenerationConfig`` passed in, then ``model.generation_config.candidate_generator``. Every output is
compared token for token with transformers' plain greedy ``generate`` on the same model.
"""

from __future__ import annotations

import copy
import threading
import warnings

import pytest
import torch
from transformers import GenerationConfig

import hf_speculative as hfs
from tests.conftest import OracleCandidateGenerator, build_model, prompt_inputs, stock_generate

GREEDY = dict(do_sample=False, max_new_tokens=30)


def drafting():
    """A strategy that drafts at every step after the prefill, on any tiny model (no cost rule)."""
    return hfs.EarlyExit(exit_layer=1, num_tokens=4, confidence_threshold=0.0, adaptive=False)


def config_like(model, **fields) -> GenerationConfig:
    """A copy of the model's generation config with ``fields`` set."""
    config = copy.deepcopy(model.generation_config)
    for key, value in fields.items():
        setattr(config, key, value)
    return config


@pytest.fixture
def llama():
    return hfs.enable(build_model("llama"))


# -- a GenerationConfig passed to generate() -------------------------------------------------------
def test_passed_generation_config_is_honoured_like_the_keyword(model):
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    strategy = drafting()
    config = config_like(model, **GREEDY, candidate_generator=strategy)
    before = config.to_dict()
    out = model.generate(**prompt_inputs(), generation_config=config)
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats is not None and stats.method == "early-exit" and stats.drafted_tokens > 0, stats
    assert config.candidate_generator is strategy and config.to_dict() == before  # the user's config is untouched


def test_a_fresh_generation_config_positionally(llama):
    """``GenerationConfig(..., candidate_generator=...)`` built from scratch, passed as generate()'s second argument."""
    ref = stock_generate(llama, **prompt_inputs(), **GREEDY)
    config = GenerationConfig(**GREEDY, candidate_generator=hfs.PromptLookup(adaptive=False))
    out = llama.generate(prompt_inputs()["input_ids"], config, attention_mask=prompt_inputs()["attention_mask"])
    assert out.tolist() == ref.tolist()
    assert hfs.last_stats(llama).method == "prompt-lookup" and hfs.last_stats(llama).drafted_tokens > 0


def test_raw_candidate_generator_in_a_passed_config(llama):
    ref = stock_generate(llama, **prompt_inputs(), **GREEDY)
    oracle = OracleCandidateGenerator(ref, num_tokens=5)
    out = llama.generate(**prompt_inputs(), generation_config=config_like(llama, **GREEDY, candidate_generator=oracle))
    assert out.tolist() == ref.tolist()
    assert oracle.proposals and not oracle.diverged
    assert hfs.last_stats(llama).accepted_tokens == hfs.last_stats(llama).drafted_tokens > 0


def test_the_keyword_wins_over_the_passed_config_with_a_warning(llama):
    ref = stock_generate(llama, **prompt_inputs(), **GREEDY)
    config = config_like(llama, **GREEDY, candidate_generator=hfs.PromptLookup(adaptive=False))
    with pytest.warns(UserWarning, match="both choose a drafter; the keyword's is used"):
        out = llama.generate(**prompt_inputs(), generation_config=config, candidate_generator=drafting())
    assert out.tolist() == ref.tolist() and hfs.last_stats(llama).method == "early-exit"
    previous = hfs.last_stats(llama)
    with pytest.warns(UserWarning, match="both choose a drafter"):
        out = llama.generate(**prompt_inputs(), generation_config=config, candidate_generator=None)
    assert out.tolist() == ref.tolist()
    assert hfs.last_stats(llama) is previous  # a plain call: no new statistics


def test_the_same_strategy_in_both_places_is_not_a_conflict(llama):
    strategy = drafting()
    config = config_like(llama, **GREEDY, candidate_generator=strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        llama.generate(**prompt_inputs(), generation_config=config, candidate_generator=strategy)
    assert hfs.last_stats(llama).method == "early-exit"


# -- the model's own default -------------------------------------------------------------------------
def test_model_default_makes_every_call_speculative(model):
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    model.generation_config.candidate_generator = drafting()
    assert model.generate(**prompt_inputs(), **GREEDY).tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats is not None and stats.method == "early-exit" and stats.drafted_tokens > 0
    # None in the call: plain decoding, no statistics
    assert model.generate(**prompt_inputs(), **GREEDY, candidate_generator=None).tolist() == ref.tolist()
    assert hfs.last_stats(model) is stats
    # another strategy in the call wins, without a warning (the default is not a passed config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.PromptLookup(adaptive=False))
    assert out.tolist() == ref.tolist() and hfs.last_stats(model).method == "prompt-lookup"


def test_model_default_under_a_passed_config_without_one(llama):
    """A passed config with no ``candidate_generator`` (or ``None`` there, as transformers reads None: unset)
    leaves the model's default in force."""
    ref = stock_generate(llama, **prompt_inputs(), **GREEDY)
    llama.generation_config.candidate_generator = drafting()
    for config in (GenerationConfig(**GREEDY), GenerationConfig(**GREEDY, candidate_generator=None)):
        previous = hfs.last_stats(llama)
        out = llama.generate(**prompt_inputs(), generation_config=config)
        assert out.tolist() == ref.tolist()
        assert hfs.last_stats(llama) is not previous and hfs.last_stats(llama).method == "early-exit"
    # a strategy in the passed config wins over the model's
    out = llama.generate(**prompt_inputs(), generation_config=GenerationConfig(
        **GREEDY, candidate_generator=hfs.PromptLookup(adaptive=False)))
    assert out.tolist() == ref.tolist() and hfs.last_stats(llama).method == "prompt-lookup"


def test_errors_about_a_default_say_how_to_turn_it_off(llama):
    llama.generation_config.candidate_generator = hfs.PromptLookup()
    with pytest.raises(ValueError, match=r"beam search.*model\.generation_config\.candidate_generator: pass "
                                         r"candidate_generator=None to generate\(\)"):
        llama.generate(**prompt_inputs(), max_new_tokens=4, num_beams=2)
    with pytest.raises(ValueError, match=r"batch size > 1\) supports.*the GenerationConfig passed to generate\(\)"):
        ids = torch.tensor([[3, 5, 6], [3, 5, 7]])
        llama.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                       generation_config=GenerationConfig(max_new_tokens=4,
                                                          candidate_generator=hfs.EarlyExit(exit_layer=1)))
    # turned off for the call, beam search runs as transformers' own
    ref = stock_generate(llama, **prompt_inputs(), max_new_tokens=6, num_beams=2)
    assert llama.generate(**prompt_inputs(), max_new_tokens=6, num_beams=2,
                          candidate_generator=None).tolist() == ref.tolist()


def test_the_keyword_error_is_unchanged(llama):
    with pytest.raises(ValueError, match=r"or drop candidate_generator=\.$"):
        llama.generate(**prompt_inputs(), max_new_tokens=4, num_beams=2, candidate_generator=hfs.PromptLookup())


def test_a_default_must_be_a_strategy_dataclass(llama):
    llama.generation_config.candidate_generator = OracleCandidateGenerator([3, 5], num_tokens=2)
    with pytest.raises(TypeError, match="a model's default drafter must be one of hf_speculative's strategies"):
        llama.generate(**prompt_inputs(), max_new_tokens=4)
    llama.generation_config.candidate_generator = hfs.PromptLookup
    with pytest.raises(TypeError, match="pass an instance"):
        llama.generate(**prompt_inputs(), max_new_tokens=4)


def test_a_config_holding_a_strategy_stays_serializable():
    """transformers prints, hashes, compares and copies the configs it is given; a strategy serializes as its spec
    (``DraftStrategy.to_dict``) and a copy shares it."""
    strategy = hfs.PromptLookup(num_tokens=7)
    config = GenerationConfig(max_new_tokens=5, candidate_generator=strategy)
    assert '"method": "prompt-lookup"' in repr(config) and '"num_tokens": 7' in config.to_json_string()
    assert hash(config) == hash(GenerationConfig(max_new_tokens=5, candidate_generator=hfs.PromptLookup(num_tokens=7)))
    assert config != GenerationConfig(max_new_tokens=5, candidate_generator=hfs.PromptLookup(num_tokens=8))
    assert copy.deepcopy(config).candidate_generator is strategy
    assert copy.deepcopy(strategy) is strategy


def test_a_model_that_is_not_enabled_ignores_its_default():
    """Without hfs.enable(), transformers' generate() runs as always (the default is only data to it)."""
    model = build_model("llama")
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    model.generation_config.candidate_generator = drafting()
    assert model.generate(**prompt_inputs(), **GREEDY).tolist() == ref.tolist()
    with pytest.raises(RuntimeError, match="not enabled"):  # nothing was recorded: last_stats says why
        hfs.last_stats(model)


def test_custom_generate_route_reads_the_config():
    from hf_speculative import compat

    if not compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE:
        pytest.skip("custom_generate=<callable> needs transformers >= 4.57")
    model = build_model("qwen2")
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    model.generation_config.candidate_generator = drafting()
    out = model.generate(**prompt_inputs(), **GREEDY, custom_generate=hfs.speculative_generate)
    assert out.tolist() == ref.tolist() and hfs.last_stats(model).method == "early-exit"


# -- pipelines and threads ------------------------------------------------------------------------------
@pytest.mark.parametrize("default_first", [True, False], ids=["default-then-pipeline", "pipeline-then-default"])
def test_pipeline_uses_the_model_default(chat_model, chat_tokenizer, default_first):
    from transformers import pipeline

    messages = [{"role": "user", "content": "the cat sat on the mat and the dog ran to the house"}]
    kwargs = dict(do_sample=False, max_new_tokens=12)
    plain = pipeline("text-generation", model=copy.deepcopy(chat_model), tokenizer=chat_tokenizer)(
        copy.deepcopy(messages), **kwargs)
    model = hfs.enable(chat_model)
    if default_first:
        model.generation_config.candidate_generator = drafting()
    pipe = pipeline("text-generation", model=model, tokenizer=chat_tokenizer)
    if not default_first:
        model.generation_config.candidate_generator = drafting()
    assert pipe(copy.deepcopy(messages), **kwargs) == plain
    stats = hfs.last_stats(model)
    assert stats is not None and stats.method == "early-exit" and stats.drafted_tokens > 0
    assert pipe(copy.deepcopy(messages), **kwargs, candidate_generator=None) == plain
    assert hfs.last_stats(model) is stats  # turned off for that call


def test_two_threads_two_models_two_defaults():
    models = [hfs.enable(build_model("llama")), hfs.enable(build_model("qwen2"))]
    refs = [stock_generate(m, **prompt_inputs(), **GREEDY).tolist() for m in models]
    models[0].generation_config.candidate_generator = drafting()
    models[1].generation_config.candidate_generator = hfs.PromptLookup(adaptive=False)
    expected = ["early-exit", "prompt-lookup"]
    problems: list[str] = []

    def run(i: int) -> None:
        for _ in range(4):
            out = models[i].generate(**prompt_inputs(), **GREEDY).tolist()
            stats = hfs.last_stats(models[i])
            if out != refs[i] or stats.method != expected[i] or stats.drafted_tokens == 0:
                problems.append(f"model {i}: {stats}")

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not problems


# -- the real model ---------------------------------------------------------------------------------
@pytest.mark.integration
def test_smollm2_pipeline_with_a_default(integration, cheap_verification):
    from transformers import pipeline

    model, tokenizer = integration
    hfs.enable(model)
    # the adaptive lookup drafts from measured costs, which the session's other tests and the machine's load move:
    # fixed GPU-like costs make this a test of the default's route and acceptance, not of the clock
    cheap_verification(model)
    text = "Repeat this sentence twice: the library opens in March with forty computers."
    messages = [{"role": "user", "content": text}]
    kwargs = dict(do_sample=False, max_new_tokens=32)
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)
    plain = pipe(copy.deepcopy(messages), **kwargs)
    model.generation_config.candidate_generator = hfs.PromptLookup()
    try:
        assert pipe(copy.deepcopy(messages), **kwargs) == plain
        stats = hfs.last_stats(model)
        assert stats is not None and stats.method == "prompt-lookup" and stats.accepted_tokens > 0, stats
    finally:
        del model.generation_config.candidate_generator  # the model is shared by the session


def test_forget_drops_the_last_statistics(llama):
    llama.generate(**prompt_inputs(), **GREEDY, candidate_generator=drafting())
    assert hfs.last_stats(llama) is not None
    from hf_speculative.core.state import forget

    forget(llama)
    assert hfs.last_stats(llama) is None
