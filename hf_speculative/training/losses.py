"""EAGLE training objectives, unrolled over several draft steps.

Notation for one sequence of ``T`` tokens ``x_0..x_{T-1}``: the target's feature ``f_p`` and final
normed hidden state ``n_p`` at every position. An *anchor* ``p`` is the last position whose true
feature the drafter has seen; draft step ``j`` (0-based) for anchor ``p`` sits at position
``p + j``, reads the token ``x_{p+j+1}`` and (``j = 0``) the true feature ``f_p`` or (``j > 0``) its
own previous output, and predicts ``x_{p+j+2}``, whose target distribution is
``softmax(lm_head(n_{p+j+1}))``.

Training-time test (EAGLE-3): step ``j`` attends to the true-feature keys of positions ``<= p``
(step 0, causal) and to its own chain's keys of steps ``1..j`` at anchor ``p`` (a diagonal), exactly
what it attends to when drafting, so the drafter learns from its own predicted states. Losses:
EAGLE-3 soft cross-entropy against the target's distribution over the draft vocabulary at every
step (weights 0.8^j); EAGLE-1 smooth-L1 regression of the next feature plus 0.1 x the token loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..drafters.eagle.model import EagleDraftModel


@dataclass
class StepMetrics:
    loss: float
    accuracy: list[float]  # top-1 agreement with the target per draft step
    counts: list[int]  # positions scored per draft step


def _chain_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                     anchors: torch.Tensor) -> torch.Tensor:
    """q `[B, nh, A, D]` (one row per anchor); keys/values[0] `[B, kvh, T, D]` (true features of
    every position, causal: anchor ``p`` sees positions ``<= p``); keys/values[i >= 1] `[B, kvh, A, D]`,
    the chain's own step ``i`` at the same anchor (a diagonal). Returns `[B, A, nh * D]`."""
    groups = q.shape[1] // keys[0].shape[1]
    keys = [k.repeat_interleave(groups, dim=1) for k in keys]
    values = [v.repeat_interleave(groups, dim=1) for v in values]
    scale = 1.0 / math.sqrt(q.shape[-1])
    t = keys[0].shape[2]
    visible = torch.arange(t, device=q.device)[None, :] <= anchors[:, None]  # [A, T]
    scores = [(q @ keys[0].transpose(-1, -2) * scale).masked_fill(~visible, float("-inf"))]  # [B, nh, A, T]
    scores += [(q * k).sum(-1, keepdim=True) * scale for k in keys[1:]]  # [B, nh, A, 1] each
    weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
    out = weights[..., :t] @ values[0]
    for i, v in enumerate(values[1:]):
        out = out + weights[..., t + i : t + i + 1] * v
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def unroll(net: EagleDraftModel, embed: torch.nn.Module, ids: torch.Tensor, features: torch.Tensor,
           steps: int, noise: float = 0.0, anchors: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Drafter outputs `[B, A, H]` for draft steps ``0..steps-1`` at each anchor (see module doc).

    Args:
        ids (`torch.LongTensor` of shape `[B, T]`), features (`torch.Tensor` of shape `[B, T, F]`).
        noise (`float`): uniform noise on the true features (EAGLE-1's robustness trick).
        anchors (`torch.LongTensor` of shape `[A]`, *optional*): the anchors to compute (default:
            all ``T``). Every position still provides its step-0 keys and values; only anchors run
            queries, MLP and later steps, so prompts cost little when only answers are learnt.
    """
    b, t = ids.shape
    layer = net.midlayer
    anchors = torch.arange(t, device=ids.device) if anchors is None else anchors
    shifted = torch.cat([ids, ids.new_zeros(b, steps + 1)], dim=1)
    if noise:
        features = features + (torch.rand_like(features) - 0.5) * 2 * noise
    # step 0: keys/values of every position from the true features
    emb = embed(shifted[:, 1 : t + 1])  # x_{p+1}  [B, T, H]
    fused = net.fuse(features, emb)  # [B, T, H]
    positions = torch.arange(t, device=ids.device)[None].expand(b, t)
    cos, sin = net.rope(fused, positions)
    x, residual = layer.prepare(fused, emb)
    q, k, v = layer.qkv(x, cos, sin)
    keys, values = [k], [v]
    hidden = layer.finish(residual[:, anchors], _chain_attention(q[:, :, anchors], keys, values, anchors))  # [B, A, H]
    outputs = [hidden]
    for j in range(1, steps):
        emb = embed(shifted[:, anchors + j + 1])  # x_{p+j+1}  [B, A, H]
        stream = net.fuse(hidden, emb) if net.config.version == 1 else hidden
        cos, sin = net.rope(stream, (anchors + j)[None].expand(b, -1))
        x, residual = layer.prepare(stream, emb)
        q, k, v = layer.qkv(x, cos, sin)
        keys.append(k)
        values.append(v)
        hidden = layer.finish(residual, _chain_attention(q, keys, values, anchors))
        outputs.append(hidden)
    return outputs


def learnt_anchors(loss_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Anchors `[A]` whose draft steps ``0..steps-1`` include at least one learnt token, in any row of
    ``loss_mask`` `[B, T]` (rows right-padded with zeros)."""
    t = loss_mask.shape[-1]
    learnt = loss_mask.bool().clone()  # [B, T]
    learnt[:, t - 1 :] = False  # the last position predicts nothing inside the sequence
    hit = torch.zeros_like(learnt)
    for j in range(steps):  # step j at anchor p is scored at q = p + j + 1
        hit[:, : max(t - j - 1, 0)] |= learnt[:, j + 1 :]
    return hit.any(0).nonzero().reshape(-1)


def eagle_loss(net: EagleDraftModel, embed: torch.nn.Module, head_weight: torch.Tensor, ids: torch.Tensor,
               loss_mask: torch.Tensor, features: torch.Tensor, final: torch.Tensor, steps: int,
               step_weight: float = 0.8, noise: float = 0.0,
               target_top: torch.Tensor | None = None) -> tuple[torch.Tensor, StepMetrics]:
    """The training loss of a batch of right-padded sequences and the per-step top-1 agreement with the target.

    Each sequence's loss is its mean over its learnt positions (per draft step, weighted ``0.8^j``), and the
    batch's loss is the mean over its sequences: a batch of ``B`` gives the gradient of ``B`` sequences
    accumulated one at a time. Padding needs no attention mask: it is on the right, and an anchor only
    sees positions up to itself.

    Args:
        ids (`torch.LongTensor` of shape `[B, T]`), features (`torch.Tensor` of shape `[B, T, F]`).
        head_weight (`torch.Tensor` of shape `[V, H]`): the target's lm_head weight (frozen).
        loss_mask (`torch.Tensor` of shape `[B, T]`): 1 where the next token is learnt (0 on padding).
        final (`torch.Tensor` of shape `[B, T, H]`): the target's final normed hidden states.
        target_top (`torch.LongTensor` of shape `[B, T]`, *optional*): the target's argmax at every
            position (cached; recomputed from ``final`` through the whole lm_head when absent).
    """
    b, t = ids.shape
    anchors = learnt_anchors(loss_mask, steps)
    draft_ids = net.target_ids()
    head = head_weight if draft_ids is None else head_weight[draft_ids]  # [V_d, H]
    total = features.new_zeros(())
    accuracy, counts = [], []
    if anchors.numel() == 0:
        return total, StepMetrics(0.0, [0.0] * steps, [0] * steps)
    outputs = unroll(net, embed, ids, features, steps, noise, anchors)
    kept = []  # per step: [B, A], where step j at anchor p is scored
    for j in range(steps):
        q = anchors + j + 1  # step j at anchor p predicts x_{p+j+2} from the target's position p+j+1
        kept.append((q < t - 1)[None, :] & (loss_mask[:, q.clamp(max=t - 1)] > 0))
    # the steps score mostly the same positions (anchors shifted by one a step): the target's distribution over the
    # draft vocabulary is computed once per scored position, not once per step (at --unroll 7 the seven products
    # were about a tenth of a CPU training step)
    scored = torch.zeros(b, t, dtype=torch.bool, device=ids.device)
    for j, keep in enumerate(kept):
        row, col = keep.nonzero(as_tuple=True)
        scored[row, anchors[col] + j + 1] = True
    slot = torch.full((b, t), -1, dtype=torch.long, device=ids.device)
    where = scored.nonzero(as_tuple=True)  # [U] each
    slot[where] = torch.arange(where[0].numel(), device=ids.device)
    with torch.no_grad():
        target_all = torch.softmax((final[where] @ head.T).float(), dim=-1) if where[0].numel() else None  # [U, V_d]
    for j, hidden in enumerate(outputs):
        keep = kept[j]
        n = int(keep.sum())
        counts.append(n)
        if n == 0:
            accuracy.append(0.0)
            continue
        row, col = keep.nonzero(as_tuple=True)  # [N] each: sequence and anchor of every scored position
        rows, q = hidden[row, col], anchors[col] + j + 1  # [N, H], [N]
        with torch.no_grad():
            target_p = target_all[slot[row, q]]  # [N, V_d]
            top = (target_top[row, q] if target_top is not None
                   else (final[row, q] @ head_weight.T).argmax(-1))  # the target's choice over its whole vocabulary
        logits = net.draft_logits(rows, lambda h: h @ head_weight.T).float()  # [N, V_d]
        loss = -(target_p * torch.log_softmax(logits, dim=-1)).sum(-1)  # [N]
        if net.config.version == 1:
            loss = F.smooth_l1_loss(rows, final[row, q], reduction="none").mean(-1) + 0.1 * loss
        per_sequence = loss.new_zeros(b).index_add(0, row, loss) / torch.bincount(row, minlength=b).clamp(min=1)
        total = total + (step_weight ** j) * per_sequence.sum() / b
        with torch.no_grad():
            chosen = logits.argmax(-1) if draft_ids is None else draft_ids[logits.argmax(-1)]
            accuracy.append(float((chosen == top).float().mean()))
    return total, StepMetrics(float(total.detach()), accuracy, counts)
