"""Attention on a CPU one query row at a time, in fp32: ``optimize_for_cpu`` sets it on 16-bit models, and on fp32
models whose products run on hf_speculative's CPU kernel.

PyTorch's CPU flash attention is slow in bf16 for the one-query forwards of decoding: Qwen2.5-1.5B's attention at
a 512-token context costs 1.27 ms a layer for one query in bf16 against 0.15 ms in fp32, and 0.53 ms for 6 queries
(torch 2.13, one thread, AMD EPYC), so a one-token forward spent 35 ms of its ~160 in attention. The same attention
on the query, keys and values widened to fp32 (exactly: every bf16 value is an fp32 one) costs the fp32 figures plus
the widening, and sums in fp32 throughout (its result is rounded back to the model's dtype).

A forward of up to :data:`ROWWISE_ROWS` tokens (decoding, drafting, verification) computes each query row on its own
against the keys its mask row shows, so that with the kernel's row-independent products a verification row is
bitwise what plain decoding computes (SDPA over several rows sums them in another order). Where hf_speculative's CPU
kernel is built (AVX2), its attention for a few query rows does it (``csrc/few_query_attention.cpp``: scores and sums
in key order, each block of keys read once for all the rows of a kv head's group; at SmolLM2's shapes 0.54× SDPA's
time for one row and about 0.3 ms a row beyond); elsewhere each row is one SDPA call of its own. A plain causal
prefill runs on the kernel's ``prefill_attention`` where the CPU has AVX-512F (:func:`_prefill_route`); other longer
forwards are transformers' SDPA attention on the widened tensors.

fp32 models on the kernel (``optimize_for_cpu(model)`` where it builds) take the same route: their verification
rows are then bitwise plain decoding's too, and a one-token forward's attention costs about half SDPA's. SmolLM2 on
the kernel, 12 Spec-Bench prompts, 128 tokens, one thread, alone: plain decoding 25.97 against 24.84 tok/s with
SDPA (1.05×), prompt lookup 31.60 against 30.79 (1.03×), every output identical to its route's greedy
(``benchmarks/cpu_attention_fp32_ab.py``, ``benchmarks/results/issue48_cpu_attention_fp32_ab.txt``).

It is registered under its own name in transformers' attention and mask interfaces (the documented way to add an
implementation: nothing of transformers' is replaced) and set on one model with ``model.set_attn_implementation``.
Only models on ``"sdpa"`` change, and ``optimize_for_cpu(model, False)`` sets ``"sdpa"`` back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.sdpa import CPU_ATTENTION  # the name in transformers' interfaces; tree verification and GQA treat it as "sdpa"
from .kernel import MAX_ROWS_BF16

ROWWISE_ROWS = MAX_ROWS_BF16  # forwards of up to this many tokens go row by row, as a bf16 model's kernel products do
_REGISTERED = False
_FAST: list = []  # [the built kernel, or None where it cannot be]: decided once per process, so that every forward
#                   of a model (plain decoding and verification alike) takes the same route


def cpu_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
             **kwargs) -> tuple[torch.Tensor, None]:
    """Attention for query `[B, H, q, D]`, key and value `[B, H_kv, kv, D]`; returns `[B, q, H, D]` in the query's
    dtype. 16-bit CPU tensors are widened to fp32. Up to :data:`ROWWISE_ROWS` queries (decoding, verification), each
    query row attends on its own arithmetic to the keys its mask row lets it see: on the kernel's attention for a few
    query rows (:func:`fast_kernel`; head dims that are multiples of 8 up to 128), else one SDPA call a row over its
    keys gathered in order (:func:`_rowwise`), so a row's result does not depend on the draft around it. Longer
    forwards (prefill) and anything else (training, compile, per-head masks) are transformers' SDPA attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dtype = query.dtype
    if query.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        query, key, value = query.float(), key.float(), value.float()
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()  # an additive mask: SDPA takes it in the query's dtype
    rowwise = (query.shape[2] <= ROWWISE_ROWS and not (module.training and dropout) and not kwargs.get("softcap")
               and kwargs.get("position_bias") is None and kwargs.get("s_aux") is None
               and (attention_mask is None or (attention_mask.dim() == 4 and attention_mask.shape[1] == 1))
               and not torch.compiler.is_compiling())
    head_dim = query.shape[-1]
    scale = float(scaling if scaling is not None else head_dim ** -0.5)
    if rowwise:
        kernel = fast_kernel()
        fits = attention_mask is None or attention_mask.shape[-1] == key.shape[2]  # (else the rows' own route)
        # the kernel has no backward: a forward that records gradients takes the rows' SDPA calls
        grads = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if (kernel is not None and head_dim % 8 == 0 and head_dim <= 128 and query.dtype == torch.float32 and fits
                and not grads):
            mask = None if attention_mask is None else _visible(attention_mask).expand(query.shape[0], -1, -1)
            out = kernel.few_query_attention(query, key, value, mask, scale)
        else:
            out = _rowwise(query, key, value, attention_mask, scaling)
    elif _prefill_route(module, query, key, attention_mask, dropout, kwargs):
        out = fast_kernel().prefill_attention(query, key, value, scale)
    else:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)
    return out.to(dtype), None


PREFILL_KERNEL = [True]  # False: prefills on SDPA (benchmarks/prefill_products.py compares the two)


def _prefill_route(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float, kwargs: dict) -> bool:
    """Whether a long forward is a plain causal prefill that the kernel's ``prefill_attention`` computes
    (``csrc/prefill_attention.cpp``: at SmolLM2's shapes 1.8-2.5x PyTorch's CPU flash attention, one thread): no
    mask (transformers leaves it out where causal alone is right), no cache before it, a causal module, fp32 on the
    CPU, no gradients, no dropout, soft-capping, sinks or window shorter than the prompt, head dims a multiple of 32
    up to 256, and AVX-512F. Anything else stays on SDPA."""
    if not PREFILL_KERNEL[0] or attention_mask is not None or query.dtype != torch.float32:
        return False
    length, head_dim = query.shape[2], query.shape[-1]
    window = kwargs.get("sliding_window")
    if (query.device.type != "cpu" or key.shape[2] != length or length < 2 or head_dim % 32 or head_dim > 256
            or not getattr(module, "is_causal", True) or kwargs.get("is_causal") is False
            or (module.training and dropout) or kwargs.get("softcap") or kwargs.get("s_aux") is not None
            or kwargs.get("position_bias") is not None or (window is not None and window < length)
            or torch.compiler.is_compiling()
            or (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad))):
        return False
    kernel = fast_kernel()
    return kernel is not None and kernel.has_prefill_attention()


def _visible(mask: torch.Tensor) -> torch.Tensor:
    """``[B, 1, q, kv]`` bool or additive (0 where a key is seen) -> bool ``[B, q, kv]``: which keys each row sees."""
    return mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0


def _rowwise(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
             scaling: float | None) -> torch.Tensor:
    """Each query row of ``query`` `[B, H, q, D]` against the keys its row of ``mask`` (`[B, 1, q, kv]`, bool or
    additive; None: causal, the last ``q`` keys being the queries') shows: a prefix of the keys is a view, others
    (a tree's ancestors) are gathered in order. Returns `[B, q, H, D]`."""
    batch, heads, rows, _ = query.shape
    kv = key.shape[2]
    gqa = heads != key.shape[1]
    out = query.new_empty(batch, rows, heads, query.shape[3])  # [B, q, H, D]
    positions = torch.arange(kv, device=key.device)
    visible_rows = None if mask is None else _visible(mask)  # [B, q, kv]
    for b in range(batch):
        if mask is None:  # causal: row i sees the keys before the queries and queries 0..i
            seen = [None] * rows
            counts = [kv - rows + i + 1 for i in range(rows)]
        else:
            visible = visible_rows[b]  # [q, kv]
            counts_t = visible.sum(-1)  # [q]
            prefix = (visible == (positions < counts_t[:, None])).all(-1)  # [q]: the visible keys are a prefix
            counts, prefix = counts_t.tolist(), prefix.tolist()
            seen = [None if prefix[i] else visible[i].nonzero().squeeze(-1) for i in range(rows)]
        for i in range(rows):
            if counts[i] == 0:  # a padding row that sees nothing: zeros, not SDPA's NaN
                out[b, i] = 0
                continue
            if seen[i] is None:
                k, v = key[b:b + 1, :, :counts[i]], value[b:b + 1, :, :counts[i]]  # [1, H_kv, n, D]
            else:
                k, v = key[b:b + 1].index_select(2, seen[i]), value[b:b + 1].index_select(2, seen[i])
            row = F.scaled_dot_product_attention(query[b:b + 1, :, i:i + 1], k, v, scale=scaling,
                                                 enable_gqa=gqa)  # [1, H, 1, D]
            out[b, i] = row[0, :, 0]
    return out


def fast_kernel():
    """The built CPU kernel, whose ``few_query_attention`` runs the rows of short forwards, or None where it cannot be
    built (no AVX2, no compiler: each row is then one SDPA call). Decided at the first call and kept."""
    if not _FAST:
        from .kernel import cpu_supports_kernel, load_kernel

        kernel = None
        if cpu_supports_kernel():
            try:
                kernel = load_kernel()
            except RuntimeError:  # no compiler or ninja: the SDPA route, which needs neither
                kernel = None
        _FAST.append(kernel)
    return _FAST[0]


def register() -> None:
    """Add :data:`CPU_ATTENTION` to transformers' attention and mask interfaces (once; SDPA's mask)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(CPU_ATTENTION, cpu_sdpa)
    AttentionMaskInterface.register(CPU_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    _REGISTERED = True


def wants_cpu_attention(model: torch.nn.Module, kernel: bool = False) -> bool:
    """Whether ``model`` is a transformers model on ``"sdpa"`` that this attention is for (:func:`_suits`)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    return _suits(model, kernel)


def _suits(model: torch.nn.Module, kernel: bool) -> bool:
    """Parameters on the CPU and 16-bit, or fp32 where the kernel runs the products (``kernel``) and its attention
    can be built (:func:`fast_kernel`)."""
    first = next(iter(model.parameters()), None)
    if first is None or first.device.type != "cpu":
        return False
    if first.dtype in (torch.bfloat16, torch.float16):
        return True
    # fp32: SDPA is fast there, but the kernel's attention is faster for a row or two and keeps rows apart
    return first.dtype == torch.float32 and kernel and fast_kernel() is not None


def use_cpu_attention(model: torch.nn.Module, enable: bool = True, kernel: bool = False) -> bool:
    """Set :data:`CPU_ATTENTION` on a CPU ``model`` on ``"sdpa"`` (``enable``; 16-bit, or fp32 with ``kernel``, see
    :func:`_suits`), or ``"sdpa"`` back on a model that has it and no longer suits it (``enable=False``, or an fp32
    model laid out again without the kernel); True when the model changed."""
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if enable and wants_cpu_attention(model, kernel):
        register()
        fast_kernel()  # built now (about a minute, once) rather than inside the first forward
        model.set_attn_implementation(CPU_ATTENTION)
        return True
    if current == CPU_ATTENTION and not (enable and _suits(model, kernel)):
        model.set_attn_implementation("sdpa")
        return True
    return False
