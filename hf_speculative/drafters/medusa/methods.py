"""Medusa's methods of the command line, the benchmark and the app: chains and the calibrated static tree.

How ``METHODS`` and its builds are read and called: :mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

METHODS = [
    {"name": "medusa", "order": 150, "label": "Medusa (hfs)",
     "description": "hf_speculative's Medusa heads on the target's last hidden state: a chain of each head's top guess "
                    "(the heads shipped for the model).",
     "options": {"num_tokens": None}, "build": "build_medusa",
     "unlisted_options": ["medusa"],  # a folder of trained heads (default: the ones shipped for the model)
     "source": {"option": "medusa", "what": "Medusa heads", "singular": "set of Medusa heads", "shipped": "shipped",
                "missing": "train heads with `hf-speculative train-medusa --target ...` and pass them with "
                           "candidate_generator=hfs.Medusa.from_pretrained(path, target=model)."}},
    {"name": "medusa-tree", "order": 160, "label": "Medusa tree (hfs)",
     "description": "hf_speculative's Medusa heads drafting the static tree calibrated on their validation ranks, "
                    "verified in one forward in hf_speculative's own loop; the tree's size per step follows the "
                    "measured cost.",
     "options": {"num_tokens": None, "tree_nodes": 16, "adaptive": True}, "build": "build_medusa_tree",
     "unlisted_options": ["medusa"]},
]


def shipped() -> list[str]:
    """The targets trained Medusa heads ship for."""
    from .drafter import pretrained_names

    return pretrained_names()


def build_medusa(model: Any, tokenizer: Any, call: Any) -> dict:
    return _heads(model, call, tree=False)


def build_medusa_tree(model: Any, tokenizer: Any, call: Any) -> dict:
    return _heads(model, call, tree=True)


def _heads(model: Any, call: Any, tree: bool) -> dict:
    """The Medusa heads shipped for ``model``: chains of each head's top guess, or the tree calibrated when they
    were trained (its first ``tree_nodes`` rank paths, parents first). Loaded once per model and settings."""
    from ...core.tree_shapes import StaticTree
    from .drafter import Medusa

    extra = {"adaptive": call.flag("adaptive"), "tree_nodes": call.tree_nodes()} if tree else {}

    def load(source: Any, settings: dict) -> Medusa:
        nodes = settings.pop("tree_nodes", None)
        strategy = Medusa.from_pretrained(source, target=model, tree="calibrated" if tree else None, **settings)
        if tree and strategy.tree.size > nodes:
            strategy = dataclasses.replace(strategy, tree=StaticTree(strategy.tree.paths[:nodes]))
        return strategy

    return call.trained("medusa", cache_key=f"_{call.name}_strategies", settings=extra, load=load)
