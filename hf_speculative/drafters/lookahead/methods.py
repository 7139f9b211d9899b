"""Lookahead decoding's method of the command line, the benchmark and the app.

How ``METHODS`` and its builds are read and called: :mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

from typing import Any

METHODS = [
    {"name": "lookahead", "order": 140, "label": "Lookahead (hfs)",
     "description": "hf_speculative's lookahead decoding: a Jacobi window and an n-gram pool verified in one tree per "
                    "forward.",
     "options": {"max_ngram": None}, "build": "build_lookahead"},
]


def build_lookahead(model: Any, tokenizer: Any, call: Any) -> dict:
    from .drafter import Lookahead

    ngram = call.option("max_ngram")  # --max-ngram: the n-gram size N (Lookahead checks it)
    return {"candidate_generator": Lookahead() if ngram is None else Lookahead(ngram=ngram)}
