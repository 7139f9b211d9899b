"""``train-eagle``'s bad input refused with a message that names the fix, before the work it would spoil (issue 67):
a resume of ``OUT/checkpoint`` by a run whose network has another shape (torch's raw "size mismatch" once the
features were computed, before), and a ``--draft-vocab-size`` larger than the target's vocabulary (a raw
``EagleConfig`` error after the self-distillation, before). On the tiny chat model, a few optimizer steps."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from hf_speculative.cli.main import app
from hf_speculative.training.config import TrainConfig
from hf_speculative.training.resume import check_resume, shape_differences
from tests.conftest import CHAT_WORDS

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
VOCAB = 128  # the tiny chat model's (tests/conftest.py)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


def one_line(result) -> str:
    """The CLI's output with its line wrapping undone."""
    return " ".join(result.output.split())


@pytest.fixture
def documents(tmp_path):
    """Eight {"text": ...} rows of the chat words: training data without a self-distillation."""
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(CHAT_WORDS[(i + j) % len(CHAT_WORDS)] for j in range(8))})
                            + "\n" for i in range(8)))
    return path


def train_eagle(chat_checkpoint, documents, out, *extra):
    """train-eagle for one epoch of 7 optimizer steps, a checkpoint every 2."""
    return invoke("train-eagle", "--model", chat_checkpoint, "--data", documents, "--out", out, "--grad-accum", 1,
                  "--eval-every", 2, "--val-prompts", 1, "--threads", 1, "--epochs", 1, *extra)


def test_a_resume_with_another_network_names_the_settings_and_the_fix(tmp_path, chat_checkpoint, documents):
    out = tmp_path / "run"
    first = train_eagle(chat_checkpoint, documents, out, "--draft-vocab-size", 24)
    assert first.exit_code == 0, first.output + repr(first.exception)
    assert (out / "checkpoint" / "progress.json").exists()
    cache = out / "cache"
    cached = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}

    for extra, settings, tensor in (
        (["--draft-vocab-size", 32], "--draft-vocab-size 24 (this run: --draft-vocab-size 32)",
         "lm_head.weight is [24, 32] there, [32, 32] in this run"),
        (["--eagle1"], "--eagle3 (this run: --eagle1)", "fc.weight is [32, 96] there, [32, 64] in this run"),
        (["--exit-layer", 1, "--draft-vocab-size", 24], "no --exit-layer (this run: --exit-layer 1)",
         "fc.weight is [32, 96] there, [32, 32] in this run"),
    ):
        result = train_eagle(chat_checkpoint, documents, out, *extra)
        text = one_line(result)
        assert result.exit_code == 2 and "size mismatch" not in text and "Traceback" not in text, text
        assert "checkpoint holds a checkpoint of another network than this run trains" in text, text
        assert tensor in text and f"it was trained with {settings}. Resume with the settings" in text, text
        assert "delete" in text and "or train into another --out" in text, text
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == cached, "refused before the features"

    # the control: the same settings resume, and train on to the end
    again = train_eagle(chat_checkpoint, documents, out, "--draft-vocab-size", 24, "--epochs", 2)
    assert again.exit_code == 0, again.output + repr(again.exception)
    assert "resumed from" in again.output
    assert json.loads((out / "training_summary.json").read_text())["optimizer_steps"] == 14


def test_check_resume_alone(tmp_path):
    """The check reads the checkpoint's header: names with or without the ``net.`` prefix of older checkpoints,
    shapes, tensors only one side has; a checkpoint written another way is left to accelerate."""
    from safetensors.torch import save_file

    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    state = tmp_path / "checkpoint"
    state.mkdir()
    check_resume(state, net, {})  # no model.safetensors: nothing to check
    save_file({f"net.{k}": v for k, v in net.state_dict().items()}, str(state / "model.safetensors"))
    check_resume(state, net, {})
    save_file(dict(net.state_dict()), str(state / "model.safetensors"))  # an older checkpoint: no prefix
    check_resume(state, net, {})
    wider = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 2), torch.nn.Linear(2, 2))
    listed = (r"0\.weight is \[3, 4\] there, \[5, 4\] in this run; 0\.bias is \[3\] there, \[5\] in this run; "
              r"1\.weight is \[2, 3\] there, \[2, 5\] in this run; and 2 more\)\. Resume with the settings")
    with pytest.raises(ValueError, match=listed):
        check_resume(state, wider, {"draft_vocab_size": 5})
    assert shape_differences({"a": (1,)}, {"b": (1,)}) == ["a only there", "b only in this run"]


def test_a_draft_vocabulary_larger_than_the_targets_is_refused_before_any_work(tmp_path, chat_checkpoint,
                                                                               documents, prompts):
    out = tmp_path / "run"
    fix = (f"--draft-vocab-size 1000: the target's vocabulary has only {VOCAB} tokens, and the draft vocabulary is "
           f"chosen among them; give at most --draft-vocab-size {VOCAB}")
    for extra in ([], ["--exit-layer", 1]):
        result = invoke("train-eagle", "--model", chat_checkpoint, "--prompts", prompts, "--out", out,
                        "--draft-vocab-size", 1000, "--threads", 1, *extra)
        assert result.exit_code == 2 and fix in one_line(result), result.output
        assert not (out / "self_distill.jsonl").exists() and not (out / "cache").exists(), "refused before any work"

    # the Python API, or a target whose config is not at hand up front: refused once the target loads
    from hf_speculative.training.loop import train

    with pytest.raises(ValueError, match=fix.replace("(", r"\(")):
        train(TrainConfig(target=str(chat_checkpoint), data=[str(documents)], out=str(out), draft_vocab_size=1000,
                          threads=1), progress=False)
    assert not (out / "cache").exists()

    # the control: the whole vocabulary is a valid draft vocabulary, EAGLE-1 and a continued drafter choose none
    from hf_speculative.training.start import check_draft_vocab_size

    config = json.loads((chat_checkpoint / "config.json").read_text())
    from transformers import LlamaConfig

    config = LlamaConfig(**config)
    check_draft_vocab_size(TrainConfig(target="t", data=["d"], out="o", draft_vocab_size=VOCAB), config)
    check_draft_vocab_size(TrainConfig(target="t", data=["d"], out="o", draft_vocab_size=1000, eagle3=False), config)
    check_draft_vocab_size(TrainConfig(target="t", data=["d"], out="o", draft_vocab_size=1000, init_from="x"), config)
    with pytest.raises(ValueError, match="give at most --draft-vocab-size 128"):
        check_draft_vocab_size(TrainConfig(target="t", data=["d"], out="o", draft_vocab_size=1000, init_from="x",
                                           refresh_vocab=True), config)
