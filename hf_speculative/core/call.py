"""The call object: one ``generate()`` call, built once at its entry and passed down explicitly.

A :class:`Call` is made by the entry (the enabled model's ``generate``, or ``custom_generate=hfs.speculative_generate``)
from what the user asked (the strategy, the seed and sampling rule, the streamer and tokenizer, a static cache, a
cache to fill), completed with what transformers prepared for the call (generation config, logits processors,
stopping criteria, model kwargs) when it hands them over, and handed to the loop (core/entry.py) and to
``strategy.open(call)``: a drafter reads everything about its call from it. The sampling rule is a field
(:attr:`Call.sampler`), not a position in the processor list. A batch's rows get views of it (:meth:`Call.for_row`:
their own processors, statistics and view of the forwards).

It also carries how the target's forwards look to a drafter that reads them (:class:`TargetView`: hidden states from
hooks or from the verifier, padding rows of a static step, a batch row's columns) and which cost model prices its
drafts (``cost_key``: a static-cache verifier's padded forward, else the dynamic one's). Nothing of this travels
through context variables below the entry. ``CallContext`` is its older name, kept for drafters written against it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from .. import compat
from .sampling import split_sampler
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


_UNSET: Any = object()  # ``sampler`` not given: found at the end of ``logits_processor`` (a hand-built call)


@dataclasses.dataclass(eq=False)
class Call:
    """One ``generate()`` call: what the loop runs and what a per-call drafter needs to know about it.

    The first five fields keep the order drafters and tests build a call with by hand
    (``Call(target, generation_config, logits_processor, stopping_criteria, stats)``).

    Attributes:
        target (`PreTrainedModel`): the model verifying the drafts.
        generation_config (`GenerationConfig`): the call's (transformers' per-call copy, once it handed it over).
        logits_processor (`LogitsProcessorList`): the call's prepared processors; under sampling the call's sampler
            ends the list (transformers' own loops draw with it there).
        stopping_criteria (`StoppingCriteriaList`): EOS, max length, stop strings and the user's own.
        stats (`SpeculativeStats`): where the call's statistics go.
        sampler: the call's sampling rule, a ``SeededSampler`` (seeded rule), a ``RejectionSampler`` (rejection rule)
            or ``None`` (greedy); given by the entry, else found at the end of ``logits_processor``.
        strategy: the strategy the call drafts with (``None``: a plain seeded call).
        model_kwargs (`dict`, *optional*): the loop's model kwargs; their cache is the target's for the whole call
            (self-speculative drafters write into it and crop it back).
        prompt_length (`int`, *optional*): the prompt's length without padding, once the call started.
        draft_budget (`int`, *optional*): the most draft nodes the strategy proposes in a step, where a static cache
            pads its steps to it; ``trees``: whether it drafts trees.
        streamer, tokenizer: what transformers does not hand a ``custom_generate`` callable, kept for the loop.
        static (`bool`): verify on a static cache (``cache_implementation="static"``, ``hfs.enable(compile=...)``).
        cache: the cache the caller passed to ``generate()``, filled by the call.
        seed (`int`, *optional*), sampling (`str`): the seed and rule asked for (``"seeded"`` or ``"rejection"``).
        ours (`bool`): hf_speculative's loop runs the call (else transformers' assisted loop).
        generator: the call's per-call drafter, closed when the call ends.
    """

    target: torch.nn.Module
    generation_config: Any = None
    logits_processor: Any = None
    stopping_criteria: Any = None
    stats: SpeculativeStats | None = None
    model_kwargs: dict | None = None
    view: TargetView = dataclasses.field(default_factory=TargetView)
    # ``(padded budget, compiled)`` on a static-cache verifier: its drafts are priced at the padded forward's cost
    cost_key: tuple[int, bool] | None = None
    prompt_length: int | None = None
    sampler: Any = _UNSET
    strategy: Any = None
    draft_budget: int | None = None
    trees: bool = False
    streamer: Any = None
    tokenizer: Any = None
    static: bool = False
    cache: Any = None
    seed: int | None = None
    seeded: bool = True  # the entry's hook appends the seeded sampler (a custom_generate route has done it already)
    sampling: str = "seeded"
    ours: bool = True
    generator: Any = None
    max_length: int | None = dataclasses.field(default=None, init=False)  # the generation config's, once it is known

    def __post_init__(self):
        if self.sampler is _UNSET:
            self.sampler = split_sampler(self.logits_processor)[1]
        length = getattr(self.generation_config, "max_length", None)
        self.max_length = None if length is None else int(length)

    def handed_over(self, generation_config: Any, logits_processor: Any, stopping_criteria: Any,
                    model_kwargs: dict | None = None) -> None:
        """What transformers prepared for the call, once it hands it over (to the loop, or to the drafter hook of its
        assisted loop). The sampler stays the one the entry recorded when the processors were built."""
        self.generation_config, self.stopping_criteria = generation_config, stopping_criteria
        self.max_length = int(generation_config.max_length)
        if self.sampler is None and logits_processor and logits_processor is not self.logits_processor:
            self.sampler = split_sampler(logits_processor)[1]  # a list the entry did not build (the assisted loop's)
        self.logits_processor, self.model_kwargs = logits_processor, model_kwargs

    def for_row(self, logits_processor: Any, stats: SpeculativeStats, view: TargetView, prompt_length: int) -> "Call":
        """A batch row's view of the call: its own processors (and sampler), statistics and view of the forwards."""
        return dataclasses.replace(self, logits_processor=logits_processor, stats=stats, view=view,
                                   prompt_length=prompt_length, model_kwargs=None, sampler=_UNSET, generator=None)

    @property
    def processors(self) -> Any:
        """The call's logits processors without its sampler (what drafters warp their own logits with)."""
        return split_sampler(self.logits_processor)[0]

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


CallContext = Call  # the name drafters (and hfs.CallContext) used before the call objects were one
