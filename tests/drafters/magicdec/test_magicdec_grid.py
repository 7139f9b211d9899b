"""``benchmarks/magicdec_grid.py``'s dry run: a tiny random model through the grid's whole path (prompts, every
method of the default list but EAGLE, the records), every row identical to batched greedy, MagicDec drafting."""

from __future__ import annotations

from tests.conftest import load_benchmark


def test_the_grid_s_dry_run_is_exact():
    grid = load_benchmark("magicdec_grid")
    assert grid.dry_run() == 0
