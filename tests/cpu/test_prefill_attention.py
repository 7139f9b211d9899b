"""The kernel's causal attention for prefills (``csrc/prefill_attention.cpp``) and the route that takes it
(``hf_speculative/cpu/attention.py: _prefill_route``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hf_speculative as hfs
from hf_speculative.cpu import attention as cpu_attention
from hf_speculative.cpu import kernel as cpu_kernel
from tests.conftest import VOCAB, build_model, make_drafter, prompt_inputs, stock_generate


def _kernel():
    if not cpu_kernel.cpu_supports_kernel():
        return None
    kernel = cpu_kernel.load_kernel()
    return kernel if kernel.has_prefill_attention() else None


pytestmark = pytest.mark.skipif(_kernel() is None, reason="prefill_attention needs the kernel and AVX-512F")


@pytest.mark.parametrize("heads, kv_heads, head_dim, length", [
    (9, 3, 64, 77), (4, 4, 32, 2), (4, 2, 32, 33), (2, 1, 128, 100), (8, 2, 256, 17), (3, 3, 64, 300)])
def test_prefill_attention_is_causal_sdpa(heads, kv_heads, head_dim, length):
    torch.manual_seed(length)
    q = torch.randn(2, heads, length, head_dim)
    k = torch.randn(2, kv_heads, length, head_dim) * 3  # sharper weights than unit scores
    v = torch.randn(2, kv_heads, length, head_dim)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)  # [B, L, H, D]
    got = _kernel().prefill_attention(q, k, v, head_dim ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # a row sees only its prefix: changing the last position changes no earlier row (negative control: the last)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, -1] += 1
    v2[:, :, -1] -= 1
    again = _kernel().prefill_attention(q, k2, v2, head_dim ** -0.5)
    assert torch.equal(again[:, :-1], got[:, :-1]) and not torch.equal(again[:, -1], got[:, -1])


def test_keys_and_values_may_be_views_of_a_larger_cache():
    q = torch.randn(1, 4, 40, 32)
    store = torch.randn(1, 2, 64, 32)  # [B, Hkv, capacity, D]: the cache's store, its first 40 positions in use
    k, v = store[:, :, :40], store.flip(2)[:, :, :40].contiguous()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(_kernel().prefill_attention(q, k, v, 32 ** -0.5), want, rtol=1e-5, atol=1e-5)


def test_bad_shapes_are_refused_with_the_rule():
    kernel = _kernel()
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernel.prefill_attention(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), 1.0)
    with pytest.raises(RuntimeError, match="H a multiple of Hkv"):
        kernel.prefill_attention(torch.randn(1, 3, 5, 32), torch.randn(1, 2, 5, 32), torch.randn(1, 2, 5, 32), 1.0)
    with pytest.raises(RuntimeError, match="fp32"):
        kernel.prefill_attention(*(torch.randn(1, 2, 5, 32, dtype=torch.float64) for _ in range(3)), 1.0)


class _Counting:
    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def prefill_attention(self, query, *args):
        self.calls.append(query.shape[2])
        return self.kernel.prefill_attention(query, *args)


@pytest.fixture
def kernel_model(monkeypatch):
    model = hfs.enable(build_model("llama", hidden=128, max_positions=512))  # heads of 32
    hfs.optimize_for_cpu(model, kernel=True)
    assert model.config._attn_implementation == cpu_attention.CPU_ATTENTION
    calls: list = []
    monkeypatch.setattr(cpu_attention, "_FAST", [_Counting(_kernel(), calls)])
    return model, calls


def test_a_models_prefill_takes_it_and_matches_sdpa(kernel_model, monkeypatch):
    model, calls = kernel_model
    ids = torch.randint(5, VOCAB, (1, 150))
    with torch.no_grad():
        got = model(ids).logits
        assert calls == [150, 150]  # both layers
        monkeypatch.setattr(cpu_attention, "PREFILL_KERNEL", [False])
        want = model(ids).logits
    assert calls == [150, 150]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_what_it_does_not_take_stays_on_sdpa(kernel_model):
    model, calls = kernel_model
    ids = torch.randint(5, VOCAB, (2, 100))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0  # a left-padded row: transformers passes a mask
    with torch.no_grad():
        model(ids, attention_mask=mask)
        assert calls == []
        model(ids[:, :10])  # within the rows computed one by one (the few-query kernel)
        assert calls == []
    model(ids[:1]).logits.sum().backward()  # gradients: SDPA, which has a backward
    assert calls == []


def test_drafters_after_a_kernel_prefill_equal_greedy(kernel_model):
    model, calls = kernel_model
    inputs = prompt_inputs([3] + [5, 6, 7, 8, 9, 10, 11, 12, 13] * 9)  # 82 tokens
    want = stock_generate(model, **inputs, do_sample=False, max_new_tokens=30)
    assert calls and calls[0] == 82
    for drafter in ("prompt-lookup", "oracle"):
        got = model.generate(**inputs, do_sample=False, max_new_tokens=30,
                             candidate_generator=make_drafter(drafter, model, want))
        assert got.tolist() == want.tolist()
