"""hf_speculative: lossless speculative decoding for Hugging Face transformers.

    import hf_speculative as hfs
    hfs.enable(model)
    out = model.generate(**inputs, candidate_generator=hfs.PromptLookup())
    print(hfs.last_stats(model).summary())

Importing the package loads only what ``enable`` / ``generate`` need (torch, a few of transformers' generation
modules, :mod:`.base`, :mod:`.integration`, :mod:`.stats`); transformers' ``generation.utils``, which imports
accelerate when it is installed, loads on first use. The drafters, the CPU layouts and the
model registry load on first use of their name (``hfs.Eagle``, ``from hf_speculative import Eagle``):
EAGLE alone pulls in transformers' Llama modelling, and the registry the POSIX file lock. The command
line, the demo app and training are never imported from here (they need extras: see
:mod:`hf_speculative.extras`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import CallContext, DraftStrategy, SpeculativeCandidateGenerator
from .integration import disable, enable, is_enabled, last_stats, speculative_generate
from .stats import SpeculativeStats

__version__ = "0.1.0"

# public name -> (module relative to this package, attribute in it; None: the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
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

__all__ = sorted([
    "CallContext",
    "DraftStrategy",
    "SpeculativeCandidateGenerator",
    "SpeculativeStats",
    "disable",
    "enable",
    "is_enabled",
    "last_stats",
    "speculative_generate",
    *_LAZY,
])

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from . import models
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
    from .models import load_model
    from .state import forget
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
