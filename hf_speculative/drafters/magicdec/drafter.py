"""The per-call (per-row) drafter of ``hfs.MagicDec``: a row of its call's :class:`~.group.DraftGroup`.

A row drafts nothing before the target's first forward (the prefill gives the keys and values its compressed cache
starts from), nothing while its text fits in that cache (it would be the whole cache: a draft step would cost a full
one), and nothing when the cost rule says a draft does not pay at this batch and context (``costs.py``); otherwise
its group drafts for every row at once and the row keeps what its plan says pays.
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.budget import Plan, Sizing
from ...core.tree import DraftTree, Verdict
from ...core.call import CallContext
from ..generator import SpeculativeCandidateGenerator
from .group import join


class MagicDecCandidateGenerator(SpeculativeCandidateGenerator):
    """One row's drafter: its group, and its sizing (chains, by the drafter's confidence, a draft step priced at what
    the group measures in this call).

    Args:
        ctx (`CallContext`): the row's call context.
        config (`MagicDec`): the strategy.
    """

    def __init__(self, ctx: CallContext, config: Any):
        super().__init__(ctx)
        self.config = config
        self.group, self.row = join(ctx, config)
        self.sizing = Sizing(ctx.verify_costs(config.num_tokens), tokens=config.num_tokens, rule="confidence",
                             adaptive=config.adaptive, confidence_threshold=config.confidence_threshold,
                             draft_price=self.group.price_now)
        self.stats.extra[config.name] = self.group.info  # the compressed cache's size, the steps it declined
        self._closed = False

    @torch.no_grad()
    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        return self.group.draft_for(self.row, sequence, plan)

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        self.group.observe(self.row, sequence, tree, verdict, self.ctx.view.row)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.group.close_row(self.row)
