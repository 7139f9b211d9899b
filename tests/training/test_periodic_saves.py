"""``--save-minutes``: the trainers save their state between validations, so that a run killed there (a session's end,
a lost machine) resumes from its last save, not its last validation, and ends on the weights an uninterrupted run
ends on. The kill is simulated in this process: the loop's per-step budget check raises after a few steps."""

from __future__ import annotations

import importlib

import pytest
import torch

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
    options = TRAINERS[kind]
    common = [*options[:1], "--target", deep_chat_checkpoint, "--data", answers, "--threads", 1, *options[1:],
              "--epochs", 1, "--eval-every", 1000]
    whole = tmp_path / "whole"
    run(*common, "--out", whole)

    out = tmp_path / "saved"
    killed_run(monkeypatch, kind, [*common, "--out", out, "--save-minutes", 1e-9])  # a save after every step
    again = run(*common, "--out", out, "--save-minutes", 1e-9)
    assert f"resumed from {out / 'checkpoint'} at optimizer step {KILLED_AFTER}" in again.output
    ends, expected = weights(out), weights(whole)
    assert ends.keys() == expected.keys()
    for name, value in ends.items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=f"{kind}: {name}")

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
