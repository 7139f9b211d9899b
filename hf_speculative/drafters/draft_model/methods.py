"""The draft model's method of the command line, the benchmark and the app.

How ``METHODS`` and its builds are read and called: :mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

from typing import Any

METHODS = [
    {"name": "draft-model", "order": 20, "label": "Draft model (hfs)",
     "description": "hf_speculative's draft model: a smaller model with the same tokenizer drafts greedily.",
     "options": {"draft_model": None, "num_tokens": None}, "build": "build_draft_model"},
]


def build_draft_model(model: Any, tokenizer: Any, call: Any) -> dict:
    from .drafter import DraftModel

    return {"candidate_generator": DraftModel(call.draft_model(), **call.given("num_tokens"))}
