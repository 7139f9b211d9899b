"""benchmarks/training_curves.py: a run's train_log.jsonl and an exported drafter's training.json read alike, every
validation in the table in order (Medusa's tree τ with its chain's), the plot written, a folder with neither
refused."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_benchmark


def test_training_curves_table_and_plot(tmp_path, capsys):
    module = load_benchmark("training_curves")
    eagle, medusa = tmp_path / "eagle", tmp_path / "export" / "medusa"
    eagle.mkdir()
    medusa.mkdir(parents=True)
    eagle_rows = [{"step": 0, "tokens": 0, "seconds": 2.0, "val_acc": [0.43, 0.3], "val_tau": 1.52},
                  {"step": 500, "tokens": 1_250_000, "seconds": 5400.0, "val_acc": [0.61, 0.45], "val_tau": 2.04}]
    (eagle / "train_log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in eagle_rows))
    medusa_rows = [{"step": 100, "tokens": 400_000, "seconds": 1800.0, "val_top1": [0.5, 0.2], "val_tau_tree": 1.71,
                    "val_tau_chain": 1.42}]
    (medusa / "training.json").write_text(json.dumps({"command": "train-medusa ...", "train_log": medusa_rows}))
    image = tmp_path / "curves.png"
    assert module.main([f"eagle={eagle}", f"medusa={medusa}", "--plot", str(image)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:5] == ["| eagle | 0 | 0.00M | 0.00 | 1.52 | 0.430 |", "| eagle | 500 | 1.25M | 1.50 | 2.04 | 0.610 |",
                          "| medusa | 100 | 0.40M | 0.50 | 1.71 (chain 1.42) | 0.500 |"]
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="neither train_log.jsonl"):
        module.main([f"dflash={tmp_path / 'export'}"])
    with pytest.raises(SystemExit):
        module.main([str(eagle)])  # no LABEL=
