"""``hf-speculative cache-features`` and the trainers' ``--feature-cache``: one pass of the target over the data for
EAGLE, DFlash and Medusa alike. Each trainer reading the shared cache trains exactly the drafter it trains from its
own cache (the same forwards: the same numbers), and a cache of other data, another target or dtype, or without
the layers a drafter reads is refused with what to do."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import hf_speculative as hfs
from hf_speculative.cli.main import app
from hf_speculative.training.cache_cli import default_layers
from hf_speculative.training.config import TrainConfig
from hf_speculative.training.data import FeatureCache, read_examples
from hf_speculative.training.selfdistill import generate_responses
from tests.training.conftest import CLI_ENV as ENV
from tests.training.conftest import run_cli as run
from tests.training.conftest import write_prompts
from tests.training.test_dflash_training import deep_chat_checkpoint  # noqa: F401 (a fixture)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


@pytest.fixture
def answers(tmp_path, deep_chat_checkpoint):  # noqa: F811
    model, tokenizer = hfs.load_model(str(deep_chat_checkpoint))
    rows = [json.loads(line) for line in write_prompts(tmp_path / "prompts.jsonl").read_text().splitlines()]
    return generate_responses(model, tokenizer, rows, tmp_path / "answers.jsonl", max_new_tokens=12, batch_size=8,
                              progress=False)


def weights(out):
    return load_file(next(out.glob("*.safetensors")))


def logs(out):
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if "seconds" not in k} for row in rows]  # timings differ


TRAINERS = {
    "eagle": ["train-eagle", "--draft-vocab-size", 24, "--grad-accum", 1, "--eval-every", 8, "--val-prompts", 1,
              "--lr", 1e-2, "--epochs", 1],
    "dflash": ["train-dflash", "--block-size", 4, "--layers", 1, "--target-layer-ids", "1,2,3", "--anchors", 8,
               "--eval-every", 10, "--val-prompts", 1, "--lr", 3e-3, "--epochs", 1],
    "medusa": ["train-medusa", "--heads", 2, "--eval-every", 10, "--val-prompts", 1, "--tree-nodes", 4, "--lr", 3e-3,
               "--epochs", 1],
}


# the cache's columns read as each trainer's own; the target's forward that fills it is tests/training/test_data.py's on
# both versions
@pytest.mark.single_version
def test_every_trainer_reads_the_shared_cache_as_its_own(tmp_path, deep_chat_checkpoint, answers):  # noqa: F811
    shared = tmp_path / "shared"
    result = run("cache-features", "--target", deep_chat_checkpoint, "--data", answers, "--out", shared,
                 "--layers", "3,1,2,4", "--threads", 1)
    assert "layers [1, 2, 3, 4]" in result.output and f"--feature-cache {shared}" in result.output
    stored = FeatureCache(shared)
    assert stored.meta["layers"] == [1, 2, 3, 4] and len(stored) == 24
    before = (shared / "features.f16").read_bytes()
    for kind, options in TRAINERS.items():
        common = [*options[:1], "--target", deep_chat_checkpoint, "--data", answers, "--threads", 1, *options[1:]]
        own, read = tmp_path / f"{kind}-own", tmp_path / f"{kind}-shared"
        run(*common, "--out", own)
        run(*common, "--out", read, "--feature-cache", shared)
        assert (own / "cache").is_dir() and not (read / "cache").exists(), kind
        mine, theirs = weights(own), weights(read)
        assert mine.keys() == theirs.keys(), kind
        for name, value in mine.items():
            assert torch.equal(theirs[name], value), (kind, name)
        assert logs(read) == logs(own), kind
    assert (shared / "features.f16").read_bytes() == before  # read, never written


def test_a_view_reads_its_layers_columns_and_the_final_state(tmp_path, deep_chat_checkpoint, answers):  # noqa: F811
    run("cache-features", "--target", deep_chat_checkpoint, "--data", answers, "--out", tmp_path / "c",
        "--layers", "1,2,3", "--max-examples", 5, "--threads", 1)
    whole, middle, final = (FeatureCache(tmp_path / "c", layers) for layers in (None, [3, 1], []))
    for i in range(5):
        features, states, top = whole.get(i)
        picked, states_again, top_again = middle.get(i)
        assert torch.equal(picked, torch.cat([features[:, 64:96], features[:, :32]], -1))
        assert torch.equal(final.get(i)[0], states) and torch.equal(states_again, states)
        assert torch.equal(top_again, top)
    with pytest.raises(ValueError, match=r"layers \[5\] are not stored \(only \[1, 2, 3\]\)"):
        FeatureCache(tmp_path / "c", [1, 5])
    assert default_layers(30) == [1, 8, 14, 20, 26, 27]  # SmolLM2-135M: EAGLE-3's three and DFlash's five
    assert default_layers(6) == [1, 2]  # too shallow for DFlash's five: EAGLE-3's alone


def test_caches_that_do_not_fit_the_run_are_refused(tmp_path, deep_chat_checkpoint, answers):  # noqa: F811
    model, tokenizer = hfs.load_model(str(deep_chat_checkpoint))
    examples = read_examples(answers, tokenizer)
    name = str(deep_chat_checkpoint)
    with pytest.raises(FileNotFoundError, match="no feature cache there .* build it first with hf-speculative "
                                                "cache-features"):
        FeatureCache.shared(tmp_path / "none", model, examples, [1], target_name=name)
    run("cache-features", "--target", deep_chat_checkpoint, "--data", answers, "--out", tmp_path / "c",
        "--layers", "1,2", "--max-examples", 20, "--threads", 1)
    with pytest.raises(ValueError, match="built for other examples .*20 of them.* than this run's 24: give the --data, "
                                         "--max-length and --max-examples"):
        FeatureCache.shared(tmp_path / "c", model, examples, [1], target_name=name)
    with pytest.raises(ValueError, match=r"stores target layers \[1, 2\], not \[3\].*cache-features --layers 1,2,3"):
        FeatureCache.shared(tmp_path / "c", model, examples[:20], [1, 3], target_name=name)
    with pytest.raises(ValueError, match="holds the features of target .* not 'other'"):
        FeatureCache.shared(tmp_path / "c", model, examples[:20], [1], target_name="other")
    with pytest.raises(ValueError, match="in torch.float32, this run loads it in torch.bfloat16: give --target-dtype "
                                         "float32"):
        FeatureCache.shared(tmp_path / "c", model.to(torch.bfloat16), examples[:20], [1], target_name=name)
    model.float()
    FeatureCache.build(tmp_path / "own", model, examples[:20], [1], progress=False)  # a training run's own cache
    with pytest.raises(ValueError, match="a cache of one training run, not one that hf-speculative cache-features"):
        FeatureCache.shared(tmp_path / "own", model, examples[:20], [1], target_name=name)
    with pytest.raises(ValueError, match="a shared cache is read from disk; drop --features online or --feature-cache"):
        TrainConfig(target="t", data=["d"], out="o", features="online", feature_cache="c")
    for bad in ("1,1", "9", "x"):
        result = invoke("cache-features", "--target", deep_chat_checkpoint, "--data", answers, "--out",
                        tmp_path / "bad", "--layers", bad)
        assert result.exit_code != 0 and "give distinct decoder layer indices in 0..5" in result.output, bad
    assert not (tmp_path / "bad").exists()
