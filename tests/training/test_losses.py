"""The training-time unroll must compute exactly what drafting computes (else the drafter trains on
states it never sees), and the losses must point at the target's own choices."""

from __future__ import annotations

import pytest
import torch

from hf_speculative.drafters.eagle.model import DraftKVCache
from hf_speculative.training.losses import unroll
from tests.conftest import build_model, fit_eagle, random_eagle


@pytest.mark.parametrize("version", [1, 3])
def test_unroll_matches_chain_drafting(version):
    target = build_model("llama", layers=4)
    net = random_eagle(target, version=version)
    embed = target.get_input_embeddings()
    torch.manual_seed(1)
    t, steps = 12, 3
    ids = torch.randint(0, target.config.vocab_size, (1, t))
    features = torch.randn(1, t, net.config.feature_size)
    with torch.no_grad():
        outputs = unroll(net, embed, ids, features, steps)
        for anchor in (0, 4, 8):
            # Inference: true pairs up to the anchor, then the chain on the drafter's own states.
            cache = DraftKVCache()
            hidden = net(embed(ids[:, 1 : anchor + 2]), features[:, : anchor + 1], torch.arange(anchor + 1)[None], cache)
            hidden = hidden[:, -1:]
            torch.testing.assert_close(hidden[0, 0], outputs[0][0, anchor], atol=1e-5, rtol=1e-4)
            for j in range(1, steps):
                token = ids[:, anchor + j + 1 : anchor + j + 2]
                hidden = net(embed(token), hidden, torch.tensor([[anchor + j]]), cache, fused=False)
                torch.testing.assert_close(hidden[0, 0], outputs[j][0, anchor], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("version", [1, 3])
def test_training_steps_learn_the_targets_choices(version):
    """A few hundred optimizer steps on one sequence drive the per-step agreement with the
    target's argmax up, for the first and the unrolled steps: the losses point the right way."""
    target = build_model("llama", layers=4, init=0.3)  # peaked distributions: a clear argmax to learn
    target.requires_grad_(False)
    torch.manual_seed(3)
    ids = torch.randint(4, target.config.vocab_size, (1, 24))
    _, before, after = fit_eagle(target, version, ids, iterations=150, unroll=2)
    assert after.accuracy[0] > max(before.accuracy[0], 0.9), (before, after)
    assert after.accuracy[1] > max(before.accuracy[1], 0.6), (before, after)


@pytest.mark.parametrize("version", [1, 3])
def test_anchor_subset_equals_full_unroll(version):
    """Computing only the learnt anchors (the answer of a self-distillation row) changes nothing there."""
    from hf_speculative.training.losses import learnt_anchors

    target = build_model("llama", layers=4)
    net = random_eagle(target, version=version)
    torch.manual_seed(4)
    t, steps = 16, 3
    ids = torch.randint(0, target.config.vocab_size, (1, t))
    features = torch.randn(1, t, net.config.feature_size)
    mask = torch.zeros(1, t, dtype=torch.long)
    mask[0, 9:15] = 1  # answer tokens 10..15 are learnt
    anchors = learnt_anchors(mask, steps)
    assert anchors.tolist() == list(range(6, 14))  # anchors whose steps reach a learnt position
    with torch.no_grad():
        full = unroll(net, target.get_input_embeddings(), ids, features, steps)
        part = unroll(net, target.get_input_embeddings(), ids, features, steps, anchors=anchors)
    for a, b in zip(full, part):
        torch.testing.assert_close(a[:, anchors], b, atol=1e-5, rtol=1e-4)
