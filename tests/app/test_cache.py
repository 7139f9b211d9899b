"""One target model at a time, loaded once; draft models are separate objects."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from hf_speculative.app.cache import ModelCache, describe_device
from tests.conftest import build_model


class _Loader:
    def __init__(self):
        self.calls = []

    def __call__(self, name, device=None):
        self.calls.append(name)
        if name == "broken":
            raise OSError("no such model")
        return build_model("llama"), _Tokenizer()


class _Tokenizer:
    eos_token_id, pad_token_id = 2, 0


def test_models_load_once_and_switching_frees_the_previous():
    loader = _Loader()
    cache = ModelCache(loader, device=torch.device("cpu"))
    first = cache.get("a")
    assert cache.get("a") is first and loader.calls == ["a"] and cache.loads == 1
    draft = cache.draft("a")
    assert draft is not first.model and cache.draft("a") is draft and loader.calls == ["a", "a"]
    old_model, old_draft = weakref.ref(first.model), weakref.ref(draft)
    del first, draft
    second = cache.get("b")
    gc.collect()
    assert old_model() is None and old_draft() is None, "the previous target and its drafts must be freed"
    assert cache.current is second and cache.loads == 2 and loader.calls[-1] == "b"


def test_a_failed_switch_keeps_the_loaded_model():
    loader = _Loader()
    cache = ModelCache(loader, device=torch.device("cpu"))
    first = cache.get("a")
    draft = cache.draft("a")
    with pytest.raises(OSError, match="no such model"):
        cache.get("broken")
    assert cache.current is first and cache.draft("a") is draft, "the loaded target and its drafts stay"
    assert cache.get("a") is first and cache.loads == 1 and loader.calls == ["a", "a", "broken"]


def test_the_new_target_loads_before_the_old_one_is_freed():
    seen = []

    class Loader(_Loader):
        def __call__(self, name, device=None):
            seen.append(cache.current.name if cache.current else None)  # what is held while loading
            return super().__call__(name, device)

    cache = ModelCache(Loader(), device=torch.device("cpu"), warmup=False)
    cache.get("a")
    cache.get("b")
    assert seen == [None, "a"] and cache.current.name == "b"


def test_layer_skip_calibration_lives_under_the_model_fingerprint(tmp_path):
    from hf_speculative.drafters.self_speculative.calibration import SkipCalibration, model_fingerprint

    cache = ModelCache(_Loader(), device=torch.device("cpu"), warmup=False, calibration_dir=tmp_path / "cal")
    loaded = cache.get("a")
    path = cache.calibration_file(loaded)
    assert path.parent == tmp_path / "cal" and path.name == f"{model_fingerprint(loaded.model)}.json"
    assert model_fingerprint(build_model("llama")) == model_fingerprint(loaded.model), "same weights, same name"
    other = build_model("llama")
    with torch.no_grad():
        next(other.parameters())[0, 0] += 1.0
    assert model_fingerprint(other) != model_fingerprint(loaded.model)
    path.write_text("not a calibration")  # unreadable: removed, so that LayerSkip calibrates again
    assert cache.calibration_file(loaded) == path and not path.exists()
    layers = loaded.model.config.num_hidden_layers
    SkipCalibration(skip=[0], num_layers=layers).save(path)
    assert cache.calibration_file(loaded) == path and SkipCalibration.load(path).skip == [0]


def test_device_description():
    assert describe_device(torch.device("cpu")).startswith("CPU (")


def test_a_failed_load_is_remembered_not_retried_by_every_visitor(monkeypatch):
    from hf_speculative.app import cache as cache_module

    loader = _Loader()
    cache = ModelCache(loader, device=torch.device("cpu"), warmup=False)
    with pytest.raises(OSError, match="no such model"):
        cache.get("broken")
    with pytest.raises(RuntimeError, match=r"no such model \(this load failed \d+ s ago; it is tried again 5 minutes"):
        cache.get("broken")
    with pytest.raises(RuntimeError, match="no such model"):
        cache.draft("broken")
    assert loader.calls == ["broken"], "tried once"
    monkeypatch.setattr(cache_module, "RETRY_AFTER_S", 0.0)
    with pytest.raises(OSError):
        cache.get("broken")
    assert loader.calls == ["broken", "broken"], "tried again once the time has passed"
