"""A drafter of chosen acceptance, for timing the verification machinery on random-weight models.

Random weights make every real drafter's acceptance meaningless, and timing two decoding loops against each
other needs the *same* drafts in both. :class:`SyntheticDrafter` knows the target's greedy continuation (computed
beforehand with plain ``generate``) and proposes ``num_tokens`` tokens after a sequence of length ``L``: the
token at position ``p`` is the true one when ``u(seed, p) < acceptance`` (``u`` a fixed hash to [0, 1)), else a
wrong one, and the draft stops after its first wrong token. The accepted length therefore depends only on the
positions, so every loop that verifies these drafts accepts exactly the same tokens: equal tau, and speed
differences that are the loops' own. It is a raw transformers ``CandidateGenerator``, so transformers' own
assisted loop runs it too (through an enabled model's ``candidate_generator=``).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import torch
from transformers.generation.candidate_generator import CandidateGenerator


def _uniform(seed: int, position: int) -> float:
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0 ** 64


class SyntheticDrafter(CandidateGenerator):
    """Drafts of ``num_tokens`` tokens along ``reference``, each right with probability ``acceptance``.

    Args:
        reference (`Sequence[int]` or `torch.Tensor`): the target's greedy sequence, prompt included.
        num_tokens (`int`, defaults to 8): draft length (cut at the reference's end).
        acceptance (`float`, defaults to 0.7): the chance that each drafted token is right.
        seed (`int`, defaults to 0): which positions are right.
        vocab_size (`int`, defaults to 32000): wrong tokens are drawn below it.
    """

    def __init__(self, reference: Sequence[int] | torch.Tensor, num_tokens: int = 8, acceptance: float = 0.7,
                 seed: int = 0, vocab_size: int = 32000):
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"SyntheticDrafter(acceptance={acceptance}): give a probability from 0 to 1.")
        self.reference = [int(t) for t in torch.as_tensor(reference).reshape(-1)]
        self.num_tokens, self.acceptance, self.seed, self.vocab_size = int(num_tokens), acceptance, seed, vocab_size

    def draft(self, length: int) -> list[int]:
        """The draft after ``length`` verified tokens."""
        tokens = []
        for position in range(length, min(length + self.num_tokens, len(self.reference))):
            true = self.reference[position]
            if _uniform(self.seed, position) < self.acceptance:
                tokens.append(true)
                continue
            tokens.append((true + 1 + int(_uniform(self.seed + 1, position) * (self.vocab_size - 2))) % self.vocab_size)
            break
        return tokens

    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs):
        tokens = self.draft(input_ids.shape[1])
        if not tokens:
            return input_ids, None
        return torch.cat([input_ids, input_ids.new_tensor([tokens])], dim=-1), None

    def update_candidate_strategy(self, input_ids, scores, num_matches) -> None:
        """Nothing to learn: the drafts are fixed by position."""
