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
    "CallContext": (".drafters.base", "CallContext"),
    "DraftStrategy": (".drafters.base", "DraftStrategy"),
    "SpeculativeCandidateGenerator": (".drafters.base", "SpeculativeCandidateGenerator"),
    "SpeculativeStats": (".core.stats", "SpeculativeStats"),
    "disable": (".hf.integration", "disable"),
    "enable": (".hf.integration", "enable"),
    "is_enabled": (".hf.integration", "is_enabled"),
    "last_stats": (".hf.integration", "last_stats"),
    "speculative_generate": (".hf.integration", "speculative_generate"),
    "DraftModel": (".drafters.draft_model", "DraftModel"),
    "DraftTree": (".core.tree", "DraftTree"),
    "DynamicTree": (".core.tree_shapes", "DynamicTree"),
    "StaticTree": (".core.tree_shapes", "StaticTree"),
    "forget": (".core.state", "forget"),
    "Eagle": (".drafters.eagle.drafter", "Eagle"),
    "EarlyExit": (".drafters.self_speculative", "EarlyExit"),
    "Hybrid": (".drafters.hybrid", "Hybrid"),
    "Medusa": (".drafters.medusa.drafter", "Medusa"),
    "LayerSkip": (".drafters.self_speculative", "LayerSkip"),
    "Lookahead": (".drafters.lookahead", "Lookahead"),
    "PromptLookup": (".drafters.prompt_lookup", "PromptLookup"),
    "SuffixDecoding": (".drafters.suffix", "SuffixDecoding"),
    "load_model": (".registry.models", "load_model"),
    "models": (".registry.models", None),
    "optimize_for_cpu": (".cpu.layout", "optimize_for_cpu"),
    "use_profile": (".core.cost_profile", "use_profile"),
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from .registry import models
    from .drafters.base import CallContext, DraftStrategy, SpeculativeCandidateGenerator
    from .core.cost_profile import use_profile
    from .cpu.layout import optimize_for_cpu
    from .drafters.draft_model.drafter import DraftModel
    from .drafters.eagle.drafter import Eagle
    from .drafters.hybrid.drafter import Hybrid
    from .drafters.lookahead.drafter import Lookahead
    from .drafters.medusa.drafter import Medusa
    from .drafters.prompt_lookup.drafter import PromptLookup
    from .drafters.self_speculative.strategies import EarlyExit, LayerSkip
    from .drafters.suffix.drafter import SuffixDecoding
    from .hf.integration import disable, enable, is_enabled, last_stats, speculative_generate
    from .registry.models import load_model
    from .core.state import forget
    from .core.stats import SpeculativeStats
    from .core.tree import DraftTree
    from .core.tree_shapes import DynamicTree, StaticTree


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
