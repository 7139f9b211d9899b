"""Our forwards leave the process environment alone: transformers' ``TRANSFORMERS_SDPA_FORCE_GQA`` (read by every SDPA
call) is the user's to set. Until issue 68 our masked forwards on a CPU set it around themselves; end to end it
changed nothing measurable (core/sdpa.py), and a process-wide variable written per call is seen by every thread."""

from __future__ import annotations

import os

import pytest

import hf_speculative as hfs
from tests.conftest import build_model, prompt_inputs, stock_generate

VARIABLE = "TRANSFORMERS_SDPA_FORCE_GQA"


@pytest.mark.parametrize("user_value", [None, "0", "1"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_verification_forwards_see_the_users_environment(arch, user_value, monkeypatch):
    """Every multi-token forward of the call (verifications of a chain and of a tree) sees what the user set, and the
    environment is as it was after the call; greedy output is unchanged."""
    if user_value is None:
        monkeypatch.delenv(VARIABLE, raising=False)
    else:
        monkeypatch.setenv(VARIABLE, user_value)
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
    for drafter in (hfs.PromptLookup(adaptive=False, num_tokens=4), hfs.PromptLookup(adaptive=False, tree=hfs.DynamicTree(nodes=6, depth=3, top_k=2))):
        seen.clear()
        out = model.generate(**inputs, max_new_tokens=24, do_sample=False, candidate_generator=drafter)
        assert out.tolist() == reference.tolist()
        verification = seen[1:]  # the first is the prompt's prefill (transformers' own path)
        assert verification and set(verification) == {user_value}
        assert os.environ.get(VARIABLE) == user_value
