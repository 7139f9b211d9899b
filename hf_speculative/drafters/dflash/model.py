"""The DFlash block drafter network (Chen et al. 2026, arXiv 2602.06036), written from its math.

One forward drafts a whole block. The *context* is the target's own hidden states on the verified tokens: the raw
outputs of its layers ``target_layer_ids``, concatenated along features and projected::

    context = hidden_norm(fc(cat[h_l1, h_l2, ...]))                   # [B, C, F] -> [B, C, H], once per token

The *window* is the anchor (the last verified token, at position p) and ``B - 1`` mask tokens at p+1 .. p+B-1,
embedded with the target's input embedding. Every decoder layer (pre-norm, QK-norm, SwiGLU) lets the window attend
to the context and to itself, bidirectionally::

    x = input_layernorm(window)
    q = rope(q_norm(q_proj(x)))                                         # window positions only
    k = rope(k_norm(k_proj(cat[context, x]))),  v = v_proj(cat[context, x])
    window = window + o_proj(attend(q, k, v));  window = window + mlp(post_attention_layernorm(window))

The context is the same for every layer (not re-normalised per layer). After the last layer, ``norm``; the
target's lm_head on window positions 1 .. B-1 gives the B-1 drafted distributions.

A *draft vocabulary* (``set_draft_vocab``: the target ids the drafter may propose, e.g. the most frequent tokens of
its training data) restricts the lm_head to those rows: on a CPU the 49k-row lm_head dominates a drafting
step, and a few thousand rows cover nearly every token a small model writes. Drafts stay exact: the target still
verifies every token, and a token outside the vocabulary is simply never proposed.

The context's keys and values never change once computed, so :class:`DFlashCache` keeps them per layer (only verified
tokens ever enter it); a window's keys and values are used in its forward and dropped. Only the norms, the MLP and
the rotary embedding come from transformers (Llama's, on both supported versions); the attention is SDPA over the
cache with an explicit mask (bidirectional, optionally causal or windowed, padding keys excluded).

Parameter names are z-lab's (``fc``, ``hidden_norm``, ``layers.N.self_attn.q_proj`` ...), so a z-lab state dict
loads as is; transformers' ``MuseGlimmerAssistantModel`` names two differently (``checkpoints.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from ... import compat
from ..eagle.model import DraftKVCache, SlotCache, attend
from .blocks import WindowBlocks, attend_blocks
from .config import DFlashConfig


class DFlashCache:
    """The context's keys and values, per layer `[B, kv_heads, n, D]`, and their positions `[B, n]`."""

    def __init__(self, num_layers: int):
        self.layers = [DraftKVCache() for _ in range(num_layers)]
        self.positions: torch.Tensor | None = None  # [B, n]
        self.padding: torch.Tensor | None = None    # [B, n] bool: True for a padding key (batched use)

    @property
    def length(self) -> int:
        return self.layers[0].length

    def crop(self, length: int) -> None:
        """Keep the first ``length`` context positions."""
        for layer in self.layers:
            layer.crop(length)
        if self.positions is not None:
            self.positions = self.positions[:, :length]
            self.padding = None if self.padding is None else self.padding[:, :length]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` `[B, heads, T, D]` with ``cos``/``sin`` `[B, T, D]`."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        h, d, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)
        self.q_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)

    def forward(self, x: torch.Tensor, context: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                cache: DraftKVCache | None, mask: torch.Tensor | None) -> torch.Tensor:
        """``x`` `[B, W, H]` the normed window, ``context`` `[B, C, H]` the new context positions (C may be 0),
        ``rope`` cos/sin `[B, C + W, D]`; ``mask`` bool `[B, 1, W, past + C + W]`. Returns `[B, W, H]`."""
        b, w, _ = x.shape
        c = context.shape[1]
        cos, sin = rope
        q = self.q_norm(self.q_proj(x).view(b, w, self.num_heads, self.head_dim)).transpose(1, 2)  # [B, nh, W, D]
        q = _rope(q, cos[:, c:], sin[:, c:])
        k, v = self.keys_values(torch.cat([context, x], dim=1), rope)  # [B, kvh, C + W, D] each
        if isinstance(cache, SlotCache):  # a fixed-shape cache (static_drafting): every row at its slot, all read
            k, v = cache.append(k, v)
        elif cache is not None:  # the context's keys stay; the window's are this forward's only
            if c:
                cache.append(k[:, :, :c], v[:, :, :c])
            if cache.length:
                k = torch.cat([cache.k[:, :, : cache.length], k[:, :, c:]], dim=2)  # [B, kvh, past + C + W, D]
                v = torch.cat([cache.v[:, :, : cache.length], v[:, :, c:]], dim=2)
        if isinstance(mask, WindowBlocks):  # training's windows (forward_blocks): the unmasked pairs only
            return self.o_proj(attend_blocks(q, k, v, mask))
        return self.o_proj(attend(q, k, v, mask))

    def keys_values(self, kv_in: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values `[B, kvh, T, D]` of ``kv_in`` `[B, T, H]` (context rows, then the normed
        window's) with ``rope`` cos/sin `[B, T, D]`."""
        b, t, _ = kv_in.shape
        k = self.k_norm(self.k_proj(kv_in).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(kv_in).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return _rope(k, *rope), v


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig, llama_config):
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = LlamaMLP(llama_config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, window, context, rope, cache, mask):
        window = window + self.self_attn(self.input_layernorm(window), context, rope, cache, mask)
        return window + self.mlp(self.post_attention_layernorm(window))


class DFlashDraftModel(nn.Module):
    """The drafter's own weights; the target's embedding and lm_head are passed in at call time, never stored.

    Args:
        config (`DFlashConfig`): its shape.
    """

    def __init__(self, config: DFlashConfig):
        super().__init__()
        if not isinstance(config, DFlashConfig):
            raise TypeError(f"DFlashDraftModel(config=...) needs a DFlashConfig, got {type(config).__name__}.")
        self.config = config
        h = config.hidden_size
        self.llama_config = compat.llama_config(
            hidden_size=h, intermediate_size=config.intermediate_size, num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps,
            rope_theta=config.rope_theta, hidden_act=config.hidden_act, mlp_bias=False,
            max_position_embeddings=config.max_position_embeddings, vocab_size=max(config.vocab_size or 1, 1),
            num_hidden_layers=1)
        self.fc = nn.Linear(len(config.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config, self.llama_config) for _ in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=self.llama_config)
        # the target ids this drafter may propose ([N], None: every id); not in the state dict: the vocabulary travels
        # in its own file beside the z-lab weights (checkpoints.DRAFT_VOCAB), which other readers ignore
        self.register_buffer("draft_vocab", None, persistent=False)
        self._head_rows: tuple | None = None  # (the lm_head weight's identity, its rows of draft_vocab)

    def new_cache(self) -> DFlashCache:
        return DFlashCache(len(self.layers))

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """The target's concatenated raw layer outputs `[B, C, len(ids) * H]` -> the context `[B, C, H]`."""
        return self.hidden_norm(self.fc(features))

    def forward(self, window: torch.Tensor, features: torch.Tensor | None, positions: torch.Tensor,
                cache: DFlashCache | None = None, padding: torch.Tensor | None = None) -> torch.Tensor:
        """One drafting forward.

        Args:
            window (`torch.Tensor` of shape `[B, W, H]`): the embedded window (anchor, then mask tokens).
            features (`torch.Tensor` of shape `[B, C, F]`, *optional*): the target's features on the verified tokens
                not yet in ``cache`` (``None`` or C = 0: none new).
            positions (`torch.Tensor` of shape `[B, C + W]`): the new context positions, then the window's.
            cache (`DFlashCache`, *optional*): the context so far; the new positions are appended to it.
            padding (`torch.Tensor` of shape `[B, C + W]`, *optional*): True at padding positions (a left-padded
                batch): never attended to, whatever the window rule (attention is bidirectional, so a window bound
                alone would not keep them out).

        Returns:
            `torch.Tensor` of shape `[B, W, H]`: the window's final hidden states (after ``norm``).
        """
        b, _, h = window.shape
        context = window.new_zeros(b, 0, h) if features is None or features.shape[1] == 0 else \
            self.context(features.to(window.dtype))
        c = context.shape[1]
        rope = self.rotary_emb(window, positions)  # cos, sin [B, C + W, D]
        keys, pad = positions, padding
        if cache is not None:
            if cache.positions is not None:
                keys = torch.cat([cache.positions, positions], dim=1)
                if padding is not None or cache.padding is not None:
                    pad = torch.cat([cache.padding if cache.padding is not None else
                                     cache.positions.new_zeros(cache.positions.shape, dtype=torch.bool),
                                     padding if padding is not None else
                                     positions.new_zeros(positions.shape, dtype=torch.bool)], dim=1)
            new = positions[:, :c]
            cache.positions = new if cache.positions is None else torch.cat([cache.positions, new], dim=1)
            if pad is not None:
                cache.padding = pad[:, : cache.positions.shape[1]]
        masks = {window_size: self._mask(positions[:, c:], keys, pad, window_size)
                 for window_size in {self.config.sliding(i) for i in range(len(self.layers))}}
        for i, layer in enumerate(self.layers):
            window = layer(window, context, rope, None if cache is None else cache.layers[i],
                           masks[self.config.sliding(i)])
        return self.norm(window)

    def forward_blocks(self, windows: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                       allowed: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """Training: many windows of one sequence in one forward, over its whole context (no cache).

        Args:
            windows (`torch.Tensor` of shape `[B, Q, H]`): the embedded windows, one after another (Q = N x W).
            features (`torch.Tensor` of shape `[B, S, F]`): the target's features on the whole sequence.
            positions (`torch.Tensor` of shape `[B, S + Q]`): the context positions, then the windows'.
            allowed (`torch.Tensor` of shape `[B, Q, S + Q]`, bool): what each window query may see (True); the
                caller's rule (a window sees the context before its anchor and its own window, as when drafting)
                is combined with this drafter's own (causal, sliding). Every query row must allow some key.
            width (`int`, *optional*): the windows' length, where no window sees another's positions (``allowed``'s
                window part block-diagonal): attention then skips those pairs (``blocks.py``: the same result).

        Returns:
            `torch.Tensor` of shape `[B, Q, H]`: the windows' final hidden states (after ``norm``), what :meth:`forward`
            gives for each window drafted after its context alone.
        """
        context = self.context(features.to(windows.dtype))  # [B, S, H]
        s = context.shape[1]
        rope = self.rotary_emb(windows, positions)  # cos, sin [B, S + Q, D]
        masks = {}
        for window_size in {self.config.sliding(i) for i in range(len(self.layers))}:
            rule = self._mask(positions[:, s:], positions, None, window_size)  # [B, 1, Q, S + Q] or None
            masks[window_size] = allowed[:, None] if rule is None else rule & allowed[:, None]
            if width is not None:
                masks[window_size] = WindowBlocks.from_mask(masks[window_size], s, width)
        for i, layer in enumerate(self.layers):
            windows = layer(windows, context, rope, None, masks[self.config.sliding(i)])
        return self.norm(windows)

    def _mask(self, queries: torch.Tensor, keys: torch.Tensor, padding: torch.Tensor | None,
              sliding: int | None) -> torch.Tensor | None:
        """bool `[B, 1, W, K]` (True: may attend) for query positions `[B, W]` and key positions `[B, K]`; ``None``
        when every query sees every key."""
        if not self.config.causal and sliding is None and padding is None:
            return None
        seen = torch.ones(queries.shape[0], queries.shape[1], keys.shape[1], dtype=torch.bool, device=keys.device)
        gap = queries[:, :, None] - keys[:, None, :]  # [B, W, K]
        if self.config.causal:
            seen &= gap >= 0
        if sliding is not None:
            seen &= gap.abs() <= sliding
        if padding is not None:
            seen &= ~padding[:, None, :]
        return seen[:, None]

    def set_draft_vocab(self, target_ids: torch.Tensor | None) -> None:
        """Propose only ``target_ids`` `[N]` (distinct target ids, int64); ``None``: the whole vocabulary. The ids are
        checked against a target when the drafter attaches to it (``drafter.check_fits``)."""
        if target_ids is not None:
            if target_ids.dim() != 1 or target_ids.dtype != torch.long or target_ids.numel() == 0:
                raise ValueError(f"a draft vocabulary is a non-empty 1-D int64 tensor of target ids, got shape "
                                 f"{tuple(target_ids.shape)} {target_ids.dtype}.")
            if int(target_ids.min()) < 0 or target_ids.unique().numel() != target_ids.numel():
                raise ValueError("a draft vocabulary's target ids must be distinct and non-negative.")
            device = next(self.parameters()).device
            target_ids = target_ids.to(device)
        self.draft_vocab = target_ids
        self._head_rows = None

    def draft_logits(self, hidden: torch.Tensor, target_head: nn.Module) -> torch.Tensor:
        """The drafted positions' logits from the window's hidden states `[B, W, H]` (the anchor's own output is not
        a draft): `[B, W - 1, V]`, or `[B, W - 1, N]` over ``draft_vocab`` (position i is target id
        ``draft_vocab[i]``) when one is set."""
        hidden = hidden[:, 1:]
        if self.draft_vocab is None:
            return target_head(hidden)
        rows = self.head_rows(target_head)
        if rows is None:  # a head given as a function: its full logits, then the rows
            return target_head(hidden)[..., self.draft_vocab]
        return F.linear(hidden, *rows)  # [B, W - 1, N]

    def head_rows(self, target_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The lm_head's rows of ``draft_vocab``: weight `[N, H]` and bias `[N]` (or ``None``), copied once, again
        after the head changes; ``None`` without a draft vocabulary or a head with a weight."""
        weight = getattr(target_head, "weight", None)
        if self.draft_vocab is None or not isinstance(weight, torch.Tensor):
            return None
        key = (weight.data_ptr(), weight._version, weight.device, weight.dtype)
        if self._head_rows is None or self._head_rows[0] != key:  # copied once, again after the head changes
            ids = self.draft_vocab.to(weight.device)
            bias = getattr(target_head, "bias", None)
            self._head_rows = (key, weight.detach()[ids].contiguous(),  # [N, H]
                               None if bias is None else bias.detach()[ids].contiguous())
        return self._head_rows[1:]
