"""MagicDec's method of the command line, the benchmark and the app.

How ``METHODS`` and its builds are read and called: :mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

from typing import Any

METHODS = [
    {"name": "magicdec", "order": 190, "label": "MagicDec (hfs)",
     "description": "hf_speculative's MagicDec: the target drafts for itself over a compressed KV cache (attention "
                    "sinks and a recent window), for long contexts and large batches; it drafts nothing while the "
                    "context fits in the window.",
     "options": {"window": 512, "sinks": 4, "num_tokens": None, "adaptive": True}, "build": "build_magicdec",
     "app": False},  # the app's requests are chats shorter than its window: it would draft nothing there
]


def build_magicdec(model: Any, tokenizer: Any, call: Any) -> dict:
    from .strategy import MagicDec

    return {"candidate_generator": MagicDec(window=call.option("window"), sinks=call.option("sinks"),
                                            adaptive=call.flag("adaptive"), **call.length())}  # it checks them
