"""``python -m tools.prompts``: its ranges, and that it runs as a module from the repository's root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.prompts.__main__ import parse_range

ROOT = Path(__file__).resolve().parents[2]


def test_parse_range():
    assert parse_range("12") == (0, 12)
    assert parse_range("900-3000") == (900, 3000)
    assert parse_range("0-1") == (0, 1)
    for bad in ("7-7", "9-2", "x", "-3", "0", "1-", "3 - 5"):
        with pytest.raises(ValueError, match="use N .* or A-B .*0 <= A < B"):
            parse_range(bad)


def test_runs_as_a_module_from_the_checkout(tmp_path):
    out = tmp_path / "ctx.jsonl"
    proc = subprocess.run([sys.executable, "-m", "tools.prompts", "context", "4", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["c00000", "c00001", "c00002", "c00003"]
    assert "hf-speculative self-distill" in proc.stderr
    usage = subprocess.run([sys.executable, "-m", "tools.prompts", "nope", "4", "--out", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "invalid choice: 'nope'" in usage.stderr
