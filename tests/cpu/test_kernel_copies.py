"""The kernel's narrower copies of a weight: bf16 where every value is a bf16 number (bitwise the fp32 copy's
products), int8 with per-column scales for drafters (``weights="int8"``, ``DraftModel(kernel_weights=...)``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hf_speculative as hfs
from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.cpu.kernel import BlockedWeight, Int8Weight, KernelLinear
from hf_speculative.cpu.layout import cpu_layout
from tests.conftest import build_model, prompt_inputs, stock_generate

needs_kernel = pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA")
ROWS = (1, 2, 3, 4, 5, 8, 9, 16, 17, 19)


def _bf16_valued(out_features: int, in_features: int) -> torch.Tensor:
    return torch.randn(out_features, in_features).bfloat16().float()  # fp32 holding bf16 numbers, as Qwen2.5's


def test_exactly_bf16_reads_the_low_bits_in_any_layout():
    weight = _bf16_valued(40, 24)
    assert cpu_kernel.exactly_bf16(weight)
    assert cpu_kernel.exactly_bf16(weight.t().contiguous().t())  # the column-major layout
    weight[3, 5] += 2.0 ** -20  # one value off the bf16 grid
    assert not cpu_kernel.exactly_bf16(weight) and not cpu_kernel.exactly_bf16(weight.t().contiguous().t())
    assert not cpu_kernel.exactly_bf16(weight.bfloat16())  # a bf16 weight is not the fp32 the kernel takes


def test_blocked_weight_is_bf16_only_where_exact(monkeypatch):
    monkeypatch.delenv("HFS_KERNEL_BF16", raising=False)
    exact, other = _bf16_valued(20, 8), torch.randn(20, 8)
    blocked, scale = BlockedWeight().make(exact)
    assert blocked.dtype == torch.bfloat16 and scale is None
    assert torch.equal(blocked.float(), cpu_kernel.block_weight(exact))
    assert BlockedWeight().make(other)[0].dtype == torch.float32
    monkeypatch.setenv("HFS_KERNEL_BF16", "0")  # fp32 copies, to compare
    assert BlockedWeight().make(exact)[0].dtype == torch.float32


@needs_kernel
@pytest.mark.parametrize("shape", [(1100, 72), (7, 13), (16, 1), (48, 576)])
def test_a_bf16_copy_gives_bitwise_the_fp32_copys_products(shape):
    weight, bias = _bf16_valued(*shape), torch.randn(shape[0])
    wide, narrow = cpu_kernel.block_weight(weight), cpu_kernel.block_weight(weight, torch.bfloat16)
    x = torch.randn(max(ROWS), shape[1])
    alone = torch.cat([cpu_kernel.skinny_linear(x[i : i + 1], narrow, bias, shape[0]) for i in range(len(x))])
    for rows in ROWS:
        got = cpu_kernel.skinny_linear(x[:rows], narrow, bias, shape[0])
        assert torch.equal(got, cpu_kernel.skinny_linear(x[:rows], wide, bias, shape[0])), rows
        assert torch.equal(got, alone[:rows]), rows  # a row's product does not depend on the rows beside it


@needs_kernel
@pytest.mark.parametrize("shape", [(1100, 72), (7, 13), (48, 576)])
def test_an_int8_copy_computes_its_quantized_weight(shape):
    weight, bias = torch.randn(*shape), torch.randn(shape[0])
    weight[2] = 0.0  # an all-zero column: scale 0, no division by it
    q, scale = cpu_kernel.quantize_int8(weight)
    assert q.dtype == torch.int8 and q.shape == cpu_kernel.block_weight(weight).shape
    assert scale.shape == (q.shape[0] * 16,) and not scale[shape[0]:].any() and scale[2] == 0
    assert q.abs().max() == 127  # each non-zero column's largest value is 127 in magnitude
    # the weight the int8 copy stands for: q [blocks, in, 16] back to [out, in], times each column's scale
    dequantized = q.transpose(1, 2).reshape(-1, shape[1])[: shape[0]].float() * scale[: shape[0], None]
    assert (dequantized - weight).abs().max() <= scale.max() / 2 + 1e-7  # rounding, half a step at most
    x = torch.randn(max(ROWS), shape[1])
    alone = torch.cat([cpu_kernel.skinny_linear(x[i : i + 1], q, bias, shape[0], scale) for i in range(len(x))])
    for rows in ROWS:
        got = cpu_kernel.skinny_linear(x[:rows], q, bias, shape[0], scale)
        torch.testing.assert_close(got, F.linear(x[:rows], dequantized, bias), rtol=1e-5, atol=1e-5 * shape[1] ** 0.5)
        assert torch.equal(got, alone[:rows]), rows


@needs_kernel
def test_copies_and_scales_that_do_not_match_are_refused():
    weight = torch.randn(40, 8)
    q, scale = cpu_kernel.quantize_int8(weight)
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="int8 blocked weight needs its scales"):
        cpu_kernel.skinny_linear(x, q, None, 40)
    with pytest.raises(RuntimeError, match="int8 blocked weight needs its scales"):
        cpu_kernel.skinny_linear(x, cpu_kernel.block_weight(weight), None, 40, scale)
    with pytest.raises(RuntimeError, match=r"scale \[ceil\(out / 16\) \* 16\]"):
        cpu_kernel.skinny_linear(x, q, None, 40, scale[:40])
    with pytest.raises(RuntimeError, match="float32, bfloat16 or int8"):
        cpu_kernel.skinny_linear(x, cpu_kernel.block_weight(weight).half(), None, 40)


@needs_kernel
def test_optimize_for_cpu_int8_copies_switch_and_count():
    model = build_model("llama")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    hfs.optimize_for_cpu(model, kernel=True)
    assert all(type(m._hfs_blocked) is BlockedWeight for m in linears)
    assert hfs.optimize_for_cpu(model, kernel=True, weights="int8") == len(linears)  # only the copies change
    assert all(type(m._hfs_blocked) is Int8Weight and m._hfs_blocked.tensor is not None for m in linears)
    assert cpu_layout(model) == "all+kernel"
    assert hfs.optimize_for_cpu(model, kernel=True, weights="int8") == 0
    ids = prompt_inputs()["input_ids"][:, :5]
    with torch.no_grad():
        approximate = model(ids).logits
    assert hfs.optimize_for_cpu(model, kernel=True) == len(linears)  # back to exact copies
    with torch.no_grad():
        exact = model(ids).logits
    assert not torch.equal(approximate, exact)  # the int8 copies were the ones that ran
    torch.testing.assert_close(approximate, exact, rtol=0.05, atol=0.05)


def test_int8_copies_need_the_kernel():
    model = build_model("llama")
    with pytest.raises(ValueError, match=r"optimize_for_cpu\(weights='int4'\): use one of"):
        hfs.optimize_for_cpu(model, weights="int4")
    with pytest.raises(ValueError, match="needs the CPU kernel"):
        hfs.optimize_for_cpu(model, kernel=False, weights="int8")
    with pytest.raises(ValueError, match="needs the CPU kernel"):
        hfs.optimize_for_cpu(model, pack=True, weights="int8")
    with pytest.raises(ValueError, match=r"kernel_weights='int4'"):
        hfs.DraftModel(build_model("llama", seed=1), kernel_weights="int4")


@needs_kernel
@pytest.mark.parametrize("kernel_weights", ["int8", "exact"])
def test_draft_model_copies_follow_its_option_and_output_is_greedy(kernel_weights):
    target, draft = hfs.enable(build_model("qwen2", seed=0)), build_model("qwen2", seed=1, layers=1)
    hfs.optimize_for_cpu(target, kernel=True)
    inputs = prompt_inputs()
    reference = stock_generate(target, **inputs, do_sample=False, max_new_tokens=30)
    strategy = hfs.DraftModel(draft, kernel_weights=kernel_weights, adaptive=False, confidence_threshold=0.0)
    out = target.generate(**inputs, do_sample=False, max_new_tokens=30, candidate_generator=strategy)
    assert out.tolist() == reference.tolist()
    copies = {type(m._hfs_blocked) for m in draft.modules() if type(m) is KernelLinear}
    assert copies == {Int8Weight if kernel_weights == "int8" else BlockedWeight}
    target_copies = {type(m._hfs_blocked) for m in target.modules() if type(m) is KernelLinear}
    assert target_copies == {BlockedWeight}  # the target's own copies stay exact


def test_draft_model_on_a_target_without_the_kernel_keeps_its_layers():
    target, draft = hfs.enable(build_model("llama", seed=0)), build_model("llama", seed=1, layers=1)
    strategy = hfs.DraftModel(draft, adaptive=False)
    target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=8, candidate_generator=strategy)
    assert not any(type(m) is KernelLinear for m in draft.modules())


@needs_kernel
def test_a_native_layers_plan_follows_its_copies_when_weights_change():
    """A model laid out with int8 copies and then exact ones again runs its native decoder layers on the exact copies:
    the layer plans are made again for the new copies (the weights themselves did not change)."""
    inputs = prompt_inputs()
    fresh = build_model("llama", seed=0)
    hfs.optimize_for_cpu(fresh, kernel=True, weights="exact")
    with torch.no_grad():
        exact = fresh(**inputs).logits
    model = build_model("llama", seed=0)
    hfs.optimize_for_cpu(model, kernel=True, weights="int8")
    with torch.no_grad():
        int8 = model(**inputs).logits
        hfs.optimize_for_cpu(model, kernel=True, weights="exact")
        again = model(**inputs).logits
    assert not torch.equal(int8, exact)  # the int8 copies do change the products
    assert torch.equal(again, exact)


def _network(kind: str, target):
    from hf_speculative.drafters.dflash.drafter import random_network
    from tests.conftest import random_eagle

    return random_eagle(target) if kind == "Eagle" else random_network(target)


@needs_kernel
@pytest.mark.parametrize("kind", ["Eagle", "DFlash"])
def test_a_drafter_networks_copies_follow_its_option_and_output_is_greedy(kind):
    """``Eagle`` / ``DFlash(kernel_weights=...)``: on a target laid out for the kernel, the network's linears take the
    kernel with int8 (the default: a drafter forward reads a quarter of the bytes) or exact copies, the same network
    switching between them; the text stays greedy's; the target's copies stay exact."""
    strategy_class = getattr(hfs, kind)
    target = hfs.enable(build_model("llama", seed=0))
    hfs.optimize_for_cpu(target, kernel=True)
    inputs = prompt_inputs()
    reference = stock_generate(target, **inputs, do_sample=False, max_new_tokens=30)
    net = _network(kind, target)
    assert strategy_class(net).kernel_weights == "int8"
    for weights in ("int8", "exact"):
        strategy = strategy_class(net, kernel_weights=weights, adaptive=False, confidence_threshold=0.0, num_tokens=3)
        out = target.generate(**inputs, do_sample=False, max_new_tokens=30, candidate_generator=strategy)
        assert out.tolist() == reference.tolist()
        assert hfs.last_stats(target).drafted_tokens > 0
        copies = {type(m._hfs_blocked) for m in net.modules() if type(m) is KernelLinear}
        assert copies == {Int8Weight if weights == "int8" else BlockedWeight}
        assert {type(m._hfs_blocked) for m in target.modules() if type(m) is KernelLinear} == {BlockedWeight}
    with pytest.raises(ValueError, match=rf"{kind}\(kernel_weights='int4'\): use one of"):
        strategy_class(net, kernel_weights="int4")
