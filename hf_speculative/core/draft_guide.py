"""Trees that draft what the call will accept: the call's logits processors on every node's guesses.

A chain drafter warps its logits with the call's logits processors before it picks a token (``draft_chain`` in
accept.py), so under a repetition penalty, a bias (``sequence_bias``, ``bad_words_ids``), ``top_k`` / ``top_p`` and
the like it proposes what the target can emit. A tree's guesses at a node are the next token of that node's own
branch, so a :class:`DraftGuide` runs the drafter's logits at a node through the same processors with that branch
as the context (input ids: the verified sequence, then the node's ancestors and the node itself), then a
log-softmax; a guess the processors ban (``-inf``) is no guess at all. The target's verification is unchanged (each
row is processed with its own branch there too, core/loop.py): this only changes which guesses are proposed, so
the output stays exact.

Host cost: the nodes of one depth have branches of one length, so they go through the processors in one call
(``[k, T]`` ids, ``[k, V]`` scores) when every processor is one of transformers' row-wise ones (:data:`ROW_WISE`,
exact types, none holding a per-row tensor of a batch row); otherwise one call per node, as verification does.

The guesses are the top ranks of the processed distribution (greedy decoding and the seeded rule), or under the
rejection rule draws from it (``DynamicTree``, which tells the rule what each guess was drawn from).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers.generation import logits_process as lp

from .sampling import RejectionSampler, split_sampler

# transformers' processors that process each row of a batch on its own row alone (the same classes in 4.x and 5.x)
ROW_WISE = (
    lp.TemperatureLogitsWarper, lp.TopKLogitsWarper, lp.TopPLogitsWarper, lp.MinPLogitsWarper,
    lp.TypicalLogitsWarper, lp.EpsilonLogitsWarper, lp.EtaLogitsWarper, lp.RepetitionPenaltyLogitsProcessor,
    lp.SequenceBiasLogitsProcessor, lp.NoBadWordsLogitsProcessor, lp.NoRepeatNGramLogitsProcessor,
    lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor, lp.SuppressTokensLogitsProcessor,
    lp.SuppressTokensAtBeginLogitsProcessor, lp.ForcedEOSTokenLogitsProcessor, lp.ForcedBOSTokenLogitsProcessor,
    lp.ExponentialDecayLengthPenalty, lp.InfNanRemoveLogitsProcessor, lp.LogitNormalization,
)


def batches_rows(processor: Any) -> bool:
    """Whether ``processor`` can take the nodes of one depth as the rows of one call: one of :data:`ROW_WISE` (its
    exact type: a subclass may read rows otherwise) holding no tensor with a leading axis of 1 (a batched call's row
    view, ``core/rows.row_view``, e.g. the repetition penalty's per-row ``prompt_ignore_length``)."""
    if type(processor) not in ROW_WISE:
        return False
    return not any(isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == 1
                   for value in vars(processor).values())


class DraftGuide:
    """One step's guide for a tree drafter: the call's processors and sampler, and the verified ``sequence``.

    Args:
        processors: the call's logits processors (``ctx.logits_processor``; the sampler last under sampling), or
            ``None``.
        sequence (`torch.LongTensor` `[1, L]`, *optional*): the verified text, the root last (needed when there are
            processors).
        sampler: a sampler to use when ``processors`` holds none (a ``RejectionSampler`` given directly).
    """

    def __init__(self, processors: Any = None, sequence: torch.Tensor | None = None, sampler: Any = None):
        self.processors, found = split_sampler(processors)
        self.sampler = found if found is not None else sampler
        self.sequence = sequence
        self.batched = all(batches_rows(p) for p in self.processors)
        self.calls = 0  # processor calls made (counted for the host-cost tests)

    @property
    def rejection(self) -> RejectionSampler | None:
        """The call's sampler under the rejection rule (guesses are drawn), else ``None``."""
        return self.sampler if isinstance(self.sampler, RejectionSampler) else None

    def contexts(self, branches: Sequence[Sequence[int]]) -> torch.Tensor:
        """``[k, L + d]`` the verified sequence followed by each branch (``k`` branches of one length ``d``)."""
        if self.sequence is None:
            raise ValueError("DraftGuide: the processors read the text: give sequence=.")
        sequence = self.sequence
        if not branches or not branches[0]:
            return sequence.expand(max(len(branches), 1), -1)
        tail = torch.tensor([list(b) for b in branches], dtype=sequence.dtype, device=sequence.device)
        return torch.cat([sequence.expand(len(branches), -1), tail], dim=-1)

    def logprobs(self, logits: torch.Tensor, branches: Sequence[Sequence[int]]) -> torch.Tensor:
        """``[k, V]`` log-probabilities: the drafter's ``logits`` ``[k, V]`` (or log-probabilities: they are
        normalised here) at ``k`` nodes whose branches (root side first, the node last; ``[]`` for the root) are
        ``branches``, processed with each branch as the context. A banned token is ``-inf``; a row with nothing left
        is all ``-inf``."""
        scores = logits.float()
        if self.processors:  # (a processor may write in place: never into the drafter's tensor)
            scores = self._process(self.contexts(branches), scores.clone())
        logprobs = torch.log_softmax(scores, dim=-1)
        return logprobs.masked_fill(logprobs.isnan(), float("-inf"))

    def _process(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.batched or scores.shape[0] == 1:
            self.calls += 1
            return self.processors(ids, scores)
        self.calls += scores.shape[0]
        return torch.cat([self.processors(ids[i: i + 1], scores[i: i + 1]) for i in range(scores.shape[0])], dim=0)

    @staticmethod
    def ranked(logprobs: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``([k, m] values, [k, m] tokens)``, ``m = min(top_k, V)``: each row's top guesses of its processed
        ``logprobs``, best first. A banned guess has value ``-inf``."""
        top = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
        return top.values, top.indices


def first_guess(guide: DraftGuide, logits: torch.Tensor, branch: Sequence[int]) -> int | None:
    """The best guess (:meth:`DraftGuide.ranked`'s first) after ``branch`` for the drafter's ``logits`` ``[V]``
    there, or ``None`` when the processors ban every token: the next token of a chain of first guesses."""
    values, order = guide.ranked(guide.logprobs(logits[None], [list(branch)]), 1)
    return int(order[0, 0]) if bool(values[0, 0].isfinite()) else None


def branch_of(tokens: Sequence[int], parents: Sequence[int], node: int) -> list[int]:
    """The tokens from the root's child down to ``node`` (its ancestors, then itself), for ``parents`` indices into
    ``tokens`` (``-1``: the root)."""
    out = []
    while node >= 0:
        out.append(int(tokens[node]))
        node = parents[node]
    return out[::-1]
