"""Form checks and method options taken from the registry."""

from __future__ import annotations

import re

import pytest

from hf_speculative.tooling import methods
from hf_speculative.app.request import (
    MAX_PROMPT_CHARS,
    AppError,
    baseline_method,
    option_slots,
    parse_request,
    selectable_methods,
)


def _parse(prompt="hello", model="", picked=("prompt-lookup",), max_new=16, sampling=False, temperature=0.7, seed=0,
           values=None):
    slots = option_slots()
    values = [s.default for s in slots] if values is None else values
    return parse_request(prompt, model, list(picked), max_new, sampling, temperature, seed, False, values,
                         slots=slots, default_model="default-model", max_new_tokens_limit=64)


def test_methods_and_knobs_come_from_the_registry(monkeypatch):
    assert baseline_method() == "greedy"
    assert selectable_methods() == [n for n in methods.available_methods()
                                    if n != "greedy" and methods.get_method(n).app]
    assert {"draft-model-uag", "hf-assisted-uag"} <= set(methods.available_methods()) - set(selectable_methods())
    expected = [(n, k) for n in selectable_methods() for k in methods.get_method(n).options
                if k not in ("calibration_file", "kernel_weights")]
    assert [(s.method, s.key) for s in option_slots()] == expected, "every option but the server-only ones"
    assert {("layer-skip", "calibration_file"), ("draft-model", "kernel_weights")}.isdisjoint(
        (s.method, s.key) for s in option_slots())
    # a drafter registered later (EAGLE, EarlyExit...) shows up with its knobs, no app change needed
    spec = methods.MethodSpec("test-drafter", "Test drafter", "test", "hfs", lambda m, t, o: {},
                              {"num_tokens": None, "depth": 3, "ratio": 0.5, "flag": False, "path": None})
    monkeypatch.setitem(methods._REGISTRY, spec.name, spec)
    slots = {s.key: s for s in option_slots() if s.method == "test-drafter"}
    assert "test-drafter" in selectable_methods()
    assert {k: s.widget for k, s in slots.items()} == {"num_tokens": "integer", "depth": "integer", "ratio": "number",
                                                        "flag": "bool", "path": "text"}


def test_a_valid_request_runs_greedy_first_and_keeps_only_set_options():
    slots = option_slots()
    values = [4 if (s.method, s.key) == ("prompt-lookup", "num_tokens") else s.default for s in slots]
    values = [" 7 " if (s.method, s.key) == ("hf-prompt-lookup", "num_tokens") else v for s, v in zip(slots, values)]
    request = _parse(picked=["prompt-lookup", "greedy", "hf-prompt-lookup", "prompt-lookup"], values=values)
    assert request.methods == ["greedy", "prompt-lookup", "hf-prompt-lookup"]
    assert request.model == "default-model" and request.sampling is None
    assert request.options == {"prompt-lookup": {"num_tokens": 4}, "hf-prompt-lookup": {"num_tokens": 7}}
    assert _parse(sampling=True, temperature="0.5", seed="3").sampling == {"temperature": 0.5, "seed": 3}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": "   "}, "The prompt is empty"),
        ({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}, "too long"),
        ({"picked": ()}, "at least one method"),
        ({"picked": ("no-such-method",)}, "Unknown method(s): 'no-such-method'. Known:"),
        ({"picked": ("prompt-lookup", "hf-prompt-lookup", "hf-early-exit", "draft-model")}, "at most 3"),
        ({"max_new": 0}, "Max new tokens must be a whole number from 1 to 64, got 0."),
        ({"max_new": "many"}, "whole number"),
        ({"sampling": True, "temperature": 0}, "Temperature must be a number from 0.05 to 2.0, got 0."),
        ({"sampling": True, "seed": 10**30}, "Seed must be a whole number from 0 to 2**63 - 1, got 1000000"),
        ({"values": [1]}, "method option values"),
    ],
)
def test_bad_requests_say_what_is_wrong(kwargs, message):
    with pytest.raises(AppError, match=re.escape(message)):
        _parse(**kwargs)


def test_a_non_integer_knob_is_refused():
    slots = option_slots()
    values = ["2.5" if (s.method, s.key) == ("prompt-lookup", "num_tokens") else s.default for s in slots]
    with pytest.raises(AppError, match="Prompt lookup \\(hfs\\): num_tokens must be a whole number from 1 to 64, got '2.5'"):
        _parse(values=values)
