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


def _per_step_loss(net, embed, head_weight, ids, loss_mask, features, final, steps, step_weight=0.8):
    """eagle_loss as written before it shared the target's distribution between steps: each step computes the
    target's softmax over the draft vocabulary for its own scored positions."""
    from hf_speculative.training.losses import learnt_anchors

    b, t = ids.shape
    anchors = learnt_anchors(loss_mask, steps)
    draft_ids = net.target_ids()
    head = head_weight if draft_ids is None else head_weight[draft_ids]
    total, counts = features.new_zeros(()), []
    for j, hidden in enumerate(unroll(net, embed, ids, features, steps, 0.0, anchors)):
        q = anchors + j + 1
        keep = (q < t - 1)[None, :] & (loss_mask[:, q.clamp(max=t - 1)] > 0)
        counts.append(int(keep.sum()))
        if not counts[-1]:
            continue
        row, col = keep.nonzero(as_tuple=True)
        rows, q = hidden[row, col], q[col]
        target_p = torch.softmax((final[row, q] @ head.T).float(), dim=-1)
        logits = net.draft_logits(rows, lambda h: h @ head_weight.T).float()
        loss = -(target_p * torch.log_softmax(logits, dim=-1)).sum(-1)
        if net.config.version == 1:
            loss = torch.nn.functional.smooth_l1_loss(rows, final[row, q], reduction="none").mean(-1) + 0.1 * loss
        per_sequence = loss.new_zeros(b).index_add(0, row, loss) / torch.bincount(row, minlength=b).clamp(min=1)
        total = total + (step_weight ** j) * per_sequence.sum() / b
    return total, counts


@pytest.mark.parametrize("version,draft_vocab", [(1, None), (3, None), (3, 64)])
def test_the_loss_is_each_steps_own_target_distribution(version, draft_vocab):
    """The target's distribution is computed once per scored position and shared by the steps that score it: the
    loss and its gradients are the per-step definition's, on a padded batch with short and empty answers."""
    from hf_speculative.training.losses import eagle_loss

    target = build_model("llama", layers=4).requires_grad_(False)
    net = random_eagle(target, version=version, draft_vocab_size=draft_vocab).requires_grad_(True)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings().weight
    torch.manual_seed(3)
    b, t, steps = 3, 17, 4
    ids = torch.randint(0, target.config.vocab_size, (b, t))
    features = torch.randn(b, t, net.config.feature_size)
    final = torch.randn(b, t, target.config.hidden_size)
    mask = torch.zeros(b, t)
    mask[0, 4:16], mask[1, 10:12] = 1, 1  # a long answer, a two-token one; row 2 learns nothing
    net.zero_grad()
    loss, metrics = eagle_loss(net, embed, head, ids, mask, features, final, steps)
    loss.backward()
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    expected, counts = _per_step_loss(net, embed, head, ids, mask, features, final, steps)
    expected.backward()
    assert metrics.counts == counts and min(counts) > 0
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, (p.grad for p in net.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
