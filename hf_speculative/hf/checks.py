"""What a call's strategy must be able to do, read from what its drafter declares (the drafter registry).

The core never reads the registry: the checks live here, in the transformers adapter's layer, and hand the core
plain numbers (:func:`draft_budget` to :func:`~hf_speculative.core.static_cache.verifier_for`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..core.static_cache import MAX_BUDGET, StaticCacheError
from ..drafters.strategy import DraftStrategy
from ..drafters.registry import capabilities_of, name_of, registered


def drafts_trees(strategy: Any) -> bool:
    """Whether ``strategy`` drafts trees (``tree=`` set, or a drafter that only drafts trees), as it declares
    (:func:`~hf_speculative.drafters.registry.capabilities_of`); a user's raw ``CandidateGenerator`` drafts chains.
    Trees need our loop and an attention that takes a tree mask."""
    return capabilities_of(strategy).trees


def draft_budget(strategy: Any) -> int:
    """The most draft nodes ``strategy`` proposes in one step, as it declares (``DraftStrategy.draft_budget``: its
    tree's ``nodes``, its ``num_tokens`` for chains, the largest of a Hybrid's members); a user's raw
    ``CandidateGenerator``, which declares nothing, by its ``num_tokens`` if it has one; else the option limit."""
    if isinstance(strategy, DraftStrategy):
        budget = strategy.draft_budget()
    else:
        budget = getattr(strategy, "num_tokens", None)
    return int(budget or MAX_BUDGET)


def check_strategy(strategy: Any, compiled: bool = False) -> None:
    """Raise :class:`StaticCacheError` when ``strategy`` cannot draft for a static-cache target (``compiled``: a
    compiled one), as its capabilities declare (:func:`~hf_speculative.drafters.registry.capabilities_of`)."""
    capabilities = capabilities_of(strategy)
    if capabilities.reads_target == "cache":
        why = "drafts with the target's own layers over its dynamic KV cache, which a static cache cannot lend"
    elif not capabilities.static_cache:
        why = "declares that it cannot draft for a static cache"
    elif compiled and not capabilities.compile:
        why = "declares that it cannot draft for a compiled target"
    else:
        return
    able = sorted({cls.__name__ for cls in registered().values() if cls.capabilities.static_cache})
    raise StaticCacheError(f"{type(strategy).__name__} {why}; use it without cache_implementation='static' and "
                           f"compile=, or draft with one that can: {', '.join(able)}.")


def check_batch_strategy(strategy: Any) -> None:
    """Raise a ``ValueError`` naming the fix unless ``strategy`` drafts for batches (B > 1), as its capabilities
    declare (:func:`~hf_speculative.drafters.registry.capabilities_of`)."""
    if capabilities_of(strategy).batch:
        return

    def needs_arguments(cls: type) -> bool:  # a field without a default (a model, a network): "(...)"
        return any(f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   for f in dataclasses.fields(cls))

    name = name_of(strategy)
    able = [cls for method, cls in registered().items() if cls.method == method and cls.capabilities.batch]
    calls = [f"hfs.{cls.__name__}({'...' if needs_arguments(cls) else ''})"
             for cls in sorted(able, key=lambda cls: (needs_arguments(cls), cls.method))]
    listed = " and ".join(filter(None, [", ".join(calls[:-1]), calls[-1]])) if calls else "no drafter"
    raise ValueError(
        f"Batched speculative decoding (batch size > 1) supports {listed}, not {name!r} ({type(strategy).__name__}). "
        f"Use one of those for batches, or call generate() once per prompt with this drafter.")


# The dtypes an embedding takes as indices: transformers' forward refuses the others (floats, int8, bool...), but only
# once a drafter has read the tokens (prompt lookup copies whatever they hold, floats included).
TOKEN_DTYPES = (torch.long, torch.int32)


def check_call_inputs(input_ids: torch.Tensor, attention_mask: Any = None) -> None:
    """Raise a ``ValueError`` naming the fix for ``input_ids`` (a 2-D tensor, as ``check_input_ids`` has it) of a dtype
    that is not token ids, or an ``attention_mask`` whose shape is not theirs. Reads shapes and dtypes only."""
    if input_ids.dtype not in TOKEN_DTYPES:
        raise ValueError(f"input_ids hold {input_ids.dtype}, and token ids are integers of dtype torch.long (or "
                         "torch.int32): pass the tokenizer's input_ids as they are "
                         "(tokenizer(text, return_tensors='pt')), or convert them with input_ids.long().")
    if attention_mask is None:
        return
    shape = tuple(getattr(attention_mask, "shape", ()))
    if shape != tuple(input_ids.shape):
        raise ValueError(f"attention_mask has shape {shape} and input_ids {tuple(input_ids.shape)}: it needs one "
                         "entry per token, the same [batch, length]. Pass the attention_mask the tokenizer returned "
                         "with these input_ids (tokenizer(texts, return_tensors='pt', padding=True)), or none for "
                         "unpadded prompts.")
