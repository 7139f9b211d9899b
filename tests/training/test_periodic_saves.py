"""``--save-minutes``: the trainers save their state between validations, so that a run killed there (a session's end,
a lost machine) resumes from its last save, not its last validation, and ends on the weights an uninterrupted run
ends on. The kill is simulated in this process: the loop's per-step budget check raises after a few steps, or a save
dies after its first file (the checkpoint is replaced whole or not at all: ``state_files``)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

from hf_speculative.training.state_files import incoming_of, promote, replaced_of
from tests.training.conftest import run_cli as run
from tests.training.test_dflash_training import deep_chat_checkpoint  # noqa: F401 (a fixture)
from tests.training.test_shared_features import answers, invoke, weights  # noqa: F401 (answers: a fixture)

LOOPS = {"eagle": "loop", "dflash": "dflash_loop", "medusa": "medusa_loop"}
# no validation before the end (--eval-every past the run's 22 steps): only --save-minutes can leave a state to resume
TRAINERS = {
    "eagle": ["train-eagle", "--draft-vocab-size", 24, "--grad-accum", 1, "--val-prompts", 1, "--lr", 1e-2],
    "dflash": ["train-dflash", "--block-size", 4, "--layers", 1, "--target-layer-ids", "1,2,3", "--anchors", 8,
               "--val-prompts", 1, "--lr", 3e-3],
    "medusa": ["train-medusa", "--heads", 2, "--val-prompts", 1, "--tree-nodes", 4, "--lr", 3e-3],
}
KILLED_AFTER = 5  # optimizer steps


class Killed(Exception):
    pass


def command(kind: str, checkpoint, data) -> list:
    """``kind``'s trainer on the tiny target and its answers, one epoch without a validation before its end."""
    options = TRAINERS[kind]
    return [*options[:1], "--target", checkpoint, "--data", data, "--threads", 1, *options[1:], "--epochs", 1,
            "--eval-every", 1000]


def assert_same_weights(out: Path, whole: Path, kind: str) -> None:
    """The drafter in ``out`` is the one in ``whole``, to the bit."""
    ends, expected = weights(out), weights(whole)
    assert ends.keys() == expected.keys()
    for name, value in ends.items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=f"{kind}: {name}")


def killed_run(monkeypatch, kind: str, args: list) -> None:
    """``args`` run in this process and killed after :data:`KILLED_AFTER` optimizer steps."""
    loop = importlib.import_module(f"hf_speculative.training.{LOOPS[kind]}")
    real, steps = loop.budget_spent, []

    def budget_spent(*a):  # the loops ask it once per optimizer step, after counting it
        steps.append(1)
        if len(steps) > KILLED_AFTER:
            raise Killed
        return real(*a)

    with monkeypatch.context() as patched:
        patched.setattr(loop, "budget_spent", budget_spent)
        result = invoke(*args)
    assert isinstance(result.exception, Killed), result.output + repr(result.exception)


# what resumes is accelerate's state and our counters; the forwards it trains on are test_train_cli's on both versions
@pytest.mark.single_version
@pytest.mark.parametrize("kind", sorted(TRAINERS))
def test_a_run_killed_between_validations_resumes_from_its_last_save(tmp_path, monkeypatch, deep_chat_checkpoint,  # noqa: F811
                                                                     answers, kind):  # noqa: F811
    common = command(kind, deep_chat_checkpoint, answers)
    whole = tmp_path / "whole"
    run(*common, "--out", whole)

    out = tmp_path / "saved"
    killed_run(monkeypatch, kind, [*common, "--out", out, "--save-minutes", 1e-9])  # a save after every step
    again = run(*common, "--out", out, "--save-minutes", 1e-9)
    assert f"resumed from {out / 'checkpoint'} at optimizer step {KILLED_AFTER}" in again.output
    assert_same_weights(out, whole, kind)

    # the control: saved at validations only, the same kill loses the run's steps
    lost = tmp_path / "lost"
    killed_run(monkeypatch, kind, [*common, "--out", lost, "--save-minutes", 0])
    assert not (lost / "checkpoint" / "progress.json").exists()
    assert "resumed from" not in run(*common, "--out", lost, "--save-minutes", 0).output


def test_save_minutes_is_checked(tmp_path):
    from hf_speculative.training.config import TrainConfig
    from hf_speculative.training.dflash import DFlashTrainConfig
    from hf_speculative.training.medusa import MedusaTrainConfig

    for config in (TrainConfig, DFlashTrainConfig, MedusaTrainConfig):
        assert config(target="t", data=["d"], out=str(tmp_path)).save_minutes == 10.0
        assert config(target="t", data=["d"], out=str(tmp_path), save_minutes=None).save_minutes is None
        with pytest.raises(ValueError, match="save_minutes=-1"):
            config(target="t", data=["d"], out=str(tmp_path), save_minutes=-1)


# a kill in the middle of a save: accelerate's writes are ours to make whole, on either version
@pytest.mark.single_version
@pytest.mark.parametrize("kind", sorted(TRAINERS))
def test_a_save_cut_short_leaves_the_last_whole_checkpoint(tmp_path, monkeypatch, deep_chat_checkpoint,  # noqa: F811
                                                           answers, kind):  # noqa: F811
    from accelerate import Accelerator

    common = command(kind, deep_chat_checkpoint, answers)
    whole = tmp_path / "whole"
    run(*common, "--out", whole)

    out, real, saves = tmp_path / "cut", Accelerator.save_state, []

    def save_state(self, output_dir=None, **kwargs):  # the 5th save dies after its first file
        saves.append(output_dir)
        if len(saves) < 5:
            return real(self, output_dir, **kwargs)
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "model.safetensors").write_bytes(b"half a file")
        raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(Accelerator, "save_state", save_state)
        result = invoke(*common, "--out", out, "--save-minutes", 1e-9)
    assert isinstance(result.exception, Killed), result.output + repr(result.exception)
    assert all(Path(d).name == "checkpoint.incoming" for d in saves)  # never written over the checkpoint
    again = run(*common, "--out", out, "--save-minutes", 1e-9)
    assert f"resumed from {out / 'checkpoint'} at optimizer step 4" in again.output
    assert not (out / "checkpoint.incoming").exists()
    assert_same_weights(out, whole, kind)


def folder(path: Path, step: int | None, marker: str) -> Path:
    """A checkpoint-like folder: a weights file saying ``marker`` and, when ``step`` is given, its progress.json."""
    path.mkdir(parents=True)
    (path / "model.safetensors").write_text(marker)
    if step is not None:
        (path / "progress.json").write_text(json.dumps({"step": step}))
    return path


@pytest.mark.parametrize("case, expected", [
    ("complete incoming", "new"),  # killed after progress.json, before the swap
    ("incomplete incoming", "old"),  # killed while accelerate wrote
    ("between the renames", "new"),  # the old one moved aside, the new one not yet in place
    ("after the swap", "new"),  # the old one not yet removed
    ("old moved aside, no new copy", "old"),
])
def test_promote_leaves_one_whole_checkpoint(tmp_path, case, expected):
    state = tmp_path / "checkpoint"
    incoming, replaced = incoming_of(state), replaced_of(state)
    if case == "complete incoming":
        folder(state, 4, "old"), folder(incoming, 5, "new")
    elif case == "incomplete incoming":
        folder(state, 4, "old"), folder(incoming, None, "half")
    elif case == "between the renames":
        folder(replaced, 4, "old"), folder(incoming, 5, "new")
    elif case == "after the swap":
        folder(replaced, 4, "old"), folder(state, 5, "new")
    else:
        folder(replaced, 4, "old")
    promote(state)
    promote(state)  # idempotent: every start runs it
    assert (state / "model.safetensors").read_text() == expected
    assert json.loads((state / "progress.json").read_text())["step"] == (5 if expected == "new" else 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
