"""``hfs.Hybrid``: several drafters in one call, the first whose draft pays proposes each step.

Prompt lookup is free and, when the answer copies the prompt (summaries, RAG, translation that
keeps names and numbers, code edits), right for many tokens in a row; a trained drafter (EAGLE, a
draft model) costs a little at every step and guesses everywhere else. ``Hybrid(PromptLookup(),
eagle)`` asks the lookup first, and the drafter only when the lookup has no match that pays (each
member keeps its own cost rule). Suffix decoding combined with a model speculator serves agents
this way (Arctic Inference); here it works with any of the package's strategies.

Every member sees every target forward: the one whose draft was verified learns from it
(``on_verified``), the others only keep their per-call state in step (``follow_verified``: an
EAGLE drafter still needs the target's hidden states of every accepted token).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .. import options
from ..base import CallContext, DraftStrategy, SpeculativeCandidateGenerator


@dataclasses.dataclass(eq=False, init=False)
class Hybrid(DraftStrategy):
    """Draft with the first of ``strategies`` that proposes something at each step.

    Put the cheap ones first: a member is asked only when all members before it drafted nothing,
    and asking is what costs (a drafter step). The draft's statistics per member are in
    ``hfs.last_stats(model).extra["hybrid"]``.

    Args:
        *strategies (`DraftStrategy`): two to eight strategies, e.g.
            ``hfs.Hybrid(hfs.PromptLookup(), hfs.Eagle.from_pretrained(name, target=model))``.
    """

    strategies: tuple[DraftStrategy, ...]
    name: ClassVar[str] = "hybrid"

    @property
    def reads_target(self) -> str:  # what the most demanding member reads (base.DraftStrategy.reads_target)
        kinds = {getattr(strategy, "reads_target", "outputs") for strategy in self.strategies}
        return next((kind for kind in ("cache", "features") if kind in kinds), "outputs")

    def __init__(self, *strategies: DraftStrategy):
        self.strategies = tuple(strategies)
        self.__post_init__()

    def __post_init__(self):
        if len(self.strategies) < 2:
            raise ValueError(f"Hybrid needs two or more strategies, got {len(self.strategies)}: e.g. "
                             "hfs.Hybrid(hfs.PromptLookup(), hfs.Eagle.from_pretrained(name, target=model)).")
        if len(self.strategies) > options.MAX_HYBRID_MEMBERS:
            # each member is asked in turn at every step, and opened (hooks, caches) for every call
            raise options.OptionError(f"Hybrid(...) takes at most {options.MAX_HYBRID_MEMBERS} strategies, got "
                                      f"{len(self.strategies)}.")
        for strategy in self.strategies:
            if isinstance(strategy, Hybrid):
                raise TypeError("Hybrid(..., Hybrid(...)): list the strategies of the inner Hybrid in the outer one.")
            if not isinstance(strategy, DraftStrategy):
                raise TypeError(f"Hybrid takes hf_speculative strategies (hfs.PromptLookup(), hfs.Eagle..., "
                                f"hfs.DraftModel(...)), got {type(strategy).__name__}; a raw transformers "
                                "CandidateGenerator can only be passed alone as candidate_generator=.")

    def labels(self) -> list[str]:
        """The members' names in the statistics (``"prompt-lookup"``, ``"eagle"``; ``"eagle#2"`` for a second one)."""
        out: list[str] = []
        for strategy in self.strategies:
            name = getattr(strategy, "name", type(strategy).__name__)
            out.append(name if name not in out else f"{name}#{sum(o.split('#')[0] == name for o in out) + 1}")
        return out

    def validate_target(self, target) -> None:
        for strategy in self.strategies:
            strategy.validate_target(target)

    def open(self, ctx: CallContext) -> "HybridCandidateGenerator":
        return HybridCandidateGenerator(ctx, self)


class HybridCandidateGenerator(SpeculativeCandidateGenerator):
    """Per-call state: one generator per member, and which one drafted the pending draft."""

    def __init__(self, ctx: CallContext, config: Hybrid):
        super().__init__(ctx)
        self.members: list[SpeculativeCandidateGenerator] = []
        try:
            for strategy in config.strategies:
                self.members.append(strategy.open(ctx))
        except BaseException:
            self.close()  # members already opened may hold hooks on the target
            raise
        self.labels = config.labels()
        self.drafter: SpeculativeCandidateGenerator = self.members[-1]
        self.per_member = {label: {"drafts": 0, "drafted": 0, "accepted": 0} for label in self.labels}
        ctx.stats.extra["hybrid"] = self.per_member

    def propose(self, input_ids, max_tokens):
        for member in self.members:
            member._prompt_length = self._prompt_length  # members never see get_candidates
            tokens, logits = member.propose(input_ids, max_tokens)
            self.drafter = member
            if tokens is not None and tokens.numel() > 0:
                return tokens, logits
        return None, None  # the last member asked learns from the empty draft's forward

    def on_verified(self, input_ids, num_accepted, num_proposed):
        for member in self.members:
            member.last_verify_s, member.last_scores = self.last_verify_s, self.last_scores
            if member is self.drafter:
                member.on_verified(input_ids, num_accepted, num_proposed)
            else:
                member.follow_verified(input_ids, num_accepted, num_proposed)
        if num_proposed:
            counts = self.per_member[self.labels[self.members.index(self.drafter)]]
            counts["drafts"] += 1
            counts["drafted"] += num_proposed
            counts["accepted"] += num_accepted

    def close(self):
        for member in self.members:
            member.close()
