"""hf_speculative: lossless speculative decoding for Hugging Face transformers.

    import hf_speculative as hfs
    hfs.enable(model)
    out = model.generate(**inputs, candidate_generator=hfs.PromptLookup())
    print(hfs.last_stats(model).summary())

Importing the package loads nothing heavy, not even torch: every public name loads its module on first use
(``hfs.enable`` loads torch, transformers and the loop; ``hfs.Eagle`` or ``from hf_speculative import Eagle``
the EAGLE drafter, with transformers' Llama modelling; ``hfs.load_model`` the registry, with the POSIX file
lock). transformers' ``generation.utils``, which imports accelerate when it is installed, loads on the first
call. The command line, the demo app and training are never imported from here (they need extras: see
:mod:`hf_speculative.extras`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> (module relative to this package, attribute in it; None: the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "CallContext": (".base", "CallContext"),
    "DraftStrategy": (".base", "DraftStrategy"),
    "SpeculativeCandidateGenerator": (".base", "SpeculativeCandidateGenerator"),
    "SpeculativeStats": (".stats", "SpeculativeStats"),
    "disable": (".integration", "disable"),
    "enable": (".integration", "enable"),
    "is_enabled": (".integration", "is_enabled"),
    "last_stats": (".integration", "last_stats"),
    "speculative_generate": (".integration", "speculative_generate"),
    "DraftModel": (".drafters.draft_model", "DraftModel"),
    "DraftTree": (".tree", "DraftTree"),
    "DynamicTree": (".tree_shapes", "DynamicTree"),
    "StaticTree": (".tree_shapes", "StaticTree"),
    "forget": (".state", "forget"),
    "Eagle": (".drafters.eagle.drafter", "Eagle"),
    "EarlyExit": (".drafters.self_speculative", "EarlyExit"),
    "Hybrid": (".drafters.hybrid", "Hybrid"),
    "Medusa": (".drafters.medusa.drafter", "Medusa"),
    "LayerSkip": (".drafters.self_speculative", "LayerSkip"),
    "Lookahead": (".drafters.lookahead", "Lookahead"),
    "PromptLookup": (".drafters.prompt_lookup", "PromptLookup"),
    "SuffixDecoding": (".drafters.suffix", "SuffixDecoding"),
    "load_model": (".models", "load_model"),
    "models": (".models", None),
    "optimize_for_cpu": (".cpu_layout", "optimize_for_cpu"),
    "use_profile": (".cost_profile", "use_profile"),
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from . import models
    from .base import CallContext, DraftStrategy, SpeculativeCandidateGenerator
    from .cost_profile import use_profile
    from .cpu_layout import optimize_for_cpu
    from .drafters.draft_model import DraftModel
    from .drafters.eagle.drafter import Eagle
    from .drafters.hybrid import Hybrid
    from .drafters.lookahead import Lookahead
    from .drafters.medusa.drafter import Medusa
    from .drafters.prompt_lookup import PromptLookup
    from .drafters.self_speculative import EarlyExit, LayerSkip
    from .drafters.suffix import SuffixDecoding
    from .integration import disable, enable, is_enabled, last_stats, speculative_generate
    from .models import load_model
    from .state import forget
    from .stats import SpeculativeStats
    from .tree import DraftTree
    from .tree_shapes import DynamicTree, StaticTree


def __getattr__(name: str) -> Any:
    """PEP 562: import the module behind a lazy public name on first access, then keep the value."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name, __name__)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
