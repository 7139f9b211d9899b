"""SuffixDecoding's method of the command line, the benchmark and the app.

How ``METHODS`` and its builds are read and called: :mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

from typing import Any

METHODS = [
    {"name": "suffix", "order": 130, "label": "SuffixDecoding (hfs)",
     "description": "hf_speculative's SuffixDecoding: draft trees from suffix tries over the call's text and the "
                    "model's earlier outputs in this process.",
     "options": {"num_tokens": None}, "build": "build_suffix"},
]


def build_suffix(model: Any, tokenizer: Any, call: Any) -> dict:
    from .drafter import SuffixDecoding

    nodes = call.option("num_tokens")  # --num-tokens: the most nodes per step (SuffixDecoding checks it)
    return {"candidate_generator": SuffixDecoding() if nodes is None else SuffixDecoding(max_nodes=nodes)}
