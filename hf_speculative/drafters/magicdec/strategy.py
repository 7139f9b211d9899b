"""``hfs.MagicDec``: self-speculation over a compressed KV cache, for long contexts and large batches.

The target drafts for itself with all its weights, attending only to a bounded second cache: the first ``sinks``
tokens of each row and its latest ``window`` (StreamingLLM's attention sinks and recent window, as MagicDec, Chen et
al. 2024, drafts), holding the keys and values the target itself computed, at their true positions. Verification
is every drafter's: one forward of the target over its full cache, so the output is exact under greedy decoding and
both sampling rules. At long contexts the cache, not the weights, is most of what a step reads, per row; a draft step
reads the weights and a bounded cache, so it is cheap exactly where batches are large and contexts long, and it is
the model itself, so its drafts are accepted often. The cost rule (``costs.py``) drafts only where that pays, from
this call's measured full steps and draft steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ... import compat, options
from ...core import sdpa
from ...core.policy import check_chain_options
from ...options import CheckedOnAssignment
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..registry import Capabilities, ExampleNotApplicable

MAX_WINDOW = 1 << 17  # ``window``: positions kept per row (the cache is bounded by it: 131072)
MAX_SINKS = 1024  # ``sinks``: first positions kept per row
# attention implementations that take the 4-D mask a compressed cache needs (core.verify.TREE_ATTENTION's)
_MASKED_ATTENTION = ("eager", *sdpa.SDPA_NAMES)


@dataclasses.dataclass(eq=False)
class MagicDec(CheckedOnAssignment, DraftStrategy, method="magicdec",
               capabilities=Capabilities(batch=True, reads_target="cache"), examples=("magicdec",)):
    """Draft with the target itself over a compressed KV cache: attention sinks and a recent window.

    Args:
        window (`int`, defaults to 512): the latest positions of each row its draft attends to (the cache's size,
            with ``sinks``). A row whose text fits in ``sinks + window`` drafts nothing (a draft step would cost a
            full one). Larger: drafts accepted more often, draft steps dearer.
        sinks (`int`, defaults to 4): the first positions of each row its draft always attends to (StreamingLLM's
            attention sinks).
        num_tokens (`int`, defaults to 4): the longest draft.
        confidence_threshold (`float`, defaults to 0.1): stop a row's draft after a token the draft gives less than
            this probability (0 disables).
        adaptive (`bool`, defaults to `True`): draft only when it pays at this batch and context, from the measured
            costs of a full-cache step and a compressed-cache step; ``False``: draft ``num_tokens`` at every step
            the context allows.
        draft_cost (`float`, *optional*): one draft step in plain decoding steps; measured by default.
    """

    window: int = 512
    sinks: int = 4
    num_tokens: int = 4
    confidence_threshold: float = 0.1
    adaptive: bool = True
    draft_cost: float | None = None

    def __post_init__(self):
        self.window = options.check_int("MagicDec", "window", self.window, 1, MAX_WINDOW)
        self.sinks = options.check_int("MagicDec", "sinks", self.sinks, 0, MAX_SINKS)
        check_chain_options(self)

    def validate_target(self, target: torch.nn.Module) -> None:
        check_target(target)

    def open(self, ctx: CallContext) -> Any:
        from .drafter import MagicDecCandidateGenerator

        self.validate_target(ctx.target)  # (a loop entered without generate(), which checks it first)
        return MagicDecCandidateGenerator(ctx, self)

    def cache_bytes(self, target: torch.nn.Module, rows: int = 1) -> int:
        """The most bytes the compressed caches of ``rows`` rows hold for ``target``: ``rows * (sinks + window)``
        tokens' keys and values over every layer, in the target's dtype."""
        config = compat.text_config(target.config)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        item = target.get_input_embeddings().weight.element_size()
        return rows * (self.sinks + self.window) * config.num_hidden_layers * 2 * heads * head_dim * item

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> MagicDec:
        """Chains of 4 at every step over a cache of 2 sinks and a window of 4 (the matrix's prompts are longer, so
        it evicts from the first step); a target with sliding-window layers is not one it drafts for."""
        try:
            check_target(target)
        except ValueError as why:
            raise ExampleNotApplicable(str(why)) from None
        settings = {"window": 4, "sinks": 2, "num_tokens": 4, "confidence_threshold": 0.0, "adaptive": False}
        return cls(**{**settings, **options})


def check_target(target: torch.nn.Module) -> None:
    """Raise a ``ValueError`` naming the reason and the fix when ``target``'s attention cannot draft over a compressed
    cache: layers with a sliding window or without attention (Gemma 2/3's and Mistral's windows, hybrid caches of
    linear-attention or state-space layers), whose own caches a sinks-and-window cache cannot stand for, or an
    attention that takes no 4-D mask (flash attention)."""
    name = type(target).__name__
    config = compat.text_config(target.config)
    kinds = set(getattr(config, "layer_types", None) or [])
    blocks = set(getattr(config, "layers_block_type", None) or [])
    windowed = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) and not kinds
    other = sorted((kinds - {"full_attention"}) | (blocks - {"attention"}))
    if other or windowed:
        what = f"layers of type {other}" if other else f"a sliding window of {config.sliding_window} on its layers"
        raise ValueError(f"MagicDec cannot draft for {name}: it has {what}, whose cache a compressed cache of "
                         "attention sinks and a recent window cannot stand in for. Use a drafter that reads no cache "
                         "of the target's (hfs.PromptLookup(), hfs.DraftModel(...), hfs.Eagle...) with this model.")
    implementation = getattr(target.config, "_attn_implementation", None) or "eager"
    if implementation not in _MASKED_ATTENTION:
        raise ValueError(f"MagicDec cannot draft for {name} with attn_implementation={implementation!r}: its drafts "
                         "attend over a compressed cache through a 4-D attention mask, which only eager and SDPA "
                         "attention take. Load the model with attn_implementation='sdpa'.")
