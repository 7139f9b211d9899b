"""A CPU kernel for the few-row products of decoding and verification: ``optimize_for_cpu(model, kernel=True)``.

Verifying a draft of ``k`` tokens runs every linear layer of the target on ``k + 1`` rows. A
one-token forward of a small model on one CPU core is bound by reading the weights from memory,
so ``k + 1`` rows could cost little more than one, if the product read each weight once for all
rows. BLAS libraries do not: MKL's fp32 products of 2-4 rows cost 1.5-2.7 one-row products on the
AVX2 EPYC we measure on, oneDNN's on a packed copy (``pack=True``) 1.3-1.7.

``csrc/skinny_linear.cpp`` reads a blocked copy of each weight (``block_weight``: 16 output
columns at a time, each block one sequential stream; 2-4 blocks at once for 1-3 rows, since one core
reads memory faster from several streams) once per group of up to 8 rows, keeping the sums in AVX2
registers. SmolLM2-135M-Instruct's 210 weights and lm_head (537 MB, cold caches, one thread, AMD
EPYC) take 22.5 / 23.5 / 28.6 / 37.0 / 43.2 ms for 1 / 2 / 3 / 4 / 8 rows, against 36.0 ms for
MKL's one-row product on the column-major weights; whole forwards: ``benchmarks/verify_costs.py``.
One-row products (plain decoding, drafting) run on it too. Every output is one FMA chain in input
order plus the bias, whatever the number of rows or threads, so a row's product is bitwise the
same computed alone or with the rows of a draft. The copy costs one more copy of the weights in
memory (as ``pack=True``), except where it is the only one (:func:`one_copy`).

Where the CPU has AVX-512F the same blocked copy is read with 16-lane registers, up to 16 rows per pass
(``kernel_isa()``); each output's FMA chain is the same, so AVX2 and AVX-512 results are bitwise equal. The kernel
also takes products of more rows (:func:`kernel_gemm`: a cache-blocked product on the same copy, each output the same
FMA chain again; 17-192 rows with AVX-512, 17-64 with AVX2: :func:`gemm_rows`), so larger trees and copies and short
prompts run every row as plain decoding does, faster than oneDNN's product (``benchmarks/results/
issue66_kernel_gemm.txt``; AVX2: :data:`MAX_GEMM_ROWS_AVX2`); longer products (prefill) run on oneDNN from the
column-major copy, or, with AVX-512, on the kernel from the blocked copy where that is the only copy in memory
(:func:`one_copy`: a weight left a view of a memory-mapped checkpoint).

The copy is made in fewer bytes where that changes nothing: a weight whose every value is a bf16 number (a
checkpoint saved in bf16, loaded in fp32: Qwen2.5's) is copied in bf16 and widened to fp32 in registers, exactly, so
the products are bitwise the fp32 copy's from half the bytes. ``weights="int8"`` copies each weight as int8 with one
scale per output column instead, a quarter of the bytes and an approximation: for drafters, whose proposals the
target verifies (``DraftModel``'s drafter on a target that runs the kernel).

A bf16 model's products (bf16 weights and inputs) run, where the CPU has AVX512-BF16, on its bf16 dot products
(``csrc/bf16_linear.cpp``: 32 multiply-adds an instruction, twice fp32 FMAs'), from a pair-blocked copy
(``block_pairs``), with fp32 sums rounded once to bf16 and, again, each row's result independent of the others:
Qwen2.5-1.5B's weights for 1 / 6 rows in 103 / 119 ms against 100 / 201 from a bf16 copy widened to fp32
(``benchmarks/kernel_copies.py``). Elsewhere bf16 models stay on PyTorch's products.

It is compiled for the machine on first use (``torch.utils.cpp_extension``: a C++ compiler and
ninja are needed, about a minute once; the build is cached in ``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``: built in a folder of its own per torch installation, then shared by every
installation of the same torch release, ``build.py``). x86-64 CPUs with AVX2 and FMA only.
"""

from __future__ import annotations

import itertools
import math
import os
import threading

import torch
import torch.nn.functional as F

from ..core.sdpa import CPU_ROWWISE_TOKENS
from .build import build as _build

MAX_ROWS = 16  # rows a pass of the few-row code; more: its cache-blocked product (kernel_gemm()), or BLAS
# the most rows of an fp32 product the kernel's cache-blocked product takes (AVX-512): faster than oneDNN's up to
# here (SmolLM2-135M's decoder products, one thread: 17 rows 40 against 57 ms, 63 rows 136 against 144, 192 rows 389
# against 391), a little slower past it (767 rows 1,541 against 1,510), where prefill keeps oneDNN
MAX_GEMM_ROWS = 192
# AVX2's cache-blocked product (gemm2: tiles of 6 rows over panels of blocks in L2) up to here: faster than oneDNN's at
# SmolLM2-135M's shapes (one thread, AMD EPYC Zen 3, AVX2; benchmarks/results/issue72_avx2_gemm.txt: the 210 decoder
# products of 17 / 32 / 64 rows 103 / 186 / 300 ms against oneDNN's 178 / 227 / 346; verifications of 17 / 24 / 32 / 64
# rows after 700 tokens 182 / 198 / 309 / 535 ms against 342 / 376 / 508 / 699), not past it (forced on, a prefill of
# 128 tokens 687 ms against 568): longer products stay on oneDNN, and there the blocked copy is never the only one
MAX_GEMM_ROWS_AVX2 = 64
# a bf16 model's products on the kernel (in passes of 16 rows): every verification a CPU runs (a draft model's chains
# reach 16 drafts, 17 rows; trees of up to 63 nodes) computes each row as plain decoding does
MAX_ROWS_BF16 = CPU_ROWWISE_TOKENS
BLOCK = 16  # output columns per block of the copy the kernel reads (csrc/skinny_linear.cpp)
_LOCK = threading.Lock()


def cpu_supports_kernel() -> bool:
    """Whether this CPU runs the kernel (x86-64 with AVX2 and FMA, as PyTorch detects it)."""
    capability = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "DEFAULT"
    return capability.startswith("AVX2") or capability.startswith("AVX512")


_KERNEL = None  # the built extension, once load_kernel() has succeeded


def load_kernel():
    """The compiled extension (built on first call, then cached); a clear error when it cannot be."""
    global _KERNEL
    if not cpu_supports_kernel():
        raise RuntimeError(
            f"optimize_for_cpu(kernel=True) needs an x86-64 CPU with AVX2 and FMA; this one reports "
            f"{torch.backends.cpu.get_cpu_capability()!r}. Use optimize_for_cpu(model, pack=True) instead.")
    with _LOCK:
        if _KERNEL is not None:  # loaded: cpp_extension.load would run ninja again to check the build (~0.1 s)
            return _KERNEL
        try:
            _KERNEL = _build()
            return _KERNEL
        except Exception as err:  # compiler missing, headers missing, ninja missing ...
            raise RuntimeError(
                f"optimize_for_cpu(kernel=True) could not compile its CPU kernel ({type(err).__name__}: "
                f"{str(err).strip().splitlines()[-1] if str(err).strip() else err}). It needs a C++ compiler (g++) "
                'and ninja (`pip install "hf-speculative[kernel]"`); or use optimize_for_cpu(model, pack=True), which '
                "needs neither."
            ) from err


def block_weight(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The copy of an ``nn.Linear`` weight `[out, in]` that the kernel reads: `[ceil(out / 16), in, 16]`,
    ``wb[j, i, c] = weight[16 j + c, i]``, zero past ``out``, in ``dtype`` (float32, or bfloat16 where
    :func:`exactly_bf16`); on huge pages where it can be (:func:`copy_buffer`)."""
    out_features, in_features = weight.shape
    blocked = copy_buffer((-(-out_features // BLOCK), in_features, BLOCK), dtype)  # [blocks, in, 16]
    _scatter(blocked.transpose(1, 2).unsqueeze(-1), weight.detach())  # as [blocks, 16, in, 1]
    return blocked


def block_pairs(weight: torch.Tensor) -> torch.Tensor:
    """The copy of a bf16 ``nn.Linear`` weight `[out, in]` that the bf16 dot-product kernel reads:
    `[ceil(out / 16), ceil(in / 2), 16, 2]`, ``wp[j, p, c, e] = weight[16 j + c, 2 p + e]``, zero past ``out`` and
    ``in``: one 64-byte load is a block's 16 output columns for two inputs."""
    out_features, in_features = weight.shape
    paired = copy_buffer((-(-out_features // BLOCK), -(-in_features // 2), BLOCK, 2), torch.bfloat16)
    _scatter(paired.permute(0, 2, 1, 3), weight.detach())  # as [blocks, 16, pairs, 2]
    return paired


def _scatter(target: torch.Tensor, weight: torch.Tensor) -> None:
    """``target[j, c, p, e] = weight[16 j + c, E p + e]`` (``target`` a view `[blocks, 16, pairs, E]` of a copy),
    zero past the weight's rows and columns: straight from the weight's own layout, without a temporary of its size
    (a freed temporary of a few MB stays in the allocator's heap: 250 MB of SmolLM2's copies did)."""
    out_features, in_features = weight.shape
    _, _, pairs, e = target.shape
    full, rest, whole = out_features // BLOCK, out_features % BLOCK, in_features // e  # full blocks, pairs
    if rest or whole < pairs:
        target.zero_()
    rows = weight[:, : whole * e].unflatten(1, (whole, e))  # [out, whole, E]: views, whatever the weight's strides
    if full:
        target[:full, :, :whole].copy_(rows[: full * BLOCK].unflatten(0, (full, BLOCK)))
    if rest:
        target[full, :rest, :whole].copy_(rows[full * BLOCK:])
    if whole < pairs:  # an odd input count: the last pair's first input
        last = weight[:, in_features - 1]
        if full:
            target[:full, :, whole, 0].copy_(last[: full * BLOCK].unflatten(0, (full, BLOCK)))
        if rest:
            target[full, :rest, whole, 0].copy_(last[full * BLOCK:])


def exactly_bf16(weight: torch.Tensor) -> bool:
    """Whether every value of an fp32 ``weight`` is a bf16 number (its 16 low bits are zero), so that a bf16 copy of
    it loses nothing."""
    w = weight.detach()
    if not w.is_contiguous():
        w = w.t() if w.dim() == 2 and w.t().is_contiguous() else w.contiguous()  # the column-major layout's storage
    if w.dtype != torch.float32:
        return False
    bits = w.view(torch.int32).reshape(-1)
    # in chunks of 1 MiB: a temporary the weight's size, freed, can stay in the allocator's heap (+250 MB for
    # SmolLM2's weights in some runs); a weight that is not bf16 shows it in its first chunk
    return not any((bits[at:at + _CHUNK] & 0xFFFF).any().item() for at in range(0, bits.numel(), _CHUNK))


_CHUNK = 1 << 18  # int32 values a chunk of exactly_bf16's check


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An approximate copy of ``weight`` `[out, in]` for the kernel: int8 values `[ceil(out / 16), in, 16]` blocked
    as :func:`block_weight`, and one fp32 scale per output column `[ceil(out / 16) * 16]` (zero past ``out``), with
    ``weight[o, i] ~ q[o, i] * scale[o]`` and ``scale[o] = max_i |weight[o, i]| / 127`` (symmetric, per column:
    the kernel applies the scale once to each sum)."""
    out_features, in_features = weight.shape
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127  # [out]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero column: q = 0
    q = torch.round(w / safe[:, None]).clamp_(-127, 127).to(torch.int8)  # [out, in]
    padded_scale = scale.new_zeros(-(-out_features // BLOCK) * BLOCK)
    padded_scale[:out_features] = scale
    return block_weight(q, torch.int8), padded_scale


def kernel_gemm() -> bool:
    """Whether the kernel's fp32 products take more than :data:`MAX_ROWS` rows here (up to :func:`gemm_rows`): its
    cache-blocked product on the same blocked copy, each output the same FMA chain as a few-row product's, so a row
    of a 40-node tree's verification (or of a short prefill) is bitwise the row plain decoding computes. Both
    instruction sets have one (``gemm512`` and AVX2's ``gemm2``); ``HFS_KERNEL_GEMM=0`` keeps more rows on oneDNN /
    BLAS (to compare)."""
    if not _GEMM:
        _GEMM.append(os.environ.get("HFS_KERNEL_GEMM", "1") != "0")
    return _GEMM[0]


def gemm_rows() -> int:
    """The most rows of an fp32 product the kernel's cache-blocked product takes here from a weight that also has a
    column-major copy: :data:`MAX_GEMM_ROWS` with AVX-512, :data:`MAX_GEMM_ROWS_AVX2` with AVX2 (:func:`kernel_isa`)."""
    return MAX_GEMM_ROWS if kernel_isa() == "avx512" else MAX_GEMM_ROWS_AVX2


def one_copy_applies() -> bool:
    """Whether ``optimize_for_cpu`` may leave fp32 weights as views of a memory-mapped checkpoint (:func:`one_copy`):
    where the kernel then serves every row count faster than or as fast as oneDNN would from a second copy, AVX-512's
    product; on AVX2 CPUs past :data:`MAX_GEMM_ROWS_AVX2` rows oneDNN's is faster, so the column-major copy stays."""
    return one_copy() and kernel_gemm() and kernel_isa() == "avx512"


_GEMM: list = []  # [kernel_gemm()], once known


def kernel_isa() -> str:
    """The instruction set the kernel runs here: ``"avx512"`` (AVX-512F, up to 16 rows a pass over the weight) or
    ``"avx2"`` (8 rows a pass); ``HFS_KERNEL_ISA=avx2`` forces the second. Both give bitwise the same results."""
    return (_KERNEL or load_kernel()).isa()


_BF16_DOT: bool | None = None  # bf16_dot_supported(), once known


def bf16_dot_supported() -> bool:
    """Whether bf16 models' products run on the kernel here: the kernel builds and the CPU has AVX512-BF16 (its
    bf16 dot products, ``skinny_linear_bf16``); elsewhere they stay on PyTorch's bf16 products."""
    global _BF16_DOT
    if _BF16_DOT is None:
        if not cpu_supports_kernel():
            _BF16_DOT = False
        else:
            try:
                _BF16_DOT = bool((_KERNEL or load_kernel()).has_bf16_dot())
            except RuntimeError:
                return False  # not built: asked again once it is
    return _BF16_DOT


def skinny_linear_bf16(x: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor | None,
                       out_features: int) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for bf16 x `[M, in]` and ``blocked = block_pairs(weight)``, on the CPU's bf16 dot
    products: fp32 sums in input order, rounded once to bf16; a row's result is the same whatever the row count."""
    return (_KERNEL or load_kernel()).skinny_linear_bf16(x, blocked, bias, out_features)


def skinny_linear(x: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor | None, out_features: int,
                  scale: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x `[M, in]` (fp32, CPU) and ``blocked = block_weight(weight)`` (float32 or
    bfloat16), or ``blocked, scale = quantize_int8(weight)`` (approximately)."""
    return (_KERNEL or load_kernel()).skinny_linear(x, blocked, bias, out_features, scale)


def few_query_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                        scale: float) -> torch.Tensor:
    """Attention of fp32 query rows `[B, H, q, D]` over keys and values `[B, H_kv, kv, D]` (``D`` a multiple of 8, at
    most 128; the last dim contiguous), ``mask`` None (causal: row ``i`` sees the first ``kv - q + i + 1`` keys) or
    bool `[B, q, kv]`; returns `[B, q, H, D]`. Every row is computed on its own (scores and sums in key order), so a
    row's result is the same computed alone (plain decoding) or beside a draft's (verification); a row that sees
    nothing is zero (``csrc/few_query_attention.cpp``)."""
    return (_KERNEL or load_kernel()).few_query_attention(query, key, value, mask, scale)


_ONEDNN: list = []  # [oneDNN's product, or None]: decided once per process


def onednn_linear():
    """oneDNN's fp32 product (``torch.ops.mkldnn._linear_pointwise``, what inductor's CPU linears call) where this
    PyTorch has it, else None; ``HFS_PREFILL_ONEDNN=0`` turns it off, to compare.

    Products of more rows than the kernel takes (prefill, trees of more than 16 nodes) run on it instead of
    ``F.linear`` when the weight has the column-major layout ``optimize_for_cpu`` gives it (``[in, out]``
    contiguous): there oneDNN's JIT kernels read it as the ``[K, N]`` operand they want, while MKL's fp32 GEMM on the
    same weight stays at its row-major speed. SmolLM2-135M's 210 decoder products, one thread, AMD EPYC (AVX-512):
    1,501 against 1,775 ms for a 767-token prefill (108 against 92 GFLOP/s), 198 against 250 ms for 93 tokens, 100
    against 128 ms for 40 (``benchmarks/prefill_products.py``). Prefill's rows never meet plain decoding's, so
    nothing about exactness changes: plain and speculative decoding share the same prefill."""
    if not _ONEDNN:
        op = None
        if os.environ.get("HFS_PREFILL_ONEDNN", "1") != "0" and torch.backends.mkldnn.is_available():
            op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
        _ONEDNN.append(op)
    return _ONEDNN[0]


def column_major(weight: torch.Tensor) -> bool:
    """Whether an ``nn.Linear`` weight `[out, in]` has ``optimize_for_cpu``'s column-major layout (its ``[in, out]``
    transpose contiguous; one input column is left as it is, its strides being ambiguous)."""
    return weight.dim() == 2 and weight.stride() == (1, weight.shape[0]) and weight.shape[1] > 1


def _onednn_takes(input: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`onednn_linear` runs this product: fp32 on the CPU, the weight column-major, no gradients."""
    return (weight.dtype == torch.float32 and input.dtype == torch.float32 and column_major(weight)
            and input.device.type == "cpu" and weight.device.type == "cpu"
            and not (torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad))
            and not torch.compiler.is_compiling() and onednn_linear() is not None)


_COPIES = itertools.count()


class WeightCopy:
    """A copy of a weight in another layout, tied to the weight it was made from (storage and
    version): made again on use after the weight changed in place (``load_state_dict``, an
    optimizer step); never saved or copied (a copy of the module makes its own on first use)."""

    def __init__(self) -> None:
        self.tensor = None  # what make() returned (a tensor, or a tuple of them)
        self.source: tuple[int, int] = (0, -1)
        self.serial = next(_COPIES)  # which copy this is (id() may come back for a later one): plans key on it

    def make(self, weight: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def get(self, weight: torch.Tensor) -> torch.Tensor:
        source = (weight.data_ptr(), weight._version)
        if self.tensor is None or self.source != source:
            with torch.no_grad():
                self.tensor = self.make(weight)
            self.source = source
        return self.tensor

    def __deepcopy__(self, memo: dict) -> "WeightCopy":
        return type(self)()

    def __getstate__(self) -> dict:
        return {"tensor": None, "source": (0, -1)}

    def __setstate__(self, state: dict) -> None:  # an unpickled copy is a new one
        self.__dict__.update(state, serial=next(_COPIES))


WEIGHTS = ("exact", "int8")  # what KernelLinear's copy holds: the weight's own values, or int8 ones with scales


def bf16_copies() -> bool:
    """Whether exact copies are made in bf16 where that is exact (``HFS_KERNEL_BF16=0``: always fp32, to compare)."""
    return os.environ.get("HFS_KERNEL_BF16", "1") != "0"


def copy_buffer(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor for a weight copy, in memory on 2 MiB pages where the OS gives them
    (``csrc/huge_pages.cpp``: Linux's transparent huge pages, asked for with ``madvise``): the kernel's copies are
    streamed from memory at every forward, and read 5-13% faster there than from 4 KiB pages (fewer TLB misses,
    prefetchers that run on). ``HFS_KERNEL_HUGE_PAGES=0``, or no kernel loaded yet: PyTorch's memory (to compare)."""
    if os.environ.get("HFS_KERNEL_HUGE_PAGES", "1") == "0" or _KERNEL is None:
        return torch.empty(shape, dtype=dtype)
    return _KERNEL.huge_page_empty(math.prod(shape) * dtype.itemsize).view(dtype).view(shape)


class BlockedWeight(WeightCopy):
    """The kernel's copy of a weight and its scales (None): bf16 where that is exact, else fp32; on huge pages."""

    def make(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if weight.dtype == torch.bfloat16:  # a bf16 model: its products on the bf16 dot products
            return block_pairs(weight), None
        narrow = bf16_copies() and exactly_bf16(weight)
        return block_weight(weight, torch.bfloat16 if narrow else torch.float32), None


class Int8Weight(BlockedWeight):
    """The kernel's int8 copy of a weight and its per-column scales (:func:`quantize_int8`): for drafters."""

    def make(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return quantize_int8(weight)  # from fp32 or bf16 weights


def _row_limit(rows: int, weight: torch.Tensor) -> int:
    """The most rows a product with ``weight`` runs on the kernel: 64 for bf16 weights; 16 for fp32 ones, up to
    :func:`gemm_rows` where :func:`kernel_gemm` (past it oneDNN's product on a column-major weight is as fast or
    faster), and any count for a weight left row-major (:func:`one_copy`: the blocked copy is then the only one in
    memory, and a long prefill on ``F.linear`` would read the file's pages back)."""
    if weight.dtype == torch.bfloat16:
        return MAX_ROWS_BF16
    if rows <= MAX_ROWS or not kernel_gemm():
        return MAX_ROWS
    return gemm_rows() if column_major(weight) else rows


def one_copy() -> bool:
    """Whether ``optimize_for_cpu`` leaves the fp32 weights that the kernel serves at every row count
    (:func:`kernel_gemm`) as views of a memory-mapped checkpoint, its blocked copy the only one in memory
    (``mapped.page_out_files``); ``HFS_KERNEL_ONE_COPY=0``: a column-major copy beside it, as before (to compare)."""
    return os.environ.get("HFS_KERNEL_ONE_COPY", "1") != "0"


class KernelLinear(torch.nn.Linear):
    """An ``nn.Linear`` (same parameters, hooks and state dict) whose inference products of 1 to 16
    rows (decoding, drafting, verification; 64 for a bf16 weight; up to 192 where :func:`kernel_gemm`: trees, short
    prefills; any count for a row-major weight there, :func:`one_copy`) on its fp32 CPU weight run on the skinny
    kernel, from
    a blocked copy of the weight (on a bf16 weight with bf16 inputs: the bf16 dot-product kernel, where the CPU has
    AVX512-BF16); anything else (more rows, gradients, other dtypes or devices)
    stays on oneDNN (fp32 column-major weights: :func:`onednn_linear`) or ``F.linear``. Made by
    ``optimize_for_cpu(model, kernel=True)``, which swaps the class of the model's own modules."""

    _hfs_blocked: BlockedWeight

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // max(self.in_features, 1)
        weight = self.weight
        if (
            rows > _row_limit(rows, weight)
            or rows < 1
            or input.dtype != weight.dtype
            or weight.dtype not in (torch.float32, torch.bfloat16)
            or (weight.dtype == torch.bfloat16 and not bf16_dot_supported())  # a model moved to another CPU
            or input.device.type != "cpu"
            or weight.device.type != "cpu"
            or (torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad))
        ):
            if rows > MAX_ROWS and _onednn_takes(input, weight):
                return onednn_linear()(input, weight, self.bias, "none", [], "")  # prefill: see onednn_linear
            return F.linear(input, weight, self.bias)
        copy = self.__dict__.get("_hfs_blocked")
        if copy is None:  # a module made KernelLinear some other way (unpickled from an older version)
            copy = self._hfs_blocked = BlockedWeight()
        blocked, scale = copy.get(weight)
        flat = input.reshape(rows, self.in_features)  # [rows, in]
        if weight.dtype == torch.float32:
            out = skinny_linear(flat, blocked, self.bias, self.out_features, scale)
        elif scale is None:  # a bf16 model: the bf16 dot products
            out = skinny_linear_bf16(flat, blocked, self.bias, self.out_features)
        else:  # a bf16 drafter's int8 copy: the fp32 kernel's int8 products on the widened rows
            bias = None if self.bias is None else self.bias.float()
            out = skinny_linear(flat.float(), blocked, bias, self.out_features, scale).to(torch.bfloat16)
        return out.view(*input.shape[:-1], self.out_features)  # [..., out]
