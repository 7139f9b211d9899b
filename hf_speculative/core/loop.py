"""Our verification loop: draft a tree, verify it in one target forward, keep the accepted path.

A ladder of small steps (gpt-fast's shape)::

    verifier = its cache, empty; pending = the prompt   # the first forward prefills the prompt too
    until stopped:
        tree    = drafter.propose_tree(sequence)    # DraftTree (a chain is a tree with one branch)
        logits  = verifier.forward(pending, tree)   # ONE forward, tree mask (dynamic or static cache)
        scores  = processed(logits)                 # logits processors, each row with its own branch
        verdict = accept(tree, scores)              # the accepted path + the target's own token
        verifier.keep(verdict.path)                 # the cache: prefix, root, accepted path
        sequence += path tokens + own token, cut at the first stop (EOS, length, stop strings...)
        drafter.observe(verdict); stats; streamer.put(the block)
        pending = [own token]

The target's own token is never in the cache when the next forward starts: it is the next tree's root.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

import torch

from .. import compat
from .accept import accept_greedy
from .stats import SpeculativeStats
from .tree import ROOT, DraftTree, Verdict
from .verify import DynamicVerifier


class TreeDrafter(Protocol):
    """What the loop asks of a per-call drafter."""

    def propose_tree(self, sequence: torch.LongTensor, max_depth: int) -> DraftTree:
        """A draft after ``sequence`` (``[1, L]``, verified), no deeper than ``max_depth`` (>= 1)."""

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        """Learn the verdict; ``sequence`` is the verified text after it (the target's token included) and
        ``scores`` the forward's processed target logits, ``[1 + n, V]``."""


@dataclasses.dataclass
class LoopResult:
    sequences: torch.LongTensor  # [1, L + new]
    scores: list[torch.Tensor]   # per new token, the processed scores it was chosen from, [1, V]
    stats: SpeculativeStats
    logits: list[torch.Tensor] = dataclasses.field(default_factory=list)  # per new token, the raw logits, [1, V]


def branch_ids(sequence: torch.LongTensor, tree: DraftTree, node: int) -> torch.LongTensor:
    """``[1, L + depth + 1]`` the sequence followed by the branch down to ``node`` (``-1``: the sequence)."""
    tokens = []
    while node != ROOT:
        tokens.append(int(tree.tokens[node]))
        node = int(tree.parents[node])
    return torch.cat([sequence, sequence.new_tensor([tokens[::-1]])], dim=-1) if tokens else sequence


def processed_scores(logits: torch.Tensor, sequence: torch.LongTensor, tree: DraftTree,
                     logits_processor: Any) -> torch.Tensor:
    """``[1 + n, V]`` scores: each row through the logits processors with its own branch as the context,
    as plain decoding would have processed it at that position."""
    scores = logits.float()
    if not logits_processor:
        return scores
    rows = [logits_processor(branch_ids(sequence, tree, node), scores[node + 1: node + 2])
            for node in range(ROOT, tree.size)]
    return torch.cat(rows, dim=0)


def stop_index(sequence: torch.LongTensor, start: int, stopping_criteria: Any) -> int | None:
    """The first new position ``>= start`` at which a stopping criterion holds (its token kept), or None."""
    for end in range(start + 1, sequence.shape[1] + 1):
        if compat.stopping_result(stopping_criteria(sequence[:, :end], None)):
            return end
    return None


def run(target: torch.nn.Module, input_ids: torch.LongTensor, drafter: TreeDrafter, *,
        stopping_criteria: Any, logits_processor: Any = None, streamer: Any = None,
        stats: SpeculativeStats | None = None, max_depth: int = 64, max_length: int | None = None,
        verifier: Any = None, cached: int = 0) -> LoopResult:
    """Speculative decoding of one sequence (``input_ids`` ``[1, L]``) with ``drafter``'s trees: greedy, or under
    sampling an exact sample of the target's distribution when ``logits_processor`` ends with the call's
    :class:`~hf_speculative.core.sampling.SeededSampler` (its scores are then the seeded draw; see accept.py).

    ``stopping_criteria`` decides the end (transformers' list: max length, EOS, stop strings, custom ones);
    it is checked after every token, so a stop inside an accepted path ends the text exactly there.
    ``verifier`` runs the forwards and keeps the cache (``forward(uncached, tree)``, ``keep(prefix, tree, path)``):
    a :class:`~hf_speculative.core.verify.DynamicVerifier` by default, a static-cache one for compiled targets;
    ``cached``: the prompt's first tokens already in its cache (a cache the caller passed), not computed again.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"hf_speculative's loop runs one sequence at a time; got input_ids of shape "
                         f"{tuple(input_ids.shape)}.")
    verifier = verifier or DynamicVerifier(target)
    stats = stats or SpeculativeStats()
    started, sequence, scores_out, logits_out = time.perf_counter(), input_ids, [], []
    pending, prompt_length = input_ids[0, cached:], input_ids.shape[1]
    while True:  # (the prompt is the caller's to put into the streamer: generate() does)
        tick = time.perf_counter()
        room = max_depth if max_length is None else min(max_depth, max_length - sequence.shape[1] - 1)
        tree = drafter.propose_tree(sequence, room) if room > 0 else DraftTree.empty(sequence.device)
        stats.record_draft(tree.size, time.perf_counter() - tick)
        tick = time.perf_counter()
        with torch.no_grad():
            logits = verifier.forward(pending, tree)  # [1 + n, V]
        scores = processed_scores(logits, sequence, tree, logits_processor)
        verdict = accept_greedy(tree, scores)
        verifier.keep(sequence.shape[1] - 1, tree, verdict.path)
        stats.record_verify(verdict.num_accepted, time.perf_counter() - tick)
        new = tree.path_tokens(verdict.path) + [verdict.next_token]
        rows = [node + 1 for node in (ROOT, *verdict.path)]  # the score row each new token came from
        before = sequence.shape[1]
        sequence = torch.cat([sequence, sequence.new_tensor([new])], dim=-1)
        end = stop_index(sequence, before, stopping_criteria)
        if end is not None:
            sequence = sequence[:, :end]
        scores_out += [scores[row: row + 1] for row in rows[: sequence.shape[1] - before]]
        logits_out += [logits[row: row + 1].float() for row in rows[: sequence.shape[1] - before]]
        drafter.observe(sequence, tree, verdict, scores)
        if streamer is not None:
            streamer.put(sequence[:, before:].cpu())
        if end is not None:
            break
        pending = sequence[0, -1:]
    if streamer is not None:
        streamer.end()
    stats.new_tokens = sequence.shape[1] - prompt_length
    stats.total_time_s = time.perf_counter() - started
    return LoopResult(sequence, scores_out, stats, logits_out)

