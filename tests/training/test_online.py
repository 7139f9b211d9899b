"""``train-eagle --features online``: the target's features computed for every batch instead of cached.
They are the numbers the cache holds, so an online run trains the drafter a cached run trains (bit for
bit with one sequence per forward), writes nothing to ``OUT/cache``, and its options are checked."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from hf_speculative.cli.main import app
from hf_speculative.training import data
from hf_speculative.training.batches import CachedExamples, pad_batch
from hf_speculative.training.config import TrainConfig
from hf_speculative.training.data import FeatureCache
from hf_speculative.training.online import OnlineFeatures
from tests.conftest import build_model
from tests.training.conftest import assert_drafts_exactly
from tests.training.test_data import LENGTHS, examples_of

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("layers", [[2, 0], []])
def test_online_features_are_the_cached_ones(tmp_path, arch, layers):
    target = build_model(arch, layers=3)
    examples = examples_of(LENGTHS)
    cache = FeatureCache.build(tmp_path / "c", target, examples, layers, batch_tokens=1, progress=False,
                               fast_cpu=False)  # both on the stock path: bitwise the same
    online = OnlineFeatures(target, examples, layers)
    for i in range(len(examples)):
        for cached, computed in zip(cache.get(i), online.get(i)):
            assert cached.dtype == computed.dtype and torch.equal(cached, computed)
    assert all(not m._forward_hooks for m in target.modules())  # no hook outlives a forward

    # a padded batch: each row its own sequence's numbers (up to the rounding of a batched forward), zero after it
    batch = pad_batch([CachedExamples(examples, None, [i])[0] for i in (4, 5, 1)])  # lengths 40, 5, 31
    assert set(batch) == {"ids", "loss_mask", "lengths", "tokens"}
    filled = online.fill(batch)
    for row, i in enumerate((4, 5, 1)):
        n = len(examples[i].ids)
        feats, final, top = cache.get(i)
        torch.testing.assert_close(filled["features"][row, :n], feats, atol=3e-3, rtol=3e-3)
        torch.testing.assert_close(filled["final"][row, :n], final, atol=3e-3, rtol=3e-3)
        assert torch.equal(filled["top"][row, :n], top)
        for key in ("features", "final", "top"):
            assert not filled[key][row, n:].any()


def train(chat_checkpoint, data, out, *extra, epochs=2, env=None):
    args = ["train-eagle", "--target", str(chat_checkpoint), "--data", str(data), "--out", str(out),
            "--draft-vocab-size", "24", "--grad-accum", "1", "--eval-every", "4", "--val-prompts", "1", "--threads", "1",
            "--lr", "1e-2", "--epochs", str(epochs), *map(str, extra)]
    result = CliRunner().invoke(app, args, env={**ENV, **(env or {})})
    assert result.exit_code == 0, result.output + repr(result.exception)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    for record in log:
        record.pop("seconds")
    return load_file(out / "model.safetensors"), log


# the training loop fed by either source; what depends on transformers' version, the features the online hooks capture
# against the cached pass, is test_online_features_are_the_cached_ones's on both versions
@pytest.mark.single_version
@pytest.mark.parametrize("extra,exact", [([], True), (["--eagle1"], True), (["--exit-layer", "1"], True),
                                         (["--target-dtype", "bfloat16"], True), (["--batch-size", "3"], False)])
def test_an_online_run_trains_the_cached_runs_drafter(tmp_path, chat_checkpoint, chat_answers, extra, exact,
                                                      monkeypatch):
    # the cache on the stock path, as online features are computed (its own CPU path rounds a little differently:
    # tests/training/test_data.py)
    monkeypatch.setattr(data, "_cpu_path", lambda target: None)
    cached_w, cached_log = train(chat_checkpoint, chat_answers, tmp_path / "cached", *extra)
    online_w, online_log = train(chat_checkpoint, chat_answers, tmp_path / "online", *extra, "--features", "online")
    assert (tmp_path / "cached" / "cache").is_dir() and not (tmp_path / "online" / "cache").exists()
    assert online_w.keys() == cached_w.keys()
    tolerance = 0 if exact else 2e-3  # a batch's target forward rounds a little differently from one per sequence
    for name, value in cached_w.items():
        torch.testing.assert_close(online_w[name], value, rtol=0, atol=tolerance, msg=name)
    if exact:
        assert online_log == cached_log  # the same validations: held-out agreement and tau
    assert len({json.dumps(r["val_acc"]) for r in cached_log}) > 1  # it learnt: equal is not trivially equal


def test_online_options_are_checked(tmp_path, chat_checkpoint, chat_answers):
    with pytest.raises(ValueError, match="use 'cache'.*or 'online'"):
        TrainConfig(target="t", data=["d"], out="o", features="disk")
    with pytest.raises(ValueError, match="drop --feature-batch-tokens or use --features cache"):
        TrainConfig(target="t", data=["d"], out="o", features="online", feature_batch_tokens=64)
    with pytest.raises(ValueError, match="use float32, bfloat16, float16 or auto"):
        TrainConfig(target="t", data=["d"], out="o", target_dtype="bf16")
    result = CliRunner().invoke(app, ["train-eagle", "--target", str(chat_checkpoint), "--data", str(chat_answers),
                                      "--out", str(tmp_path / "o"), "--features", "memory"], env=ENV)
    assert result.exit_code != 0 and "'online'" in result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("version", ["--eagle3", "--eagle1"])
def test_a_bfloat16_target_trains_a_float32_drafter_that_drafts_for_it(tmp_path, chat_checkpoint, chat_answers, version):
    """``--target-dtype bfloat16`` (how an accelerator loads most checkpoints): the loss reads the target's
    embedding and lm_head in float32, validation drafts with a bfloat16 copy, and the saved float32 drafter,
    loaded for the bfloat16 target, gives the target's own greedy tokens."""
    import hf_speculative as hfs

    weights, log = train(chat_checkpoint, chat_answers, tmp_path / "bf16", version, "--target-dtype", "bfloat16")
    assert all(w.dtype == torch.float32 for w in weights.values() if w.is_floating_point())
    assert json.loads((tmp_path / "bf16" / "train_config.json").read_text())["target_dtype"] == "bfloat16"
    assert len({json.dumps(r["val_acc"]) for r in log}) > 1 and all(r["val_tau"] >= 1.0 for r in log)
    model, tokenizer = hfs.load_model(str(chat_checkpoint), dtype="bfloat16")
    hfs.enable(model)
    eagle = hfs.Eagle.from_pretrained(tmp_path / "bf16", target=model, num_tokens=4, confidence_threshold=0.0,
                                      adaptive=False)
    assert_drafts_exactly(model, tokenizer, eagle)


def test_mixed_precision_from_accelerate(tmp_path, chat_checkpoint, chat_answers):
    """``accelerate launch --mixed_precision bf16`` (here its environment variable): the drafter's forward
    runs under bfloat16 autocast, its weights and the saved drafter stay float32."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # one per process: an earlier test's set "no"
    try:
        weights, _ = train(chat_checkpoint, chat_answers, tmp_path / "o", "--features", "online", "--target-dtype",
                           "bfloat16", epochs=1, env={"ACCELERATE_MIXED_PRECISION": "bf16"})
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert all(w.dtype == torch.float32 for w in weights.values() if w.is_floating_point())
    assert json.loads((tmp_path / "o" / "training_summary.json").read_text())["optimizer_steps"] == 19
    assert json.loads((tmp_path / "o" / "training.json").read_text())["mixed_precision"] == "bf16"
