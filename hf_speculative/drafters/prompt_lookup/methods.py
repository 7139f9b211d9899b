"""Prompt lookup's method of the command line, the benchmark and the app.

``hf_speculative.tooling.methods`` reads ``METHODS`` (plain data) without importing this module, so that
``hf-speculative --help`` lists the methods before any drafter loads, and calls an entry's ``build`` on use:
``build(model, tokenizer, call)`` returns the extra ``generate()`` kwargs of one call. ``call`` is tooling's (this
module imports nothing of it): ``call.option(key)``, ``call.given(*keys)``, ``call.length()``, ``call.trained(...)``
... (see ``tooling.methods.MethodCall``). ``source`` declares the trained drafter an option names.
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
