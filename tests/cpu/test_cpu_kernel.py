"""``optimize_for_cpu(model, kernel=True)``: the skinny CPU kernel equals ``F.linear``, a row's
product does not depend on the rows computed with it, its blocked copy of a weight follows the
weight, the model keeps its parameters, and every drafter stays token-identical to plain greedy on
it. Compiled once per machine (about a minute)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import hf_speculative as hfs
from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.cpu.kernel import MAX_GEMM_ROWS, KernelLinear
from hf_speculative.cpu.layout import PackedLinear, cpu_layout
from tests.conftest import build_model, make_drafter, prompt_inputs, stock_generate
from tests.cpu.test_cpu_layout import _linears, convert_keeping_parameters, restore_row_major

needs_kernel = pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA")
GREEDY = dict(do_sample=False, max_new_tokens=40)


def _column_major(out_features: int, in_features: int) -> torch.Tensor:
    return torch.randn(out_features, in_features).t().contiguous().t()  # [out, in] on [in, out] storage


class _Counting:
    """Stands in for the built extension and counts its calls (rows per call)."""

    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getattr__(self, name):  # the rest (the native layers' calls) as the extension has them
        return getattr(self.kernel, name)

    def skinny_linear(self, x, blocked, bias, out_features, scale=None):
        self.calls.append(x.shape[0])
        return self.kernel.skinny_linear(x, blocked, bias, out_features, scale)


def test_blocked_copy_layout():
    weight = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)  # out 20: one full block and 4 columns
    blocked = cpu_kernel.block_weight(weight)
    assert blocked.shape == (2, 3, 16) and blocked.is_contiguous()
    assert torch.equal(blocked[0], weight[:16].t()) and torch.equal(blocked[1, :, :4], weight[16:].t())
    assert not blocked[1, :, 4:].any()  # padding
    assert torch.equal(cpu_kernel.block_weight(_column_major(20, 3).copy_(weight)), blocked)  # any layout


@needs_kernel
@pytest.mark.parametrize("shape", [(8, 16), (7, 13), (192, 576), (1030, 40), (3, 9), (16, 1)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_equals_linear(shape, with_bias):
    weight = _column_major(*shape)
    bias = torch.randn(shape[0]) if with_bias else None
    blocked = cpu_kernel.block_weight(weight)
    for rows in (1, 2, 3, 5, 8, 9, 16, 19):
        x = torch.randn(rows, shape[1])
        # sums of `in` products in another order: fp32 rounding grows with the length
        torch.testing.assert_close(cpu_kernel.skinny_linear(x, blocked, bias, shape[0]), F.linear(x, weight, bias),
                                   rtol=1e-5, atol=1e-6 * shape[1])


@needs_kernel
@pytest.mark.parametrize("copy", ["fp32", "bf16", "int8"])
def test_a_rows_product_does_not_depend_on_the_other_rows(copy):
    """Up to 8 rows a pass, more in tiles of 6 over panels of blocks (AVX2), or passes of 16 and tiles (AVX-512): each
    row is bitwise its product alone, for each kind of copy, on one thread or two."""
    weight, bias = torch.randn(1100, 72), torch.randn(1100)  # 68 full blocks and one of 12 columns (2 AVX2 panels)
    blocked, scale = {"fp32": lambda: (cpu_kernel.block_weight(weight), None),
                      "bf16": lambda: (cpu_kernel.block_weight(weight.bfloat16().float(), torch.bfloat16), None),
                      "int8": lambda: cpu_kernel.quantize_int8(weight)}[copy]()
    x = torch.randn(17, 72)
    alone = torch.cat([cpu_kernel.skinny_linear(x[i : i + 1], blocked, bias, 1100, scale) for i in range(17)])
    for rows in range(2, 18):
        assert torch.equal(cpu_kernel.skinny_linear(x[:rows], blocked, bias, 1100, scale), alone[:rows]), rows
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(cpu_kernel.skinny_linear(x, blocked, bias, 1100, scale), alone)
    finally:
        torch.set_num_threads(threads)


_PRODUCTS = """
import sys, torch
from hf_speculative.cpu import kernel
g = torch.Generator().manual_seed(3)
weight, bias = torch.randn(1100, 72, generator=g), torch.randn(1100, generator=g)
x = torch.randn(19, 72, generator=g)
copies = [(kernel.block_weight(weight), None), (kernel.block_weight(weight.bfloat16().float(), torch.bfloat16), None),
          kernel.quantize_int8(weight)]  # fp32, bf16 and int8 copies: each its own code
out = [kernel.skinny_linear(x[:m], blocked, bias, 1100, scale) for blocked, scale in copies for m in range(1, 20)]
torch.save({"isa": kernel.kernel_isa(), "out": out}, sys.argv[1])
"""


@needs_kernel
@pytest.mark.single_version  # the kernel's own products (two builds of it): nothing of transformers
def test_avx512_and_avx2_give_bitwise_the_same_products(tmp_path):
    """Each output is the same FMA chain on either instruction set, so the choice never changes a token. (Where
    the CPU has no AVX-512 both runs take the AVX2 code and the comparison is trivially true: `isa` says which.)"""
    import os
    import subprocess
    import sys

    script = tmp_path / "products.py"
    script.write_text(_PRODUCTS)
    results = {}
    for isa in ("default", "avx2"):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        env.pop("HFS_KERNEL_ISA", None)
        if isa == "avx2":
            env["HFS_KERNEL_ISA"] = "avx2"
        subprocess.run([sys.executable, str(script), str(tmp_path / f"{isa}.pt")], env=env, check=True, timeout=600)
        results[isa] = torch.load(tmp_path / f"{isa}.pt")
    assert results["avx2"]["isa"] == "avx2"
    assert results["default"]["isa"] == ("avx512" if "avx512f" in _cpu_flags() else "avx2")
    assert len(results["avx2"]["out"]) == 3 * 19
    for rows, (a, b) in enumerate(zip(results["default"]["out"], results["avx2"]["out"]), start=1):
        assert torch.equal(a, b), rows


def _cpu_flags() -> set[str]:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


@needs_kernel
def test_kernel_errors_on_a_wrong_copy():
    weight = torch.randn(40, 8)
    with pytest.raises(RuntimeError, match="does not have `out` columns"):
        cpu_kernel.skinny_linear(torch.randn(2, 8), cpu_kernel.block_weight(weight), None, 56)
    with pytest.raises(RuntimeError, match="blocked weight"):
        cpu_kernel.skinny_linear(torch.randn(2, 8), weight, None, 40)


@needs_kernel
def test_blocked_copy_follows_in_place_weight_changes():
    layer = torch.nn.Linear(16, 24)
    hfs.optimize_for_cpu(layer, kernel=True)
    made = layer._hfs_blocked.tensor
    assert made is not None  # made by optimize_for_cpu, not inside the first forward
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        assert layer._hfs_blocked.tensor is made
        layer.weight.mul_(-2.0)  # e.g. an optimizer step
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        layer.load_state_dict({"weight": torch.randn(24, 16), "bias": torch.randn(24)})
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        layer.weight.data = torch.randn(24, 16)  # a new tensor: another storage
        torch.testing.assert_close(layer(x[:1]), F.linear(x[:1], layer.weight, layer.bias))
    hfs.optimize_for_cpu(layer, False)
    assert type(layer) is torch.nn.Linear and "_hfs_blocked" not in layer.__dict__


@needs_kernel
def test_kernel_layers_keep_parameters_state_dict_and_outputs(arch, monkeypatch):
    model = build_model(arch)
    ids = prompt_inputs()["input_ids"].repeat(1, 14)  # [1, 196]: more rows than the kernel takes
    with torch.no_grad():
        before, few, some = model(ids).logits, model(ids[:, :3]).logits, model(ids[:, :28]).logits

    # the linears' own forwards (the native layers run the decoder's products from C++: test_native_layers.py)
    changed = convert_keeping_parameters(model, KernelLinear, "all+kernel", kernel=True, native=False)

    calls = []
    monkeypatch.setattr(cpu_kernel, "_KERNEL", _Counting(cpu_kernel.load_kernel(), calls))
    with torch.no_grad():
        torch.testing.assert_close(model(ids[:, :3]).logits, few, rtol=1e-5, atol=1e-5)
        assert calls and set(calls) == {3}  # verification-sized products: the kernel
        calls.clear()
        model(ids[:, :1])
        assert len(calls) == len(_linears(model)) and set(calls) == {1}  # decoding too
        calls.clear()
        torch.testing.assert_close(model(ids[:, :28]).logits, some, rtol=1e-5, atol=1e-5)
        # more rows than a pass: the kernel's cache-blocked product (unless HFS_KERNEL_GEMM=0: then BLAS)
        assert set(calls) == ({28} if cpu_kernel.kernel_gemm() else set())
        calls.clear()
        assert ids.shape[1] > MAX_GEMM_ROWS
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)
        assert not calls  # a long prefill: oneDNN / BLAS

    restore_row_major(model, changed)


@needs_kernel
def test_switching_between_packed_and_kernel():
    model = build_model("llama")
    hfs.optimize_for_cpu(model, pack=True)
    assert hfs.optimize_for_cpu(model, kernel=True) == len(_linears(model))
    assert cpu_layout(model) == "all+kernel" and not any(hasattr(m, "_hfs_packed") for m in _linears(model))
    hfs.optimize_for_cpu(model, pack=True)
    assert cpu_layout(model) == "all+packed" and all(type(m) is PackedLinear for m in _linears(model))
    assert hfs.optimize_for_cpu(model, layers="output", kernel=True) == 1
    assert cpu_layout(model) == "mixed"
    with pytest.raises(ValueError, match="choose one"):
        hfs.optimize_for_cpu(model, pack=True, kernel=True)


@needs_kernel
def test_someone_elses_linear_subclass_is_left_alone():
    class Custom(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(Custom(8, 8), torch.nn.Linear(8, 4))
    assert hfs.optimize_for_cpu(model, kernel=True) == 2  # both re-laid out
    assert type(model[0]) is Custom and type(model[1]) is KernelLinear


@needs_kernel
def test_kernel_layers_still_train_copy_and_save(tmp_path):
    model = build_model("qwen2")
    hfs.optimize_for_cpu(model, kernel=True)
    ids = prompt_inputs()["input_ids"][:, :6]
    model(ids, labels=ids).loss.backward()  # gradients: F.linear
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for m in _linears(model))
    with torch.no_grad():
        expected = model(ids).logits
    twin = copy.deepcopy(model)
    assert twin.lm_head._hfs_blocked.tensor is None  # a copy makes its own blocked copies on first use
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    model.save_pretrained(tmp_path / "hf")
    again = type(model).from_pretrained(tmp_path / "hf")
    assert cpu_layout(twin) == cpu_layout(loaded) == "all+kernel"
    with torch.no_grad():
        for other in (twin, loaded, again):
            torch.testing.assert_close(other(ids).logits, expected, rtol=1e-5, atol=1e-5)


def test_kernel_errors_name_the_fix(monkeypatch):
    model = build_model("llama")
    monkeypatch.setattr(cpu_kernel, "cpu_supports_kernel", lambda: False)
    with pytest.raises(RuntimeError, match="AVX2 and FMA.*pack=True"):
        hfs.optimize_for_cpu(model, kernel=True)
    monkeypatch.setattr(cpu_kernel, "cpu_supports_kernel", lambda: True)
    monkeypatch.setattr(cpu_kernel, "_KERNEL", None)

    def no_compiler():
        raise OSError("g++: command not found")

    monkeypatch.setattr(cpu_kernel, "_build", no_compiler)
    with pytest.raises(RuntimeError, match=r"could not compile.*g\+\+: command not found.*pack=True"):
        hfs.optimize_for_cpu(model, kernel=True)
    assert cpu_layout(model) == "none"  # nothing changed


@needs_kernel
@pytest.mark.parametrize("drafter_name", ["prompt-lookup", "draft-model", "eagle3", "early-exit", "oracle",
                                          "adversary"])
def test_drafters_identical_to_greedy_on_the_kernel(arch, drafter_name, monkeypatch):
    model = hfs.enable(build_model(arch))
    hfs.optimize_for_cpu(model, kernel=True)
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    calls = []
    monkeypatch.setattr(cpu_kernel, "_KERNEL", _Counting(cpu_kernel.load_kernel(), calls))
    torch.manual_seed(0)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=make_drafter(drafter_name, model, ref))
    assert out.tolist() == ref.tolist()
    assert any(rows > 1 for rows in calls)  # drafts were verified on the kernel
