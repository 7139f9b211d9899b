"""The names users imported from here before the drafter root was split (issue 68): the strategy root is
:mod:`~hf_speculative.drafters.strategy`, the per-call drafter :mod:`~hf_speculative.drafters.generator`, its adapter
to transformers' assisted loop :mod:`~hf_speculative.drafters.assisted`, the call object :mod:`hf_speculative.core.call`.
Nothing in the package imports this module."""

from ..core.call import CallContext
from .generator import (ExternalCandidateGenerator, SpeculativeCandidateGenerator, TreeOrChainCandidateGenerator,
                        check_network_once, to_target_vocab)
from .strategy import DraftStrategy

__all__ = ["CallContext", "DraftStrategy", "ExternalCandidateGenerator", "SpeculativeCandidateGenerator",
           "TreeOrChainCandidateGenerator", "check_network_once", "to_target_vocab"]
