"""Prompt lookup decoding: propose the continuation of the most recent earlier occurrence of the
last n tokens (Saxena 2023). Free to run, excellent when the output copies the input
(summarization, RAG, code editing), and nothing to load."""

from __future__ import annotations

import dataclasses

import torch

from ... import options
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..generator import SpeculativeCandidateGenerator
from ..registry import Capabilities, example_label

from ...options import CheckedOnAssignment
from ...core.tree import DraftTree
from ...core.tree_shapes import DynamicTree
from .copying import CopyTracker, best_alignment, copied, copy_keys, copy_prior, copy_reach
from .tree import MultiNgramIndex, lookup_tree
from ...core.budget import Plan, Sizing
from ...core.policy import check_input_ids


# The default longest draft of a copy under way: a verification of more than 16 rows leaves the CPU kernel's few-row
# code (cpu/kernel.py's MAX_ROWS) for its cache-blocked product (or oneDNN under HFS_KERNEL_GEMM=0), where each row
# costs a row's arithmetic: 17-32 rows 3.7 ms a row more at SmolLM2's shapes), and those timings, learned into the
# target's shared cost model, move every drafter's decisions on that model (early exit and Medusa stopped drafting
# after long copies). Copies of 32 or 64 tokens did not shorten the app's "answer from a context" (7-8 forwards as
# with 15, its last long draft running past the answer's end), so 15 it stays
COPY_TOKENS = 15


@dataclasses.dataclass
class PromptLookup(CheckedOnAssignment, DraftStrategy, method="prompt-lookup",
                   capabilities=Capabilities(trees=True, batch=True),
                   examples=("prompt-lookup", "prompt-lookup-fixed", "prompt-lookup-tree")):
    """N-gram lookup over the prompt and the generated text.

    Better than transformers' ``prompt_lookup_num_tokens``: the longest n-gram first and its *most
    recent* occurrence, an incremental index (the per-step cost does not grow with the context),
    a copy that goes on matching followed as far as it reaches (a whole copied sentence in a few forwards), and a
    draft length chosen per step from the measured acceptance of matches that long and the measured cost of
    verifying drafts on this hardware; when matches do not pay, it drafts nothing and costs nothing
    (:mod:`~hf_speculative.drafters.prompt_lookup.copying`).

    Args:
        num_tokens (`int`, defaults to 10): the longest draft of a fresh match (1-64).
        max_ngram (`int`, defaults to 3): the longest n-gram to match (1-16).
        min_ngram (`int`, defaults to 1): the shortest n-gram to match (1-``max_ngram``).
        adaptive (`bool`, defaults to `True`): choose the draft length per step; ``False`` always
            proposes ``num_tokens`` tokens when there is a match (like transformers does).
        tree (`DynamicTree`, *optional*): draft a tree instead of a chain: the continuations of several
            matches (every n-gram size, the ``tree.top_k`` most recent occurrences of each) merged where
            they agree, up to ``tree.nodes`` nodes and ``tree.depth`` tokens deep; verified in one forward
            by hf_speculative's own loop. With ``adaptive`` the node count per step (0 included) follows the
            measured verification cost and what trees kept.
        copy_tokens (`int`, *optional*): the longest draft of a copy under way (``num_tokens``-64; default
            ``max(num_tokens, 15)``: 16 rows, the CPU kernel's, verify a draft of 15 and its root): a match that
            already matched ``m`` tokens may draft up to ``m`` tokens ahead, within ``[num_tokens, copy_tokens]``, so a
            copy whose drafts are accepted doubles its reach every step. ``copy_tokens=num_tokens``: no growth. With
            ``adaptive=False`` every draft is ``num_tokens`` long.
    """

    num_tokens: int = 10
    max_ngram: int = 3
    min_ngram: int = 1
    adaptive: bool = True
    tree: DynamicTree | None = None
    copy_tokens: int | None = None  # last: the positional order of the options before it stays

    def __post_init__(self):
        # types and limits first: the n-gram index and the verify-cost model grow with these numbers
        self.num_tokens = options.check_int("PromptLookup", "num_tokens", self.num_tokens, 1, options.MAX_DRAFT_TOKENS)
        if self.copy_tokens is not None:
            self.copy_tokens = options.check_int("PromptLookup", "copy_tokens", self.copy_tokens, 1,
                                                 options.MAX_DRAFT_TOKENS)
        self.max_ngram = options.check_int("PromptLookup", "max_ngram", self.max_ngram, 1, options.MAX_NGRAM)
        self.min_ngram = options.check_int("PromptLookup", "min_ngram", self.min_ngram, 1, options.MAX_NGRAM)
        self.adaptive = options.check_bool("PromptLookup", "adaptive", self.adaptive)
        if self.min_ngram > self.max_ngram:
            raise ValueError(
                f"PromptLookup(min_ngram={self.min_ngram}, max_ngram={self.max_ngram}): need 1 <= min_ngram <= max_ngram."
            )
        if self.copy_tokens is not None and self.copy_tokens < self.num_tokens:
            raise ValueError(f"PromptLookup(num_tokens={self.num_tokens}, copy_tokens={self.copy_tokens}): need "
                             "copy_tokens >= num_tokens (copy_tokens is the longest draft of a copy under way, "
                             "num_tokens of a fresh match); set copy_tokens=num_tokens for no growth.")
        if self.tree is not None and not isinstance(self.tree, DynamicTree):
            raise ValueError(f"PromptLookup(tree={options.shown(self.tree)}): use hfs.DynamicTree(nodes=..., depth=..., "
                             f"top_k=...) (top_k: occurrences per n-gram) or None for chains.")

    def open(self, ctx: CallContext) -> "PromptLookupCandidateGenerator":
        return PromptLookupCandidateGenerator(ctx, self)

    def longest_chain(self) -> int:
        """The longest chain one step may draft: ``copy_tokens`` (``num_tokens`` with ``adaptive=False``)."""
        return self.copy_limit() if self.adaptive else self.num_tokens

    def copy_limit(self) -> int:
        """``copy_tokens``, or by default ``max(num_tokens, COPY_TOKENS)``."""
        return self.copy_tokens if self.copy_tokens is not None else max(self.num_tokens, COPY_TOKENS)

    def draft_budget(self) -> int:
        return self.tree.nodes if self.tree is not None else self.longest_chain()

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options) -> "PromptLookup":
        """``"prompt-lookup"``: the defaults; ``"prompt-lookup-fixed"``: ``num_tokens`` at every match
        (``adaptive=False``); ``"prompt-lookup-tree"``: trees 3 wide, so that paths other than the first branch win."""
        settings = {"prompt-lookup": {}, "prompt-lookup-fixed": {"adaptive": False},
                    "prompt-lookup-tree": {"tree": DynamicTree(nodes=8, depth=4, top_k=3), "adaptive": False}}
        return cls(**{**settings[example_label(cls, label)], **options})


class NgramIndex:
    """Most recent end position of every n-gram (``min_n <= n <= max_n``) of a growing token list.

    An n-gram ending at position ``e`` (tokens ``[e-n, e)``) is only indexed once ``e < len``, so
    that it has a continuation; appending ``t`` tokens costs ``O(t * (max_n - min_n + 1))``.
    """

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._last_end: dict[tuple[int, ...], int] = {}
        self._next_end = 1  # ends < this are indexed

    def extend(self, new_tokens: list[int]) -> None:
        self.tokens.extend(new_tokens)
        tokens, last_end = self.tokens, self._last_end
        for end in range(self._next_end, len(tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                last_end[tuple(tokens[end - n : end])] = end
        self._next_end = max(self._next_end, len(tokens))

    def lookup(self) -> tuple[int, int] | None:
        """``(n, start of the continuation)`` for the longest suffix n-gram seen before, or ``None``."""
        tokens = self.tokens
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            end = self._last_end.get(tuple(tokens[len(tokens) - n :]))
            if end is not None:
                return n, end
        return None


class PromptLookupCandidateGenerator(SpeculativeCandidateGenerator):
    """One call of :class:`PromptLookup`: the n-gram index of the text so far (and of its several matches, for
    trees) and the copy under way. The chain's length is the loop's choice for the acceptance measured per match
    length (``copying``)."""

    def __init__(self, ctx: CallContext, config: PromptLookup):
        super().__init__(ctx)
        self.config = config
        self.index = NgramIndex(config.min_ngram, config.max_ngram)
        self.copy = CopyTracker()
        nodes = config.tree.nodes if config.tree else 0
        tokens = config.longest_chain()
        self.sizing = Sizing(ctx.verify_costs(max(tokens, nodes)), tokens=tokens, nodes=nodes, rule="keyed",
                             adaptive=config.adaptive)
        if config.tree is not None:
            self.matches = MultiNgramIndex(config.min_ngram, config.max_ngram, occurrences=config.tree.top_k)

    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        check_input_ids("PromptLookup", sequence)
        if self.config.tree is not None and not plan.chain_only:
            return self._tree(sequence, plan)
        index, config = self.index, self.config
        index.extend(sequence[0, len(index.tokens) :].tolist())
        tokens = index.tokens
        found = best_alignment(tokens, index.lookup(), self.copy.candidate(tokens))
        if found is None:
            return DraftTree.empty(sequence.device)
        start, m = found
        self.copy.drafted_from(start, len(tokens))  # carried to the next step, drafted or not
        reach = copy_reach(m, config.num_tokens, config.copy_limit()) if config.adaptive else config.num_tokens
        # token j of the draft, once the ones before it are accepted, continues a copy of m + j matched tokens: the
        # acceptance measured for copies that long decides how much of the reach pays
        k = plan.copy_length(copy_keys(m, reach), copy_prior)
        return DraftTree.from_tokens(copied(tokens, start, k), sequence.device)

    def _tree(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        """The matches' continuations as one tree, within the loop's node budget."""
        self.matches.extend(sequence[0, len(self.matches.tokens):].tolist())
        nodes = plan.tree_nodes()
        if nodes == 0:
            return DraftTree.empty(sequence.device)
        return lookup_tree(self.matches, nodes, min(self.config.tree.depth, plan.depth))
