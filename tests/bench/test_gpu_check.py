"""``make gpu-check DEVICE=cpu TINY=1``: the GPU pipeline end to end on this CPU (device battery, eager and
compiled profiles, end-to-end timings of every loop with equal-acceptance drafts, projections), so it keeps
working between the rare runs on a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools.gpu.gpu_check import TINY_LAYERS, config_label, config_model, main
from tools.gpu.synthetic import SyntheticDrafter

ROOT = Path(__file__).resolve().parents[2]


def test_synthetic_drafts_depend_only_on_positions():
    reference = list(range(100, 160))
    drafter = SyntheticDrafter(reference, num_tokens=6, acceptance=0.6, seed=3, vocab_size=500)
    runs = [drafter.draft(length) for length in range(10, 50)]
    assert runs == [SyntheticDrafter(reference, num_tokens=6, acceptance=0.6, seed=3, vocab_size=500).draft(length)
                    for length in range(10, 50)]
    right = wrong = 0
    for length, draft in zip(range(10, 50), runs):
        assert 1 <= len(draft) <= 6
        for j, token in enumerate(draft):
            if token == reference[length + j]:
                right += 1
            else:
                wrong += 1
                assert j == len(draft) - 1  # a draft stops after its first wrong token
    assert right > 0 and wrong > 0
    assert all(t == r for t, r in zip(SyntheticDrafter(reference, acceptance=1.0).draft(5), reference[5:]))
    with pytest.raises(ValueError, match="acceptance=1.5"):
        SyntheticDrafter(reference, acceptance=1.5)


def test_eagle_drafting_costs_come_from_the_compiled_e2e_rows_in_one_token_forwards():
    from tools.gpu.gpu_check import MEASURED_DRAFTING, measured_drafting

    e2e = {"new_tokens": 100, "methods": {
        "transformers greedy (static cache, compiled)": {"seconds": 1.0},  # 10 ms a token
        MEASURED_DRAFTING["eagle-tree"]: {"seconds": 2.0, "draft_ms_per_step": 2.5},
        MEASURED_DRAFTING["eagle"]: {"error": "..."}}}
    assert measured_drafting(e2e) == {"eagle-tree": 0.25}
    assert measured_drafting({"new_tokens": 100, "methods": {}}) == {} == measured_drafting({})


@pytest.mark.slow
@pytest.mark.single_version
def test_make_gpu_check_on_the_cpu(tmp_path):
    out = tmp_path / "gc"
    bench = ROOT / "benchmarks" / "results" / "projection_bench_smollm2_cpu.jsonl"
    done = subprocess.run(["make", "-s", "gpu-check", "DEVICE=cpu", "TINY=1", f"GPU_CHECK_OUT={out}",
                           f"GPU_PY={sys.executable}", f"GPU_BENCH={bench if bench.exists() else ''}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert all(result["returncode"] == 0 for result in report["tests"].values())
    assert report["tests"]["bfloat16"]["seconds"] > 0  # run; float32 on the CPU is the suite's own test_device.py
    assert report["tests"]["float32"]["summary"].startswith("skipped on the CPU")
    tiny = f"smollm2-135m-{TINY_LAYERS}layers"  # smollm2-135m's shape with 4 of its 30 layers (test below)
    assert set(report["profile"]) == {f"{tiny}_eager", f"{tiny}_default"}
    assert all("error" not in value for value in report["profile"].values())
    assert set(report["profile"][f"{tiny}_eager"]["batch_relative"]["128"]) == {"1", "2"}  # batches: eager only
    assert report["e2e"]["config"] == tiny
    methods = report["e2e"]["methods"]
    ours = {label: row for label, row in methods.items() if label.startswith(("hf_speculative", "transformers greedy"))}
    assert all("error" not in row and row["identical"] for row in ours.values()), ours
    # transformers' own speculative loops are peers: a failure of theirs on an old version is recorded, not ours
    # (4.57.6's prompt lookup fails on torch 2.13's isin here)
    taus = {row["tau"] for label, row in methods.items() if "synthetic" in label and "tau" in row}
    assert len(taus) == 1  # the same drafts, the same acceptance, in every loop
    eagle = {label: row for label, row in ours.items() if "EAGLE" in label}
    assert len(eagle) == 4 and all(row["draft_ms_per_step"] > 0 < row["verify_ms_per_step"] for row in eagle.values())
    if bench.exists():
        assert report["project"] and not any(text.startswith("error") for text in report["project"].values())
        assert set(report["drafting_measured"]) == {"eagle", "eagle-tree"}  # EAGLE's drafting, timed in e2e
        assert all(cost > 0 for cost in report["drafting_measured"].values())
        assert any(key.endswith("@drafting-measured") for key in report["project"])
    assert (out / "summary.md").read_text().startswith("# gpu-check")


def test_the_tiny_run_s_model_is_the_shipped_shape_with_fewer_layers(capsys):
    whole = config_model("smollm2-135m", "meta", torch.float32, layers=None)  # random_model, no weights
    cut = config_model("smollm2-135m", "meta", torch.float32, layers=2)
    assert cut.config.num_hidden_layers == len(cut.model.layers) == 2 != whole.config.num_hidden_layers == 30
    assert {k: v for k, v in cut.config.to_dict().items() if k != "num_hidden_layers"} == \
        {k: v for k, v in whole.config.to_dict().items() if k != "num_hidden_layers"}
    assert (config_label("smollm2-135m", 2), config_label("smollm2-135m", None)) == ("smollm2-135m-2layers",
                                                                                     "smollm2-135m")
    with pytest.raises(ValueError, match="use one of"):
        config_model("no-such-config", "cpu", torch.float32, layers=2)
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--layers", "0", "--steps", "e2e"])
    assert "--layers 0: give at least one decoder layer" in capsys.readouterr().err


def test_a_step_keeps_the_rows_asked_for_and_greedy_and_refuses_unknown_parts():
    from tools.gpu.gpu_check import keep_labels

    rows = {"transformers greedy (eager)": 1, "transformers greedy (static cache, compiled)": 2,
            "hf_speculative loop (EAGLE tree 32, random drafter)": 3,
            "hf_speculative loop, compiled (EAGLE tree 32, random drafter)": 4,
            "hf_speculative loop, compiled (EAGLE chain, random drafter)": 5, "transformers prompt lookup": 6}
    assert keep_labels(rows, None, "--e2e-methods") is rows
    assert list(keep_labels(rows, ["compiled (EAGLE", "(EAGLE tree"], "--e2e-methods").values()) == [1, 2, 3, 4, 5]
    assert list(keep_labels(rows, ["compiled (EAGLE chain"], "--e2e-methods").values()) == [1, 2, 5]
    with pytest.raises(ValueError, match=r"--e2e-methods: \['EGLE'\] match nothing; use parts of: transformers"):
        keep_labels(rows, ["EGLE"], "--e2e-methods")
