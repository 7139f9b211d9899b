"""The hybrids' methods of the command line, the benchmark and the app: prompt lookup, then EAGLE.

``hybrid`` is the spec's method and the test matrix's example of the same drafter; until issue 68 it was called
``eagle+lookup`` here, a name still taken (``aliases``). How ``METHODS`` and its builds are read and called:
:mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

from typing import Any

METHODS = [
    {"name": "hybrid", "aliases": ["eagle+lookup"], "order": 40, "label": "EAGLE + lookup (hfs)",
     "description": "hf_speculative's hybrid: prompt lookup when an n-gram match pays, else the EAGLE drafter "
                    "(hfs.Hybrid).",
     "options": {"eagle": None, "num_tokens": None, "max_ngram": None}, "build": "build_hybrid"},
    {"name": "hybrid-tree", "aliases": ["eagle+lookup-tree"], "order": 60, "label": "EAGLE + lookup trees (hfs)",
     "description": "hf_speculative's hybrid with trees: a tree of several prompt-lookup matches when one pays, else an "
                    "EAGLE dynamic tree (hfs.Hybrid with tree= members, hf_speculative's own loop).",
     "options": {"eagle": None, "num_tokens": None, "max_ngram": None, "tree_nodes": 32, "adaptive": True},
     "build": "build_hybrid_tree"},
]


def build_hybrid(model: Any, tokenizer: Any, call: Any) -> dict:
    from .drafter import Hybrid

    eagle = call.build("eagle")["candidate_generator"]  # --eagle, --num-tokens (loaded once: cached in the options)
    lookup = call.strategy("prompt-lookup", **call.given("max_ngram"))  # (it checks the type)
    return {"candidate_generator": Hybrid(lookup, eagle)}


def build_hybrid_tree(model: Any, tokenizer: Any, call: Any) -> dict:
    """The hybrid of lookup trees (several n-gram matches) and EAGLE trees, in hf_speculative's own loop."""
    from .drafter import Hybrid

    nodes = call.tree_nodes()
    eagle = call.build("eagle-tree")["candidate_generator"]
    lookup = call.strategy("prompt-lookup", tree=call.tree_shape(nodes), adaptive=call.flag("adaptive"),
                           **call.given("max_ngram"))
    return {"candidate_generator": Hybrid(lookup, eagle)}
