"""``hfs.Hybrid``: several drafters in one call, the first whose draft pays proposes each step.

Prompt lookup is free and, when the answer copies the prompt (summaries, RAG, translation that
keeps names and numbers, code edits), right for many tokens in a row; a trained drafter (EAGLE, a
draft model) costs a little at every step and guesses everywhere else. ``Hybrid(PromptLookup(),
eagle)`` asks the lookup first, and the drafter only when the lookup has no match that pays (each
member keeps its own cost rule). Suffix decoding combined with a model speculator serves agents
this way (Arctic Inference); here it works with any of the package's strategies.

Every member observes every target forward (an EAGLE drafter still needs the target's hidden states of every
accepted token); the loop's sizing rules of the member whose draft was verified learn from it (core/budget.py).

With a tree member (``hfs.Hybrid(hfs.PromptLookup(tree=...), hfs.Eagle.from_pretrained(..., tree=...))``) the
call runs in hf_speculative's own loop: members with ``tree=`` propose trees, the others chains (a chain is a
tree with one branch), and the first non-empty draft is verified.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ... import options
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..generator import SpeculativeCandidateGenerator
from ..registry import Capabilities, all_of, capabilities_of, example, example_label
from ...options import CheckedOnAssignment
from ...core.budget import Plan, Sizing
from ...core.tree import DraftTree, Verdict
from ...core.tree_shapes import DynamicTree


@dataclasses.dataclass(eq=False, init=False)
class Hybrid(CheckedOnAssignment, DraftStrategy, method="hybrid", capabilities=Capabilities(trees=True),
             examples=("hybrid", "hybrid-tree"), live_fields=("strategies",), holds_members=True):
    """Draft with the first of ``strategies`` that proposes something at each step.

    Put the cheap ones first: a member is asked only when all members before it drafted nothing,
    and asking is what costs (a drafter step). The draft's statistics per member are in
    ``hfs.last_stats(model).extra["hybrid"]``.

    Args:
        *strategies (`DraftStrategy`): two to eight strategies, e.g.
            ``hfs.Hybrid(hfs.PromptLookup(), hfs.Eagle.from_pretrained(name, target=model))``.
    """

    strategies: tuple[DraftStrategy, ...]  # its spec lists their specs (holds_members)

    @property
    def tree(self):
        """The first member's draft tree shape (``tree=``), or ``None`` when every member drafts chains: with one,
        the call runs in hf_speculative's own loop (``hf.checks.drafts_trees``)."""
        return next((s.tree for s in self.strategies if capabilities_of(s).trees), None)

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
        own_cache = [type(s).__name__ for s in self.strategies if capabilities_of(s).reads_target == "cache"]
        if own_cache and self.tree is not None:
            raise ValueError(f"Hybrid(...) with a draft tree runs in hf_speculative's own loop, where {own_cache[0]} "
                             "cannot draft (it drafts chains on the target's own KV cache, not beside a draft "
                             "tree): drop tree= from the other members, or leave "
                             f"{own_cache[0]} out of this Hybrid.")

    def labels(self) -> list[str]:
        """The members' names in the statistics (``"prompt-lookup"``, ``"eagle"``; ``"eagle#2"`` for a second one)."""
        out: list[str] = []
        for strategy in self.strategies:
            name = strategy.name
            out.append(name if name not in out else f"{name}#{sum(o.split('#')[0] == name for o in out) + 1}")
        return out

    def validate_target(self, target) -> None:
        for strategy in self.strategies:
            strategy.validate_target(target)

    def declared(self) -> Capabilities:
        """From its members: a batch, a static cache or compile only if every member can; it reads what the most
        demanding member reads; trees when a member drafts them (the others' chains are one-branch trees)."""
        members = [capabilities_of(strategy) for strategy in self.strategies]
        common = all_of([type(self).capabilities, *members])
        return dataclasses.replace(common, trees=any(member.trees for member in members))

    def draft_budget(self) -> int | None:
        """The largest of its members' (``None`` when one does not say)."""
        budgets = [strategy.draft_budget() for strategy in self.strategies]
        return None if None in budgets else max(budgets)

    def spec_members(self) -> list[tuple[DraftStrategy, str]]:
        return list(zip(self.strategies, self.labels()))

    @classmethod
    def example(cls, target: Any, label: str | None = None, **options: Any) -> "Hybrid":
        """A trigram-only lookup first (it drafts once the text repeats itself, EAGLE before that), then EAGLE:
        ``"hybrid"`` chains, ``"hybrid-tree"`` trees (the lookup's 2 wide)."""
        lookup = dict(min_ngram=3, max_ngram=3)
        if example_label(cls, label) == "hybrid-tree":
            members = (example("prompt-lookup-tree", target, tree=DynamicTree(nodes=6, depth=4, top_k=2), **lookup),
                       example("eagle-tree", target))
        else:
            members = (example("prompt-lookup-fixed", target, num_tokens=4, **lookup), example("eagle3", target))
        return cls(*members, **options)

    def open(self, ctx: CallContext) -> "HybridCandidateGenerator":
        return HybridCandidateGenerator(ctx, self)


class HybridCandidateGenerator(SpeculativeCandidateGenerator):
    """Per-call state: one drafter per member, and which one drafted the pending draft. The loop sizes each
    member's drafts by its own rules (the sizing's ``members``; ``plan.members`` each step)."""

    def __init__(self, ctx: CallContext, config: Hybrid):
        super().__init__(ctx)
        self.members: list[SpeculativeCandidateGenerator] = []
        try:
            for strategy in config.strategies:
                self.members.append(strategy.open(ctx))
        except BaseException:
            self.close()  # members already opened may hold hooks on the target
            raise
        self.sizing = Sizing(costs=None, members=tuple(member.sizing for member in self.members))
        self.labels = config.labels()
        self._drafter = len(self.members) - 1
        self.per_member = {label: {"drafts": 0, "drafted": 0, "accepted": 0} for label in self.labels}
        ctx.stats.extra["hybrid"] = self.per_member

    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        """The first member's non-empty draft (its tree, or its chain: a one-branch tree); when every member drafts
        nothing, the last one asked learns from the plain step."""
        tree = DraftTree.empty(sequence.device)
        for i, (member, member_plan) in enumerate(zip(self.members, plan.members)):
            tree = member.draft(sequence, member_plan)
            plan.member = self._drafter = i
            if tree.size:
                break
        return tree

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        for member in self.members:  # every member keeps its state in step, whoever drafted
            member.observe(sequence, tree, verdict, scores)
        if tree.size:
            counts = self.per_member[self.labels[self._drafter]]
            counts["drafts"] += 1
            counts["drafted"] += tree.size
            counts["accepted"] += verdict.num_accepted

    def close(self):
        for member in self.members:
            member.close()
