"""Attention for training's many windows in one forward (``DFlashDraftModel.forward_blocks``), without the masked-out
pairs.

In training, ``N`` windows of ``W`` positions each (``Q = N * W`` queries) attend to the context's ``S`` keys (each
window to the positions before its anchor) and to their own window's ``W`` keys, never to another window's. Dense
attention over ``[context; every window]`` computes ``Q * (S + Q)`` scores of which ``Q * Q - Q * W`` are masked out: at
the CPU recipe's shapes (a few hundred anchors, blocks of 10) that was most of the attention's work. Here the two parts
are computed apart and share one softmax::

    s_c = q k_c^T / sqrt(D)              # [B, kvh, g, Q, S]     the context, masked per window
    s_o = q_n k_n^T / sqrt(D)            # [B, kvh, g, N, W, W]  each window's own keys only
    m = max(max s_c, max s_o)            # per query
    out = (exp(s_c - m) v_c + exp(s_o - m) v_n) / (sum exp(s_c - m) + sum exp(s_o - m))

which is exactly the softmax over the union of the keys each query may see (the rest weigh ``exp(-inf) = 0``).
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class WindowBlocks:
    """What each window query may see (True), split: ``context`` bool `[B, 1, Q, S]` and ``own`` bool
    `[B, 1, N, W, W]` (a window's queries against its own keys). Every query must see some key."""

    context: torch.Tensor
    own: torch.Tensor

    @classmethod
    def from_mask(cls, mask: torch.Tensor, context_length: int, width: int) -> WindowBlocks:
        """Split a dense mask `[B, 1, Q, S + Q]` whose window part is block-diagonal (blocks of ``width``); a mask that
        lets a window see another window's keys is refused (the split would drop those pairs)."""
        b, _, q, _ = mask.shape
        if q % width:
            raise ValueError(f"WindowBlocks: {q} window queries are not whole windows of {width}.")
        n = q // width
        windows = mask[:, :, :, context_length:]  # [B, 1, Q, Q]
        own = torch.diagonal(windows.reshape(b, 1, n, width, n, width), dim1=2, dim2=4)  # [B, 1, W, W, N]
        own = own.permute(0, 1, 4, 2, 3).contiguous()  # [B, 1, N, W, W]
        if int(windows.sum()) != int(own.sum()):
            raise ValueError("WindowBlocks: the mask lets a window attend to another window's positions; use dense "
                             "attention for such masks.")
        return cls(mask[:, :, :, :context_length], own)


def attend_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: WindowBlocks) -> torch.Tensor:
    """q `[B, nh, Q, D]`; k, v `[B, kvh, S + Q, D]` (the context's keys, then the windows'); returns `[B, Q, nh * D]`,
    equal to SDPA over all ``S + Q`` keys with the dense mask that ``blocks`` was split from."""
    b, nh, q_len, d = q.shape
    kvh = k.shape[1]
    g, s = nh // kvh, blocks.context.shape[-1]
    n, w = blocks.own.shape[2], blocks.own.shape[3]
    scale = d ** -0.5
    queries = q.reshape(b, kvh, g, q_len, d)  # query heads grouped under their key/value head
    k_c, v_c = k[:, :, None, :s], v[:, :, None, :s]  # [B, kvh, 1, S, D]
    k_o = k[:, :, None, s:].reshape(b, kvh, 1, n, w, d)
    v_o = v[:, :, None, s:].reshape(b, kvh, 1, n, w, d)
    # the softmax in float32 whatever the products' dtype (bf16 under autocast: its sums over a long context would
    # lose the small weights)
    scores_c = (queries @ k_c.transpose(-1, -2)).float() * scale  # [B, kvh, g, Q, S]
    scores_c = scores_c.masked_fill(~blocks.context[:, :, None], float("-inf"))
    scores_o = (queries.reshape(b, kvh, g, n, w, d) @ k_o.transpose(-1, -2)).float() * scale  # [B, kvh, g, N, W, W]
    scores_o = scores_o.masked_fill(~blocks.own[:, :, None], float("-inf"))
    top = torch.maximum(scores_c.amax(-1), scores_o.amax(-1).reshape(b, kvh, g, q_len)).detach()  # [B, kvh, g, Q]
    p_c = torch.exp(scores_c - top[..., None])
    p_o = torch.exp(scores_o - top.reshape(b, kvh, g, n, w)[..., None])
    total = p_c.sum(-1) + p_o.sum(-1).reshape(b, kvh, g, q_len)  # [B, kvh, g, Q]
    v_c, v_o = v_c.to(p_c.dtype), v_o.to(p_o.dtype)  # float32 products unless autocast casts them (as SDPA's P V)
    out = (p_c @ v_c + (p_o @ v_o).reshape(b, kvh, g, q_len, d)) / total[..., None]  # [B, kvh, g, Q, D]
    return out.to(v.dtype).reshape(b, nh, q_len, d).transpose(1, 2).reshape(b, q_len, nh * d)
