"""DFlash's methods of the command line, the benchmark and the app: block chains and top-k trees.

How ``METHODS`` and its builds are read and called: :mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

from typing import Any

METHODS = [
    {"name": "dflash", "order": 170, "label": "DFlash (hfs)",
     "description": "hf_speculative's DFlash block drafter: one forward of a small network reading the target's "
                    "hidden states drafts a whole block, verified as a chain.",
     "options": {"num_tokens": None, "adaptive": True}, "build": "build_dflash",
     "unlisted_options": ["dflash"],  # a drafter folder (default: the one shipped for the model)
     "source": {"option": "dflash", "what": "DFlash drafter", "shipped": "shipped",
                "missing": "pass --option dflash=PATH to a trained drafter (hf-speculative train-dflash)."}},
    {"name": "dflash-tree", "order": 180, "label": "DFlash tree (hfs)",
     "description": "hf_speculative's DFlash block drafter drafting a tree of each position's likeliest guesses from "
                    "one forward, verified in one forward with tree attention; the tree's size per step follows the "
                    "measured verification cost.",
     "options": {"tree_nodes": 32, "adaptive": True}, "build": "build_dflash_tree",
     "unlisted_options": ["dflash"]},
]


def shipped() -> list[str]:
    """The targets a DFlash drafter ships for."""
    from .drafter import pretrained_names

    return pretrained_names()


def build_dflash(model: Any, tokenizer: Any, call: Any) -> dict:
    from .drafter import DFlash

    return call.trained("dflash", cache_key="_dflash_strategies", settings={"adaptive": call.flag("adaptive")},
                        load=lambda source, settings: DFlash.from_pretrained(source, target=model, **settings))


def build_dflash_tree(model: Any, tokenizer: Any, call: Any) -> dict:
    """DFlash drafting top-k trees from one block, their size per step chosen from the measured verification cost."""
    from .drafter import DFlash

    shape = call.tree_shape(call.tree_nodes())

    def load(source: Any, settings: dict) -> DFlash:
        return DFlash.from_pretrained(source, target=model, tree=shape,
                                      **{k: v for k, v in settings.items() if k != "tree_nodes"})

    return call.trained("dflash", cache_key="_dflash_tree_strategies", load=load,
                        settings={"adaptive": call.flag("adaptive"), "tree_nodes": shape.nodes})
