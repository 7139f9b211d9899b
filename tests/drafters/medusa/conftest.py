"""Medusa heads for the tests: random ones, and oracle heads that know a reference text."""

from __future__ import annotations

import torch

from hf_speculative.drafters.medusa.config import MedusaConfig
from hf_speculative.drafters.medusa.model import MedusaHeads
from hf_speculative.core.features import tapped_features


def random_heads(target, num_heads: int = 4, lm_head: str = "per_head", layers: int = 1, seed: int = 7,
                 scale: float = 0.3) -> MedusaHeads:
    """Random heads shaped for ``target`` (weights ~ N(0, scale): every input matters)."""
    torch.manual_seed(seed)
    heads = MedusaHeads(MedusaConfig.for_target(target.config, num_heads, lm_head=lm_head, num_layers=layers))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, scale)
    return heads.to(next(target.parameters()).dtype).eval().requires_grad_(False)


class OracleHeads(MedusaHeads):
    """Heads that know ``text`` `[1, T]` (a reference output): from the target's hidden state at position ``q``
    (found as the nearest of the reference's own states), head ``k`` gives ``text[q + k + 2]`` (plus ``shift``
    modulo the vocabulary: ``shift=1`` makes every guess wrong), or ``tail`` past the end of the text."""

    def __init__(self, target, text: torch.Tensor, num_heads: int = 4, shift: int = 0, tail: int = 4):
        super().__init__(MedusaConfig.for_target(target.config, num_heads, lm_head="target"))
        self.states = tapped_features(target, [], text)[0]  # [T, H]
        self.text, self.shift, self.tail = text[0].tolist(), shift, tail
        self.requires_grad_(False).eval()

    def head_logits(self, hidden, k, target_head=None):
        q = int((self.states - hidden.float()).norm(dim=-1).argmin())
        out = torch.full((self.config.vocab_size,), -30.0)  # [V]
        at = q + k + 2
        token = self.text[at] if at < len(self.text) else self.tail
        out[(token + self.shift) % self.config.vocab_size] = 0.0
        return out
