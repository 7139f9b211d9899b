"""core.sdpa.grouped_query_sdpa: our masked multi-token forwards on a CPU use transformers' grouped-query SDPA (no
repeat_kv copies) where transformers reads TRANSFORMERS_SDPA_FORCE_GQA, without leaving it set or overriding a user's
value; greedy output is unchanged (the identity matrix runs through it)."""

from __future__ import annotations

import os
import threading

import pytest
import torch

import hf_speculative as hfs
from hf_speculative import compat
from hf_speculative.core import sdpa
from tests.conftest import build_model, prompt_inputs, stock_generate

VARIABLE = "TRANSFORMERS_SDPA_FORCE_GQA"
needs_switch = pytest.mark.skipif(not compat.reads_force_gqa(), reason="this transformers has no GQA switch")


@pytest.fixture
def no_user_value(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)


@needs_switch
def test_set_only_inside_a_multi_token_forward_of_a_cpu_sdpa_model(no_user_value):
    model = build_model("llama")
    assert model.config._attn_implementation == "sdpa"
    with sdpa.grouped_query_sdpa(model, 1):
        assert VARIABLE not in os.environ  # one token: no mask, transformers uses GQA already
    with sdpa.grouped_query_sdpa(model, 3):
        assert os.environ[VARIABLE] == "1"
    assert VARIABLE not in os.environ
    model.config._attn_implementation = "eager"
    with sdpa.grouped_query_sdpa(model, 3):
        assert VARIABLE not in os.environ


@needs_switch
def test_a_users_value_is_kept(monkeypatch):
    model = build_model("llama")
    monkeypatch.setenv(VARIABLE, "0")
    with sdpa.grouped_query_sdpa(model, 3):
        assert os.environ[VARIABLE] == "0"
    assert os.environ[VARIABLE] == "0"


@needs_switch
def test_overlapping_calls_restore_once_the_last_ends(no_user_value):
    model = build_model("llama")
    inside, release = threading.Event(), threading.Event()

    def other():
        with sdpa.grouped_query_sdpa(model, 4):
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    with sdpa.grouped_query_sdpa(model, 2):
        pass
    assert os.environ[VARIABLE] == "1"  # the other call still runs
    release.set()
    thread.join()
    assert VARIABLE not in os.environ


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_verification_sees_the_switch_and_stays_identical_to_greedy(arch, no_user_value, monkeypatch):
    model = build_model(arch)
    seen = []
    forward = type(model).forward

    def spy(self, *args, **kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:
            seen.append(os.environ.get(VARIABLE))
        return forward(self, *args, **kwargs)

    inputs = prompt_inputs()
    reference = stock_generate(model, **inputs, max_new_tokens=24, do_sample=False)
    monkeypatch.setattr(type(model), "forward", spy)
    hfs.enable(model)
    out = model.generate(**inputs, max_new_tokens=24, do_sample=False,
                         candidate_generator=hfs.PromptLookup(adaptive=False, num_tokens=4))
    assert out.tolist() == reference.tolist()
    verification = seen[1:]  # the first is the prompt's prefill (transformers' own path)
    assert verification and set(verification) == ({"1"} if compat.reads_force_gqa() else {None})
    assert VARIABLE not in os.environ
