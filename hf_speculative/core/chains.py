"""Drafters in our loop: a per-call generator that proposes token chains (or trees), seen as a tree drafter.

Every drafter written for transformers' assisted loop proposes a chain (``propose(input_ids,
max_tokens) -> (tokens [k], logits [k, V] or None)``) and learns from ``on_verified(input_ids,
num_accepted, num_proposed)``; a user's raw transformers ``CandidateGenerator`` is wrapped into one by
:class:`~hf_speculative.drafters.base.ExternalCandidateGenerator`. :class:`ChainDrafter` speaks the loop's
``propose_tree`` / ``observe`` for them: a chain is the tree ``parents = [-1, 0, ..., k-2]`` (the logits a
drafter returns beside its tokens are not needed: our loop verifies every draft against the target's own,
possibly seeded, choice; see :mod:`hf_speculative.core.accept`).
A generator that drafts trees itself has ``propose_tree(input_ids, max_depth) -> DraftTree | None``
(``None``: a chain this step) and ``observe_tree(input_ids, tree, verdict)``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .tree import DraftTree, Verdict


class ChainDrafter:
    """The loop's view of a chain-proposing per-call generator.

    Args:
        generator (`SpeculativeCandidateGenerator`): opened for this call (``strategy.open(ctx)``).
    """

    def __init__(self, generator: Any):
        self.generator = generator
        self._tree = False
        self._asked = False  # whether the loop asked for this step's draft
        self._observed_at = 0.0
        self._verify_started = 0.0

    def propose_tree(self, sequence: torch.LongTensor, max_depth: int) -> DraftTree:
        gen = self.generator
        if gen.prompt_length is None:
            gen.start(sequence.shape[1])
        grow = getattr(gen, "propose_tree", None)  # drafters that draft trees (``tree=`` options)
        tree = None if grow is None or max_depth < 1 else grow(sequence, max_depth)
        self._tree = tree is not None
        if tree is not None:
            self._verify_started, self._asked = time.perf_counter(), True
            return tree
        tokens, _ = (None, None) if max_depth < 1 else gen.propose(sequence, max_depth)
        if tokens is None or tokens.numel() == 0:
            tree = DraftTree.empty(sequence.device)
        else:
            tree = DraftTree.chain(tokens.reshape(-1)[:max_depth].to(device=sequence.device, dtype=torch.long))
        self._verify_started, self._asked = time.perf_counter(), True
        return tree

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        """``scores``: the processed target logits of the forward, ``[1 + n, V]``."""
        gen = self.generator
        if not self._asked:  # the loop verified without asking (no room left): nothing of ours in it, and the
            # forward ran since the last observe
            self._tree, self._verify_started = False, self._observed_at
        self._asked = False
        gen.last_verify_s = time.perf_counter() - self._verify_started
        gen.last_scores = scores[None]  # [1, 1 + k, V], as transformers' loop hands them over
        if self._tree:
            gen.observe_tree(sequence, tree, verdict)
        else:
            # what was verified: the draft, or its first nodes (a batch step's width cuts it), or nothing
            gen.on_verified(sequence, verdict.num_accepted, tree.size)
        self._observed_at = time.perf_counter()

    def close(self) -> None:
        self.generator.close()
