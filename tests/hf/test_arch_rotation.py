"""The 4.x run's rotation of the edge-case matrix (tests/hf/conftest.py): what it leaves out, the rest still covers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hf.conftest import MATRIX, ROTATED

ROOT = Path(__file__).resolve().parents[2]
DUMP = '''
import json, os

from tests.hf.conftest import matrix_rows

def pytest_collection_finish(session):
    with open(os.environ["ROTATION_DUMP"], "w") as f:
        json.dump(matrix_rows(session.items), f)
'''


def recorded(config) -> list[dict] | None:
    """This session's own record of test_integration.py's items (tests/hf/conftest.py), where the session collected
    the whole module (no node ids given, no ``--lf``); else None."""
    whole = not any("::" in str(arg) for arg in config.invocation_params.args) and not config.getoption("lf", False)
    return config.stash.get(MATRIX, None) if whole else None


def collected(tmp_path) -> list[dict]:
    """Every item of test_integration.py: its test, parameters and whether it carries ``arch_rotated``, collected in a
    subprocess (34-59 s in CI's runs: torch, transformers and the module imported again)."""
    (tmp_path / "rotation_dump.py").write_text(DUMP)
    out = tmp_path / "items.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "rotation_dump",
                           "-p", "no:cacheprovider", "tests/hf/test_integration.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False,
                          env={**os.environ, "ROTATION_DUMP": str(out), "PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.single_version  # the marks' arithmetic over the collection: the same on both versions
def test_the_rotation_keeps_each_case_once_and_meets_every_drafter_and_arch(tmp_path, request):
    items = recorded(request.config) or collected(tmp_path)
    matrix = [item for item in items if item["test"] in ROTATED]
    assert {item["test"] for item in matrix} == set(ROTATED)
    assert not any(item["rotated"] for item in items if item["test"] not in ROTATED)  # greedy identity: every arch
    kept_on = {}  # (test, the cell's parameters but its arch) -> the archs it keeps
    for item in matrix:
        case = (item["test"], tuple(sorted((k, v) for k, v in item["params"].items() if k != "arch")))
        kept_on.setdefault(case, []).extend([] if item["rotated"] else [item["params"]["arch"]])
    assert all(len(archs) == 1 for archs in kept_on.values()), "a case kept on no or several architectures"
    archs = {item["params"]["arch"] for item in matrix}
    for test in ROTATED:  # every arch of a test keeps some of its cells
        tested = {item["params"]["arch"] for item in matrix if item["test"] == test}
        assert tested == {item["params"]["arch"] for item in matrix if item["test"] == test and not item["rotated"]}
    met = {(item["params"]["drafter_name"], item["params"]["arch"]) for item in matrix if not item["rotated"]}
    drafters = {item["params"]["drafter_name"] for item in matrix}
    assert met == {(drafter, arch) for drafter in drafters for arch in archs}, "a drafter never meets an arch"
    left_out = sum(item["rotated"] for item in matrix)
    assert len(matrix) / 2 < left_out < len(matrix)  # what the 4.x run saves: over half of the matrix's cells


@pytest.mark.slow  # a second collection of the module in a subprocess
def test_the_sessions_record_is_the_modules_collection(tmp_path, request):
    """The record the fast test reads is what a collection of test_integration.py alone finds."""
    items = recorded(request.config)
    if not items:
        pytest.skip("this session did not collect all of tests/hf/test_integration.py (run tests/hf whole)")
    assert items == collected(tmp_path)
