"""The call object: what one ``generate()`` call's steps and its drafter need, passed down explicitly.

A :class:`CallContext` is built by the loop's entry for every call (for every row of a batch) and handed to
``strategy.open(ctx)``. Besides the call's settings (generation config, processors, stopping criteria, stats) it
carries how the target's forwards look to a drafter that reads them (:class:`TargetView`: hidden states from
hooks or from the verifier, padding rows of a static step, a batch row's columns) and which cost model prices
its drafts (``cost_key``: a static-cache verifier's padded forward, else the dynamic one's). Nothing of this
travels through context variables: a drafter reads it from its ``ctx``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from .. import compat
from .stats import SpeculativeStats


@dataclasses.dataclass
class TargetView:
    """How the running call's target forwards look to what reads their hidden states (``features.FeatureTap``).

    Attributes:
        feed (`StatesFeed`, *optional*): the verifier publishes the hidden states of its forwards (a compiled one
            runs no hooks); ``None``: taps hook the target's modules.
        padding (`int`): rows at the end of the forward running now that are padding (a static step is padded to one
            shape); taps leave them out. Set by the verifier around each forward.
        row (`tuple[int, torch.Tensor]`, *optional*): while a batched forward is handed to one row's drafter, that
            row's index in the forward's batch and its real columns `[T']`; set by the batch loop.
    """

    feed: Any = None
    padding: int = 0
    row: tuple[int, torch.Tensor] | None = None


@dataclasses.dataclass
class CallContext:
    """What a per-call drafter needs to know about the ``generate()`` call it serves."""

    target: torch.nn.Module
    generation_config: Any
    logits_processor: Any
    stopping_criteria: Any
    stats: SpeculativeStats
    # the loop's model kwargs when the generator was built; their cache (``compat.target_cache``) is
    # the target's for the whole call (self-speculative drafters write into it and crop it back)
    model_kwargs: dict | None = None
    view: TargetView = dataclasses.field(default_factory=TargetView)
    # ``(padded budget, compiled)`` on a static-cache verifier: its drafts are priced at the padded forward's cost
    cost_key: tuple[int, bool] | None = None
    # the prompt's length without padding, set when the call starts (transformers' loop: at its first draft)
    prompt_length: int | None = None

    @property
    def max_length(self) -> int:
        return int(self.generation_config.max_length)

    @functools.cached_property
    def vocab_size(self) -> int:
        """Width of the target's logits (the lm_head's padded size, e.g. 151936 for Qwen); read once
        per call, drafters pad or cut their logits to it at every step."""
        head = self.target.get_output_embeddings()
        if head is not None and getattr(head, "out_features", None):
            return int(head.out_features)
        return int(compat.text_config(self.target.config).vocab_size)

    def verify_costs(self, max_tokens: int) -> Any:
        """The cost model of this call's verifying forwards (``costs.verify_costs_for``; the padded one on a static
        cache), for drafts of up to ``max_tokens`` tokens."""
        from .costs import verify_costs_for

        return verify_costs_for(self.target, max_tokens, padded=self.cost_key)
