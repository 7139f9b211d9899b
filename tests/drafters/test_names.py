"""One namespace of names (issue 68 item 3): a drafter's spec method, its methods of the command line and the app
(its folder's ``methods.py``) and its examples in the test matrix follow one rule, written in
``hf_speculative/drafters/declaration.py``: the spec method, or ``<method>-<variant>`` with a variant of a short
list (EAGLE's network versions: ``eagle1``, ``eagle3``). The names the command line took before (``eagle+lookup``,
now ``hybrid``) still work, in the command line, the benchmark and the app."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from hf_speculative.drafters import declaration, registry
from hf_speculative.tooling import methods

VARIANTS = ("tree", "fixed", "uag", "copy", "auto", "adapter")  # declaration.py's list
OLD_NAMES = {"eagle+lookup": "hybrid", "eagle+lookup-tree": "hybrid-tree"}


def named_method(name: str, spec_methods: set[str]) -> str | None:
    """The spec method ``name`` is named after by the rule (the longest that fits), else ``None``."""
    fits = [m for m in spec_methods
            if name == m or (name.startswith(f"{m}-") and name[len(m) + 1:] in VARIANTS)
            or (name.startswith(m) and name[len(m):].isdigit())]
    return max(fits, key=len, default=None)


def test_the_rule_is_the_one_written_down():
    for variant in VARIANTS:
        assert f"``-{variant}``" in declaration.__doc__, variant
    assert named_method("eagle-tree", {"eagle"}) == "eagle" and named_method("eagle3", {"eagle"}) == "eagle"
    assert named_method("early-exit-adapter", {"early-exit", "early-exit-adapter"}) == "early-exit-adapter"
    # negative controls: the names the rule refuses (the example and the methods renamed by issue 68)
    assert named_method("lookup-tree", {"prompt-lookup"}) is None
    assert named_method("eagle+lookup", {"eagle", "prompt-lookup", "hybrid"}) is None
    assert named_method("eagle-big", {"eagle"}) is None


def test_every_example_is_named_after_its_class_method():
    spec_methods = set(registry.registered())
    for label, cls in registry.examples().items():
        assert named_method(label, spec_methods) in cls.declaration.methods, label


def test_every_method_of_the_tools_is_named_after_its_folder_drafter():
    spec_methods = set(registry.registered())
    folders = {method: cls.__module__.rsplit(".", 1)[0] for method, cls in registry.registered().items()}
    for folder, entries in registry.folder_data("methods", "METHODS"):
        for entry in entries:
            method = named_method(entry["name"], spec_methods)
            assert method is not None and folders[method] == folder, (folder, entry["name"])


def test_a_name_means_one_drafter_wherever_it_is_used():
    """Where a name is both a method of the tools and an example, it builds the same class; where it is a spec method,
    that method's class."""
    registered, examples = registry.registered(), registry.examples()
    for name in methods.available_methods():
        if name in examples:
            assert named_method(name, set(registered)) in examples[name].declaration.methods, name
        if name in registered:
            assert methods.get_method(name).kind == "hfs", name


def test_the_old_names_still_work():
    listed = methods.available_methods()
    for old, new in OLD_NAMES.items():
        assert methods.get_method(old) is methods.get_method(new) and old not in listed and new in listed
        assert methods.canonical_name(old) == new
        methods.check_options([old], {"eagle": None, "max_ngram": 2})
    assert methods.canonical_name("prompt-lookup") == "prompt-lookup" and methods.canonical_name("nope") == "nope"
    with pytest.raises(ValueError, match=re.escape("unknown method 'eagle+lookups'")):
        methods.get_method("eagle+lookups")


def test_the_command_line_takes_the_old_names(tmp_path):
    from hf_speculative.cli.main import app

    def cli(*args):
        return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200", "NO_COLOR": "1"})

    result = cli("compare", "--method", "eagle+lookup", "--option", "num_token=3")  # refused before any load
    assert result.exit_code == 2 and "unknown option 'num_token' for hybrid; did you mean 'num_tokens'?" in result.output
    missing = tmp_path / "none.jsonl"
    result = cli("bench", "--methods", "eagle+lookup,prompt-lookup", "--reference", "eagle+lookup", "--dataset", missing)
    assert result.exit_code == 2 and f"dataset not found: {missing}" in result.output  # the names passed their checks
    result = cli("bench", "--methods", "prompt-lookup", "--reference", "eagle+lookup", "--dataset", missing)
    assert result.exit_code == 2 and "--reference hybrid must be greedy or one of" in result.output
    rows = json.loads(cli("methods", "--json").stdout)
    assert "hybrid" in [row["method"] for row in rows] and "eagle+lookup" not in [row["method"] for row in rows]


def test_the_app_takes_the_old_names():
    from hf_speculative.app.request import AppError, _methods

    assert _methods(["eagle+lookup", "prompt-lookup"]) == ["hybrid", "prompt-lookup"]
    assert _methods(["eagle+lookup", "hybrid"]) == ["hybrid"]  # one method, however it is named
    with pytest.raises(AppError, match="Unknown method"):
        _methods(["eagle-lookup"])
