"""hfs.EarlyExit and hfs.LayerSkip: exact, drafting on the target's own cache (no copy, no second
prefill), nothing shared mutated, calibration cached / saved / reported, clear errors.

The generic edge cases (EOS / max_new_tokens / stop strings inside drafts, sampling, stats, threads)
run for these drafters through ``DRAFTERS`` in tests/conftest.py."""

from __future__ import annotations

import json

import pytest
import torch

import hf_speculative as hfs
from hf_speculative import compat
from hf_speculative.core import kv_cache
from hf_speculative.drafters.self_speculative import calibration as layer_calibration
from hf_speculative.drafters.self_speculative.calibration import SkipCalibration
from hf_speculative.drafters.self_speculative.layer_view import LayerSubset, UnsupportedModelError, check_structure
from tests.conftest import ARCHS, PROMPT, build_model, prompt_inputs, stock_generate

GREEDY = dict(do_sample=False, max_new_tokens=40)
EXACT = dict(confidence_threshold=0.0, adaptive=False)


def identity_layers(model, layers):
    """Zero the output projections of ``layers``: each then adds nothing to the residual stream, so a
    draft that skips them computes exactly what the full model does (always accepted)."""
    decoder = model.model
    with torch.no_grad():
        for i in layers:
            decoder.layers[i].self_attn.o_proj.weight.zero_()
            decoder.layers[i].mlp.down_proj.weight.zero_()
    return model


def layer_keys(cache, i):
    return cache.layers[i].keys if hasattr(cache, "layers") else cache.key_cache[i]


def layer_calls(model):
    """Record the number of positions every call of decoder layer 0 processes."""
    sizes = []
    handle = model.model.layers[0].register_forward_hook(lambda m, args, out: sizes.append(args[0].shape[1]))
    return sizes, handle


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", ["early-exit", "layer-skip"])
def test_always_accepted_when_the_skipped_layers_do_nothing(arch, kind):
    model = hfs.enable(identity_layers(build_model(arch, layers=4), [2, 3] if kind == "early-exit" else [1, 2]))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    strategy = hfs.EarlyExit(exit_layer=2, **EXACT) if kind == "early-exit" else hfs.LayerSkip(skip=[1, 2], **EXACT)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=strategy)
    stats = hfs.last_stats(model)
    assert out.tolist() == ref.tolist()
    assert stats.drafted_tokens > 20 and stats.accepted_tokens == stats.drafted_tokens, stats
    assert stats.tau > 4


@pytest.mark.parametrize("arch", ARCHS)
def test_no_second_prefill_and_the_verified_cache_is_plain_decodings(arch):
    model = hfs.enable(build_model(arch, layers=4))
    plain = stock_generate(model, **prompt_inputs(), **GREEDY, return_dict_in_generate=True)
    check_structure(model)  # the once-per-model structure probe runs its own two tokens
    sizes, handle = layer_calls(model)
    try:
        out = model.generate(**prompt_inputs(), **GREEDY, return_dict_in_generate=True,
                             candidate_generator=hfs.EarlyExit(exit_layer=2, **EXACT))
    finally:
        handle.remove()
    stats = hfs.last_stats(model)
    assert out.sequences.tolist() == plain.sequences.tolist()
    # layer 0 saw the prompt once (the target's prefill), then single-token draft steps and the
    # target's verifying forwards of 1 + k tokens
    assert sizes.count(len(PROMPT)) == 1 and sizes[0] == len(PROMPT)
    assert len(sizes) == stats.target_forwards + stats.drafted_tokens
    # every draft entry was cropped: the cache has plain decoding's lengths and (up to the
    # rounding of batched verification) its values, in every layer
    mine, theirs = compat.output_cache(out), compat.output_cache(plain)
    for i in range(4):
        assert compat.cache_layer_length(mine, i) == compat.cache_layer_length(theirs, i)
        a, b = layer_keys(mine, i), layer_keys(theirs, i)
        kept = min(a.shape[-2], b.shape[-2])  # 4.x plain decoding keeps only a sliding window's keys
        torch.testing.assert_close(a[..., -kept:, :], b[..., -kept:, :], atol=1e-5, rtol=1e-4)


def test_the_config_is_never_changed_during_a_call():
    model = hfs.enable(build_model("llama", layers=4))
    seen = []
    handle = model.model.layers[0].register_forward_hook(lambda *a: seen.append(model.config.num_hidden_layers))
    try:
        model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.EarlyExit(exit_layer=1, **EXACT))
        model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.LayerSkip(skip=[0, 3], **EXACT))
    finally:
        handle.remove()
    assert set(seen) == {4} and len(seen) > 40


@pytest.mark.parametrize("arch", ARCHS)
def test_the_view_reproduces_the_model_past_the_sliding_window(arch):
    """Every layer through the view, one token at a time on a prefilled cache, gives the model's own
    logits (sliding-window layers included), and rolling back restores the cache lengths."""
    model = build_model(arch, layers=4)
    ids = torch.randint(4, 90, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # the cache an assisted loop runs on: 5.x sliding layers that record their past, 4.x full layers
        start = None if compat.IS_TRANSFORMERS_5 else kv_cache.new_dynamic_cache()
        prefill = model(input_ids=ids[:, :20], **{compat.cache_kwarg(): start}, use_cache=True)
        cache = compat.output_cache(prefill)
        if hasattr(cache, "activate_past_recording"):
            cache.activate_past_recording()
        full = model(input_ids=ids, use_cache=False).logits[0]
        view = LayerSubset(model, range(4))
        for p in range(20, 30):
            torch.testing.assert_close(view.step(int(ids[0, p]), p, cache, ids.device), full[p], atol=1e-5, rtol=1e-4)
        view.rollback(cache, 10)
    assert cache.get_seq_length() == 20


def test_the_calibration_finds_the_layers_that_do_nothing(tmp_path):
    model = hfs.enable(identity_layers(build_model("llama", layers=6), [2, 3, 4]))
    ids = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=60)
    strategy = hfs.LayerSkip("auto", calibration_file=tmp_path / "skip.json")
    plan = strategy.calibrate(model, ids)
    assert plan.skip[:3] == [2, 3, 4] or set(plan.skip) >= {2, 3, 4}, plan
    assert plan.agreement == 1.0 and plan.expected_speedup > 1.0 and plan.tokens == ids.shape[1]
    saved = json.loads((tmp_path / "skip.json").read_text())
    assert saved["skip"] == plan.skip and saved["format"] == layer_calibration.FORMAT
    assert SkipCalibration.load(tmp_path / "skip.json") == plan


def test_auto_calibrates_once_per_model_and_reports_it(tmp_path):
    model = hfs.enable(build_model("llama", layers=4))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    file = tmp_path / "calib.json"
    strategy = hfs.LayerSkip("auto", calibration_tokens=16, calibration_file=file, **EXACT)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=strategy)
    first = hfs.last_stats(model).extra["layer-skip"]
    assert out.tolist() == ref.tolist()
    # positions compared: those predicting the 16 generated tokens and the next one
    assert first["source"] == "calibrated" and first["calibration_tokens"] == 17 and first["calibration_s"] > 0
    assert file.exists() and json.loads(file.read_text())["skip"] == first["skip"]
    # the next call (a new strategy object too) reuses the model's calibration from the start
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.LayerSkip(**EXACT))
    second = hfs.last_stats(model).extra["layer-skip"]
    assert out.tolist() == ref.tolist()
    assert second["source"] == "cached" and second["skip"] == first["skip"]
    # another model object loads it from the file instead of calibrating
    other = hfs.enable(build_model("llama", layers=4))
    other.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.LayerSkip(calibration_file=file, calibration_tokens=16, **EXACT))
    third = hfs.last_stats(other).extra["layer-skip"]
    assert third["source"] == "file" and third["skip"] == first["skip"]


@pytest.mark.parametrize("expected, drafts", [(1.0, False), (1.4, True)])
def test_auto_does_not_draft_when_no_set_pays(tmp_path, cheap_verification, expected, drafts):
    """A calibration whose best set is expected to lose against plain decoding means: skip nothing.
    The adaptive strategy then drafts nothing at all (no draft steps paid for)."""
    model = hfs.enable(build_model("llama", layers=4))
    cheap_verification(model)
    SkipCalibration(skip=[1, 2], num_layers=4, agreement=0.5, draft_cost=0.6, expected_speedup=expected).save(tmp_path / "c.json")
    strategy = hfs.LayerSkip(calibration_file=tmp_path / "c.json", confidence_threshold=0.0, draft_cost=0.0)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=strategy)
    assert out.tolist() == stock_generate(model, **prompt_inputs(), **GREEDY).tolist()
    stats = hfs.last_stats(model)
    assert stats.extra["layer-skip"]["drafting"] is drafts
    assert (stats.drafted_tokens > 0) is drafts, stats


def test_a_short_generation_drafts_nothing_until_calibrated():
    model = hfs.enable(build_model("llama", layers=4))
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=5)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=5,
                         candidate_generator=hfs.LayerSkip(calibration_tokens=64, **EXACT))
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens == 0 and stats.extra["layer-skip"]["source"] == "waiting"
    assert layer_calibration.cached_calibration(model) is None


# -- errors -----------------------------------------------------------------------------------
def test_unsupported_structure_is_a_clear_error():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = hfs.enable(GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96)).eval())
    with pytest.raises(UnsupportedModelError, match="hfs.PromptLookup"):
        model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.EarlyExit(exit_layer=1))
    with pytest.raises(ValueError, match="built differently"):
        check_structure(model)


@pytest.mark.parametrize("make, message", [
    (lambda: hfs.EarlyExit(exit_layer=0), "exit_layer"),
    (lambda: hfs.EarlyExit(exit_layer=2, num_tokens=0), "num_tokens"),
    (lambda: hfs.LayerSkip(skip="most"), "'auto'"),
    (lambda: hfs.LayerSkip(skip=[]), "at least one"),
    (lambda: hfs.LayerSkip(skip=[1, 1]), "distinct"),
    (lambda: hfs.LayerSkip(skip=[1], calibration_file="x.json"), "only read with skip='auto'"),
    (lambda: hfs.LayerSkip(calibration_tokens=2), "calibration_tokens"),
])
def test_bad_options(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("strategy, message", [
    (hfs.EarlyExit(exit_layer=4), "below the model's 4 layers"),
    (hfs.LayerSkip(skip=[1, 7]), r"\[7\] out of range"),
    (hfs.LayerSkip(skip=[0, 1, 2, 3]), "keep at least one"),
])
def test_strategies_that_do_not_fit_the_model(strategy, message):
    model = hfs.enable(build_model("llama", layers=4))
    with pytest.raises(ValueError, match=message):
        model.generate(**prompt_inputs(), **GREEDY, candidate_generator=strategy)


def test_calibration_files_that_do_not_fit(tmp_path):
    model = hfs.enable(build_model("llama", layers=4))
    wrong = tmp_path / "six.json"
    SkipCalibration(skip=[1, 2], num_layers=6, model="six-layer").save(wrong)
    with pytest.raises(ValueError, match="6-layer model"):
        model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.LayerSkip(calibration_file=wrong))
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"skip": [1], "num_lay')
    with pytest.raises(ValueError, match="not a readable LayerSkip calibration"):
        model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.LayerSkip(calibration_file=corrupt))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something-else", "skip": [1], "num_layers": 4}))
    with pytest.raises(ValueError, match="not a readable LayerSkip calibration"):
        SkipCalibration.load(other)


def test_a_cache_kept_elsewhere_is_said_and_drafts_nothing(monkeypatch, caplog):
    """Where the installed transformers keeps the loop's cache somewhere unknown (as 5.24 did, renaming
    it), the call is still plain greedy's and a warning says why nothing was drafted, instead of a
    silent loss of the speedup."""
    import logging

    model = hfs.enable(build_model("llama"))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.EarlyExit(exit_layer=1, **EXACT))
    assert out.tolist() == ref.tolist() and hfs.last_stats(model).drafted_tokens > 0  # where it is known
    monkeypatch.setattr(compat, "target_cache", lambda model_kwargs: None)
    with caplog.at_level(logging.WARNING, logger="hf_speculative.drafters.self_speculative.drafter"):
        out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.EarlyExit(exit_layer=1, **EXACT))
    assert out.tolist() == ref.tolist()
    assert hfs.last_stats(model).drafted_tokens == 0
    said = [r.getMessage() for r in caplog.records if "KV cache is not where" in r.getMessage()]
    assert len(said) == 1 and "EarlyExit drafts nothing" in said[0], said
