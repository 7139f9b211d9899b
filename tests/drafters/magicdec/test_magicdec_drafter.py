"""``hfs.MagicDec`` on one row: identical to plain greedy in both loops, its compressed cache equal to the target's own
keys and values at the sinks and the window after every step (evicting), drafts always and never accepted, stops
inside accepted drafts, declining where nothing is compressed, and the models it refuses."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core.static_cache import StaticCacheError
from hf_speculative.drafters.magicdec import group as group_module
from hf_speculative.drafters.magicdec.choosing import Choice
from hf_speculative.options import OptionError, OptionTypeError
from tests.conftest import ARCHS, PROMPT, build_model, prompt_inputs, stock_generate
from tests.drafters.magicdec.conftest import CheckedMagicDec, context_free_model, evicting
from tests.drafters.tree_battery import check_eos_inside_paths, check_max_new_tokens, check_stop_strings

GREEDY = dict(do_sample=False, max_new_tokens=40)
TWO = [arch for arch in ARCHS if arch != "gemma3"]  # (Gemma3's sliding layers are refused: see below)


@pytest.mark.parametrize("loop", ["hf_speculative", "transformers"])
@pytest.mark.parametrize("arch", TWO)
def test_greedy_identity_with_a_cache_that_evicts(arch, loop):
    model = hfs.enable(build_model(arch))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    strategy = CheckedMagicDec(window=4, sinks=2, num_tokens=4, confidence_threshold=0.0, adaptive=False)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=strategy, speculative_loop=loop)
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0 and stats.target_forwards < 40, stats
    # every step's cache was checked against the target's own keys and values (at most sinks + window of them)
    assert len(strategy.checked) == stats.target_forwards
    info = stats.extra["magicdec"]
    assert info["cache_slots"] == 6 and info["sinks"] == 2 and info["window"] == 4 and info["rows"] == 1
    assert info["cache_bytes"] == strategy.cache_bytes(model) and info["uncompressed_steps"] == 0


def test_a_long_prompt_and_a_wider_window():
    model = hfs.enable(build_model("qwen2", max_positions=512))
    prompt = (PROMPT * 10)[:130]
    ref = stock_generate(model, **prompt_inputs(prompt), **GREEDY)
    strategy = CheckedMagicDec(window=32, sinks=4, num_tokens=5, confidence_threshold=0.0, adaptive=False)
    out = model.generate(**prompt_inputs(prompt), **GREEDY, candidate_generator=strategy)
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0
    assert stats.extra["magicdec"]["cache_slots"] == 36  # bounded by sinks + window, not by the 170 tokens


def test_drafts_always_accepted_where_attention_reads_nothing():
    model = hfs.enable(context_free_model())
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None,
                         candidate_generator=CheckedMagicDec(window=4, sinks=2, confidence_threshold=0.0,
                                                             adaptive=False))
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.accepted_tokens == stats.drafted_tokens > 0 and stats.target_forwards <= 30 // 5 + 2, stats


def test_an_eos_inside_an_accepted_draft_ends_the_text_there():
    model = hfs.enable(context_free_model())
    free = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None)
    text = free[0, len(PROMPT):].tolist()
    # a token the text writes first at new position >= 3: a draft of 4 from position 1 or 2 holds it
    at = next(i for i in range(3, len(text)) if text[i] not in text[:i])
    kwargs = dict(do_sample=False, max_new_tokens=30, eos_token_id=text[at])
    ref = stock_generate(model, **prompt_inputs(), **kwargs)
    assert ref.shape[1] == len(PROMPT) + at + 1
    out = model.generate(**prompt_inputs(), **kwargs, candidate_generator=evicting())
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.new_tokens == at + 1 and stats.accepted_tokens > 0


def test_drafts_never_accepted_leave_no_trace(monkeypatch):
    """Every drafted token is the drafter's least likely one (never the target's): the text is greedy's, nothing is
    kept, and the compressed cache never holds a drafted token's keys and values (checked after every step)."""
    real = group_module.choose

    def worst(processors, sampler, sequence, logits):
        choice = real(processors, sampler, sequence, logits)
        return None if choice is None else Choice(choice.peak, int(torch.argmin(logits)), choice.p)

    monkeypatch.setattr(group_module, "choose", worst)
    model = hfs.enable(build_model("qwen2"))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    strategy = CheckedMagicDec(window=4, sinks=2, confidence_threshold=0.0, adaptive=False)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=strategy)
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0 and stats.accepted_tokens == 0 and stats.target_forwards == 40
    assert len(strategy.checked) == 40


@pytest.mark.parametrize("arch", TWO)
def test_stops_inside_drafts(arch):
    check_max_new_tokens(evicting, arch)
    check_eos_inside_paths(evicting, arch)
    check_stop_strings(evicting, arch)


def test_no_compression_drafts_nothing_and_stays_exact():
    """A window as long as the context: the compressed cache would be the whole cache, so the drafter declines."""
    model = hfs.enable(build_model("llama"))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.MagicDec(window=64, sinks=4,
                                                                                       adaptive=False))
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens == 0 and stats.target_forwards == 40
    # asked at every step but the prefill and the last one (no room left for a draft there)
    assert stats.extra["magicdec"]["uncompressed_steps"] == 38


def test_drafting_starts_once_the_context_outgrows_the_cache():
    model = hfs.enable(build_model("llama", eos=None))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=CheckedMagicDec(
        window=20, sinks=4, confidence_threshold=0.0, adaptive=False))
    assert out.tolist() == ref.tolist()
    info = hfs.last_stats(model).extra["magicdec"]
    assert 0 < info["uncompressed_steps"] < 24 and info["draft_steps"] > 0, info


# -- what it refuses ----------------------------------------------------------------------------------------------
@pytest.mark.skipif("gemma3" not in ARCHS, reason="Gemma3 arrived in transformers 4.50")
def test_sliding_window_layers_are_refused_at_call_time():
    model = hfs.enable(build_model("gemma3"))
    with pytest.raises(ValueError, match=r"MagicDec cannot draft for Gemma3ForCausalLM: it has layers of type "
                                         r"\['sliding_attention'\]"):
        model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.MagicDec())
    with pytest.raises(hfs.drafters.registry.ExampleNotApplicable, match="sliding_attention"):
        hfs.MagicDec.example(model)


def test_a_sliding_window_config_and_flash_attention_are_refused():
    from transformers import MistralConfig, MistralForCausalLM

    mistral = MistralForCausalLM(MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=4, num_key_value_heads=2, sliding_window=8))
    with pytest.raises(ValueError, match="it has a sliding window of 8 on its layers"):
        hfs.MagicDec().validate_target(mistral)
    llama = build_model("llama")
    llama.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="with attn_implementation='flash_attention_2'.*attn_implementation='sdpa'"):
        hfs.MagicDec().validate_target(llama)


def test_a_static_cache_is_refused_with_the_reason():
    model = hfs.enable(build_model("llama"))
    with pytest.raises(StaticCacheError, match="MagicDec drafts with the target's own layers over its dynamic KV cache"):
        model.generate(**prompt_inputs(), **GREEDY, candidate_generator=evicting(), cache_implementation="static")


@pytest.mark.parametrize("options, error, message", [
    ({"window": 0}, OptionError, r"MagicDec\(window=0\): must be an integer from 1 to 131072"),
    ({"sinks": -1}, OptionError, r"MagicDec\(sinks=-1\): must be an integer from 0 to 1024"),
    ({"window": 2.5}, OptionTypeError, r"MagicDec\(window=2.5\)"),
    ({"num_tokens": 0}, OptionError, r"MagicDec\(num_tokens=0\)"),
    ({"windows": 8}, TypeError, "did you mean 'window'"),
])
def test_bad_options_name_the_fix(options, error, message):
    with pytest.raises(error, match=message):
        hfs.MagicDec(**options)


def test_its_spec_round_trips():
    from hf_speculative.hf import spec

    strategy = hfs.MagicDec(window=256, sinks=8, num_tokens=3, adaptive=False)
    data = strategy.to_dict()
    assert data["method"] == "magicdec" and data["options"]["window"] == 256
    again = spec.from_spec(data, build_model("llama"), None)
    assert type(again) is hfs.MagicDec
    assert (again.window, again.sinks, again.num_tokens, again.adaptive) == (256, 8, 3, False)


def test_a_cache_that_already_holds_the_prompt_start_is_read_into_the_compressed_cache():
    """A cache passed to generate() holding the prompt's first tokens: the drafter reads their keys and values from
    it at the first forward (it never saw the forward that made them), so it drafts from the first step and its
    compressed cache is the target's own after every step; the text is greedy's. A forward it did not see later on
    (the control: the tap misses the second forward) stops its drafts, said why; the text is greedy's all the same."""
    from transformers import DynamicCache

    from hf_speculative import compat

    model = hfs.enable(build_model("llama"))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.tensor([PROMPT[:5]]), use_cache=True, **{compat.cache_kwarg(): cache})
    strategy = CheckedMagicDec(window=6, sinks=2, num_tokens=4, confidence_threshold=0.0, adaptive=False)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=strategy, **{compat.cache_kwarg(): cache})
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0 and "stopped" not in stats.extra["magicdec"]
    assert strategy.checked[0] == len(PROMPT) + 1  # the first step's check: the prompt read whole

    missed = {"count": 0}
    original = group_module.DraftGroup._received

    def missing_the_second(self, forward):  # the tap misses the second forward
        missed["count"] += 1
        if missed["count"] != 2:
            original(self, forward)

    group_module.DraftGroup._received = missing_the_second
    try:
        out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=evicting())
    finally:
        group_module.DraftGroup._received = original
    assert out.tolist() == ref.tolist()
    assert "no keys and values were read" in hfs.last_stats(model).extra["magicdec"]["stopped"]
