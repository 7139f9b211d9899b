"""Flags shown as flags in ``--help``: no ``<bool>`` beside ``--json`` or ``--progress/--no-progress``.

typer's rich help (0.29) prints a column of value types, a flag's as ``<bool>``, though a flag takes no value (click's
plain help shows none). :class:`Typer` is ``typer.Typer`` whose group and commands give every flag, ``--help``
included, an empty metavar, which that column prints in its place. A flag's metavar is read nowhere else (usage
lines and error messages name its switches), so nothing but the help changes. Only this CLI's apps use these
classes: typer itself is left as it is.
"""

from __future__ import annotations

from typing import Any

from ..extras import require

typer = require("typer", "cli", "The hf-speculative command line")
_core = require("typer.core", "cli", "The hf-speculative command line")


def without_flag_types(params: list[Any]) -> list[Any]:
    """``params`` (a command's click parameters), each flag given the empty metavar (a metavar set by hand kept)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class FlagCommand(_core.TyperCommand):
    """A typer command whose help shows no type beside its flags."""

    def get_params(self, ctx: Any) -> list[Any]:
        return without_flag_types(super().get_params(ctx))


class FlagGroup(_core.TyperGroup):
    """A typer group (an app with commands) whose help shows no type beside its own flags."""

    def get_params(self, ctx: Any) -> list[Any]:
        return without_flag_types(super().get_params(ctx))


class Typer(typer.Typer):
    """``typer.Typer`` whose group is a :class:`FlagGroup` and whose commands are :class:`FlagCommand` unless given
    another ``cls``."""

    def __init__(self, *args: Any, cls: Any = FlagGroup, **kwargs: Any):
        super().__init__(*args, cls=cls, **kwargs)

    def command(self, name: str | None = None, *, cls: Any = FlagCommand, **kwargs: Any) -> Any:
        return super().command(name, cls=cls, **kwargs)
