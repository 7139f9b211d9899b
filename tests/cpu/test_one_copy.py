"""One copy of the weights in memory: ``optimize_for_cpu`` on a memory-mapped checkpoint leaves the fp32 linear weights
that the kernel serves at every row count as views of the file, makes the kernel's blocked copies and drops the
process's pages of the file (``hf_speculative.cpu.mapped.page_out_files``); ``HFS_KERNEL_ONE_COPY=0`` keeps the
column-major copy beside the blocked one, as before."""

from __future__ import annotations

import gc
import os
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_speculative as hfs
from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.cpu.kernel import MAX_GEMM_ROWS, KernelLinear, column_major
from hf_speculative.cpu.layout import cpu_layout
from hf_speculative.cpu.mapped import file_backed_ranges, in_files, page_out, page_out_files
from tests.conftest import build_model, prompt_inputs, stock_generate
from tests.cpu.test_cpu_kernel import _Counting

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps and smaps"),
    pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA"),
]
GREEDY = {"do_sample": False, "max_new_tokens": 16}


def _resident_kib(path) -> int:
    """KiB of ``path``'s mapping resident in this process (``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=5)
            if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:  # a mapping's first line
                inside = len(head) == 6 and head[5].strip() == str(path)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def _linears(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


@pytest.fixture
def saved(checkpoint):
    """:func:`checkpoint` where one copy applies (AVX-512)."""
    if not cpu_kernel.one_copy_applies():
        pytest.skip("one copy needs the kernel's products at every row count (AVX-512)")
    return checkpoint


@pytest.fixture
def checkpoint(tmp_path):
    """A Llama of a few MB saved as safetensors: its folder, and a loader that maps it."""
    build_model("llama", hidden=256, layers=2, vocab_size=2048).save_pretrained(tmp_path)
    os.sync()  # clean pages, as a checkpoint's are: dirty ones would be written back before they could go

    def load():
        model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
        if not in_files(model.get_output_embeddings().weight):
            pytest.skip("this transformers version does not memory-map the checkpoint")
        return model
    return tmp_path, load


def test_the_weights_stay_in_the_file_and_its_pages_leave(saved):
    folder, load = saved
    model = load()
    want = stock_generate(model, **prompt_inputs(), **GREEDY)  # reads every weight: the file's pages resident
    resident = _resident_kib(folder / "model.safetensors")
    assert resident > 4_000  # (the weights are ~8 MB)
    assert hfs.optimize_for_cpu(model) == len({id(m.weight) for m in _linears(model)})
    files = file_backed_ranges()
    for module in _linears(model):
        assert type(module) is KernelLinear
        assert in_files(module.weight, files) and not column_major(module.weight)
    assert cpu_layout(model) == "all+kernel"
    assert _resident_kib(folder / "model.safetensors") < resident / 4  # paged out; the norms come back on use
    with torch.no_grad():  # (not stock_generate: its reference cache reads every weight to key it)
        assert torch.equal(type(model).generate(model, **prompt_inputs(), **GREEDY), want)
    assert _resident_kib(folder / "model.safetensors") < resident / 4  # decoding reads the blocked copies


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_with_avx2_the_column_major_copy_stays(checkpoint, monkeypatch, isa):
    """AVX2's product takes up to 64 rows (kernel.gemm_rows), so a longer prefill wants oneDNN's column-major copy:
    one copy is AVX-512's alone (the instruction set as the kernel would report it; only the layout is looked at)."""
    _, load = checkpoint
    monkeypatch.setattr(cpu_kernel, "kernel_isa", lambda: isa)
    monkeypatch.delenv("HFS_KERNEL_ONE_COPY", raising=False)
    model = load()
    hfs.optimize_for_cpu(model)
    assert cpu_kernel.gemm_rows() == (64 if isa == "avx2" else MAX_GEMM_ROWS)
    kept = [in_files(m.weight) and not column_major(m.weight) for m in _linears(model)]
    assert all(kept) if isa == "avx512" and cpu_kernel.kernel_gemm() else not any(kept), kept


def test_negative_control_two_copies(saved, monkeypatch):
    """HFS_KERNEL_ONE_COPY=0: the weights are copied column-major off the file, which is let go."""
    folder, load = saved
    monkeypatch.setenv("HFS_KERNEL_ONE_COPY", "0")
    model = load()
    want = stock_generate(model, **prompt_inputs(), **GREEDY)
    hfs.optimize_for_cpu(model)
    assert all(column_major(m.weight) and not in_files(m.weight) for m in _linears(model))
    assert cpu_layout(model) == "all+kernel"
    gc.collect()
    assert _resident_kib(folder / "model.safetensors") == 0  # unmapped
    assert torch.equal(stock_generate(model, **prompt_inputs(), **GREEDY), want)


def test_one_copy_and_two_copies_decode_the_same_and_long_forwards_stay_on_the_kernel(saved, monkeypatch):
    _, load = saved
    one = load()
    hfs.optimize_for_cpu(one)
    monkeypatch.setenv("HFS_KERNEL_ONE_COPY", "0")
    two = load()
    hfs.optimize_for_cpu(two)
    assert torch.equal(stock_generate(one, **prompt_inputs(), **GREEDY), stock_generate(two, **prompt_inputs(), **GREEDY))
    ids = torch.randint(4, 2048, (1, MAX_GEMM_ROWS + 40), generator=torch.Generator().manual_seed(0))
    seen: list = []
    monkeypatch.setattr(cpu_kernel, "_KERNEL", _Counting(cpu_kernel.load_kernel(), seen))
    with torch.inference_mode():
        long_one = one(ids).logits
        assert seen and set(seen) == {ids.shape[1]}  # every product of the long forward on the kernel
        seen.clear()
        long_two = two(ids).logits
        assert not seen  # oneDNN on the column-major copies
    torch.testing.assert_close(long_one, long_two, rtol=1e-4, atol=1e-4)


def test_a_weight_changed_in_place_keeps_its_change(saved):
    """Paging out is a residency hint: a weight written after the layout (a private page of the mapping) keeps the
    new values, and the kernel's copy follows them."""
    _, load = saved
    model, reference = load(), load()
    hfs.optimize_for_cpu(model)
    with torch.no_grad():
        for m in (model, reference):
            m.model.layers[0].mlp.up_proj.weight.mul_(3.0)
    page_out_files(model)
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, reference.model.layers[0].mlp.up_proj.weight)
    assert torch.equal(stock_generate(model, **prompt_inputs(), **GREEDY),
                       stock_generate(reference, **prompt_inputs(), **GREEDY))


def test_undo_leaves_the_stock_layout(saved):
    _, load = saved
    model = load()
    want = stock_generate(model, **prompt_inputs(), **GREEDY)
    hfs.optimize_for_cpu(model)
    hfs.optimize_for_cpu(model, False)
    assert all(type(m) is torch.nn.Linear and m.weight.is_contiguous() for m in _linears(model))
    assert cpu_layout(model) == "none"
    assert torch.equal(stock_generate(model, **prompt_inputs(), **GREEDY), want)


def test_a_model_not_from_a_file_keeps_two_copies():
    """Nothing to page out for weights in the process's own memory: they are copied column-major as before."""
    model = build_model("llama")
    hfs.optimize_for_cpu(model)
    assert all(column_major(m.weight) for m in _linears(model))
    assert page_out_files(model) == 0


def test_int8_copies_keep_the_exact_weights_beside_them(saved):
    """int8 copies (drafters) are approximate: the exact weights, column-major, serve the longer products."""
    _, load = saved
    model = load()
    hfs.optimize_for_cpu(model, weights="int8")
    assert all(column_major(m.weight) and not in_files(m.weight) for m in _linears(model))


def test_page_out_keeps_the_values():
    tensor = torch.randn(300_000)
    before = tensor.clone()
    page_out(tensor)  # anonymous memory: kept (no swap) or swapped, never lost
    assert torch.equal(tensor, before)
