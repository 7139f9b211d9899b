"""tools/gpu/batch_e2e.py: batched greedy against our batched prompt lookup on left-padded Spec-Bench prompts."""

from __future__ import annotations

import json

from tools.gpu import batch_e2e


def test_every_batch_size_runs_both_arms_and_every_row_is_the_batched_greedys(chat_checkpoint, tmp_path):
    assert batch_e2e.main(["--model-dir", str(chat_checkpoint), "--sizes", "1,3", "--new-tokens", "6",
                           "--repeats", "1", "--device", "cpu", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "batch_e2e.json").read_text())
    assert list(report["sizes"]) == ["1", "3"] and report["dtype"] == "float32"
    for size, entry in report["sizes"].items():
        ours, greedy = entry["prompt lookup (our loop)"], entry["transformers batched greedy"]
        assert ours["identical_rows"] == greedy["identical_rows"] == f"{size}/{size}"
        assert 1 <= ours["target_forwards"] <= 6 and ours["tokens_per_batched_forward"] >= 1
        assert entry["speedup"] > 0 and ours["tokens_per_s"] > 0


def test_batches_of_chosen_categories(chat_checkpoint, tmp_path):
    assert batch_e2e.main(["--model-dir", str(chat_checkpoint), "--sizes", "2", "--new-tokens", "4", "--repeats", "1",
                           "--device", "cpu", "--categories", "rag", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "batch_e2e.json").read_text())
    assert report["categories"] == ["rag"]
    assert report["sizes"]["2"]["prompt lookup (our loop)"]["identical_rows"] == "2/2"
