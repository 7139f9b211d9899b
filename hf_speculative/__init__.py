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
from pathlib import Path
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> (module relative to this package, attribute in it; None: the module itself). The drafters are not
# listed here: each drafter folder declares its public names (``PUBLIC`` in its ``__init__``), found on first use.
_LAZY: dict[str, tuple[str, str | None]] = {
    "CallContext": (".core.call", "CallContext"),
    "Capabilities": (".drafters.registry", "Capabilities"),
    "DraftStrategy": (".drafters.strategy", "DraftStrategy"),
    "SpeculativeCandidateGenerator": (".drafters.generator", "SpeculativeCandidateGenerator"),
    "SpeculativeStats": (".core.stats", "SpeculativeStats"),
    "disable": (".hf.integration", "disable"),
    "enable": (".hf.integration", "enable"),
    "is_enabled": (".hf.integration", "is_enabled"),
    "last_stats": (".hf.integration", "last_stats"),
    "speculative_generate": (".hf.integration", "speculative_generate"),
    "DraftTree": (".core.tree", "DraftTree"),
    "Plan": (".core.budget", "Plan"),
    "Sizing": (".core.budget", "Sizing"),
    "DynamicTree": (".core.tree_shapes", "DynamicTree"),
    "StaticTree": (".core.tree_shapes", "StaticTree"),
    "forget": (".core.state", "forget"),
    "load_model": (".registry.models", "load_model"),
    "models": (".registry.models", None),
    "optimize_for_cpu": (".cpu.layout", "optimize_for_cpu"),
    "prefill": (".hf.prefill", "prefill"),
    "use_profile": (".core.cost_profile", "use_profile"),
}

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs (the drafters: hf_speculative.drafters.*)
    from .registry import models
    from .core.call import CallContext
    from .drafters.strategy import DraftStrategy
    from .drafters.generator import SpeculativeCandidateGenerator
    from .drafters.registry import Capabilities
    from .core.cost_profile import use_profile
    from .cpu.layout import optimize_for_cpu
    from .hf.integration import disable, enable, is_enabled, last_stats, speculative_generate
    from .hf.prefill import prefill
    from .registry.models import load_model
    from .core.state import forget
    from .core.stats import SpeculativeStats
    from .core.budget import Plan, Sizing
    from .core.tree import DraftTree
    from .core.tree_shapes import DynamicTree, StaticTree


def _is_submodule(name: str) -> bool:
    """Whether ``name`` is one of this package's modules (``from . import compat`` asks this module's ``__getattr__``
    first: answered without looking for drafters)."""
    here = Path(__file__).parent
    return (here / name).is_dir() or (here / f"{name}.py").is_file()


def _drafters() -> dict[str, str]:
    """The drafter folders' public names -> the module defining each (their ``__init__`` modules: no torch)."""
    from .drafters.registry import public_names

    return public_names()


def __getattr__(name: str) -> Any:
    """PEP 562: import the module behind a lazy public name on first access, then keep the value."""
    if name == "__all__":  # every public name, the drafters' included (``from hf_speculative import *``)
        value: Any = sorted({*_LAZY, *_drafters()})
    elif name in _LAZY:
        module_name, attribute = _LAZY[name]
        module = importlib.import_module(module_name, __name__)
        value = module if attribute is None else getattr(module, attribute)
    elif not name.startswith("__") and not _is_submodule(name) and name in _drafters():
        value = getattr(importlib.import_module(_drafters()[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_drafters()))
