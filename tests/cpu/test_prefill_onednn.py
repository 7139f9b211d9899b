"""Products of more rows than the kernel takes (long prefills; on CPUs without AVX-512, anything past 16 rows) on
oneDNN (``hf_speculative/cpu/kernel.py: onednn_linear``) where the weight has optimize_for_cpu's column-major layout.
The kernel's own products of 17-192 rows: tests/cpu/test_kernel_gemm.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hf_speculative as hfs
from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.cpu.kernel import MAX_GEMM_ROWS, MAX_ROWS, KernelLinear
from tests.conftest import build_model, make_drafter, prompt_inputs, stock_generate

pytestmark = pytest.mark.skipif(cpu_kernel.onednn_linear() is None, reason="this PyTorch has no oneDNN product")
LONG = MAX_GEMM_ROWS + 8  # more rows than the kernel takes anywhere


class _CountingOp:
    def __init__(self, op, calls: list):
        self.op, self.calls = op, calls

    def __call__(self, x, weight, bias, *args):
        self.calls.append(x.shape[:-1].numel())
        return self.op(x, weight, bias, *args)


def _layer(out_features: int, in_features: int, bias: bool) -> KernelLinear:
    layer = torch.nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.data = layer.weight.data.t().contiguous().t()  # [out, in] on [in, out] storage
    layer.__class__ = KernelLinear
    return layer


@pytest.fixture
def calls(monkeypatch):
    seen: list = []
    monkeypatch.setattr(cpu_kernel, "_ONEDNN", [_CountingOp(cpu_kernel.onednn_linear(), seen)])
    return seen


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(192, 576), (7, 13), (1030, 40)])
def test_long_products_on_a_column_major_weight_run_on_onednn(shape, bias, calls):
    layer = _layer(*shape, bias)
    x = torch.randn(2, LONG // 2, shape[1])  # 3-D as a model passes them
    with torch.no_grad():
        got = layer(x)
    assert calls == [LONG]
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-6 * shape[1])


def test_what_onednn_does_not_take_stays_on_f_linear(calls, monkeypatch):
    layer = _layer(64, 32, True)
    with torch.no_grad():
        layer(torch.randn(MAX_ROWS, 32))  # the kernel's rows
        layer(torch.randn(MAX_ROWS + 1, 32))  # one more: the kernel's cache-blocked product, else oneDNN
        layer(torch.randn(MAX_GEMM_ROWS + 1, 32))  # oneDNN
    assert calls == ([] if cpu_kernel.kernel_gemm() else [MAX_ROWS + 1]) + [MAX_GEMM_ROWS + 1]
    calls.clear()
    monkeypatch.setattr(cpu_kernel, "_GEMM", [False])  # an AVX2 CPU
    with torch.no_grad():
        layer(torch.randn(MAX_ROWS + 1, 32))
    assert calls == [MAX_ROWS + 1]
    calls.clear()
    x = torch.randn(LONG, 32, requires_grad=True)
    layer(x).sum().backward()  # gradients: F.linear, which has a backward
    assert x.grad is not None and calls == []
    row_major = torch.nn.Linear(32, 64)
    row_major.__class__ = KernelLinear  # row-major: oneDNN reads it no faster than MKL
    with torch.no_grad():
        row_major(torch.randn(LONG, 32))
    assert calls == []
    monkeypatch.setattr(cpu_kernel, "_ONEDNN", [None])  # a PyTorch without it, or HFS_PREFILL_ONEDNN=0
    with torch.no_grad():
        torch.testing.assert_close(layer(torch.ones(LONG, 32)), F.linear(torch.ones(LONG, 32), layer.weight, layer.bias))
    assert calls == []


def test_the_switch_is_read_once(monkeypatch):
    monkeypatch.setattr(cpu_kernel, "_ONEDNN", [])
    monkeypatch.setenv("HFS_PREFILL_ONEDNN", "0")
    assert cpu_kernel.onednn_linear() is None
    monkeypatch.setattr(cpu_kernel, "_ONEDNN", [])
    monkeypatch.delenv("HFS_PREFILL_ONEDNN")
    assert cpu_kernel.onednn_linear() is torch.ops.mkldnn._linear_pointwise


@pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA")
def test_drafters_on_the_kernel_with_a_long_prompt_equal_greedy(calls):
    model = hfs.enable(build_model("llama"))
    hfs.optimize_for_cpu(model, kernel=True)
    inputs = prompt_inputs([3] + [5, 6, 7, 8, 9, 10, 11] * 28)  # 197 tokens: the prefill is oneDNN's
    want = stock_generate(model, **inputs, do_sample=False, max_new_tokens=30)
    assert calls and min(calls) == 197
    for drafter in ("prompt-lookup", "oracle"):
        got = model.generate(**inputs, do_sample=False, max_new_tokens=30,
                             candidate_generator=make_drafter(drafter, model, want))
        assert got.tolist() == want.tolist()
