"""The EAGLE drafter network, built from transformers' Llama building blocks.

EAGLE-1 (Li et al. 2024a) reads the target's last hidden state ``f_t`` and the embedding of the
next token ``x_{t+1}``, fuses them with ``fc`` (2H -> H) and runs one decoder layer whose output
is the predicted ``f_{t+1}``; the target's own lm_head turns it into token logits.

EAGLE-3 (Li et al. 2025) fuses three of the target's layers (low, middle, high: 3H -> H with
``fc``), feeds the decoder layer ``[norm(embedding) ; norm(feature)]`` (2H wide q/k/v inputs), and
has its own final norm and lm_head over a reduced vocabulary whose ids map to the target's through
``d2t`` (target id = draft id + d2t[draft id]). After the first step it feeds back its own output
hidden state (H wide, no ``fc``).

Only the projections, norms, MLP and rotary embedding come from transformers; the attention is
computed here with SDPA over an explicit KV cache, because drafting needs cheap rollback and
custom masks (the training-time test of EAGLE-3 and, later, draft trees).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from ... import compat
from ...cpu.layers import Plan, drafter_kernel, kernel_mask
from .config import EagleConfig

_SDPA_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


class SlotCache:
    """A fixed-shape cache's view for one forward (``static_drafting``'s, EAGLE's and DFlash's): ``append`` writes the
    forward's keys and values at ``slots`` (``[T]``, along dim 2 of the buffers ``[1, kvh, C, D]``) and returns the
    whole buffers; the forward's mask hides what a row may not see."""

    length = 0  # (unused: the mask is always given)

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor):
        self.keys, self.values, self.slots = keys, values, slots

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys.index_copy_(2, self.slots, k)  # [1, kvh, C, D]
        self.values.index_copy_(2, self.slots, v)
        return self.keys, self.values


class DraftKVCache:
    """Keys and values of the drafter's single layer, `[B, kv_heads, capacity, D]`, grown by doubling;
    ``crop(n)`` rolls back to the first ``n`` positions at no cost."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new = k.shape[2]
        if self.k is None or self.length + new > self.k.shape[2]:
            capacity = max(2 * (self.length + new), 64)
            grown_k = k.new_empty((*k.shape[:2], capacity, k.shape[3]))
            grown_v = v.new_empty((*v.shape[:2], capacity, v.shape[3]))
            if self.k is not None:
                grown_k[:, :, : self.length] = self.k[:, :, : self.length]
                grown_v[:, :, : self.length] = self.v[:, :, : self.length]
            self.k, self.v = grown_k, grown_v
        self.k[:, :, self.length : self.length + new] = k
        self.v[:, :, self.length : self.length + new] = v
        self.length += new
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def crop(self, length: int) -> None:
        self.length = min(self.length, max(length, 0))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """SDPA with grouped KV heads. q `[B, nh, T, D]`, k/v `[B, kvh, S, D]`, mask bool `[T, S]`
    (True = may attend) or ``None`` for full attention. Returns `[B, T, nh * D]`."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and not _SDPA_GQA:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    kwargs = {"enable_gqa": True} if groups > 1 and _SDPA_GQA else {}
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)  # [B, nh, T, D]
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def causal_mask(new: int, past: int, device: torch.device) -> torch.Tensor | None:
    """Mask for ``new`` positions after ``past`` cached ones: `[new, past + new]`, or ``None`` for one."""
    if new == 1:
        return None
    rows = torch.arange(new, device=device)[:, None] + past
    return torch.arange(past + new, device=device)[None, :] <= rows


class EagleLayer(nn.Module):
    """One decoder layer; EAGLE-3's takes ``[norm(embedding) ; norm(hidden)]`` (2H) into q/k/v."""

    def __init__(self, config: EagleConfig, llama_config):
        super().__init__()
        self.version = config.version
        self.norm_before_residual = config.norm_before_residual
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        self.self_attn = LlamaAttention(llama_config, layer_idx=0)
        if config.version == 3:
            wide = 2 * config.hidden_size
            for name, heads in (("q_proj", self.num_heads), ("k_proj", self.num_kv_heads), ("v_proj", self.num_kv_heads)):
                setattr(self.self_attn, name, nn.Linear(wide, heads * self.head_dim, bias=config.attention_bias))
            self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if config.version == 3 or config.input_layernorm:
            self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(llama_config)

    def prepare(self, hidden: torch.Tensor, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What q/k/v are projected from, `[B, T, H]` (EAGLE-1) or `[B, T, 2H]` (EAGLE-3), and the
        residual stream `[B, T, H]`."""
        if self.version == 3:
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            return torch.cat([self.input_layernorm(embeds), normed], dim=-1), residual
        norm = getattr(self, "input_layernorm", None)
        return (hidden if norm is None else norm(hidden)), hidden

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated q `[B, nh, T, D]`, k and v `[B, kvh, T, D]`."""
        b, t, _ = x.shape
        attn = self.self_attn
        q = attn.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def native_plan(self, kernel):
        """The layer's plan for the native calls (``hf_speculative.cpu.layers``): q/k/v take :meth:`prepare`'s
        output as it is, the MLP its post-attention norm."""
        plan = self.__dict__.get("_hfs_plan")
        if plan is None:
            plan = self._hfs_plan = Plan()
        return plan.get(kernel, self.self_attn, self.mlp, (None, None, None, None, self.post_attention_layernorm, None))

    def finish(self, residual: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Output projection, residuals and MLP: `[B, T, H]`."""
        hidden = residual + self.self_attn.o_proj(attn_out)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class EagleDraftModel(nn.Module):
    """The drafter's own weights; the target's embedding (and, for EAGLE-1, its lm_head) are
    passed in at call time and never stored.

    Args:
        config (`EagleConfig`): the drafter's shape.
    """

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.llama_config = compat.llama_config(
            hidden_size=h, intermediate_size=config.intermediate_size, num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps,
            rope_theta=config.rope_theta, rope_scaling=config.rope_scaling, hidden_act=config.hidden_act,
            max_position_embeddings=config.max_position_embeddings, attention_bias=config.attention_bias,
            mlp_bias=config.mlp_bias, vocab_size=config.vocab_size, num_hidden_layers=1,
        )
        self.fc = nn.Linear(config.feature_size + (h if config.version == 1 else 0), h, bias=config.fc_bias)
        self.midlayer = EagleLayer(config, self.llama_config)
        self.rotary_emb = LlamaRotaryEmbedding(config=self.llama_config)
        if config.version == 3:
            self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
            self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))

    # -- pieces shared by inference and training ----------------------------------------------
    def fuse(self, features: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """Target features `[B, T, F]` -> the layer's residual stream `[B, T, H]`."""
        if self.config.version == 1:
            return self.fc(torch.cat([embeds, features], dim=-1))
        return self.fc(features)

    def rope(self, hidden: torch.Tensor, positions: torch.Tensor):
        """cos, sin `[B, T, D]` for ``positions`` `[B, T]`."""
        return self.rotary_emb(hidden, positions)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: DraftKVCache | None = None,
        *,
        fused: bool = True,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One drafter pass over ``T`` new positions.

        Args:
            embeds (`torch.Tensor` of shape `[B, T, H]`): the target's embeddings of the tokens
                ``x_{t+1}`` paired with each feature.
            hidden (`torch.Tensor` of shape `[B, T, F]` or `[B, T, H]`): the target's features
                ``f_t`` (``fused=True``) or, EAGLE-3 only, the drafter's own previous output (``fused=False``;
                for EAGLE-1 a predicted feature is a target-like feature and goes through ``fc``).
            positions (`torch.Tensor` of shape `[B, T]`): position ids (``t``).
            cache (`DraftKVCache`, *optional*): keys/values of earlier positions; extended in place.
            attn_mask (`torch.Tensor`, *optional*): bool `[T, past + T]`; causal by default.

        Returns:
            `torch.Tensor` of shape `[B, T, H]`: the output hidden states (pre-norm).
        """
        if fused or self.config.version == 1:
            hidden = self.fuse(hidden, embeds)
        layer = self.midlayer
        cos, sin = self.rope(hidden, positions)
        x, residual = layer.prepare(hidden, embeds)
        kernel = drafter_kernel(x, layer.self_attn)  # after optimize_for_cpu(target): the native calls
        plan = None if kernel is None else layer.native_plan(kernel)
        kernel = None if plan is None else kernel
        if kernel is not None:
            x = x.contiguous()
            q, k, v = kernel.attention_inputs(plan, x, cos.contiguous(), sin.contiguous())
        else:
            q, k, v = layer.qkv(x, cos, sin)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)
        if kernel is not None:
            fits, mask = kernel_mask(attn_mask, x.shape[0], x.shape[1], k.shape[2])
            if fits:
                return kernel.layer_output(plan, residual.contiguous(), q, k, v, mask)
        if attn_mask is None:
            attn_mask = causal_mask(q.shape[2], past, q.device)
        if kernel is not None:  # a mask the kernel's attention does not read: SDPA's, the rest native
            return kernel.layer_output(plan, residual.contiguous(), None, None, None, None, attend(q, k, v, attn_mask))
        return layer.finish(residual, attend(q, k, v, attn_mask))

    def draft_logits(self, hidden: torch.Tensor, target_head: nn.Module) -> torch.Tensor:
        """Logits over the drafter's vocabulary `[..., V_draft]` (the target's for EAGLE-1)."""
        if self.config.version == 1:
            return target_head(hidden)
        return self.lm_head(self.norm(hidden))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids to target ids (identity without a reduced vocabulary)."""
        if self.config.version == 1 or not self.config.reduced_vocab:
            return draft_ids
        return draft_ids + self.d2t[draft_ids]

    def target_ids(self) -> torch.Tensor | None:
        """`[V_draft]` target id of every draft id, or ``None`` when the vocabularies are the same."""
        if self.config.version == 1 or not self.config.reduced_vocab:
            return None
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t
