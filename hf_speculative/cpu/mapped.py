"""Tensors still read from a memory-mapped checkpoint, copied off it once the big weights have moved.

transformers loads safetensors checkpoints through ``mmap``: every parameter is a view of the file's one mapping,
and the mapping stays while any of them lives. ``optimize_for_cpu`` gives the linear weights storage of their own
(the column-major copy) and the kernel its blocked copy; the norms' few kilobytes are still views of the file, so the
whole mapping stays, and with it every page the layout read to copy the weights: SmolLM2-135M kept 513 MB of file
pages resident beside its two copies (RSS 2,053 MB after ``optimize_for_cpu`` against 950 MB for plain
transformers). Copying what is left of the file off it lets the mapping go.

Linux only (``/proc/self/maps`` says which addresses are file-backed); elsewhere nothing is copied.
"""

from __future__ import annotations

import bisect
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


def _inside(ranges: list[tuple[int, int]], starts: list[int], address: int) -> bool:
    at = bisect.bisect_right(starts, address) - 1
    return at >= 0 and address < ranges[at][1]


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
