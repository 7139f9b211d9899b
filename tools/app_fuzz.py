"""The fuzz table of the demo app's ``/compare`` API: hostile values for every parameter.

Used by ``tests/app/test_fuzz.py`` (every case through the request handler, some through a served
app) and by ``tools/load_test.py`` (a fifth of its requests). A case is ``(parameter, value)``: the
``/compare`` endpoint's parameter (``prompt``, ``model``, ..., ``<method>__<option>`` as gradio_client
names it) and what a hostile or careless client sends there; every other parameter keeps the
page's default.
"""

from __future__ import annotations

import math
from typing import Any

FIXED = ("prompt", "model", "methods", "max_new_tokens", "sample", "temperature", "seed", "concurrent")

# Server paths and Hub ids: a remote caller must never get one loaded, read or created.
PATHS = ["/etc", "/tmp", "/etc/shadow", "/tmp/hfs-fuzz-probe.json", "../../etc/passwd", "~/.ssh", "./", "C:\\Windows",
         "file:///etc/passwd"]
HUB_IDS = ["gpt2", "openai-community/gpt2", "meta-llama/Llama-3.1-8B"]
NUMBERS = [10**9, 10**30, -1, -(10**9), 2.5, 0.5, math.nan, math.inf, -math.inf, 1e308, 2**63, 2**64]
JUNK = [None, "", "abc", "5; rm -rf /", [], [1, 2], {}, {"a": 1}, True, False, "x" * 10_000, "\x00", "1e400"]


def hostile_values(kind: str) -> list[Any]:
    """Values to throw at a parameter of ``kind``: ``"text"``, ``"name"`` (models and drafters),
    ``"number"``, ``"flag"``, ``"methods"``, ``"layers"``."""
    if kind == "methods":
        return [None, [], "greedy", ["no-such-method"], ["prompt-lookup"] * 1000, [f"m{i}" for i in range(100)],
                ["/etc"], [None], [1, 2], {"prompt-lookup": 1}, 5, "prompt-lookup", ["gpt2"]]
    if kind == "name":
        return PATHS + HUB_IDS + JUNK + NUMBERS[:3]
    if kind == "layers":
        return ["0," * 5000, "-1", "1,1", "99999", "1.5", "auto;/etc", "a,b"] + PATHS[:3] + JUNK + NUMBERS[:4]
    if kind == "text":
        return JUNK + PATHS[:3] + NUMBERS[:3] + ["x" * 20_001, " " * 50]
    return NUMBERS + JUNK + PATHS[:2] + HUB_IDS[:1]  # "number", "flag"


def parameter_kinds() -> dict[str, str]:
    """Every ``/compare`` parameter and the kind of hostile values it gets."""
    from hf_speculative.app.request import option_slots

    kinds = {"prompt": "text", "model": "name", "methods": "methods", "max_new_tokens": "number", "sample": "flag",
             "temperature": "number", "seed": "number", "concurrent": "flag"}
    widget_kind = {"integer": "number", "number": "number", "bool": "flag", "model": "name", "drafter": "name",
                   "layers": "layers", "text": "text"}
    for slot in option_slots():
        kinds[api_name(slot.method, slot.key)] = widget_kind[slot.widget]
    return kinds


def hostile_cases() -> list[tuple[str, Any]]:
    """``(parameter, value)`` for every parameter and every hostile value of its kind."""
    return [(name, value) for name, kind in parameter_kinds().items() for value in hostile_values(kind)]


def api_name(method: str, key: str) -> str:
    """The API parameter of a method option."""
    from hf_speculative.app.request import api_parameter

    return api_parameter(method, key)


def form(overrides: dict[str, Any] | None = None, *, prompt: str = "Say hello.", model: str | None = None,
         methods: list[str] | None = None, max_new_tokens: int = 8) -> list[Any]:
    """The ``/compare`` positional arguments: the page's defaults with ``overrides`` (by API name)."""
    from hf_speculative.app.request import option_slots

    values: dict[str, Any] = {"prompt": prompt, "model": model, "methods": methods or ["prompt-lookup"],
                              "max_new_tokens": max_new_tokens, "sample": False, "temperature": 0.7, "seed": 0,
                              "concurrent": False}
    values.update({api_name(s.method, s.key): s.default for s in option_slots()})
    values.update(overrides or {})
    return [values[name] for name in FIXED] + [values[api_name(s.method, s.key)] for s in option_slots()]
