"""tools/gpu/travel.py: what a lent GPU call carries, and setting aside the tracked folders it does not need."""

from __future__ import annotations

import subprocess

import pytest

from tools.gpu import travel


def _repo(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text(".aside/\nignored/\n")
    for rel, size in {"docs/img/a.png": 3 << 20, "benchmarks/results/r.jsonl": 1 << 20, "pkg/code.py": 100,
                      "ignored/big.bin": 9 << 20}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x" * size)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    return tmp_path


def test_aside_and_back_change_what_travels_and_restore_every_file(tmp_path):
    root = _repo(tmp_path)
    before, _ = travel.size(root)
    assert 4.0 < before < 4.1  # the ignored file never travels
    assert travel.aside(root) == ["benchmarks/results", "docs/img"]
    after, largest = travel.size(root)
    assert after < 0.01 and all(folder != "docs/img" for folder, _ in largest)
    assert (root / ".aside/docs/img/a.png").stat().st_size == 3 << 20
    with pytest.raises(SystemExit, match="put it back first"):  # a second aside would mix two stashes
        (root / "docs/img").mkdir()
        travel.aside(root)
    (root / "docs/img").rmdir()
    assert travel.back(root) == ["benchmarks/results", "docs/img"]
    assert travel.size(root)[0] == before and not (root / ".aside/docs/img").exists()
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert status.split() == ["A", ".gitignore", "A", "benchmarks/results/r.jsonl", "A", "docs/img/a.png", "A",
                              "pkg/code.py"]


def test_back_refuses_to_overwrite(tmp_path):
    root = _repo(tmp_path)
    travel.aside(root)
    (root / "docs/img").mkdir()
    with pytest.raises(SystemExit, match="remove one by hand"):
        travel.back(root)


def test_all_drafters_sets_the_shipped_drafters_aside_too_and_back_returns_them(tmp_path):
    root = _repo(tmp_path)
    for rel in travel.TRAIN_ASIDE:
        (root / rel / "smol").mkdir(parents=True)
        (root / rel / "smol" / "model.safetensors").write_bytes(b"w" * (1 << 20))
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    assert travel.aside(root) == ["benchmarks/results", "docs/img"]  # without the flag: they stay
    assert travel.size(root)[0] > 2
    travel.back(root)
    assert travel.aside(root, all_drafters=True) == ["benchmarks/results", "docs/img", *travel.TRAIN_ASIDE]
    assert travel.size(root)[0] < 0.01
    assert travel.back(root) == ["benchmarks/results", "docs/img", *travel.TRAIN_ASIDE]
    assert all((root / rel / "smol" / "model.safetensors").stat().st_size == 1 << 20 for rel in travel.TRAIN_ASIDE)
