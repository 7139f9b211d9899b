"""Without the [train] extra (accelerate, tqdm), training says which ``pip install`` to run, before any model loads."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from hf_speculative.cli.main import app
from hf_speculative.training.loop import process_state

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
PIP = 'pip install "hf-speculative[train]"'


def _hide(monkeypatch, *modules):
    for module in modules:  # None in sys.modules makes `import module` raise ImportError
        monkeypatch.setitem(sys.modules, module, None)


def test_process_state_without_accelerate(monkeypatch):
    _hide(monkeypatch, "accelerate", "accelerate.utils")
    with pytest.raises(ImportError, match=r"drafter training .* needs the optional package 'accelerate'") as error:
        process_state()
    assert PIP in str(error.value)


@pytest.mark.parametrize("missing, package", [(("accelerate", "accelerate.utils"), "accelerate"),
                                              (("tqdm", "tqdm.auto"), "tqdm")])
def test_commands_without_the_extra(tmp_path, monkeypatch, missing, package):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "hello"}) + "\n")
    _hide(monkeypatch, *missing)
    for args in (["self-distill", "--target", "nowhere", "--prompts", str(prompts)],
                 ["train-eagle", "--target", "nowhere", "--data", str(prompts), "--out", str(tmp_path / "o")]):
        result = CliRunner().invoke(app, args, env=ENV)
        assert result.exit_code == 1, result.output
        assert f"needs the optional package {package!r}" in result.output and PIP in result.output
    assert not (tmp_path / "o").exists()
