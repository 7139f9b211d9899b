"""The kernel's weight copies on transparent huge pages (``csrc/huge_pages.cpp``, ``kernel.copy_buffer``): aligned,
apart, advised onto huge pages where Linux offers them, freed with their last copy, written straight from the weight
(zero padding whatever the memory held), the same values and products."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch

from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.cpu.kernel import BlockedWeight, Int8Weight, block_pairs, block_weight, copy_buffer, skinny_linear

pytestmark = pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
linux_thp = pytest.mark.skipif(not sys.platform.startswith("linux") or not THP.exists()
                               or "[never]" in THP.read_text(), reason="no transparent huge pages here")


def _mapping(address: int) -> dict | None:
    """The /proc/self/smaps entry of the mapping holding ``address``: its range and VmFlags, or None."""
    entry = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            start, end = (int(x, 16) for x in head.split("-"))
            entry = {"start": start, "end": end} if start <= address < end else None
        elif entry is not None and head == "VmFlags:":
            entry["flags"] = line.split()[1:]
            return entry
    return None


def test_buffers_are_aligned_apart_and_writable():
    kernel = cpu_kernel.load_kernel()
    buffers = [kernel.huge_page_empty(n) for n in (1, 100, 4096, 3 << 20, 0)]
    assert [b.numel() for b in buffers] == [1, 100, 4096, 3 << 20, 0]
    assert all(b.dtype == torch.uint8 and b.data_ptr() % 64 == 0 for b in buffers[:4])
    for i, b in enumerate(buffers):
        b.fill_(i)
    assert all(bool((b == i).all()) for i, b in enumerate(buffers))  # no buffer wrote over another
    with pytest.raises(RuntimeError, match="at least 0"):
        kernel.huge_page_empty(-1)


@linux_thp
def test_copies_sit_on_advised_2mib_aligned_mappings_freed_with_them():
    kernel = cpu_kernel.load_kernel()
    small = kernel.huge_page_empty(1 << 20)
    mapping = _mapping(small.data_ptr())
    assert mapping is not None and mapping["start"] % (2 << 20) == 0 and "hg" in mapping["flags"]  # MADV_HUGEPAGE
    large = kernel.huge_page_empty(40 << 20)  # more than half an arena: a mapping of its own
    address = large.data_ptr()
    mapping = _mapping(address)
    assert mapping["start"] == address and mapping["end"] - mapping["start"] == 40 << 20 and "hg" in mapping["flags"]
    del large
    gc.collect()
    assert _mapping(address) is None  # unmapped with its copy


def _old_block_weight(weight, dtype=torch.float32):  # the layout as it was made before, through a padded temporary
    blocks = -(-weight.shape[0] // 16)
    padded = weight.new_zeros(blocks * 16, weight.shape[1], dtype=dtype)
    padded[: weight.shape[0]] = weight
    return padded.view(blocks, 16, weight.shape[1]).transpose(1, 2).contiguous()


def _old_block_pairs(weight):
    even = torch.nn.functional.pad(weight, (0, weight.shape[1] % 2))
    blocked = _old_block_weight(even, torch.bfloat16)
    return blocked.view(blocked.shape[0], -1, 2, 16).transpose(2, 3).contiguous()


@pytest.mark.parametrize("shape", [(100, 64), (7, 13), (16, 1), (33, 9), (48, 576)])
def test_copies_are_written_straight_from_any_layout(shape, monkeypatch):
    torch.manual_seed(0)
    cpu_kernel.load_kernel()
    weight = torch.randn(*shape)
    column_major = weight.t().contiguous().t()
    for source in (weight, column_major):
        assert torch.equal(block_weight(source), _old_block_weight(weight))
        assert torch.equal(block_weight(source.bfloat16().float(), torch.bfloat16),
                           _old_block_weight(weight.bfloat16().float(), torch.bfloat16))
        assert torch.equal(block_pairs(source.bfloat16()), _old_block_pairs(weight.bfloat16()))
    # the buffer is not cleared for them: the padding is written, whatever the memory held
    monkeypatch.setattr(cpu_kernel, "copy_buffer", lambda size, dtype: torch.full(size, float("nan"), dtype=dtype))
    assert torch.equal(block_weight(weight), _old_block_weight(weight))
    assert torch.equal(block_pairs(weight.bfloat16()), _old_block_pairs(weight.bfloat16()))


@linux_thp
def test_a_models_copies_are_made_on_huge_pages():
    cpu_kernel.load_kernel()
    copy, scale = BlockedWeight().make(torch.randn(100, 64))
    assert scale is None and "hg" in _mapping(copy.data_ptr())["flags"]
    q, _ = Int8Weight().make(torch.randn(100, 64))
    assert "hg" in _mapping(q.data_ptr())["flags"]


def test_a_weights_copy_keeps_its_values_and_products(monkeypatch):
    torch.manual_seed(0)
    weight, x = torch.randn(100, 64), torch.randn(5, 64)
    cpu_kernel.load_kernel()
    copy, _ = BlockedWeight().make(weight)
    assert torch.equal(copy, _old_block_weight(weight)) and copy.data_ptr() % 64 == 0
    q, scale = Int8Weight().make(weight)
    want_q, want_scale = cpu_kernel.quantize_int8(weight)
    assert torch.equal(q, want_q) and torch.equal(scale, want_scale)
    monkeypatch.setenv("HFS_KERNEL_HUGE_PAGES", "0")
    plain = block_weight(weight)
    assert _mapping(plain.data_ptr()) is None or "hg" not in _mapping(plain.data_ptr())["flags"]  # the switch
    assert torch.equal(plain, copy)
    assert torch.equal(skinny_linear(x, copy, None, 100), skinny_linear(x, plain, None, 100))


def test_copy_buffers_have_the_shape_and_dtype_asked():
    cpu_kernel.load_kernel()
    for dtype in (torch.float32, torch.bfloat16, torch.int8):
        buffer = copy_buffer((3, 5, 16), dtype)
        assert buffer.shape == (3, 5, 16) and buffer.dtype == dtype and buffer.is_contiguous()


def _resident() -> int:
    return int(next(line for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("VmRSS:")).split()[1]) << 10


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_copies_made_and_freed_again_and_again_do_not_pile_up():
    kernel = cpu_kernel.load_kernel()
    keep = kernel.huge_page_empty(1 << 20).fill_(1)  # a copy that lives on in the arena
    before = _resident()
    for _ in range(300):  # 300 MB made, written and freed one at a time
        buffer = kernel.huge_page_empty(1 << 20)
        buffer.fill_(1)
        del buffer
    assert _resident() - before < (16 << 20)
    assert bool((keep == 1).all())
