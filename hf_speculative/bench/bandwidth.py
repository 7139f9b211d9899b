"""How far a CPU's decoding is from the memory limit: the weights' GB/s against this machine's read bandwidth.

A one-token forward of a small model on one CPU core is bound by reading its weights, so the tokens/s of plain
decoding mean little alone: "25 tok/s" is good or poor depending on the model's bytes and the machine's memory.
gpt-fast prints "bandwidth achieved" for that reason; ``hf-speculative bench`` and ``profile`` print, for CPU runs::

    weights 538 MB/token -> 13.5 GB/s at 25.0 tok/s, 58% of this machine's 23.0 GB/s single-thread read

- :func:`weight_bytes`: the bytes one token's forward reads from the weights (the rule is in its docstring; defined
  in ``hf_speculative/cpu/weight_bytes.py``, which MagicDec's cost prior shares).
- :func:`measure_read_bandwidth`: this machine's single-thread read bandwidth, measured once per process (a second
  or two over 1 GiB), or taken from ``HFS_READ_BANDWIDTH_GBS`` (GB/s) where that is set.
- :func:`format_bandwidth`: the line above.

Units are decimal (1 GB = 10**9 bytes), as memory bandwidths are quoted. Only plain decoding's tokens/s (and a
profile's one-token forward) give the weights' GB/s: a speculative step reads the weights once for several tokens,
so its "GB/s per token" would not be a read rate.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable

import torch

from ..cpu import kernel as _kernel
from ..cpu.weight_bytes import _nbytes, weight_bytes  # the rule lives below the benchmark (drafters use it)

ENV = "HFS_READ_BANDWIDTH_GBS"
GIB = 1 << 30
# the kernel's measurement reads matrices of SmolLM2-to-Llama-8B width, each one sequential stream per block
KERNEL_IN_FEATURES = 8192
KERNEL_MATRIX_BYTES = 128 << 20  # 4096 x 8192 fp32

def _env_bandwidth() -> float | None:
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    try:
        gbs = float(value)
    except ValueError:
        gbs = math.nan
    if not (math.isfinite(gbs) and gbs > 0):
        raise ValueError(f"HFS_READ_BANDWIDTH_GBS={value!r}: give this machine's single-thread read bandwidth in "
                         "GB/s, a number above 0 (e.g. 22.5), or unset it to have it measured.")
    return gbs


def read_bandwidth_source() -> str:
    """Where :func:`measure_read_bandwidth`'s value comes from: ``"measured"``, or the environment variable's name."""
    return ENV if os.environ.get(ENV, "").strip() else "measured"


def measure_read_bandwidth(nbytes: int = GIB, repeats: int = 3, *, kernel: bool | None = None) -> float:
    """This machine's single-thread read bandwidth, GB/s: the best of a STREAM-like read (a one-thread ``sum`` over
    ``nbytes`` of fp32) and, where the CPU kernel runs, the kernel's own one-row product over blocked fp32 weights
    totalling ``nbytes``, on huge pages as its copies are (``repeats`` passes each, the best kept).

    ``nbytes`` must be far larger than the last-level cache for a memory bandwidth (the default, 1 GiB, is; a few
    MiB measure the cache, which tests use for speed). Runs on one torch thread and restores the previous count.
    Measured once per process for given arguments. ``HFS_READ_BANDWIDTH_GBS`` (GB/s), where set, is returned
    instead, nothing measured: for CI, tests, and tables that must quote a figure measured before.

    Args:
        kernel (`bool`, *optional*): ``None``: the kernel's product too where the kernel runs here (it is compiled
            on first use, as ``optimize_for_cpu`` does); ``False``: the ``sum`` alone; ``True``: the kernel's product
            too, or the kernel's error.
    """
    given = _env_bandwidth()
    if given is not None:
        return given
    if kernel is None:
        kernel = _kernel.cpu_supports_kernel() and _kernel_loads()
    return _measured(int(nbytes), max(1, int(repeats)), bool(kernel))


def _kernel_loads() -> bool:
    try:
        _kernel.load_kernel()
    except RuntimeError:
        return False
    return True


@functools.cache
def _measured(nbytes: int, repeats: int, kernel: bool) -> float:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = _sum_read_gbs(nbytes, repeats)
        if kernel:
            best = max(best, _kernel_read_gbs(nbytes, repeats))
        return best
    finally:
        torch.set_num_threads(previous)


def _best_gbs(read: Callable[[], object], nbytes: int, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - start)
    return nbytes / max(best, 1e-9) / 1e9


def _sum_read_gbs(nbytes: int, repeats: int) -> float:
    data = torch.ones(max(1, nbytes // 4), dtype=torch.float32)  # written once: every page is mapped before timing
    return _best_gbs(data.sum, _nbytes(data), repeats)


def _kernel_read_gbs(nbytes: int, repeats: int) -> float:
    """The kernel's one-row product (plain decoding's) over blocked fp32 matrices of ``nbytes`` in all."""
    matrix_bytes = min(nbytes, KERNEL_MATRIX_BYTES)
    in_features = min(KERNEL_IN_FEATURES, max(1, matrix_bytes // (4 * _kernel.BLOCK)))
    blocks = max(1, matrix_bytes // (4 * _kernel.BLOCK * in_features))
    count = max(1, round(nbytes / (blocks * _kernel.BLOCK * in_features * 4)))
    # the values do not change the cost of an FMA; a constant is quicker to write than random numbers. On huge pages
    # where the OS gives them, as the kernel's own copies are (kernel.copy_buffer)
    weights = [_kernel.copy_buffer((blocks, in_features, _kernel.BLOCK), torch.float32).fill_(0.5)
               for _ in range(count)]
    x = torch.ones(1, in_features)
    out_features = blocks * _kernel.BLOCK

    def read() -> None:
        for blocked in weights:
            _kernel.skinny_linear(x, blocked, None, out_features)

    read()  # the first call loads the kernel's code paths
    return _best_gbs(read, sum(_nbytes(w) for w in weights), repeats)


def weights_gbs(weight_bytes_per_token: int, tokens_per_s: float) -> float:
    """The weights' read rate, GB/s, of a forward per token at ``tokens_per_s``."""
    return weight_bytes_per_token * tokens_per_s / 1e9


def _number(value: float) -> str:
    """Three significant digits, never in exponent form (``.3g`` writes 1234 as ``1.23e+03``)."""
    return f"{value:.3g}" if abs(value) < 999.5 else f"{value:.0f}"


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= 0.9995 * scale:  # 999.6 MB is written 1 GB, not 1e+03 MB
            return f"{_number(nbytes / scale)} {unit}"
    return f"{nbytes:.0f} B"


def format_bandwidth(weight_bytes_per_token: int, *, tokens_per_s: float | None = None,
                     seconds_per_token: float | None = None, read_bandwidth_gbs: float | None = None,
                     source: str = "measured", threads: int = 1) -> str:
    """``weights 538 MB/token -> 13.5 GB/s at 25.0 tok/s, 58% of this machine's 23.0 GB/s single-thread read``,
    from tokens/s or seconds per token; the share is left out without ``read_bandwidth_gbs``, and says where that
    figure came from when it was not measured (``source``), and on how many threads the tokens were made. Give
    one of ``tokens_per_s`` and ``seconds_per_token``."""
    if tokens_per_s is None:
        tokens_per_s = 1 / seconds_per_token if seconds_per_token else 0.0
    gbs = weights_gbs(weight_bytes_per_token, tokens_per_s)
    text = f"weights {_size(weight_bytes_per_token)}/token -> {_number(gbs)} GB/s at {tokens_per_s:.1f} tok/s"
    if read_bandwidth_gbs:
        text += f", {gbs / read_bandwidth_gbs:.0%} of this machine's {read_bandwidth_gbs:.1f} GB/s single-thread read"
        if source != "measured":
            text += f" ({source})"
    if threads != 1:
        text += f" (decoding on {threads} threads)"
    return text


def bandwidth_fields(model: torch.nn.Module) -> dict:
    """What a CPU run's results record (nothing for a model whose weights are elsewhere, a GPU's: a single-thread
    CPU read is not its limit): ``weight_bytes_per_token``, ``read_bandwidth_gbs`` and ``read_bandwidth_from``
    (``"measured"`` or ``HFS_READ_BANDWIDTH_GBS``). Measures the bandwidth if this process has not yet."""
    params = list(model.parameters())
    if not params or any(p.device.type != "cpu" for p in params):
        return {}
    return {"weight_bytes_per_token": weight_bytes(model), "read_bandwidth_gbs": measure_read_bandwidth(),
            "read_bandwidth_from": read_bandwidth_source()}


def describe(fields: dict, *, tokens_per_s: float | None = None, seconds_per_token: float | None = None,
             threads: int = 1) -> str | None:
    """:func:`format_bandwidth` of a run's recorded :func:`bandwidth_fields` (None where it recorded none)."""
    if "weight_bytes_per_token" not in fields:
        return None
    return format_bandwidth(fields["weight_bytes_per_token"], tokens_per_s=tokens_per_s,
                            seconds_per_token=seconds_per_token, read_bandwidth_gbs=fields.get("read_bandwidth_gbs"),
                            source=fields.get("read_bandwidth_from", "measured"), threads=threads)
