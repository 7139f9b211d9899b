"""A CPU kernel for the few-row products of verification: ``optimize_for_cpu(model, kernel=True)``.

Verifying a draft of ``k`` tokens runs every linear layer of the target on ``k + 1`` rows. A
one-token forward of a small model on one CPU core is bound by reading the weights from memory,
so ``k + 1`` rows could cost little more than one, if the product read each weight once for all
rows. BLAS libraries do not: MKL's fp32 products of 2-4 rows cost 1.5-2.7 one-row products on the
AVX2 EPYC we measure on, oneDNN's on a packed copy (``pack=True``) 1.3-1.7.

``csrc/skinny_linear.cpp`` streams each weight (stored column-major, the layout
``optimize_for_cpu`` gives it) once per group of up to 8 rows, keeping the rows' outputs in L1, with
AVX2/FMA. Measured on SmolLM2-135M-Instruct's shapes (210 weights + lm_head, cold caches, one
thread), relative to MKL's one-row product: 1 row 1.05, 2 rows 1.13, 3 rows 1.27, 4 rows 1.29, 6
rows 1.63 (oneDNN packed: 0.99, 1.30, 1.40, 1.65, 1.95). One-row products (plain decoding) stay
on MKL, which is a little faster there. Every output is one FMA chain in input order, whatever the
number of rows or threads, so a row's product does not depend on the rows computed with it.

It is compiled for the machine on first use (``torch.utils.cpp_extension``: a C++ compiler and
ninja are needed, about a minute once; the build is cached in ``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``). x86-64 CPUs with AVX2 and FMA only.
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

SOURCE = Path(__file__).parent / "csrc" / "skinny_linear.cpp"
EXTENSION = "hfs_skinny_linear_v1"
MAX_ROWS = 16  # larger products (prefill, training) stay on BLAS, which is better at them
_LOCK = threading.Lock()


def cpu_supports_kernel() -> bool:
    """Whether this CPU runs the kernel (x86-64 with AVX2 and FMA, as PyTorch detects it)."""
    capability = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "DEFAULT"
    return capability.startswith("AVX2") or capability.startswith("AVX512")


def _ninja_on_path() -> None:
    """torch's builder runs ``ninja`` from PATH; the pip ``ninja`` package's binary sits in the venv,
    which is not on PATH when the venv's python is run by its full path."""
    if shutil.which("ninja") is None:
        try:
            import ninja  # the pip package (a dependency of hf_speculative)
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


@functools.lru_cache(maxsize=1)
def _build():
    from torch.utils.cpp_extension import load

    _ninja_on_path()
    return load(name=EXTENSION, sources=[str(SOURCE)], extra_cflags=["-O3", "-mavx2", "-mfma"], verbose=False)


_KERNEL = None  # the built extension, once load_kernel() has succeeded


def load_kernel():
    """The compiled extension (built on first call, then cached); a clear error when it cannot be."""
    global _KERNEL
    if not cpu_supports_kernel():
        raise RuntimeError(
            f"optimize_for_cpu(kernel=True) needs an x86-64 CPU with AVX2 and FMA; this one reports "
            f"{torch.backends.cpu.get_cpu_capability()!r}. Use optimize_for_cpu(model, pack=True) instead.")
    with _LOCK:
        try:
            _KERNEL = _build()
            return _KERNEL
        except Exception as err:  # compiler missing, headers missing, ninja missing ...
            raise RuntimeError(
                f"optimize_for_cpu(kernel=True) could not compile its CPU kernel ({type(err).__name__}: "
                f"{str(err).strip().splitlines()[-1] if str(err).strip() else err}). It needs a C++ compiler (g++) "
                "and ninja (`pip install ninja`); or use optimize_for_cpu(model, pack=True), which needs neither."
            ) from err


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x `[M, in]` (fp32, CPU) and a column-major ``weight`` `[out, in]`."""
    return (_KERNEL or load_kernel()).skinny_linear(x, weight, bias)


class KernelLinear(torch.nn.Linear):
    """An ``nn.Linear`` (same parameters, hooks and state dict) whose inference products of 2 to
    16 rows (verification) on its column-major fp32 CPU weight run on the skinny kernel; anything
    else (one row, more rows, gradients, other dtypes or layouts) stays on ``F.linear``. Made by
    ``optimize_for_cpu(model, kernel=True)``, which swaps the class of the model's own modules."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // max(self.in_features, 1)
        weight = self.weight
        if (
            rows > MAX_ROWS
            or rows < 2  # plain decoding: MKL's one-row product on this layout is ~8% faster
            or input.dtype != torch.float32
            or input.device.type != "cpu"
            or weight.stride() != (1, self.out_features)
            or (torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad))
        ):
            return F.linear(input, weight, self.bias)
        out = skinny_linear(input.reshape(rows, self.in_features), weight, self.bias)  # [rows, out]
        return out.view(*input.shape[:-1], self.out_features)
