"""Every command's ``--help`` shows its flags as flags (issue 67, CLI conventions): no ``<bool>`` beside ``--json``,
``--progress/--no-progress`` or ``--help``, as typer's rich help prints by default."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from hf_speculative.cli.flags import Typer
from hf_speculative.cli.main import app

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def command_paths(command, path=()) -> list[tuple[tuple[str, ...], object]]:
    """``(path, click command)`` of ``command`` and of every command under it (groups' too)."""
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += command_paths(sub, (*path, name))
    return found


def test_no_command_help_shows_a_type_beside_a_flag():
    runner = CliRunner()
    paths = command_paths(typer.main.get_command(app))
    names = {" ".join(path) for path, _ in paths}
    assert {"", "models", "models list", "compare", "bench", "train-eagle", "export-dflash"} <= names, names
    flags_seen = 0
    for path, command in paths:
        result = runner.invoke(app, [*path, "--help"], env=ENV)
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, f"hf-speculative {' '.join(path)} --help:\n{result.output}"
        flags = [p for p in command.params if getattr(p, "is_flag", False)]
        for flag in flags:  # still listed, each of its switches
            assert all(switch in result.output for switch in (*flag.opts, *flag.secondary_opts)), (path, flag.opts)
        flags_seen += len(flags)
    assert flags_seen >= 10, "the scan met the CLI's flags (--json, --append, --progress/--no-progress, ...)"


def test_flags_still_parse_and_a_flag_with_its_own_metavar_keeps_it():
    ours = Typer()

    @ours.command()
    def run(loud: bool = typer.Option(False, "--loud/--quiet"), shown: bool = typer.Option(False, metavar="YES")):
        print(f"loud={loud} shown={shown}")

    runner = CliRunner()
    assert runner.invoke(ours, ["--loud", "--shown"], env=ENV).output.strip() == "loud=True shown=True"
    assert runner.invoke(ours, ["--quiet"], env=ENV).output.strip() == "loud=False shown=False"
    text = runner.invoke(ours, ["--help"], env=ENV).output
    assert "<bool>" not in text and "YES" in text


def test_a_plain_typer_app_shows_the_type_ours_hides():
    """The control: the same command on typer's own class prints ``<bool>`` (typer 0.29's rich help), on ours not."""
    texts = {}
    for kind in (typer.Typer, Typer):
        made = kind()

        @made.command()
        def run(loud: bool = typer.Option(False, "--loud")):
            pass

        texts[kind] = CliRunner().invoke(made, ["--help"], env=ENV).output
    assert "--loud" in texts[Typer] and "<bool>" not in texts[Typer]
    if "<bool>" not in texts[typer.Typer]:
        pytest.skip("this typer's rich help shows no type beside a flag: nothing to hide")
