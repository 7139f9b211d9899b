"""bf16 models on the CPU kernel: their products of 1-16 rows run on the CPU's bf16 dot products (AVX512-BF16;
``skinny_linear_bf16`` on a pair-blocked copy), a row's product does not depend on the rows beside it, and
``optimize_for_cpu`` lays a bf16 model out (kernel and fp32 attention) where the CPU has them, leaving its linears to
PyTorch elsewhere."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hf_speculative as hfs
from hf_speculative.core import sdpa
from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.cpu.kernel import KernelLinear
from hf_speculative.cpu.layout import cpu_layout
from tests.conftest import build_model, make_drafter, prompt_inputs, stock_generate

needs_bf16_dot = pytest.mark.skipif(not cpu_kernel.bf16_dot_supported(),
                                    reason="bf16 products on the kernel need AVX512-BF16")
GREEDY = dict(do_sample=False, max_new_tokens=40)


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.float() @ weight.float().t()  # [M, out], fp32 sums of exact products
    return out + bias.float() if bias is not None else out


def test_pair_blocked_copy_layout():
    weight = torch.randn(37, 9).bfloat16()  # neither dimension a multiple of the block
    pairs = cpu_kernel.block_pairs(weight)
    assert pairs.shape == (3, 5, 16, 2) and pairs.dtype == torch.bfloat16 and pairs.is_contiguous()
    for j, p, c, e in [(0, 0, 0, 0), (1, 2, 3, 1), (2, 3, 4, 0), (0, 4, 15, 0)]:
        assert pairs[j, p, c, e] == weight[16 * j + c, 2 * p + e]
    assert not pairs[2, :, 5:].any() and not pairs[:, 4, :, 1].any()  # zero past `out` and past `in`


@needs_bf16_dot
@pytest.mark.parametrize("shape", [(1100, 72), (7, 13), (16, 1), (48, 576)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_bf16_products_are_row_independent_and_close_to_fp32_sums(shape, with_bias):
    weight = torch.randn(*shape).bfloat16()
    bias = torch.randn(shape[0]).bfloat16() if with_bias else None
    pairs = cpu_kernel.block_pairs(weight)
    x = torch.randn(16, shape[1]).bfloat16()
    alone = torch.cat([cpu_kernel.skinny_linear_bf16(x[i : i + 1], pairs, bias, shape[0]) for i in range(16)])
    for rows in (1, 2, 3, 4, 5, 6, 8, 11, 16):
        got = cpu_kernel.skinny_linear_bf16(x[:rows], pairs, bias, shape[0])
        assert got.dtype == torch.bfloat16 and got.shape == (rows, shape[0])
        assert torch.equal(got, alone[:rows]), rows  # a row's product does not depend on the rows beside it
    # bf16 output: within a rounding of the exact sum (relative 2^-8 of the row's largest value, plus the sums' own)
    want = _reference(x, weight, bias)
    assert (alone.float() - want).abs().max() <= 2 ** -7 * want.abs().max() + 1e-3


@needs_bf16_dot
def test_bf16_kernel_errors_on_a_wrong_copy():
    weight = torch.randn(32, 8).bfloat16()
    with pytest.raises(RuntimeError, match="pair-blocked weight"):
        cpu_kernel.skinny_linear_bf16(torch.randn(2, 8).bfloat16(), cpu_kernel.block_weight(weight.float()), None, 32)
    with pytest.raises(RuntimeError, match="bfloat16"):
        cpu_kernel.skinny_linear_bf16(torch.randn(2, 8), cpu_kernel.block_pairs(weight), None, 32)


@needs_bf16_dot
def test_kernel_linear_on_a_bf16_weight():
    layer = torch.nn.Linear(24, 40).bfloat16()
    ref = torch.nn.Linear(24, 40).bfloat16()
    ref.load_state_dict(layer.state_dict())
    hfs.optimize_for_cpu(layer, kernel=True)
    assert type(layer) is KernelLinear
    x = torch.randn(3, 5, 24).bfloat16()
    with torch.no_grad():
        got = layer(x)  # 15 rows: the kernel
        assert torch.equal(got, cpu_kernel.skinny_linear_bf16(x.reshape(15, 24), layer._hfs_blocked.get(
            layer.weight)[0], layer.bias, 40).view(3, 5, 40))
        assert (got.float() - ref(x).float()).abs().max() < 0.05  # PyTorch's bf16 product, rounded otherwise
        chain = torch.randn(20, 24).bfloat16()  # a draft model's longest chains: 17 rows, in passes of 16
        assert torch.equal(layer(chain), torch.cat([layer(chain[i : i + 1]) for i in range(20)]))
        long = torch.randn(1, cpu_kernel.MAX_ROWS_BF16 + 1, 24).bfloat16()  # a prefill: PyTorch's product
        assert torch.equal(layer(long), F.linear(long, layer.weight, layer.bias))
    grad = x.clone().requires_grad_()  # training: PyTorch's product, which has a backward
    assert torch.equal(layer(grad).detach(), F.linear(x, layer.weight, layer.bias).detach())


def test_a_bf16_model_is_laid_out_where_the_cpu_has_bf16_products(monkeypatch):
    model = build_model("llama").to(torch.bfloat16)
    if not cpu_kernel.bf16_dot_supported():
        pytest.skip("bf16 products on the kernel need AVX512-BF16")
    assert hfs.optimize_for_cpu(model) > 0
    assert all(type(m) is KernelLinear for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert cpu_layout(model) == "all+kernel" and model.config._attn_implementation == sdpa.CPU_ATTENTION
    hfs.optimize_for_cpu(model, False)
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert cpu_layout(model) == "none" and model.config._attn_implementation == "sdpa"


@needs_bf16_dot
def test_a_bf16_drafters_int8_copies():
    """``weights="int8"`` on a bf16 model (a draft model's ``kernel_weights="int8"``): the fp32 kernel's int8
    products on the widened rows, rounded to bf16."""
    layer = torch.nn.Linear(72, 40).bfloat16()
    hfs.optimize_for_cpu(layer, weights="int8")
    q, scale = cpu_kernel.quantize_int8(layer.weight)
    x = torch.randn(4, 72).bfloat16()
    with torch.no_grad():
        got = layer(x)
    want = cpu_kernel.skinny_linear(x.float(), q, layer.bias.float(), 40, scale).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert (got.float() - _reference(x, layer.weight, layer.bias)).abs().max() < 0.1  # an approximation


def test_without_bf16_products_a_bf16_models_linears_stay_pytorchs(monkeypatch):
    monkeypatch.setattr(cpu_kernel, "_BF16_DOT", False)  # a CPU without AVX512-BF16
    model = build_model("llama").to(torch.bfloat16)
    assert hfs.optimize_for_cpu(model) == 0
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert model.config._attn_implementation == sdpa.CPU_ATTENTION  # fp32 attention pays without the kernel too


class _Counting:
    """Stands in for the built extension and counts the rows of its bf16 calls."""

    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getattr__(self, name):  # the rest (the native layers' calls) as the extension has them
        return getattr(self.kernel, name)

    def has_bf16_dot(self):
        return self.kernel.has_bf16_dot()

    def skinny_linear(self, *args, **kwargs):
        return self.kernel.skinny_linear(*args, **kwargs)

    def skinny_linear_bf16(self, x, blocked, bias, out_features):
        self.calls.append(x.shape[0])
        return self.kernel.skinny_linear_bf16(x, blocked, bias, out_features)


@needs_bf16_dot
@pytest.mark.parametrize("drafter_name", ["prompt-lookup", "draft-model", "eagle3", "early-exit", "oracle",
                                          "adversary"])
def test_drafters_identical_to_greedy_on_a_bf16_model(arch, drafter_name, monkeypatch):
    """In bf16 a last-bit difference between a verification row and a one-token forward moves logits by a bf16
    step, which parts a greedy text at the frequent ties: every row's products and attention are computed as a
    one-token forward computes them, so the texts are identical."""
    model = hfs.enable(build_model(arch).to(torch.bfloat16))
    hfs.optimize_for_cpu(model)
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    calls: list[int] = []
    monkeypatch.setattr(cpu_kernel, "_KERNEL", _Counting(cpu_kernel.load_kernel(), calls))
    torch.manual_seed(0)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=make_drafter(drafter_name, model, ref))
    assert out.tolist() == ref.tolist()
    assert any(rows > 1 for rows in calls)  # drafts were verified on the kernel


def _first_forwards(tokens: list[int], strategy):
    """Generate greedily from ``tokens`` on a bf16 Llama on the kernel with ``strategy(model, ref)``'s drafter: the
    output, greedy's, the input length of every target forward, and the call's steps."""
    model = hfs.enable(build_model("llama", max_positions=512).to(torch.bfloat16))
    hfs.optimize_for_cpu(model)
    prompt = prompt_inputs(tokens)
    ref = stock_generate(model, **prompt, **GREEDY)
    seen: list[int] = []
    hook = model.model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs["input_ids"].shape[1]),
                                                 with_kwargs=True)
    try:
        out = model.generate(**prompt, **GREEDY, candidate_generator=strategy(model, ref))
    finally:
        hook.remove()
    return out, ref, seen, hfs.last_stats(model).steps()


@needs_bf16_dot
@pytest.mark.parametrize("drafter_name", ["prompt-lookup", "oracle", "prompt-lookup-tree"])
def test_a_long_prompt_is_prefilled_as_plain_decoding_prefills_it(drafter_name):
    """Beyond 64 tokens a first forward would run on PyTorch's products, unlike plain decoding's prefill and
    one-token forwards: the prompt runs alone (plain decoding's prefill), and the loop drafts nothing there (a draft
    would need a forward of its own, which the next step's draft, made knowing the prefill's token, gets for the
    same price); the drafts come from the second forward on."""
    out, ref, seen, steps = _first_forwards([3] + [5, 6, 7, 8, 9] * 16,  # 81 tokens, repeating: lookup drafts at once
                                            lambda model, ref: make_drafter(drafter_name, model, ref))
    assert out.tolist() == ref.tolist()
    assert seen[0] == 81 and steps["drafted"][0] == 0  # the prompt alone, no draft beside it
    assert len(seen) == len(steps["drafted"])  # one forward per step: none ran as two
    if drafter_name == "oracle":  # it drafts the reference at every step: from the second forward on
        assert 1 < seen[1] <= 64 and steps["drafted"][1] == seen[1] - 1


@needs_bf16_dot
def test_a_short_prompts_first_draft_keeps_the_first_forward_whole():
    """A prompt under 64 tokens may carry a draft in the first forward, as many nodes as keep it within 64 tokens
    (one forward, every row computed as a one-token forward computes it)."""
    out, ref, seen, steps = _first_forwards([3] + [5, 6, 7, 8, 9] * 12,  # 61 tokens, repeating: lookup drafts at once
                                            lambda model, ref: hfs.PromptLookup(adaptive=False))
    assert out.tolist() == ref.tolist()
    assert steps["drafted"][0] == 3 and seen[0] == 64  # 61 + 3 nodes: the most that keeps it whole
    assert len(seen) == len(steps["drafted"])
