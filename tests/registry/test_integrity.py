"""Integrity of shipped drafters: the sha256 manifest written at release matches the files, a corrupt
copy is refused before its weights are read, and repeat loads do not re-hash unchanged files (the trust
record lives in the package cache, never in the drafter's folder). The registry models' checks are in
tests/registry/test_models.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import hf_speculative as hfs
from hf_speculative.registry import integrity
from hf_speculative.drafters.self_speculative import exit_adapter
from hf_speculative.drafters.eagle import checkpoints, drafter
from hf_speculative.drafters.eagle.checkpoints import MANIFEST, CheckpointError
from tests.conftest import corrupt_same_size, count_hashes
from tools import drafter_manifests

SHIPPED = [(root, name) for root in (drafter.PRETRAINED_DIR, exit_adapter.SHIPPED_DIR)
           for name in checkpoints.shipped_names(root)]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _shipped_copy(tmp_path: Path, root: Path, name: str) -> Path:
    """A copy of the shipped folder `root` holding only the drafter `name`, as the package would."""
    copy = tmp_path / "package" / root.name
    shutil.copytree(root / name, copy / name)
    return copy


def test_every_shipped_drafter_has_a_current_manifest():
    assert len(SHIPPED) >= 2, "the package ships an EAGLE drafter and an exit adapter"
    for root, name in SHIPPED:
        folder = root / name
        manifest = json.loads((folder / MANIFEST).read_text())
        assert manifest == drafter_manifests.manifest_of(folder), (
            f"{folder / MANIFEST} is stale: run python -m tools.drafter_manifests")
        assert {"config.json", "model.safetensors"} <= set(manifest["sha256"])
    assert drafter_manifests.main(["--check"]) == 0


def test_shipped_drafters_load_and_are_checked(monkeypatch, cache):
    hashed = count_hashes(monkeypatch)
    for root, name in SHIPPED:
        checkpoints.load_checkpoint(root / name)
    assert sorted(hashed) == sorted(f for root, name in SHIPPED
                                    for f in json.loads((root / name / MANIFEST).read_text())["sha256"])
    for root, name in SHIPPED:  # nothing written into the package's folders
        listed = json.loads((root / name / MANIFEST).read_text())["sha256"]
        assert sorted(p.name for p in (root / name).iterdir()) == sorted([*listed, MANIFEST])
    assert len(list((cache / "trust").iterdir())) == len(SHIPPED)  # the records live in the cache


@pytest.mark.parametrize("kind", ["eagle", "exit-adapter"])
@pytest.mark.parametrize("rel", ["model.safetensors", "config.json"])
def test_corrupt_shipped_drafter_is_refused(tmp_path, monkeypatch, kind, rel):
    root = drafter.PRETRAINED_DIR if kind == "eagle" else exit_adapter.SHIPPED_DIR
    name = checkpoints.shipped_names(root)[0]
    copy = _shipped_copy(tmp_path, root, name)
    monkeypatch.setattr(drafter, "PRETRAINED_DIR", copy) if kind == "eagle" else \
        monkeypatch.setattr(exit_adapter, "SHIPPED_DIR", copy)
    load = (lambda: hfs.Eagle.from_pretrained(name)) if kind == "eagle" else (lambda: exit_adapter.load_adapter(name))
    load()  # intact copy: loads
    corrupt_same_size(copy / name / rel)
    with pytest.raises(CheckpointError) as info:
        load()
    msg = str(info.value)
    assert f"failed its integrity check: {rel} has sha256 " in msg and "Reinstall hf-speculative" in msg
    with pytest.raises(CheckpointError, match="failed its integrity check"):
        checkpoints.load_checkpoint(copy / name)  # any path to the folder
    with pytest.raises(CheckpointError, match="failed its integrity check"):
        checkpoints.check_manifest(copy / name, full=True)
    (copy / name / MANIFEST).unlink()  # a shipped drafter without its manifest is not loaded unchecked
    with pytest.raises(CheckpointError, match="has no sha256sums.json"):
        load()


def test_repeat_loads_do_not_rehash(tmp_path, monkeypatch, cache):
    folder = _shipped_copy(tmp_path, drafter.PRETRAINED_DIR, checkpoints.shipped_names(drafter.PRETRAINED_DIR)[0])
    folder = next(folder.iterdir())
    monkeypatch.setattr(integrity, "SETTLE_NS", 0)  # copied just now: trust it at once
    hashed = count_hashes(monkeypatch)
    checkpoints.load_checkpoint(folder)
    assert sorted(hashed) == ["config.json", "model.safetensors", "training.json"]
    hashed.clear()
    checkpoints.load_checkpoint(folder)
    checkpoints.load_checkpoint(folder)
    assert hashed == []
    st = (folder / "model.safetensors").stat()
    os.utime(folder / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # touched only
    checkpoints.load_checkpoint(folder)
    assert hashed == ["model.safetensors"]
    assert checkpoints.check_manifest(folder, full=True) == 3 and len(hashed) == 4


def test_no_writable_cache_hashes_every_time(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(blocker / "cache"))  # cannot be created
    monkeypatch.setattr(integrity, "SETTLE_NS", 0)
    hashed = count_hashes(monkeypatch)
    root, name = SHIPPED[0]
    for _ in range(2):
        checkpoints.load_checkpoint(root / name)
    assert hashed.count("model.safetensors") == 2


def test_user_folders_without_manifest_load_unchecked(tmp_path, monkeypatch):
    root, name = SHIPPED[0]
    folder = tmp_path / "mine"
    shutil.copytree(root / name, folder)
    (folder / MANIFEST).unlink()
    hashed = count_hashes(monkeypatch)
    checkpoints.load_checkpoint(folder)
    assert hashed == []
    (folder / MANIFEST).write_text('{"sha256": ["not", "a", "map"]}')
    with pytest.raises(CheckpointError, match="is not a readable sha256 manifest"):
        checkpoints.load_checkpoint(folder)
