"""benchmarks/ab_runs.py: the CPU A/B scripts' shared records and table figures (tokens/s per category and overall
from median seconds, τ, the ratio to a baseline arm)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import load_benchmark


def test_rates_tau_and_ratio_come_from_the_medians_and_the_records():
    runs = load_benchmark("ab_runs").Runs()
    prompts = [SimpleNamespace(category="qa"), SimpleNamespace(category="rag")]

    def done(seconds, tokens, forwards):
        return SimpleNamespace(seconds=seconds, new_tokens=tokens, target_forwards=forwards)

    for seconds in (1.0, 3.0, 2.0):  # median 2 s
        runs.record("greedy", 0, done(seconds, 10, 10), True)
    runs.record("greedy", 1, done(4.0, 20, None), True)  # no forwards recorded: one per token
    runs.record("lookup", 0, done(1.0, 10, 5), True)
    runs.record("lookup", 1, done(2.0, 20, 10), False)
    assert runs.rates("greedy", prompts, ("qa", "rag")) == ["5.00", "5.00", "5.00"]  # 10/2, 20/4, 30/6
    assert runs.rates("lookup", prompts, ("qa", "rag")) == ["10.00", "10.00", "10.00"]
    assert runs.tau("greedy", 2) == 1.0 and runs.tau("lookup", 2) == 2.0
    assert runs.ratio("lookup", "greedy", 2) == pytest.approx(6 / 3)
    assert runs.identical == {"greedy": 4, "lookup": 1}


def test_the_table_has_a_row_per_arm_against_its_baseline():
    runs = load_benchmark("ab_runs").Runs()
    prompts = [SimpleNamespace(category="qa")]
    runs.record("greedy", 0, SimpleNamespace(seconds=2.0, new_tokens=10, target_forwards=None), True)
    runs.record("lookup", 0, SimpleNamespace(seconds=1.0, new_tokens=10, target_forwards=5), False)
    lines = runs.table(["greedy", "lookup"], prompts, ("qa",), lambda label: "greedy", "greedy", 2)
    assert lines == ["| arm | qa | overall tok/s | τ | vs greedy | identical |", "|---|---|---|---|---|---|",
                     "| greedy | 5.00 | 5.00 | 1.00 | 1.00× | 1/2 |", "| lookup | 10.00 | 10.00 | 2.00 | 2.00× | 0/2 |"]
