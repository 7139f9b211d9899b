"""hf_speculative: lossless speculative decoding for Hugging Face transformers.

    import hf_speculative as hfs
    hfs.enable(model)
    out = model.generate(**inputs, candidate_generator=hfs.PromptLookup())
    print(hfs.last_stats(model).summary())
"""

from . import models
from .base import CallContext, DraftStrategy, SpeculativeCandidateGenerator
from .cpu_layout import optimize_for_cpu
from .drafters.draft_model import DraftModel
from .drafters.eagle.drafter import Eagle
from .drafters.hybrid import Hybrid
from .drafters.prompt_lookup import PromptLookup
from .drafters.self_speculative import EarlyExit, LayerSkip
from .integration import disable, enable, is_enabled, last_stats, speculative_generate
from .models import load_model
from .stats import SpeculativeStats

__version__ = "0.1.0"

__all__ = [
    "CallContext",
    "DraftModel",
    "DraftStrategy",
    "EarlyExit",
    "Eagle",
    "Hybrid",
    "LayerSkip",
    "PromptLookup",
    "SpeculativeCandidateGenerator",
    "SpeculativeStats",
    "disable",
    "enable",
    "is_enabled",
    "last_stats",
    "load_model",
    "models",
    "optimize_for_cpu",
    "speculative_generate",
]
