"""The adapter that runs any of our per-call drafters in transformers' own assisted loop (a ``CandidateGenerator``).

transformers' loop (``speculative_loop="transformers"``) verifies chains and asks ``get_candidates`` /
``update_candidate_strategy``; the adapter owns what must be right there for *every* drafter:

- the draft never runs past ``max_length`` (transformers crops there only from 5.14);
- the draft is cut at a token that would fire a stopping criterion (EOS, stop strings, custom
  criteria), because transformers checks stopping criteria only at the end of an accepted block;
- statistics are counted where the events happen; the loop's sizing rules learn as in ours.

Our own loop never calls it: what it needs (the call's EOS ids and custom criteria) is read on its first use.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
)

from .. import compat
from ..core.budget import DraftBudget, Plan
from ..core.tree import DraftTree, Verdict

# Criteria that a draft never needs to be checked against token by token: max length is enforced
# by capping the draft, EOS by token ids, and wall time is not a property of the tokens.
_BUILTIN_CRITERIA = (MaxLengthCriteria, MaxTimeCriteria, EosTokenCriteria)


class AssistedLoopAdapter(compat.CandidateGenerator):
    """transformers' ``CandidateGenerator`` interface over our drafter protocol (``sizing``, ``draft``, ``observe``,
    ``ctx``, ``stats``: :class:`~hf_speculative.drafters.generator.SpeculativeCandidateGenerator`)."""

    _adapter: tuple[DraftBudget, Plan | None, DraftTree] | None = None  # transformers' loop's step
    _proposed_at: float = 0.0
    _stops: tuple[torch.Tensor | None, list] | None = None  # (EOS ids [E], custom criteria), read on first use

    def get_candidates(self, input_ids: torch.LongTensor, *args: Any, **kwargs: Any):
        """Returns the full sequence `[1, L+k]` and the candidate logits `[1, k, V]` or ``None``."""
        first_call = self._adapter is None
        if first_call:
            if self.ctx.prompt_length is None:
                self.ctx.prompt_length = input_ids.shape[1]
            budget = DraftBudget(self.sizing)
        else:
            budget = self._adapter[0]
        start = time.perf_counter()
        # Leave room for the target's own token: L + k + 1 <= max_length.
        room = self.ctx.max_length - input_ids.shape[1] - 1
        plan, tree, logits = budget.plan(max(room, 1), chain_only=True), DraftTree.empty(input_ids.device), None
        if room > 0:
            self.draft_logits = None
            tree = self.draft(input_ids, plan).first_branch().first(room)
            keep = self._length_before_stop(input_ids, tree.tokens.to(input_ids.device)) if tree.size else 0
            tree, logits = tree.first(keep), self.draft_logits
            if logits is None and tree.q is not None:  # drawn from q under the rejection rule: transformers reads q
                logits = tree.q.clamp_min(1e-30).log()
            logits = None if logits is None or keep == 0 else logits[:keep]
        if tree.size == 0 and first_call and room > 0 and self._prompt_already_stopped(input_ids):
            # transformers < 5.18 drops the last candidate when the candidate sequence already
            # satisfies a stopping criterion, and with no candidate at all that drops the target's
            # own token. One filler candidate keeps the target's token whatever it is (accepted or
            # not, the loop appends exactly the target's choice).
            tree, logits = DraftTree.chain(input_ids[0, -1:]), None
        self._adapter = (budget, plan, tree)
        self.stats.record_draft(tree.size, time.perf_counter() - start)
        self._proposed_at = time.perf_counter()
        if tree.size == 0:
            return input_ids, None
        candidates = torch.cat([input_ids, tree.tokens.to(input_ids.device)[None, :]], dim=-1)  # [1, L+k]
        if logits is not None:
            logits = self._to_target_vocab(logits)[None].to(input_ids.device)  # [1, k, V]
        return candidates, logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: Any) -> None:
        budget, plan, tree = self._adapter
        accepted = min(int(num_matches), tree.size)
        seconds = time.perf_counter() - self._proposed_at
        self.stats.record_verify(accepted, seconds)
        self.stats.new_tokens = input_ids.shape[1] - (self.prompt_length or input_ids.shape[1])
        verdict = Verdict(tuple(range(accepted)), int(input_ids[0, -1]))
        # (the prefill's forward is not a verification: it says nothing of verify costs)
        budget.verified(plan, tree, verdict, seconds if self.after_prefill else None)
        self.observe(input_ids, tree, verdict, scores[0] if scores is not None and scores.dim() == 3 else scores)

    # -- helpers ----------------------------------------------------------------------------
    def _length_before_stop(self, input_ids: torch.LongTensor, tokens: torch.Tensor) -> int:
        """Number of draft tokens to keep so that no stopping criterion fires inside the block.

        The draft is cut *before* the stopping token: the target produces it itself if it chooses it, a
        choice that is deterministic under greedy decoding and under seeded sampling alike (see accept.py).
        """
        if self._stops is None:
            eos = compat.eos_token_ids(self.ctx.generation_config)
            self._stops = (torch.tensor(eos, dtype=torch.long) if eos else None,
                           [c for c in (self.ctx.stopping_criteria or []) if not isinstance(c, _BUILTIN_CRITERIA)])
        eos_tensor, custom = self._stops
        limit = tokens.numel()
        if eos_tensor is not None:
            hits = torch.isin(tokens, eos_tensor.to(tokens.device)).nonzero()
            if hits.numel():
                limit = int(hits[0])
        if custom and limit > 0:
            sequence = torch.cat([input_ids, tokens[None, :limit]], dim=-1)
            base = input_ids.shape[1]
            for i in range(1, limit + 1):
                if any(compat.stopping_result(c(sequence[:, : base + i], None)) for c in custom):
                    return i - 1
        return limit

    def _prompt_already_stopped(self, input_ids: torch.LongTensor) -> bool:
        """Whether a stopping criterion already holds for the prompt itself (e.g. it ends with EOS),
        on versions whose loop then mishandles an empty draft."""
        if not compat.HAS_IS_DONE_CANDIDATE_RULE or not self.ctx.stopping_criteria:
            return False
        return compat.stopping_result(self.ctx.stopping_criteria(input_ids, None))
