"""``python -m tools.cpu_ship``: a trained drafter replaces the shipped one only where its τ is at least the shipped
one's at every budget and dataset, and every output was greedy's; the copy is whole and checked."""

from __future__ import annotations

import json

import pytest

from hf_speculative.drafters.checkpoints import CheckpointError, check_manifest
from tools.cpu_ship import comparisons, main, replace_folder, ship, verdict
from tools.drafter_manifests import manifest_of, text_of

TARGET = "smollm2-135m-instruct"


def drafter_folder(path, weights: bytes, extra: str | None = None):
    """A stand-in drafter in the shipped format: its files and their manifest."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"target": TARGET}))
    (path / "model.safetensors").write_bytes(weights)
    if extra:
        (path / extra).write_text("{}")
    (path / "sha256sums.json").write_text(text_of(manifest_of(path)))
    return path


def tau_file(path, budgets: dict[str, float], identical: bool = True, prompts: int = 3):
    rows = [{"category": "qa", "new_tokens": 60, **{b: {"tau": t, "identical": identical} for b, t in budgets.items()}}
            for _ in range(prompts)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def work(tmp_path):
    work = tmp_path / "work"
    (work / "tau").mkdir(parents=True)
    (work / "agenda.json").write_text(json.dumps({"settings": {"target": TARGET}, "steps": {}}))
    drafter_folder(work / "export" / "eagle", b"new weights", extra="training.json")
    drafter_folder(work / "export" / "medusa", b"new heads")
    return work


@pytest.fixture
def package(tmp_path):
    root = tmp_path / "drafters"
    drafter_folder(root / "eagle" / "pretrained" / TARGET, b"old weights", extra="old_only.json")
    drafter_folder(root / "medusa" / "pretrained" / TARGET, b"old heads")
    return root


def scores(work, kind, trained: dict, shipped: dict, *, datasets=("spec_bench", "held_out"), identical=True):
    for dataset in datasets:
        tau_file(work / "tau" / f"trained-{kind}-{dataset}.jsonl", trained, identical)
        tau_file(work / "tau" / f"shipped-{kind}-{dataset}.jsonl", shipped)


def test_a_better_drafter_replaces_the_shipped_folder_whole(work, package, capsys):
    scores(work, "eagle", {"chain5": 2.3, "32": 2.9}, {"chain5": 1.4, "32": 1.9})
    scores(work, "medusa", {"medusa16": 1.5}, {"medusa16": 1.6})  # lower: kept
    assert ship(work, package=package) == {"eagle": True, "dflash": False, "medusa": False}
    printed = capsys.readouterr().out
    assert "spec_bench chain5: trained τ 2.30 >= shipped 1.40 (3 prompts)" in printed
    assert "medusa: keep the shipped one: lower τ than the shipped drafter: held_out medusa16: trained τ 1.50 < " \
           "shipped 1.60" in printed
    assert "dflash: not exported" in printed
    dest = package / "eagle" / "pretrained" / TARGET
    assert (dest / "model.safetensors").read_bytes() == b"new weights"
    assert not (dest / "old_only.json").exists() and (dest / "training.json").exists()  # replaced whole
    assert check_manifest(dest, full=True, required=True) == 3
    assert not list(dest.parent.glob("*.incoming")) and not list(dest.parent.glob("*.replaced"))
    assert (package / "medusa" / "pretrained" / TARGET / "model.safetensors").read_bytes() == b"old heads"


def test_lower_on_one_budget_of_one_dataset_keeps_the_shipped_one_unless_forced(work, package):
    scores(work, "eagle", {"chain5": 2.3, "32": 2.9}, {"chain5": 1.4, "32": 1.9}, datasets=("spec_bench",))
    scores(work, "eagle", {"chain5": 2.3, "32": 1.8}, {"chain5": 1.4, "32": 1.9}, datasets=("held_out",))
    ok, why = verdict(comparisons(work, "eagle"))
    assert not ok and why == "lower τ than the shipped drafter: held_out 32: trained τ 1.80 < shipped 1.90 (3 prompts)"
    assert ship(work, kinds=("eagle",), package=package) == {"eagle": False}
    assert (package / "eagle" / "pretrained" / TARGET / "model.safetensors").read_bytes() == b"old weights"
    assert ship(work, kinds=("eagle",), package=package, force=True) == {"eagle": True}
    assert (package / "eagle" / "pretrained" / TARGET / "model.safetensors").read_bytes() == b"new weights"


def test_an_output_unlike_greedys_never_ships_even_forced(work, package):
    scores(work, "eagle", {"chain5": 3.0, "32": 3.5}, {"chain5": 1.4, "32": 1.9}, identical=False)
    ok, why = verdict(comparisons(work, "eagle"), force=True)
    assert not ok and why.startswith("an output differed from greedy's: ") and "3 outputs unlike greedy's" in why
    assert ship(work, kinds=("eagle",), package=package, force=True) == {"eagle": False}


def test_without_both_taus_nothing_ships_and_the_step_is_named(work, package):
    tau_file(work / "tau" / "trained-eagle-spec_bench.jsonl", {"chain5": 3.0, "32": 3.5})  # no shipped run to compare
    ok, why = verdict(comparisons(work, "eagle"))
    assert not ok and "--steps tau" in why
    assert ship(work, kinds=("eagle",), package=package) == {"eagle": False}


def test_an_export_changed_since_its_manifest_is_refused_before_the_copy(work, package):
    scores(work, "eagle", {"chain5": 2.3, "32": 2.9}, {"chain5": 1.4, "32": 1.9})
    (work / "export" / "eagle" / "model.safetensors").write_bytes(b"changed")
    with pytest.raises(CheckpointError, match="failed its integrity check"):
        ship(work, kinds=("eagle",), package=package)
    assert (package / "eagle" / "pretrained" / TARGET / "model.safetensors").read_bytes() == b"old weights"


def test_a_dry_run_copies_nothing_and_a_tiny_target_ships_nothing(work, package, tmp_path):
    scores(work, "eagle", {"chain5": 2.3, "32": 2.9}, {"chain5": 1.4, "32": 1.9})
    assert ship(work, kinds=("eagle",), package=package, dry_run=True) == {"eagle": True}
    assert (package / "eagle" / "pretrained" / TARGET / "model.safetensors").read_bytes() == b"old weights"
    (work / "agenda.json").write_text(json.dumps({"settings": {"target": str(tmp_path / "tiny"), "tiny": True}}))
    with pytest.raises(SystemExit, match="not a registry model"):
        ship(work, package=package)
    with pytest.raises(SystemExit):
        main(["--work", str(work), "--kinds", "eagle,lookahead"])


def test_an_interrupted_swap_is_cleaned_up_by_the_next(tmp_path):
    source = drafter_folder(tmp_path / "new", b"new")
    dest = drafter_folder(tmp_path / "pkg" / TARGET, b"old")
    drafter_folder(tmp_path / "pkg" / f"{TARGET}.incoming", b"half")  # a copy cut short earlier
    replace_folder(source, dest)
    assert (dest / "model.safetensors").read_bytes() == b"new"
    assert sorted(p.name for p in dest.parent.iterdir()) == [TARGET]
