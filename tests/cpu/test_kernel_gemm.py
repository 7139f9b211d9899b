"""The kernel's products of more than 16 rows (``csrc/skinny_linear.cpp``: ``gemm512`` with AVX-512, ``gemm2`` with
AVX2, which takes them from 9): a cache-blocked product on the same blocked copy whose every output is the few-row
code's FMA chain, so each row is bitwise the row computed alone (plain decoding's), for fp32, bf16-exact and int8
copies, any shape, any thread count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.cpu.kernel import (
    MAX_GEMM_ROWS,
    MAX_GEMM_ROWS_AVX2,
    MAX_ROWS,
    KernelLinear,
    block_weight,
    quantize_int8,
    skinny_linear,
)
from tests.cpu.test_cpu_kernel import _Counting

pytestmark = pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA")


def _copies(weight: torch.Tensor):
    """``(name, blocked, scale)`` of each copy the kernel reads: fp32, bf16 (of a bf16-exact weight), int8."""
    exact = weight.bfloat16().float()
    return [("fp32", block_weight(weight), None), ("bf16", block_weight(exact, torch.bfloat16), None),
            ("int8", *quantize_int8(weight))]


def _alone(x, blocked, bias, out, scale):
    return torch.cat([skinny_linear(x[i:i + 1], blocked, bias, out, scale) for i in range(x.shape[0])])


@pytest.mark.parametrize("rows", [17, 18, 23, 64, MAX_GEMM_ROWS])
@pytest.mark.parametrize("shape", [(49, 37), (576, 64), (20, 300), (1030, 24)])  # (out, in): partial blocks, panels
def test_each_row_is_the_row_computed_alone(shape, rows):
    out, inp = shape
    torch.manual_seed(rows)
    weight, bias, x = torch.randn(out, inp), torch.randn(out), torch.randn(rows, inp)
    for name, blocked, scale in _copies(weight):
        got = skinny_linear(x, blocked, bias, out, scale)
        assert torch.equal(got, _alone(x, blocked, bias, out, scale)), name
        if name == "fp32":
            torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-4, atol=1e-5 * inp)


def test_rows_stay_apart_and_threads_change_nothing():
    torch.manual_seed(0)
    weight, x = torch.randn(200, 96), torch.randn(40, 96)
    blocked = block_weight(weight)
    base = skinny_linear(x, blocked, None, 200)
    moved = x.clone()
    moved[7] += 1.0  # one row changed: only its outputs move
    got = skinny_linear(moved, blocked, None, 200)
    assert not torch.equal(got[7], base[7])
    assert torch.equal(torch.cat([got[:7], got[8:]]), torch.cat([base[:7], base[8:]]))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(skinny_linear(x, blocked, None, 200), base)  # panels split between threads
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("layout", ["column-major", "row-major"])
def test_a_kernel_linear_sends_its_rows_to_the_kernel_up_to_the_limit(monkeypatch, layout):
    """A column-major weight (two copies) sends more than gemm_rows() rows (192 with AVX-512, 64 with AVX2) to oneDNN,
    which reads them as fast or faster; a row-major one (one copy: kernel.one_copy) keeps every row count on the
    kernel."""
    if not cpu_kernel.kernel_gemm():
        pytest.skip("HFS_KERNEL_GEMM=0: more than 16 rows on oneDNN")
    layer = torch.nn.Linear(32, 48)
    if layout == "column-major":
        layer.weight.data = layer.weight.data.t().contiguous().t()
    layer.__class__ = KernelLinear
    seen: list = []
    monkeypatch.setattr(cpu_kernel, "_KERNEL", _Counting(cpu_kernel.load_kernel(), seen))
    limit = cpu_kernel.gemm_rows()
    assert limit == (MAX_GEMM_ROWS if cpu_kernel.kernel_isa() == "avx512" else MAX_GEMM_ROWS_AVX2)
    counts = (MAX_ROWS, MAX_ROWS + 1, limit, limit + 1, 3 * limit)
    with torch.no_grad():
        for rows in counts:
            x = torch.randn(rows, 32)
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert seen == (list(counts[:3]) if layout == "column-major" else list(counts))  # the rest: oneDNN
