"""core/features.py's VerifiedFeatures queue: verified features are queued in order and joined once, when a
drafter takes them (a drafter paused for many steps must not copy its whole backlog at every step)."""

from __future__ import annotations

import torch

from hf_speculative.core import features as features_module
from hf_speculative.core.features import VerifiedFeatures
from tests.conftest import build_model


def test_the_queue_keeps_order_and_joins_only_when_read(monkeypatch):
    queue = VerifiedFeatures(build_model("llama"), [0])
    chunks = [torch.full((1, n, 4), float(i)) for i, n in enumerate((5, 1, 2, 1))]
    joins = []
    cat = torch.cat
    monkeypatch.setattr(features_module.torch, "cat",
                        lambda tensors, dim=0: joins.append(len(tensors)) or cat(tensors, dim=dim))
    assert queue.empty and queue.pending is None and queue.pop() is None
    for chunk in chunks:
        queue._queue(chunk)
        assert not queue.empty  # asking costs nothing
    assert joins == []
    assert queue.known == 9
    joined = queue.pop()
    assert joins == [4] and torch.equal(joined, cat(chunks, dim=1))
    assert queue.empty and queue.pop() is None
    queue._queue(chunks[0])
    assert queue.pending is queue.pending  # one chunk: no join, the same tensor
    queue.close()
    assert queue.empty
