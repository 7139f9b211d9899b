"""One comparison without the page: run order, the GPU's all-at-once mode, prompt limits."""

from __future__ import annotations

import pytest
import torch

from hf_speculative.app.cache import ModelCache
from hf_speculative.app.request import AppError, CompareRequest
from hf_speculative.app.session import Comparison
from tests.app.conftest import TINY_PROMPT


@pytest.fixture
def loaded(tiny_chat_dir):
    cache = ModelCache(device=torch.device("cpu"))
    return cache, cache.get(str(tiny_chat_dir))


def _request(tiny_chat_dir, concurrent=False, max_new=16, prompt=TINY_PROMPT):
    return CompareRequest(prompt=prompt, model=str(tiny_chat_dir), methods=["greedy", "prompt-lookup", "hf-prompt-lookup"],
                          max_new_tokens=max_new, options={}, concurrent=concurrent)


def _run(comparison: Comparison) -> list[int]:
    return list(comparison.run(interval=0.01))


def test_methods_run_one_after_another_greedy_first(loaded, tiny_chat_dir):
    cache, model = loaded
    comparison = Comparison(model, _request(tiny_chat_dir), cache, max_prompt_tokens=256)
    running = _run(comparison)
    assert running == sorted(running) and running[-1] == 2  # the page always names the method in progress
    traces = comparison.traces
    assert all(t.status == "done" for t in traces)
    for earlier, later in zip(traces, traces[1:]):  # no overlap: fair timings
        assert earlier.started + earlier.seconds <= later.started
    assert all(comparison.identical(t) for t in traces[1:])
    assert [text.text for text in comparison.texts] == [comparison.texts[0].text] * 3
    assert comparison.results()["order"] == "sequential"


def test_all_at_once_mode_gives_the_same_outputs(loaded, tiny_chat_dir):
    cache, model = loaded
    comparison = Comparison(model, _request(tiny_chat_dir, concurrent=True), cache, max_prompt_tokens=256)
    _run(comparison)
    assert all(t.status == "done" for t in comparison.traces)
    assert all(comparison.identical(t) for t in comparison.traces[1:])
    assert comparison.results()["order"] == "concurrent"


def test_prompt_limits(loaded, tiny_chat_dir):
    cache, model = loaded
    with pytest.raises(AppError, match="22 tokens, this demo accepts at most 10"):
        Comparison(model, _request(tiny_chat_dir), cache, max_prompt_tokens=10)
    with pytest.raises(AppError, match="exceed the model's context of 512 tokens"):
        Comparison(model, _request(tiny_chat_dir, max_new=500), cache, max_prompt_tokens=256)
