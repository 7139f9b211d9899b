"""Prompt lookup's method of the command line, the benchmark and the app.

How ``METHODS`` and its builds are read and called: :mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

from typing import Any

METHODS = [
    {"name": "prompt-lookup", "order": 10, "label": "Prompt lookup (hfs)",
     "description": "hf_speculative's n-gram prompt lookup: drafts the continuation of the last n-gram seen earlier.",
     "options": {"num_tokens": None, "max_ngram": None}, "build": "build_prompt_lookup"},
]


def build_prompt_lookup(model: Any, tokenizer: Any, call: Any) -> dict:
    from .drafter import PromptLookup

    return {"candidate_generator": PromptLookup(**call.given("num_tokens", "max_ngram"))}
