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


def test_a_failed_load_leaves_no_model_and_raises():
    cache = ModelCache(_Loader(), device=torch.device("cpu"))
    cache.get("a")
    with pytest.raises(OSError, match="no such model"):
        cache.get("broken")
    assert cache.current is None


def test_device_description():
    assert describe_device(torch.device("cpu")).startswith("CPU (")
