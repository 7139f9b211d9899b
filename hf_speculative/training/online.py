"""The target's features computed for each batch as training reads it (``train-eagle --features online``).

:class:`~hf_speculative.training.data.FeatureCache` runs the target once over every example and keeps
what it saw on disk: fast epochs, but ``(F + H) x 2`` bytes per token (EAGLE-3 on an 8B target: 32 KB a
token, 3.3 TB for 100M tokens). Online, the target runs again for every batch of every epoch and nothing is
written: disk stays flat, the first step comes at once, and each process (each GPU) computes the features
of its own batches. The numbers are those the cache would hold (rounded to float16, zero past a
sequence's end), so both modes train the same drafter; with one sequence per forward, bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.features import FeatureTap
from .data import Example, _forward_features


class OnlineFeatures:
    """What a :class:`~hf_speculative.training.data.FeatureCache` gives, computed by ``target`` on demand.

    Args:
        target (`PreTrainedModel`): the frozen target, on the training device.
        examples (`list[Example]`): the examples that :meth:`get` indexes.
        layers (`list[int]`): EAGLE-3's fused layers; empty for EAGLE-1 (features = final hidden).
    """

    def __init__(self, target: Any, examples: list[Example], layers: list[int]):
        self.target, self.examples, self.layers = target, examples, list(layers)

    def __len__(self) -> int:
        return len(self.examples)

    @torch.no_grad()
    def forward(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One target forward over right-padded ``sequences``: features `[B, T, F]` and final states `[B, T, H]`
        (float32 holding float16 values, zero past each sequence's end) and the argmax `[B, T]`, on the target's device."""
        # hooks only around this forward: validation's generate() runs the same target between batches
        tap = FeatureTap(self.target, self.layers)
        final_tap = FeatureTap(self.target, []) if self.layers else None
        try:
            feats, norm, best = _forward_features(self.target, sequences, tap, final_tap)
        finally:
            tap.remove()
            if final_tap is not None:
                final_tap.remove()
        lengths = torch.tensor([len(s) for s in sequences], device=best.device)
        real = torch.arange(best.shape[1], device=best.device)[None, :] < lengths[:, None]  # [B, T]
        as_cached = [x.float().half().float() * real[..., None] for x in (feats, norm)]  # the cache's float16
        return as_cached[0], as_cached[1], best.long() * real

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Features `[T, F]`, final states `[T, H]` (float32) and argmax `[T]` of example ``i``, like ``FeatureCache.get``."""
        feats, norm, best = self.forward([self.examples[i].ids])
        return feats[0], norm[0], best[0]

    def fill(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``batch`` (``ids`` `[B, T]` right-padded, ``lengths`` `[B]`) with its ``features``, ``final`` and ``top``."""
        sequences = [row[:n].tolist() for row, n in zip(batch["ids"], batch["lengths"].tolist())]
        feats, norm, best = self.forward(sequences)
        device = batch["ids"].device
        return dict(batch, features=feats.to(device), final=norm.to(device), top=best.to(device))
