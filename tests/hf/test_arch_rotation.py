"""The 4.x run's rotation of the edge-case matrix (tests/hf/conftest.py): what it leaves out, the rest still covers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.hf.conftest import ROTATED

ROOT = Path(__file__).resolve().parents[2]
DUMP = '''
import json, os

def pytest_collection_finish(session):
    rows = [{"test": getattr(item, "originalname", item.name),
             "params": {key: repr(value) for key, value in getattr(item, "callspec", None).params.items()}
             if hasattr(item, "callspec") else {},
             "rotated": item.get_closest_marker("arch_rotated") is not None} for item in session.items]
    with open(os.environ["ROTATION_DUMP"], "w") as f:
        json.dump(rows, f)
'''


def collected(tmp_path) -> list[dict]:
    """Every item of test_integration.py: its test, parameters and whether it carries ``arch_rotated``."""
    (tmp_path / "rotation_dump.py").write_text(DUMP)
    out = tmp_path / "items.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "rotation_dump",
                           "-p", "no:cacheprovider", "tests/hf/test_integration.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False,
                          env={**os.environ, "ROTATION_DUMP": str(out), "PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


def test_the_rotation_keeps_each_case_once_and_meets_every_drafter_and_arch(tmp_path):
    items = collected(tmp_path)
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
