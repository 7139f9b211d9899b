"""The ``[train]`` extra's row, in getting started and in the README, names the commands that need it: those that stop
with the ``pip install`` when accelerate or tqdm is missing (``training.cli._training_extra``). It once named
``export-eagle``, which needs only ``[cli]``, and left out ``train-medusa``."""

from __future__ import annotations

import inspect
import re

import pytest
from docblocks import DOCS, ROOT

typer_main = pytest.importorskip("typer.main", reason="the command line needs the cli extra")

TRAINING_MODULE = "hf_speculative.training"


def _training_commands() -> dict[str, bool]:
    """Every command defined in the training package: whether it needs the ``[train]`` extra."""
    from hf_speculative.cli.main import app

    group = typer_main.get_command(app)
    commands = {name: command.callback for name, command in group.commands.items()
                if command.callback is not None and command.callback.__module__.startswith(TRAINING_MODULE)}
    return {name: "_training_extra()" in inspect.getsource(callback) for name, callback in commands.items()}


def _row_commands(path, row_start: str) -> tuple[set[str], str]:
    """The commands a table row lists before its parenthesis, and the parenthesis' text."""
    row = next(line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith(row_start))
    cell = row.split("|")[3]
    listed, _, aside = cell.partition("(")
    names = {re.sub(r"^hf-speculative ", "", quote) for quote in re.findall(r"`([^`]+)`", listed)}
    return names, aside


@pytest.mark.parametrize("page", [DOCS / "getting-started.md", ROOT / "README.md"], ids=lambda p: p.name)
def test_the_train_row_names_the_commands_that_need_the_extra(page):
    needs = _training_commands()
    assert {"train-eagle", "self-distill"} <= set(needs), needs
    names, aside = _row_commands(page, "| `[train]` |")
    assert names == {name for name, needed in needs.items() if needed}
    others = {name for name, needed in needs.items() if not needed}
    assert others == {"sample-prompts"} | {name for name in others if name.startswith("export-")}
    assert "`sample-prompts`" in aside and "`export-*`" in aside and "`[cli]` only" in aside
