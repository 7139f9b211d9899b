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


def _chain_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """q `[B, nh, T, D]`; keys/values[0] `[B, kvh, T, D]` (true features, causal over anchors),
    keys/values[i >= 1] the chain's own step ``i`` at the same anchor (diagonal). Returns `[B, T, nh*D]`."""
    groups = q.shape[1] // keys[0].shape[1]
    keys = [k.repeat_interleave(groups, dim=1) for k in keys]
    values = [v.repeat_interleave(groups, dim=1) for v in values]
    scale = 1.0 / math.sqrt(q.shape[-1])
    t = q.shape[2]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = [(q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]  # [B, nh, T, T]
    scores += [(q * k).sum(-1, keepdim=True) * scale for k in keys[1:]]  # [B, nh, T, 1] each
    weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
    out = weights[..., :t] @ values[0]
    for i, v in enumerate(values[1:]):
        out = out + weights[..., t + i : t + i + 1] * v
    return out.transpose(1, 2).reshape(q.shape[0], t, -1)


def unroll(net: EagleDraftModel, embed: torch.nn.Module, ids: torch.Tensor, features: torch.Tensor,
           steps: int, noise: float = 0.0) -> list[torch.Tensor]:
    """Drafter outputs `[B, T, H]` for draft steps ``0..steps-1`` at every anchor (see module doc).

    Args:
        ids (`torch.LongTensor` of shape `[B, T]`), features (`torch.Tensor` of shape `[B, T, F]`).
        noise (`float`): uniform noise on the true features (EAGLE-1's robustness trick).
    """
    b, t = ids.shape
    layer = net.midlayer
    pad = ids.new_zeros(b, steps + 1)
    shifted = torch.cat([ids, pad], dim=1)
    if noise:
        features = features + (torch.rand_like(features) - 0.5) * 2 * noise
    outputs, keys, values = [], [], []
    hidden = features
    for j in range(steps):
        emb = embed(shifted[:, j + 1 : j + 1 + t])  # x_{p+j+1}  [B, T, H]
        residual = net.fuse(hidden, emb) if (j == 0 or net.config.version == 1) else hidden
        positions = (torch.arange(t, device=ids.device) + j)[None].expand(b, t)
        cos, sin = net.rope(residual, positions)
        q, k, v = layer.qkv(layer.attention_input(residual, emb), cos, sin)
        keys.append(k)
        values.append(v)
        hidden = layer.finish(residual, _chain_attention(q, keys, values))
        outputs.append(hidden)
    return outputs


def eagle_loss(net: EagleDraftModel, embed: torch.nn.Module, head_weight: torch.Tensor, ids: torch.Tensor,
               loss_mask: torch.Tensor, features: torch.Tensor, final: torch.Tensor, steps: int,
               step_weight: float = 0.8, noise: float = 0.0,
               target_top: torch.Tensor | None = None) -> tuple[torch.Tensor, StepMetrics]:
    """The training loss of one batch and its per-step top-1 agreement with the target.

    Args:
        head_weight (`torch.Tensor` of shape `[V, H]`): the target's lm_head weight (frozen).
        loss_mask (`torch.Tensor` of shape `[B, T]`): 1 where the next token is learnt.
        final (`torch.Tensor` of shape `[B, T, H]`): the target's final normed hidden states.
        target_top (`torch.LongTensor` of shape `[B, T]`, *optional*): the target's argmax at every
            position (cached; recomputed from ``final`` through the whole lm_head when absent).
    """
    outputs = unroll(net, embed, ids, features, steps, noise)
    t = ids.shape[1]
    draft_ids = net.target_ids()
    head = head_weight if draft_ids is None else head_weight[draft_ids]  # [V_d, H]
    with torch.no_grad():
        target_logits = final @ head.T  # [B, T, V_d]: position q predicts x_{q+1}
        # Drafts are judged against the target's choice over its whole vocabulary.
        if target_top is None:
            target_top = (final @ head_weight.T).argmax(-1) if draft_ids is not None else target_logits.argmax(-1)
    total = ids.new_zeros((), dtype=torch.float32)
    accuracy, counts = [], []
    for j, hidden in enumerate(outputs):
        # step j at anchor p predicts x_{p+j+2}: the target's distribution at position q = p+j+1
        q = torch.arange(t, device=ids.device) + j + 1
        valid = q < t - 1
        q = q.clamp(max=t - 1)
        mask = (loss_mask[:, q] > 0) & valid[None]  # [B, T]
        n = int(mask.sum())
        counts.append(n)
        if n == 0:
            accuracy.append(0.0)
            continue
        logits = net.draft_logits(hidden, lambda h: h @ head_weight.T).float()  # [B, T, V_d]
        target_p = torch.softmax(target_logits[:, q].float(), dim=-1)
        token_loss = -(target_p * torch.log_softmax(logits, dim=-1)).sum(-1)  # [B, T]
        loss = token_loss[mask].mean()
        if net.config.version == 1:
            loss = F.smooth_l1_loss(hidden[mask], final[:, q][mask]) + 0.1 * loss
        total = total + (step_weight ** j) * loss
        with torch.no_grad():
            chosen = logits.argmax(-1) if draft_ids is None else draft_ids[logits.argmax(-1)]
            accuracy.append(float((chosen == target_top[:, q])[mask].float().mean()))
    return total, StepMetrics(float(total.detach()), accuracy, counts)
