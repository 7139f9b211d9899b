"""EAGLE's methods of the command line, the benchmark and the app: chains and dynamic trees.

How ``METHODS`` and its builds are read and called: :mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

from typing import Any

METHODS = [
    {"name": "eagle", "order": 30, "label": "EAGLE (hfs)",
     "description": "hf_speculative's EAGLE drafter: one trained layer reading the target's own hidden states.",
     "options": {"eagle": None, "num_tokens": None}, "build": "build_eagle",
     "source": {"option": "eagle", "what": "EAGLE drafter", "shipped": "shipped",
                "missing": "pass --eagle PATH to a trained drafter."}},
    {"name": "eagle-tree", "order": 50, "label": "EAGLE tree (hfs)",
     "description": "hf_speculative's EAGLE drafter drafting EAGLE-2 dynamic trees, verified in one forward with tree "
                    "attention in hf_speculative's own loop; the tree's size per step follows the measured verification "
                    "cost.",
     "options": {"eagle": None, "num_tokens": None, "tree_nodes": 32, "adaptive": True}, "build": "build_eagle_tree"},
]


def shipped() -> list[str]:
    """The targets an EAGLE drafter ships for."""
    from .drafter import pretrained_names

    return pretrained_names()


def build_eagle(model: Any, tokenizer: Any, call: Any) -> dict:
    from .drafter import Eagle

    return call.trained("eagle", cache_key="_eagle_strategies",
                        load=lambda source, settings: Eagle.from_pretrained(source, target=model, **settings))


def build_eagle_tree(model: Any, tokenizer: Any, call: Any) -> dict:
    """EAGLE drafting dynamic trees, their size per step chosen from the measured verification cost."""
    from .drafter import Eagle

    shape = call.tree_shape(call.tree_nodes())

    def load(source: Any, settings: dict) -> Eagle:
        return Eagle.from_pretrained(source, target=model, tree=shape,
                                     **{k: v for k, v in settings.items() if k != "tree_nodes"})

    return call.trained("eagle", cache_key="_eagle_tree_strategies", load=load,
                        settings={"adaptive": call.flag("adaptive"), "tree_nodes": shape.nodes})
