"""16-bit models' attention on a CPU (``hf_speculative/cpu/attention.py``, set by ``optimize_for_cpu``): in fp32, each
query row of a short forward computed as a one-token forward computes it (so verification rows equal plain decoding's
to the bit), close to transformers' SDPA, with trees' masks, additive masks and rows that see nothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hf_speculative as hfs
from hf_speculative.core import sdpa
from hf_speculative.cpu import attention
from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.cpu.attention import ROWWISE_ROWS, cpu_sdpa, use_cpu_attention
from tests.conftest import build_model

needs_kernel = pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA")


class _Module(torch.nn.Module):  # what transformers' attention functions read from the layer
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True
        self.eval()


def _qkv(rows: int, kv: int, dtype=torch.bfloat16, heads: int = 4, kv_heads: int = 2, dim: int = 16):
    torch.manual_seed(rows * 1000 + kv)
    q = torch.randn(1, heads, rows, dim).to(dtype)  # [B, H, q, D]
    k, v = (torch.randn(1, kv_heads, kv, dim).to(dtype) for _ in range(2))  # [B, H_kv, kv, D]
    return q, k, v


def _causal(rows: int, kv: int) -> torch.Tensor:
    return torch.ones(rows, kv, dtype=torch.bool).tril(kv - rows)[None, None]  # [1, 1, q, kv]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rows_do_not_depend_on_the_rows_beside_them(dtype, monkeypatch):
    q, k, v = _qkv(6, 40, dtype)
    module = _Module(groups=2)

    def rows_alone(together):  # row i as the one-token forward at its position computes it: no mask, keys up to it
        return [torch.equal(together[:, i], cpu_sdpa(module, q[:, :, i : i + 1], k[:, :, : 35 + i], v[:, :, : 35 + i],
                                                     None, scaling=0.25)[0][:, 0]) for i in range(6)]

    together, _ = cpu_sdpa(module, q, k, v, _causal(6, 40), scaling=0.25)  # [1, 6, H, D]
    assert together.dtype == dtype and together.shape == (1, 6, 4, 16)
    assert all(rows_alone(together))
    wide = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=_causal(6, 40), scale=0.25,
                                          enable_gqa=True).transpose(1, 2)
    assert torch.allclose(together.float(), wide, atol=1e-2)  # transformers' SDPA's values, in fp32
    if dtype == torch.float32:  # the check can fail: SDPA over the 6 rows at once sums them otherwise
        monkeypatch.setattr(attention, "ROWWISE_ROWS", 0)
        assert not all(rows_alone(cpu_sdpa(module, q, k, v, _causal(6, 40), scaling=0.25)[0]))


def test_a_tree_row_sees_its_ancestors_gathered_in_order():
    q, k, v = _qkv(4, 20)
    mask = _causal(4, 20).clone()
    mask[0, 0, 2, 17] = False  # row 2 (a sibling of row 1; the queries are keys 16-19) does not see row 1
    mask[0, 0, 3, 17:19] = False  # row 3 sees the prefix and itself only
    additive = torch.zeros(mask.shape, dtype=torch.bfloat16).masked_fill(~mask, torch.finfo(torch.bfloat16).min)
    got, _ = cpu_sdpa(_Module(2), q, k, v, mask, scaling=0.25)
    assert torch.equal(got, cpu_sdpa(_Module(2), q, k, v, additive, scaling=0.25)[0])  # either kind of mask
    seen = torch.tensor([*range(17), 18])  # row 2's keys: the prefix (keys 0-16), then itself
    alone, _ = cpu_sdpa(_Module(2), q[:, :, 2:3], k[:, :, seen], v[:, :, seen], None, scaling=0.25)
    assert torch.equal(got[:, 2], alone[:, 0])
    wide = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=0.25,
                                          enable_gqa=True).transpose(1, 2)
    assert torch.allclose(got.float(), wide, atol=1e-2)


def test_a_row_that_sees_nothing_is_zero_and_long_forwards_use_sdpa():
    q, k, v = _qkv(3, 10)
    mask = _causal(3, 10).clone()
    mask[0, 0, 0] = False  # a padding row
    got, _ = cpu_sdpa(_Module(2), q, k, v, mask, scaling=0.25)
    assert not got[:, 0].any() and got[:, 1:].abs().sum() > 0
    rows = ROWWISE_ROWS + 4  # a prefill: transformers' SDPA on the widened tensors, in one call
    q, k, v = _qkv(rows, rows + 5)
    got, _ = cpu_sdpa(_Module(2), q, k, v, _causal(rows, rows + 5), scaling=0.25)
    wide = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=_causal(rows, rows + 5),
                                          scale=0.25, enable_gqa=True).transpose(1, 2)
    assert torch.allclose(got.float(), wide, atol=1e-2)


def _rows_alone_equal(model, tokens: int = 5) -> bool:
    """Whether a forward over ``tokens`` tokens after 30 gives bitwise the logits of as many one-token forwards."""
    prefix, new = torch.randint(4, 90, (1, 30)), torch.randint(4, 90, (1, tokens))
    with torch.no_grad():
        cache = model(prefix, use_cache=True).past_key_values
        together = model(new, past_key_values=cache, use_cache=True).logits  # [1, 5, V]
        cache = model(prefix, use_cache=True).past_key_values
        alone = torch.cat([model(new[:, i : i + 1], past_key_values=cache, use_cache=True).logits
                           for i in range(tokens)], dim=1)
    return torch.equal(together, alone)


@needs_kernel
def test_a_models_verification_forward_equals_its_one_token_forwards(arch):
    """Through transformers' interfaces (masks, grouped-query heads, the cache): with the kernel's row-independent
    products, the attention makes a verification forward's logits those of one-token forwards. fp32 models on the
    kernel and bf16 models get it from optimize_for_cpu; transformers' SDPA set back on the fp32 model parts them (the
    control)."""
    model = build_model(arch)
    hfs.optimize_for_cpu(model, kernel=True)
    assert model.config._attn_implementation == sdpa.CPU_ATTENTION
    assert _rows_alone_equal(model) and _rows_alone_equal(model, 16)  # 16: the kernel's longest fp32 products
    model.set_attn_implementation("sdpa")
    assert not _rows_alone_equal(model)  # transformers' SDPA: the check can fail
    small = build_model(arch).to(torch.bfloat16)
    hfs.optimize_for_cpu(small)
    assert small.config._attn_implementation == sdpa.CPU_ATTENTION
    if cpu_kernel.bf16_dot_supported():  # elsewhere its linears stay on PyTorch's bf16 products
        assert _rows_alone_equal(small) and _rows_alone_equal(small, 20)  # 20: beyond one pass of 16 rows
    hfs.optimize_for_cpu(small, False)
    assert small.config._attn_implementation == "sdpa"


def test_16_bit_cpu_models_on_sdpa_change_and_fp32_ones_only_on_the_kernel():
    assert not use_cpu_attention(build_model("llama"))  # fp32 without the kernel's products: SDPA is fast there
    layout_only = build_model("llama")
    hfs.optimize_for_cpu(layout_only, kernel=False)
    assert layout_only.config._attn_implementation == "sdpa"
    if attention.fast_kernel() is not None:
        assert use_cpu_attention(build_model("llama"), kernel=True)
        relaid = build_model("llama")
        hfs.optimize_for_cpu(relaid, kernel=True)
        assert relaid.config._attn_implementation == sdpa.CPU_ATTENTION
        hfs.optimize_for_cpu(relaid, kernel=False)  # laid out again without the kernel: SDPA again
        assert relaid.config._attn_implementation == "sdpa"
    eager = build_model("llama").to(torch.bfloat16)
    eager.set_attn_implementation("eager")
    assert not use_cpu_attention(eager) and eager.config._attn_implementation == "eager"
    hfs.optimize_for_cpu(eager, False)  # undoing leaves a model that never had it alone
    assert eager.config._attn_implementation == "eager"


@needs_kernel
def test_a_forward_that_records_gradients_gets_them_through_the_attention():
    """The kernel's attention has no backward: with gradients recorded the rows take SDPA calls, and the query, keys
    and values get SDPA's gradients (the kernel route would leave them None)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 3, 16, requires_grad=True),
               *(torch.randn(1, 2, 12, 16, requires_grad=True) for _ in range(2)))
    out, _ = cpu_sdpa(_Module(2), q, k, v, _causal(3, 12), scaling=0.25)
    out.sum().backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=_causal(3, 12), scale=0.25,
                                              enable_gqa=True)
    expected.sum().backward()
    for mine, theirs in zip(got, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("q_len, kv, dim", [(1, 41, 16), (3, 41, 16), (7, 41, 16), (1, 300, 64), (5, 300, 64),
                                            (3, 129, 24)])
def test_the_kernels_few_query_attention_rows_are_independent_and_close_to_sdpa(q_len, kv, dim):
    """csrc/few_query_attention.cpp on its own: strided keys and values (a cache with room holds them so), row ``i``
    alone over the keys it sees gives the same bits, SDPA's values; other keys give other values (the control). Long
    contexts take the values in blocks of 64 keys (300: four and a part), 64 dims in passes of 32, 24 in chunks of 8."""
    torch.manual_seed(q_len + kv)
    keys, values = torch.randn(1, 2, kv + 49, dim), torch.randn(1, 2, kv + 49, dim)
    key, value = keys[:, :, :kv], values[:, :, :kv]
    query = torch.randn(1, 6, q_len, dim)
    ours = cpu_kernel.few_query_attention(query, key, value, None, 0.25)  # [1, q, 6, dim]
    mask = torch.ones(q_len, kv, dtype=torch.bool).tril(kv - q_len)
    reference = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.25,
                                               enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    for i in range(q_len):
        n = kv - q_len + i + 1
        alone = cpu_kernel.few_query_attention(query[:, :, i:i + 1], key[:, :, :n], value[:, :, :n], None, 0.25)
        assert torch.equal(alone[:, 0], ours[:, i])
    shifted = cpu_kernel.few_query_attention(query[:, :, :1], key[:, :, 1:kv + 1 - q_len],
                                             value[:, :, 1:kv + 1 - q_len], None, 0.25)
    assert not torch.equal(shifted[:, 0], ours[:, 0])


@needs_kernel
def test_the_kernels_attention_over_a_long_tree_mask_is_each_rows_own():
    """A mask with gaps across several blocks of 64 keys (a tree's rows over a long prefix): each row equals itself
    alone over the keys it sees, and SDPA's values under the mask."""
    torch.manual_seed(1)
    key, value, query = torch.randn(1, 2, 260, 64), torch.randn(1, 2, 260, 64), torch.randn(1, 6, 4, 64)
    mask = torch.rand(1, 4, 260) > 0.4
    mask[..., 0] = True
    out = cpu_kernel.few_query_attention(query, key, value, mask, 0.125)
    reference = F.scaled_dot_product_attention(query, key, value, attn_mask=mask[:, None], scale=0.125,
                                               enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    for i in range(4):
        seen = mask[0, i].nonzero().squeeze(-1)
        alone = cpu_kernel.few_query_attention(query[:, :, i:i + 1], key[:, :, seen], value[:, :, seen], None, 0.125)
        assert torch.equal(alone[:, 0], out[:, i])


@needs_kernel
def test_the_kernels_attention_takes_a_tree_mask_and_gives_zeros_to_a_row_that_sees_nothing():
    torch.manual_seed(0)
    key, value, query = torch.randn(1, 1, 12, 8), torch.randn(1, 1, 12, 8), torch.randn(1, 2, 3, 8)
    mask = torch.zeros(1, 3, 12, dtype=torch.bool)
    mask[0, 0, :9] = True  # a prefix
    mask[0, 1, [0, 1, 2, 3, 4, 5, 6, 7, 9]] = True  # a prefix and an ancestor, not the key between
    out = cpu_kernel.few_query_attention(query, key, value, mask, 0.5)  # row 2 sees nothing
    for i in range(2):
        seen = mask[0, i].nonzero().squeeze(-1)
        alone = cpu_kernel.few_query_attention(query[:, :, i:i + 1], key[:, :, seen], value[:, :, seen], None, 0.5)
        assert torch.equal(alone[:, 0], out[:, i])
    assert torch.equal(out[:, 2], torch.zeros(1, 2, 8))


def test_without_the_kernel_each_row_is_an_sdpa_call_of_its_own(monkeypatch):
    """Where the kernel cannot be built the rows take the SDPA route, still row by row (the same bits alone)."""
    monkeypatch.setattr(attention, "_FAST", [None])
    q, k, v = _qkv(4, 30)
    together, _ = cpu_sdpa(_Module(2), q, k, v, _causal(4, 30), scaling=0.25)
    for i in range(4):
        alone, _ = cpu_sdpa(_Module(2), q[:, :, i:i + 1], k[:, :, :27 + i], v[:, :, :27 + i], None, scaling=0.25)
        assert torch.equal(alone[:, 0], together[:, i])
