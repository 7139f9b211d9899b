"""The draft model's methods of the command line, the benchmark and the app.

How ``METHODS`` and its builds are read and called: :mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

from typing import Any

METHODS = [
    {"name": "draft-model", "order": 20, "label": "Draft model (hfs)",
     "description": "hf_speculative's draft model: a smaller model with the same tokenizer drafts greedily.",
     "options": {"draft_model": None, "num_tokens": None, "adaptive": True, "kernel_weights": None},
     "build": "build_draft_model"},
    # after transformers' methods (orders 100-125): the same pair as hf-assisted-uag
    {"name": "draft-model-uag", "order": 130, "label": "Draft model, another tokenizer (hfs)",
     "description": "hf_speculative's draft model with a drafter of another tokenizer: its drafts are decoded to text "
                    "and encoded with the target's tokenizer (universal assisted generation).",
     "options": {"draft_model": None, "num_tokens": None, "adaptive": True}, "build": "build_draft_model_uag",
     "app": False},  # the app's draft-model list holds same-tokenizer models only
]


def build_draft_model(model: Any, tokenizer: Any, call: Any) -> dict:
    from .drafter import DraftModel

    # adaptive=False (--fixed-budget): always the whole num_tokens, to measure τ without the cost model
    return {"candidate_generator": DraftModel(call.draft_model(), adaptive=call.flag("adaptive"),
                                              **call.given("num_tokens", "kernel_weights"))}


def build_draft_model_uag(model: Any, tokenizer: Any, call: Any) -> dict:
    from .drafter import DraftModel

    if tokenizer is None:
        raise ValueError(f"method {call.name!r} needs the target's tokenizer")
    draft = call.draft_model()
    # adaptive=False (--fixed-budget): always the whole num_tokens, to measure τ without the cost model
    return {"candidate_generator": DraftModel(draft, tokenizer=call.draft_tokenizer(), target_tokenizer=tokenizer,
                                              adaptive=call.flag("adaptive"), **call.given("num_tokens"))}
