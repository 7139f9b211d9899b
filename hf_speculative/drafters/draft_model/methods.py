"""The draft model's method of the command line, the benchmark and the app.

``hf_speculative.tooling.methods`` reads ``METHODS`` (plain data) without importing this module, so that
``hf-speculative --help`` lists the methods before any drafter loads, and calls an entry's ``build`` on use:
``build(model, tokenizer, call)`` returns the extra ``generate()`` kwargs of one call. ``call`` is tooling's (this
module imports nothing of it): ``call.option(key)``, ``call.given(*keys)``, ``call.length()``, ``call.trained(...)``
... (see ``tooling.methods.MethodCall``). ``source`` declares the trained drafter an option names.
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
