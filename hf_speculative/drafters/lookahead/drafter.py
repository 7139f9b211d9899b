"""Lookahead decoding (Fu et al. 2024, hao-ai-lab/LookaheadDecoding): Jacobi iteration and an n-gram pool,
both in one draft tree of our loop.

Every target forward verifies one :class:`~hf_speculative.core.tree.DraftTree` with two branches:

- the *verification branch*: up to ``guesses`` n-grams of the pool whose first token is the root (the last
  verified token), each the chain of its other ``ngram - 1`` tokens under the root, merged where they agree;
- the *lookahead branch*, a 2-D window of ``ngram - 1`` levels by ``window`` columns. Level 0 is a chain of
  guessed tokens under the root (offsets +1..+W); the token of level ``l`` in column ``c`` (offset
  ``l + c + 1``) is the child of level ``l - 1`` in the same column. So each token sees the prefix, the root,
  the level-0 tokens up to its column and its own column's lower levels (its diagonal in the paper's figure),
  at the position of its offset: the mask of the reference implementation (each level's rows see level 0
  causally and the lower levels of their column only), whose level 0 starts at the root itself instead.

The target's argmax at each top-level token (the verified forward's scores) is the next Jacobi level; once the window holds
``ngram - 1`` levels, each column with its new token is a completed n-gram for the pool, the oldest level is
dropped and the window moves one position on. The lookahead tokens are drafts like any other: when the
verification walks along them, that is accepted as well, and every token kept is the target's own choice
(greedy, or the seeded sample), so the output is exactly plain decoding's.

A lookahead token costs a verified row without being likely to be kept: on hardware where rows are not free
(CPUs), the measured cost model (``adaptive``) gives the verification branch its nodes first and the window
what is left, down to nothing (0 = off: then only the pool's n-grams, from the call's own text, are tried).
"""

from __future__ import annotations

import dataclasses
import random
from collections import OrderedDict

import torch

from ... import options
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..generator import SpeculativeCandidateGenerator
from ..registry import Capabilities, example_label

from ...options import CheckedOnAssignment
from ...core.tree import ROOT, DraftTree, Verdict
from ...core.tree_shapes import DynamicTree
from ...core.budget import Plan, Sizing
from ...core.policy import check_input_ids

MAX_POOL_KEYS = 1_000_000


class NgramPool:
    """N-grams by first token: up to ``per_key`` distinct continuations each (the most recently added kept),
    for up to ``keys`` first tokens (the least recently used dropped). Holds at most
    ``keys * per_key * (ngram - 1)`` tokens."""

    def __init__(self, keys: int, per_key: int):
        self.keys, self.per_key = keys, per_key
        self._pool: OrderedDict[int, OrderedDict[tuple[int, ...], None]] = OrderedDict()

    def add(self, first: int, rest: tuple[int, ...]) -> None:
        entry = self._pool.get(first)
        if entry is None:
            entry = self._pool[first] = OrderedDict()
            if len(self._pool) > self.keys:
                self._pool.popitem(last=False)
        else:
            self._pool.move_to_end(first)
        if rest in entry:
            entry.move_to_end(rest)
        else:
            entry[rest] = None
            if len(entry) > self.per_key:
                entry.popitem(last=False)

    def get(self, first: int) -> list[tuple[int, ...]]:
        """The continuations of ``first``, most recent first."""
        entry = self._pool.get(first)
        return [] if entry is None else list(reversed(entry))

    def __len__(self) -> int:
        return len(self._pool)

    @property
    def tokens(self) -> int:
        """Tokens held (what the memory bound is about)."""
        return sum(len(rest) for entry in self._pool.values() for rest in entry)


@dataclasses.dataclass
class Lookahead(CheckedOnAssignment, DraftStrategy, method="lookahead", capabilities=Capabilities(trees=True),
                examples=("lookahead",)):
    """Lookahead decoding: a Jacobi window and an n-gram pool verified in one tree per target forward.

    Runs in hf_speculative's own tree loop (greedy or seeded sampling, lossless either way).

    Args:
        window (`int`, defaults to 5): ``W``, the Jacobi columns (0-64; 0: no lookahead branch).
        ngram (`int`, defaults to 4): ``N``, the n-gram size; the window keeps ``N - 1`` levels (2-16).
        guesses (`int`, defaults to 5): ``G``, the pool's n-grams verified per step (0-64), also the n-grams kept
            per first token.
        pool_size (`int`, defaults to 4096): first tokens the pool keeps (least recently used dropped).
        text_ngrams (`bool`, defaults to `True`): also pool the n-grams of the call's own text (prompt and output),
            as the reference implementation's prompt pool does.
        adaptive (`bool`, defaults to `True`): the measured verification cost sets the nodes per step (``W``
            and ``G`` as far as they fit, 0 = off); ``False`` always verifies the full window and guesses.

    ``(window + guesses) * (ngram - 1)`` nodes at most per step, at most 256.
    """

    window: int = 5
    ngram: int = 4
    guesses: int = 5
    pool_size: int = 4096
    text_ngrams: bool = True
    adaptive: bool = True

    def __post_init__(self):
        owner = "Lookahead"
        self.window = options.check_int(owner, "window", self.window, 0, options.MAX_DRAFT_TOKENS)
        self.ngram = options.check_int(owner, "ngram", self.ngram, 2, options.MAX_NGRAM)
        self.guesses = options.check_int(owner, "guesses", self.guesses, 0, options.MAX_TOP_K)
        self.pool_size = options.check_int(owner, "pool_size", self.pool_size, 1, MAX_POOL_KEYS)
        self.text_ngrams = options.check_bool(owner, "text_ngrams", self.text_ngrams)
        self.adaptive = options.check_bool(owner, "adaptive", self.adaptive)
        if self.window + self.guesses == 0:
            raise options.OptionError("Lookahead(window=0, guesses=0): nothing would be drafted; give window > 0 "
                                      "(Jacobi lookahead) and/or guesses > 0 (n-grams verified).")
        if self.max_nodes > options.MAX_TREE_NODES:
            raise options.OptionError(
                f"Lookahead(window={self.window}, ngram={self.ngram}, guesses={self.guesses}): "
                f"(window + guesses) * (ngram - 1) = {self.max_nodes} tokens per forward; at most "
                f"{options.MAX_TREE_NODES}: lower window, guesses or ngram.")

    @property
    def max_nodes(self) -> int:
        return (self.window + self.guesses) * (self.ngram - 1)

    @property
    def tree(self) -> DynamicTree:
        """Its trees' bounds (it always drafts trees, so it always runs in hf_speculative's loop)."""
        depth = max(self.window + self.ngram - 2, self.ngram - 1)
        return DynamicTree(nodes=self.max_nodes, depth=min(depth, options.MAX_TREE_DEPTH), top_k=1)

    def open(self, ctx: CallContext) -> "LookaheadCandidateGenerator":
        return LookaheadCandidateGenerator(ctx, self)

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options) -> "Lookahead":
        """``"lookahead"``: the default window and pool, the whole tree verified."""
        example_label(cls, label)
        return cls(**{"adaptive": False, **options})


class LookaheadCandidateGenerator(SpeculativeCandidateGenerator):
    """One call of :class:`Lookahead`: the Jacobi window (``levels``), the pool, the node budget."""

    def __init__(self, ctx: CallContext, config: Lookahead):
        super().__init__(ctx)
        self.config = config
        self.pool = NgramPool(config.pool_size, max(config.guesses, 1))
        self.levels: list[list[int]] = []  # levels[l][c]: the token at offset l + c + 1 (oldest level first)
        self.tokens: list[int] = []
        self._pooled_to = 0  # n-grams of the text starting before this are pooled
        self.sizing = Sizing(ctx.verify_costs(config.max_nodes), tokens=config.max_nodes, nodes=config.max_nodes,
                             adaptive=config.adaptive)
        self._step: tuple[int, int, int] = (0, 0, 0)  # (verification nodes, levels, columns) of the last tree

    def _index(self, input_ids: torch.LongTensor) -> None:
        check_input_ids("Lookahead", input_ids, min_length=1)
        self.tokens += input_ids[0, len(self.tokens):].tolist()
        tokens, n = self.tokens, self.config.ngram
        if not self.levels and self.config.window:
            # level 0 starts as tokens of the prompt, drawn with a fixed seed: the same drafts on every run
            self.levels = [random.Random(len(tokens)).choices(tokens, k=self.config.window)]
        if self.config.text_ngrams:
            for start in range(self._pooled_to, len(tokens) - n + 1):
                self.pool.add(tokens[start], tuple(tokens[start + 1: start + n]))
            self._pooled_to = max(self._pooled_to, len(tokens) - n + 1)

    def draft(self, input_ids: torch.LongTensor, plan: Plan) -> DraftTree:
        self._index(input_ids)
        self._step = (0, 0, 0)
        if plan.chain_only:
            return self._chain(input_ids, plan.depth)
        max_depth = plan.depth
        budget = plan.tree_nodes()
        if budget == 0:
            return DraftTree.empty(input_ids.device)
        tokens, parents = [], []
        # verification branch: the pool's n-grams after the root, as a trie, while they fit the budget
        children: dict[int, dict[int, int]] = {ROOT: {}}
        for gram in self.pool.get(self.tokens[-1])[: self.config.guesses]:
            gram = gram[:max_depth]
            path, node = [], ROOT
            for token in gram:
                child = children.get(node, {}).get(token)
                if child is None:
                    break
                node = child
                path.append(child)
            added = len(gram) - len(path)
            if len(tokens) + added > budget:
                break
            for token in gram[len(path):]:
                tokens.append(token)
                parents.append(node)
                children.setdefault(node, {})[token] = len(tokens) - 1
                node = len(tokens) - 1
        verified = len(tokens)
        # lookahead branch: the window's first `columns` columns, every level, while they fit
        levels = len(self.levels)
        columns = 0
        if levels:
            columns = min(self.config.window, (budget - verified) // levels, max_depth - levels + 1)
        if columns > 0:
            for level in range(levels):
                for column in range(columns):
                    tokens.append(self.levels[level][column])
                    if level == 0:
                        parents.append(ROOT if column == 0 else verified + column - 1)
                    else:
                        parents.append(verified + (level - 1) * columns + column)
            self._step = (verified, levels, columns)
        if not tokens:
            return DraftTree.empty(input_ids.device)
        device = input_ids.device
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=device),
                         torch.tensor(parents, dtype=torch.long, device=device))

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        """The target's argmax at the window's top level is the next level (``scores`` `[1 + n, V]`)."""
        verified, levels, columns = self._step
        self._step = (0, 0, 0)
        if not columns or tree.size != verified + levels * columns:
            return  # no window this step (or the loop verified no tree of ours: no room left)
        top = 1 + verified + (levels - 1) * columns  # the score row of the top level's first column
        guessed = scores[top: top + columns].argmax(dim=-1).tolist()  # [columns]: the next level
        full = levels == self.config.ngram - 1
        if full:  # each column, with the token the target put after it, is a completed n-gram
            for column in range(columns):
                gram = [self.levels[level][column] for level in range(levels)] + [guessed[column]]
                self.pool.add(gram[0], tuple(gram[1:]))
        new_level = guessed + self.levels[-1][columns:]  # columns left out this step keep their last guess
        self.levels = (self.levels[1:] if full else self.levels) + [new_level]

    def _chain(self, input_ids: torch.LongTensor, max_tokens: int) -> DraftTree:
        """A chain, for a loop that verifies chains: the pool's most recent n-gram after the last token."""
        grams = self.pool.get(self.tokens[-1])
        return DraftTree.from_tokens(list(grams[0][:max_tokens]) if grams else [], input_ids.device)
