"""Issue 71's GPU agenda, ``make gpu-check GPU_STEPS=magicdec``: its dry run on this CPU (``DEVICE=cpu TINY=1``: the
same grid code at a small inflation, short contexts and a few tokens), every row of every method batched greedy's, the
cells in the report and its summary, and the records in the file a lent call brings back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.gpu import long_context
from tools.gpu.inflate import COST_MODEL

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.single_version
def test_the_long_context_agenda_dry_run_on_the_cpu(tmp_path):
    out = tmp_path / "gc"
    done = subprocess.run(["make", "-s", "gpu-check", "DEVICE=cpu", "TINY=1", "GPU_STEPS=magicdec",
                           f"GPU_CHECK_OUT={out}", f"GPU_PY={sys.executable}", "GPU_BENCH="],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())["magicdec"]
    assert report == json.loads((out / "magicdec.json").read_text())
    assert report["label"] == COST_MODEL and report["inflated"]["label"] == COST_MODEL
    assert report["identical"] and report["dtype"] == "float32"
    tiny = long_context.TINY
    assert report["cells"] == [[c, b] for c in tiny["contexts"] for b in tiny["batch_sizes"]]
    records = [json.loads(line) for line in (out / "magicdec_grid.jsonl").read_text().splitlines()]
    assert {r["method"] for r in records} == {"greedy", *long_context.METHODS}
    assert all(r["identical_to_greedy"] and r["shared_prefill"] for r in records)
    assert sum(r.get("drafted", 0) for r in records if r["method"] == "magicdec-always") > 0
    for cell, memory in report["memory"].items():
        assert 0 < memory["compressed_bytes"] < memory["full_cache_bytes"], cell  # 36 slots a row against 96+
    summary = (out / "summary.md").read_text()
    assert f"## MagicDec at long contexts ({COST_MODEL}" in summary and "| 160 x 3 |" in summary


def test_the_summary_table_has_a_row_per_cell_and_a_column_per_method():
    rows = [{"context": 2048, "batch_size": 8, "method": "greedy", "tokens_per_s": 100.0},
            {"context": 2048, "batch_size": 8, "method": "magicdec", "decode_speedup": 1.4, "tau": 2.5},
            {"context": 2048, "batch_size": 8, "method": "prompt-lookup", "decode_speedup": None, "tau": None}]
    report = {"label": COST_MODEL, "shape": {"name": "llama-3.1-8b"}, "dtype": "float32", "window": 512, "sinks": 4,
              "new_tokens": 64, "repeats": 2, "identical": True, "rows": rows}
    lines = long_context.summary_lines(report)
    assert "| context x batch | greedy tok/s | magicdec | prompt-lookup |" in lines
    assert "| 2048 x 8 | 100.0 | 1.40x (τ 2.50) | - |" in lines
