"""Tensors still read from a memory-mapped checkpoint, copied off it once the big weights have moved.

transformers loads safetensors checkpoints through ``mmap``: every parameter is a view of the file's one mapping,
and the mapping stays while any of them lives. ``optimize_for_cpu`` gives the linear weights storage of their own
(the column-major copy) and the kernel its blocked copy; the norms' few kilobytes are still views of the file, so the
whole mapping stays, and with it every page the layout read to copy the weights: SmolLM2-135M kept 513 MB of file
pages resident beside its two copies (RSS 2,053 MB after ``optimize_for_cpu`` against 950 MB for plain
transformers). Copying what is left of the file off it lets the mapping go.

Where the kernel's blocked copy serves a weight at every row count, the weight need not be copied at all: it stays
a view of the file, and once the blocked copies are made :func:`page_out_files` asks Linux to drop the process's
pages of the checkpoint's mapping (``MADV_PAGEOUT``). The blocked copy is then the only copy in memory, and the file's
pages come back, a page at a time, only where something still reads the parameter (an embedding row, a norm).

Linux only (``/proc/self/maps`` says which addresses are file-backed); elsewhere nothing is copied or paged out.
"""

from __future__ import annotations

import bisect
import ctypes
import sys
from pathlib import Path

import torch

_MAPS = Path("/proc/self/maps")


def file_backed_ranges() -> list[tuple[int, int]]:
    """The address ranges `[start, end)` this process maps from regular files (sorted; empty off Linux)."""
    try:
        lines = _MAPS.read_text().splitlines()
    except OSError:
        return []
    ranges = []
    for line in lines:
        fields = line.split(maxsplit=5)
        # fields: address perms offset dev inode [path]; anonymous memory has inode 0, [heap]/[stack] no file path
        if len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/"):
            start, end = fields[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return sorted(ranges)


def _mapping_of(ranges: list[tuple[int, int]], starts: list[int], address: int) -> tuple[int, int] | None:
    """The range of ``ranges`` (sorted, ``starts`` their starts) that holds ``address``, or None."""
    at = bisect.bisect_right(starts, address) - 1
    return ranges[at] if at >= 0 and address < ranges[at][1] else None


def _inside(ranges: list[tuple[int, int]], starts: list[int], address: int) -> bool:
    return _mapping_of(ranges, starts, address) is not None


def in_files(tensor: torch.Tensor, ranges: list[tuple[int, int]] | None = None) -> bool:
    """Whether ``tensor``'s storage is in a file mapping (``ranges`` from :func:`file_backed_ranges`, else read now)."""
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return False
    ranges = file_backed_ranges() if ranges is None else ranges
    return _inside(ranges, [start for start, _ in ranges], tensor.untyped_storage().data_ptr())


MADV_PAGEOUT = 21  # linux/mman.h (Linux 5.4+): reclaim these pages now; clean file pages are simply dropped


def _madvise():
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise


def page_out(tensor: torch.Tensor) -> int:
    """Drop this process's resident pages wholly inside ``tensor``'s storage (``MADV_PAGEOUT``; a file-backed one:
    see :func:`page_out_files`), as soon as its copy is made, so that the peak stays near one copy; returns the
    bytes advised."""
    if not sys.platform.startswith("linux") or tensor.device.type != "cpu":
        return 0
    storage = tensor.untyped_storage()
    start = -(-storage.data_ptr() // _PAGE) * _PAGE
    end = (storage.data_ptr() + storage.nbytes()) // _PAGE * _PAGE
    return end - start if end > start and _madvise()(start, end - start, MADV_PAGEOUT) == 0 else 0


_PAGE = 4096


def page_out_files(model: torch.nn.Module) -> int:
    """Drop this process's resident pages of every file mapping that holds one of ``model``'s CPU parameters or
    buffers (``madvise(MADV_PAGEOUT)``): the pages read to make the kernel's copies stop counting in its memory, and
    any the model still reads come back from the page cache on use. Only a residency hint: the values do not change
    (a page written in place is private memory, which is kept, or swapped). Returns the bytes advised (0 off Linux,
    or where the kernel refuses the advice)."""
    ranges = file_backed_ranges()
    if not ranges or not sys.platform.startswith("linux"):
        return 0
    starts = [start for start, _ in ranges]
    held = {_mapping_of(ranges, starts, tensor.untyped_storage().data_ptr())
            for tensor in (*model.parameters(), *model.buffers()) if tensor.device.type == "cpu" and tensor.numel()}
    held.discard(None)
    madvise, advised = _madvise(), 0
    for start, end in sorted(held):
        if madvise(start, end - start, MADV_PAGEOUT) == 0:
            advised += end - start
    return advised


def copy_off_files(model: torch.nn.Module) -> int:
    """Give every CPU parameter and buffer of ``model`` that is still a view of a file mapping storage of its own, so
    that the mapping can go; tied tensors stay tied (one copy per tensor object). Returns how many were copied."""
    ranges = file_backed_ranges()
    if not ranges:
        return 0
    starts = [start for start, _ in ranges]
    copied, seen = 0, set()
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if id(tensor) in seen or tensor.device.type != "cpu" or tensor.numel() == 0:
                continue
            seen.add(id(tensor))
            if _inside(ranges, starts, tensor.untyped_storage().data_ptr()):
                tensor.data = tensor.data.clone(memory_format=torch.preserve_format)
                copied += 1
    return copied
