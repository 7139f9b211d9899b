"""The per-call drafter of self-speculation: the target drafts for itself with some of its layers,
on its own KV cache (``hfs.EarlyExit``, ``hfs.LayerSkip``; the exit adapter's drafter builds on it).

The path of one draft: the last verified token is fed at position ``L - 1`` through the chosen
layers (they read the target's cache for the context and append their own entries), then each
drafted token at the next position, while the chain policy says it pays. Before the target
verifies, the entries the draft wrote are cropped from exactly the layers that wrote them, so the
cache the target sees is the one plain decoding would hold. There is no second cache and no
second prefill: the first target forward prefills the prompt and the draft starts after it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from ... import compat
from ...core.chain_drafting import draft_chain
from ...core.call import CallContext
from ..generator import SpeculativeCandidateGenerator
from ...core.costs import draft_price, record_draft_step
from .calibration import SkipCalibration, cached_calibration
from .layer_view import LayerSubset, layer_subset, num_layers
from ...core.budget import Plan, Sizing
from ...core.tree import DraftTree

logger = logging.getLogger(__name__)


class SelfSpeculativeCandidateGenerator(SpeculativeCandidateGenerator):
    """Per-call state: the target's cache, the view of the drafting layers and the length policy.

    ``config`` is the strategy (``EarlyExit`` or ``LayerSkip``): its options, ``drafted_layers(target)``
    and, for ``LayerSkip("auto")``, ``calibration_for`` / ``calibrate``.
    """

    def __init__(self, ctx: CallContext, config: Any):
        super().__init__(ctx)
        self.config = config
        self.cache = compat.target_cache(ctx.model_kwargs)
        if self.cache is None:  # the loop builds its cache before its drafter: this version keeps it elsewhere
            logger.warning(
                "hf_speculative: the target's KV cache is not where transformers %s's assisted loop was expected "
                "to keep it, so %s drafts nothing in this call (the output is still exact). Upgrade hf_speculative, "
                "or use a transformers version it is tested with (docs/versions.md).",
                compat.TRANSFORMERS_VERSION, type(config).__name__)
        self.verify_costs = ctx.verify_costs(config.num_tokens)
        self.subset: LayerSubset | None = None
        self._idle = False  # the calibration found no set worth drafting with
        layers = config.drafted_layers(ctx.target)
        if layers is not None and not getattr(config, "auto", False):
            self._use(layers, source="given")
        elif layers is not None:  # "auto" with a calibration made by an earlier call, or read from a file
            plan = cached_calibration(ctx.target)
            self._use(layers, source="file" if plan.source == "file" else "cached", plan=plan)
        self.sizing = Sizing(self.verify_costs, tokens=config.num_tokens, rule="confidence", adaptive=config.adaptive,
                             confidence_threshold=config.confidence_threshold, draft_price=self._draft_price)

    def _use(self, layers: list[int], source: str, plan: SkipCalibration | None = None) -> None:
        self.subset = layer_subset(self.ctx.target, layers)
        total = num_layers(self.ctx.target)
        info: dict[str, Any] = {"layers": len(layers), "of": total,
                                "skip": [i for i in range(total) if i not in set(layers)], "source": source}
        if plan is not None:
            info.update(agreement=round(plan.agreement, 4), expected_speedup=round(plan.expected_speedup, 3),
                        calibration_s=round(plan.seconds, 3), calibration_tokens=plan.tokens)
            # "auto" maximises the expected speedup; when no skipped set beats plain decoding, skipping
            # nothing is the maximum: do not draft (adaptive=False drafts anyway, as it always does)
            self._idle = self.config.adaptive and plan.expected_speedup <= 1.0
            info["drafting"] = not self._idle
        self.stats.extra[self.config.name] = info

    def _draft_price(self) -> float:
        # until measured: the share of the model's parameters a draft step runs
        return draft_price(self.subset, self.verify_costs, self.config.draft_cost, self.subset.cost)

    def _maybe_calibrate(self, input_ids: torch.LongTensor) -> None:
        config = self.config
        if input_ids.shape[1] - self.prompt_length < config.calibration_tokens:
            # wait for enough generated text to measure agreement on (said in the stats, in case the call ends first)
            self.stats.extra[config.name] = {"source": "waiting", "calibration_tokens": config.calibration_tokens,
                                             "generated": input_ids.shape[1] - self.prompt_length}
            return
        plan = config.calibration_for(self.ctx.target) or config.calibrate(self.ctx.target, input_ids,
                                                                           from_position=self.prompt_length)
        self._use(plan.drafted_layers, source=plan.source, plan=plan)

    @torch.no_grad()
    def draft(self, input_ids: torch.LongTensor, plan: Plan) -> DraftTree:
        none = DraftTree.empty(input_ids.device)
        if self.cache is None or self.stats.target_forwards == 0:
            return none  # the first target forward prefills the prompt; drafts start after it
        if self.subset is None:
            self._maybe_calibrate(input_ids)
            if self.subset is None:
                return none
        if self._idle:
            return none
        subset, device = self.subset, input_ids.device
        position = input_ids.shape[1] - 1
        if compat.cache_layer_length(self.cache, subset.layers[0]) != position or not plan.start_chain():
            return none
        fed = 0

        def step(token: int) -> torch.Tensor:
            nonlocal fed
            start = time.perf_counter()
            logits = subset.step(token, position + fed, self.cache, device)
            fed += 1
            record_draft_step(subset, time.perf_counter() - start)
            return self._to_target_vocab(logits)

        try:
            first = step(int(input_ids[0, -1]))
            tree = draft_chain(plan, self.ctx, input_ids, first, plan.depth, step)
        finally:
            subset.rollback(self.cache, fed)  # the verified cache is exactly plain decoding's
            plan.steps = fed  # the first step fed the root: one more than the tokens
        return tree

    def close(self):
        self.cache = None
