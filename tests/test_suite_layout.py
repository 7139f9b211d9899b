"""The suite collects as one tree (`make test` is one pytest over every folder). The
test folders are not packages, so pytest imports each test module by its file name alone
(the default `prepend` import mode): two test files with the same name in different folders stop the whole
collection ("import file mismatch"), as tests/docs/test_train_extra.py beside tests/training/test_train_extra.py
did to stop 76's CI, while the per-folder groups still passed. CI's timing run collects tests/bench alone (the whole
tree's collection took 31 s of a wall time that nothing else shares): every timing test must live there."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_module_names_are_unique_across_the_suite():
    folders: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name == "conftest.py" or "__pycache__" in path.parts:
            continue
        folders[path.stem].append(str(path.parent.relative_to(TESTS.parent)))
    clashes = {name: sorted(where) for name, where in folders.items() if len(where) > 1}
    assert not clashes, f"rename one of each: two modules of one name break one-process collection: {clashes}"


def test_timing_tests_live_where_ci_runs_them():
    """.ci/run runs the `timing` tests (they compare times measured in the test) alone, as `-m timing tests/bench`;
    one marked elsewhere would be skipped by the queue (`not timing`) and never run."""
    decorator = re.compile(r"^\s*(@pytest\.mark\.timing\b|pytestmark\b.*\btiming\b)", re.MULTILINE)
    marked = sorted(str(path.relative_to(TESTS.parent)) for path in TESTS.rglob("test_*.py")
                    if decorator.search(path.read_text(encoding="utf-8")))
    assert marked and all(path.startswith("tests/bench/") for path in marked), marked
    assert 'PYTEST_ARGS="-m timing tests/bench"' in (TESTS.parent / ".ci" / "run").read_text(encoding="utf-8")
