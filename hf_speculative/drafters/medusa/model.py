"""The Medusa heads as a module: residual blocks per head, then a vocabulary head (see ``config.py``).

Our parameter names are vLLM's (``blocks.{i}.layers.{j}.weight``, ``lm_heads.{i}.weight``; ``lm_head.weight``
for one shared head), so checkpoints in the three layouts differ only in names that ``formats.py`` maps.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import MedusaConfig


class ResidualBlocks(nn.Module):
    """``num_layers`` blocks ``x <- x + SiLU(W_j x + b_j)`` (Medusa's ResBlock; zero ``W`` is the identity)."""

    def __init__(self, hidden_size: int, num_layers: int, bias: bool):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size, bias=bias) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + nn.functional.silu(layer(x))
        return x


class MedusaHeads(nn.Module):
    """All heads of one target.

    Args:
        config (`MedusaConfig`): the shape; ``config.lm_head == "target"`` stores no vocabulary head (the
            target's lm_head is passed to :meth:`logits`).
    """

    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.config = config
        h, v = config.hidden_size, config.vocab_size
        self.blocks = nn.ModuleList(ResidualBlocks(h, config.num_layers, config.block_bias)
                                    for _ in range(config.num_heads))
        if config.lm_head == "per_head":
            self.lm_heads = nn.ModuleList(nn.Linear(h, v, bias=False) for _ in range(config.num_heads))
        elif config.lm_head == "shared":
            self.lm_head = nn.Linear(h, v, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Every head's state before its vocabulary head: ``hidden`` `[..., H]` -> `[K, ..., H]`."""
        return torch.stack([block(hidden) for block in self.blocks])

    def head_logits(self, hidden: torch.Tensor, k: int, target_head: nn.Module | None = None) -> torch.Tensor:
        """Head ``k``'s logits: ``hidden`` `[..., H]` (the target's normed last hidden state) -> `[..., V]`. The
        vocabulary projection is most of a head's cost, so drafters ask for the heads they use, one by one.
        ``target_head`` (the target's lm_head) is needed when ``config.lm_head == "target"``."""
        state = self.blocks[k](hidden)  # [..., H]
        if self.config.lm_head == "per_head":
            return self.lm_heads[k](state)
        head = self.lm_head if self.config.lm_head == "shared" else target_head
        if head is None:
            raise ValueError("These Medusa heads use the target's lm_head (lm_head='target'): pass it, "
                             "heads.logits(hidden, target.get_output_embeddings()).")
        return head(state)

    def logits(self, hidden: torch.Tensor, target_head: nn.Module | None = None) -> torch.Tensor:
        """Every head's logits: ``hidden`` `[..., H]` -> `[K, ..., V]` (see :meth:`head_logits`)."""
        return torch.stack([self.head_logits(hidden, k, target_head) for k in range(self.config.num_heads)])
