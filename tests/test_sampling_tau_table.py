"""benchmarks/sampling_tau_table.py: the grid files' pooled τ per drafter and rule, the rejection rule's change, and
its bootstrap interval over prompts."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_benchmark


def row(question_id, category, temperature, seeded, rejection):
    """A grid row: ``seeded`` / ``rejection`` are per-seed ``(new tokens, forwards)``."""
    return {"category": category, "question_id": question_id, "temperature": temperature, "max_new_tokens": 64,
            "counts": {"chain/seeded": [[n, f, 0, 0] for n, f in seeded],
                       "chain/rejection": [[n, f, 0, 0] for n, f in rejection]}}


def test_tau_is_pooled_over_prompts_and_seeds_and_the_change_is_rejection_over_seeded(tmp_path):
    table = load_benchmark("sampling_tau_table")
    path = tmp_path / "grid.jsonl"
    rows = [row(1, "qa", 0.7, [(64, 64), (64, 32)], [(64, 32), (64, 32)]),
            row(2, "rag", 0.7, [(32, 32)], [(32, 16)]),
            row(3, "qa", 1.0, [(10, 10)], [(10, 5)])]
    path.write_text("\n".join(json.dumps(r) for r in [*rows, {"question_id": 9, "temperature": 0.7}]) + "\n")
    read = table.read_rows([str(path)])
    assert len(read) == 3  # the row without counts (a record of another kind) is left out
    at_07 = [r for r in read if r["temperature"] == 0.7]
    assert table.tau(at_07, "chain/seeded") == pytest.approx(160 / 128)
    assert table.tau(at_07, "chain/rejection") == pytest.approx(160 / 80)
    low, high = table.change_interval(at_07, "chain", 500)
    assert low <= (160 / 80) / (160 / 128) - 1 <= high
    lines = table.table(read, 200)
    assert lines[2].startswith("| chain | 1.250 | 2.000 (+60.0%,") and "| 1.000 | 2.000 (+100.0%," in lines[2]
    assert lines[-1] == "T = 0.7: 2 prompts (qa 1, rag 1), T = 1.0: 1 prompts (qa 1)"


def test_a_prompt_written_twice_counts_once_and_equal_rules_give_no_change(tmp_path):
    table = load_benchmark("sampling_tau_table")
    path = tmp_path / "grid.jsonl"
    first = row(1, "qa", 0.7, [(64, 64)], [(64, 64)])
    again = row(1, "qa", 0.7, [(64, 32)], [(64, 32)])  # a resumed run wrote the prompt again
    path.write_text(json.dumps(first) + "\n" + json.dumps(again) + "\n")
    read = table.read_rows([str(path)])
    assert read == [again]
    assert table.change_interval(read, "chain", 100) == (0.0, 0.0)
