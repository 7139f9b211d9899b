"""Weight layout that makes verifying several tokens cheap on CPUs.

A speculative step runs the target on ``k + 1`` tokens at once. On CPUs, fp32 ``nn.Linear`` weights
stored the PyTorch way (``[out, in]``, row-major) send ``F.linear`` with 4 or more rows to a packed
GEMM kernel that costs about twice the 1-3 row kernel (measured with MKL on an AVX-512 Xeon for
SmolLM2's shapes: the 49152-row lm_head costs 10 ms for 1-2 rows and 22 ms for 4). With the same
values stored column-major (the ``[in, out]`` transpose kept contiguous, seen through ``.t()``),
``F.linear`` runs a plain GEMM whose cost grows slowly with the row count: a whole 135M-parameter
forward on 8 tokens costs 1.9 one-token forwards instead of 2.2-2.5, and a one-token forward is no
slower. Nothing in the model's code changes: the parameters keep their shapes, values, dtype and
identity (tied weights stay tied), only their strides change.

On other CPUs MKL's products with 2-3 rows cost 2-3 one-row products whatever the layout (an AMD
EPYC, AVX2); there ``pack=True`` adds a oneDNN-packed copy of each weight for products of several
rows (`PackedLinear`), which costs 1.1-1.5 one-row products, while one-row products stay on the
column-major weight. ``kernel=True`` instead runs products of 1-16 rows on a kernel of our own
that reads a blocked copy of each weight once for all rows (SmolLM2's weights: 0.63 one-row MKL
products for 1 row, 0.65 for 2, 1.03 for 4, 1.20 for 8).

    hfs.optimize_for_cpu(model)               # once, after loading: the kernel where it runs, else the layout
    hfs.optimize_for_cpu(model, kernel=False) # the column-major layout alone
    hfs.optimize_for_cpu(model, pack=True)    # and oneDNN-packed products of 2+ rows
    hfs.optimize_for_cpu(model, kernel=True)  # the kernel or an error that names what it lacks (kernel.py)
    hfs.optimize_for_cpu(model, False)        # back to the usual layout

Plain greedy ``generate`` runs on the same weights, so speedups measured against it stay fair.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ..core.costs import forget_costs
from .attention import use_cpu_attention
from .kernel import (
    WEIGHTS,
    BlockedWeight,
    Int8Weight,
    KernelLinear,
    WeightCopy,
    bf16_dot_supported,
    column_major,
    cpu_supports_kernel,
    load_kernel,
    one_copy_applies,
)
from .layers import use_native_layers
from .mapped import copy_off_files, file_backed_ranges, in_files, page_out, page_out_files


def _eligible(module: torch.nn.Module, bf16: bool = False) -> bool:
    """An ``nn.Linear`` with an fp32 CPU weight, or (``bf16``: where the kernel runs bf16 products) a bf16 one."""
    weight = getattr(module, "weight", None)
    return (
        isinstance(module, torch.nn.Linear)
        and isinstance(weight, torch.Tensor)
        and weight.device.type == "cpu"
        and (weight.dtype == torch.float32 or (bf16 and weight.dtype == torch.bfloat16))
    )


LAYERS = ("all", "output")


def _modules(model: torch.nn.Module, layers: str) -> list[torch.nn.Module]:
    if layers not in LAYERS:
        raise ValueError(f"optimize_for_cpu(layers={layers!r}): use one of {LAYERS}.")
    if layers == "all":
        return list(model.modules())
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [] if head is None else [head]


def optimize_for_cpu(model: torch.nn.Module, enable: bool = True, *, layers: str = "all", pack: bool = False,
                     kernel: bool | None = None, weights: str = "exact", native: bool | None = None) -> int:
    """Store ``model``'s fp32 CPU ``nn.Linear`` weights column-major (``enable=True``) or back in
    PyTorch's usual row-major layout (``enable=False``), in place; with ``pack=True`` their products
    of several rows also run on oneDNN-packed copies (`PackedLinear`).

    Args:
        model (`torch.nn.Module`): any model; fp32 CPU weights, and bf16 ones with the kernel (below); weights on
            other devices or in other dtypes are left alone (GPU GEMMs do not have this cliff).
        enable (`bool`, defaults to `True`): `False` undoes every previous call (layout and packing).
        layers (`str`, defaults to `"all"`): `"all"` linear layers, or only the `"output"` layer
            (the lm_head, whose large matrix gains at every row count; the decoder's smaller
            matrices lose a little with 2-3 rows and gain from 4).
        pack (`bool`, defaults to `False`): also swap those layers to `PackedLinear`, whose
            inference products of 2+ rows (verification) run on a oneDNN-packed copy of the
            weight, made here (and again after in-place changes to the weight): one more copy of
            those weights in memory. The parameters, state dict, hooks and one-row products (plain
            decoding) are unchanged.
        kernel (`bool`, *optional*): instead of packing, run those layers' inference
            products of 1-16 rows (decoding, drafting, verification) on hf_speculative's own AVX2 kernel
            (AVX-512F from 4 rows where the CPU has it; `hf_speculative.cpu.kernel.KernelLinear`), which
            reads a blocked copy of each weight, made here (and again after in-place changes to the
            weight), once for all rows: one-token forwards are 15% faster than on MKL, and a forward on 2 / 4 / 8 tokens
            costs 1.13 / 1.31 / 1.57 of them (SmolLM2-135M, AVX2 EPYC). One more copy of those
            weights in memory, except on AVX-512 CPUs for fp32 weights that are views of a memory-mapped checkpoint
            (transformers' safetensors loading): those stay views of the file, the kernel takes their products of
            every row count, and the process's pages of the file are dropped (``mapped.page_out_files``), so the
            blocked copy is the only copy in memory (``HFS_KERNEL_ONE_COPY=0``: two, to compare). Compiled on first
            use (a C++ compiler and ninja, about a minute once). ``None`` (default, without ``pack``): the kernel where it runs (an AVX2 CPU, the
            compiler and ninja at hand), else the column-major layout alone (on an AVX2 CPU with a
            warning naming what is missing); ``True``: the kernel or a ``RuntimeError`` naming what it
            lacks; ``False``: never. The kernel's copy of a weight whose every value is a bf16 number (a checkpoint
            saved in bf16, as Qwen2.5's) is kept in bf16, half the bytes, with bitwise the same products. A bf16
            model's products of up to 64 rows run on the kernel's bf16 dot products where the CPU has AVX512-BF16
            (else they are left to PyTorch), and a 16-bit model's attention runs in fp32, one query row at a time
            for forwards of up to 64 tokens (``hf_speculative.cpu.attention``; ``enable=False`` sets ``"sdpa"``
            back), so that a verification row is computed as plain decoding computes it.
        weights (`str`, defaults to `"exact"`): what the kernel's copies hold: `"exact"`, the weights' own values;
            `"int8"`, int8 values with one scale per output column (a quarter of the fp32 bytes; the products are
            approximate, so the model's outputs change a little): for a drafter, whose proposals the target
            verifies (``DraftModel`` asks for it); made from fp32 or bf16 weights. Needs the kernel.
        native (`bool`, *optional*): with the kernel, also run the decoder layers' forwards of 1-16 tokens as two
            native calls each around the model's own cache (``hf_speculative.cpu.layers``: norms, rotary, residuals
            and the gated MLP in C++ rather than ~55 PyTorch operators a layer), for fp32 Llama, Qwen2, Qwen3 and
            Gemma3 layers. ``None`` (default): where the kernel runs, with one warning naming why when a
            transformers model's layers cannot; ``True``: a ``ValueError`` naming why instead; ``False``: never.

    Returns:
        `int`: how many linear layers changed (0 when there was nothing to do, e.g. on a GPU).
    """
    if pack and kernel:
        raise ValueError("optimize_for_cpu(pack=True, kernel=True): choose one way to run products of several rows.")
    if pack and enable and not _can_pack():
        raise RuntimeError(
            "optimize_for_cpu(pack=True) needs a PyTorch build with oneDNN (torch.backends.mkldnn); "
            "use optimize_for_cpu(model) without pack on this build."
        )
    if native and enable and (pack or kernel is False or layers != "all"):
        raise ValueError("optimize_for_cpu(native=True) needs the kernel on every linear layer (kernel=None or True, "
                         "layers='all', no pack).")
    if weights not in WEIGHTS:
        raise ValueError(f"optimize_for_cpu(weights={weights!r}): use one of {WEIGHTS}.")
    if weights != "exact" and enable and (pack or kernel is False or not cpu_supports_kernel()):
        raise ValueError(f"optimize_for_cpu(weights={weights!r}) needs the CPU kernel (kernel=None or True, no pack, "
                         "an x86-64 CPU with AVX2); use weights='exact' otherwise.")
    if kernel is None:
        laid_out = any(_eligible(m, bf16=True) for m in _modules(model, layers))  # fp32 or bf16 linears
        kernel = enable and not pack and laid_out and _auto_kernel()
    elif kernel and enable:
        load_kernel()  # compile now (or fail with the fix), not inside the first forward
    if native and enable and not kernel:
        raise ValueError("optimize_for_cpu(native=True) needs the CPU kernel, which does not run here (the warning "
                         "above says why); pass native=None to run without it.")
    # bf16 weights: on the kernel's bf16 dot products where the CPU has them, else left to PyTorch's bf16 products
    bf16 = not enable or (kernel and bf16_dot_supported())
    wanted = (PackedLinear if pack else KernelLinear if kernel else torch.nn.Linear) if enable else torch.nn.Linear
    # fp32 weights the kernel serves at every row count stay views of a memory-mapped checkpoint (mapped.py)
    files = file_backed_ranges() if enable and kernel and weights == "exact" and one_copy_applies() else []
    changed, seen, kept = 0, set(), set()
    with torch.no_grad():
        for module in _modules(model, layers):
            if not _eligible(module, bf16):
                continue
            touched = False
            weight = module.weight
            if id(weight) not in seen:  # tied weights (lm_head = embeddings) are one parameter
                seen.add(id(weight))
                if (files and weight.dtype == torch.float32 and type(module) in _OURS and not column_major(weight)
                        and in_files(weight, files)):
                    kept.add(id(weight))  # the blocked copy, made below, is its only copy in memory
                elif enable and not column_major(weight):
                    weight.data = weight.data.t().contiguous().t()  # [out, in] seen through [in, out] storage
                    touched = True
                elif not enable and column_major(weight):
                    weight.data = weight.data.contiguous()
                    touched = True
            touched |= _set_class(module, wanted, Int8Weight if weights == "int8" else BlockedWeight)
            if type(module) is PackedLinear:
                module._hfs_packed.get(module.weight)  # now, not inside the first verification
            elif type(module) is KernelLinear:
                module._hfs_blocked.get(module.weight)
                if id(weight) in kept:
                    page_out(weight)  # now: the peak stays near one copy of the weights
            changed += touched
    if enable and kept:
        page_out_files(model)  # the pages read to make the blocked copies leave the process's memory (mapped.py)
    elif enable and changed:
        copy_off_files(model)  # the norms' views would keep the whole checkpoint mapped (mapped.py)
    # a bf16 model's attention in fp32: PyTorch's bf16 CPU attention is slow for one query; an fp32 model's on the
    # kernel: faster for a row or two, and its rows apart (attention.py)
    attention = use_cpu_attention(model, enable, kernel=bool(kernel))
    natives = _native_layers(model, enable and bool(kernel) and layers == "all" and native is not False, native)
    if changed or attention or natives:
        forget_costs(model)  # verify costs measured in the old layout no longer hold
    return changed


def _native_layers(model: torch.nn.Module, enable: bool, native: bool | None) -> int:
    """The native decoder layers on (``enable``) or off; what could not take them, said (``native=None``) or raised
    (``native=True``). Modules that are not transformers models with decoder layers (a drafter's network) are left
    alone silently."""
    changed, reasons = use_native_layers(model, enable)
    if reasons and enable and native:
        use_native_layers(model, False)
        raise ValueError(f"optimize_for_cpu(native=True): {type(model).__name__}'s decoder layers cannot run as native "
                         f"layers ({'; '.join(reasons)}). Pass native=None to run them on PyTorch's operators.")
    if reasons and enable:
        warnings.warn(f"optimize_for_cpu: {type(model).__name__}'s decoder layers keep PyTorch's operators around the "
                      f"kernel's products ({'; '.join(reasons)}), so a one-token forward costs more than its weights' "
                      f"reads; this changes speed only.", stacklevel=3)
    return changed


def _auto_kernel() -> bool:
    """``kernel=None``: whether the kernel runs here, compiled now (not inside the first forward) if it was not;
    when it does not, the layout alone, saying why."""
    if not cpu_supports_kernel():
        return False  # another CPU: the layout is what runs here, nothing to fix
    try:
        load_kernel()
    except (RuntimeError, ImportError) as err:
        warnings.warn(f"optimize_for_cpu: the CPU kernel is not used, only the column-major layout: {err}",
                      stacklevel=3)
        return False
    return True


LAYOUT_NAMES = ("none", "output", "all", "output+packed", "all+packed", "output+kernel", "all+kernel")


def apply_layout(model: torch.nn.Module, layout: str) -> int:
    """``optimize_for_cpu`` by the name :func:`cpu_layout` reports (``"all+kernel"``: ``layers="all",
    kernel=True``); ``"none"`` leaves ``model`` as it is. Returns how many linear layers changed."""
    if layout not in LAYOUT_NAMES:
        raise ValueError(f"Unknown CPU layout {layout!r}: use one of {', '.join(LAYOUT_NAMES)}.")
    if layout == "none":
        return 0
    layers, _, rows = layout.partition("+")
    return optimize_for_cpu(model, layers=layers, pack=rows == "packed", kernel=rows == "kernel")


def follow_layout(module: torch.nn.Module, reference: torch.nn.Module, weights: str = "exact") -> int:
    """Lay out a drafter network's fp32 CPU linear weights as its target's are: all column-major,
    with the same path for products of several rows, when any of the target's are column-major;
    left alone otherwise. A drafting step is a one-row product of every weight, as the target's
    decoding steps are (SmolLM2's EAGLE drafter: 4.4 ms row-major, 3.4 ms column-major). Returns
    how many layers changed: 0 for a module laid out already (a draft model follows at every call; the kernel
    loads once and its blocked copies are kept). ``weights="int8"``: where the reference runs the kernel, the
    module's copies are int8 (`optimize_for_cpu`'s ``weights``), for a drafter whose proposals are verified."""
    layout = cpu_layout(reference)
    if layout in ("none", "mixed"):
        return 0
    _, plus, rows = layout.partition("+")
    if rows == "kernel":
        return optimize_for_cpu(module, layers="all", kernel=True, weights=weights)
    return apply_layout(module, f"all{plus}{rows}")


def cpu_layout(model: torch.nn.Module) -> str:
    """Which of ``model``'s fp32 CPU linear weights are laid out (column-major, or served by the kernel's blocked
    copy): ``"all"``, ``"output"`` (the lm_head only), ``"none"`` (or no such weights), or ``"mixed"``;
    ``"+packed"`` (``"+kernel"``) follows when exactly those layers are `PackedLinear` (`KernelLinear`)."""
    modules = [m for m in model.modules() if _eligible(m, bf16=type(m) is KernelLinear)]
    weights = {id(m.weight): m.weight for m in modules}
    packed = {id(m.weight) for m in modules if type(m) is PackedLinear}
    kernel = {id(m.weight) for m in modules if type(m) is KernelLinear}
    # a kernel's weight left row-major is laid out all the same: its blocked copy is its only copy (kernel.one_copy)
    converted = {key for key, w in weights.items() if column_major(w) or key in kernel}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not converted:
        layout = "none"
    elif len(converted) == len(weights):
        layout = "all"
    elif head is not None and converted == {id(head.weight)}:
        layout = "output"
    else:
        return "mixed"
    if packed and kernel:
        return "mixed"
    if not packed and not kernel:
        return layout
    return f"{layout}+{'packed' if packed else 'kernel'}" if (packed or kernel) == converted else "mixed"


# ---------------------------------------------------------------------------------------------
# oneDNN-packed copies for products of several rows


class _Packed(WeightCopy):
    """A weight's oneDNN-packed copy (see `WeightCopy`: made again after in-place changes, never saved)."""

    def make(self, weight: torch.Tensor) -> torch.Tensor:
        # the batch size is only a hint for oneDNN's blocking; verification has 2-10 rows
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS_HINT)


PACK_ROWS_HINT = 8


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` (same parameters, hooks and state dict) whose inference products of two or
    more rows run on a oneDNN-packed copy of its fp32 CPU weight.

    MKL's products with 2-8 rows of SmolLM2's shapes cost 2-3 one-row products on the AMD EPYC we
    measured; oneDNN's on a packed weight cost 1.1-1.5, which is what verifying drafts needs. One
    row (plain decoding, drafting with the target's layers) and anything that needs gradients stay
    on ``F.linear``. Made by ``optimize_for_cpu(model, pack=True)``, which swaps the class of the
    model's own modules; ``optimize_for_cpu(model, False)`` swaps it back.
    """

    _hfs_packed: _Packed

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // max(self.in_features, 1)
        if (
            rows < 2
            or input.dtype != torch.float32
            or input.device.type != "cpu"
            or (torch.is_grad_enabled() and (input.requires_grad or self.weight.requires_grad))
        ):
            return F.linear(input, self.weight, self.bias)
        flat = input.reshape(rows, self.in_features)  # [rows, in]
        out = torch.ops.mkldnn._linear_pointwise(flat, self._hfs_packed.get(self.weight), self.bias, "none", [], "")
        return out.view(*input.shape[:-1], self.out_features)  # [..., out]


def _can_pack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


_OURS = (torch.nn.Linear, PackedLinear, KernelLinear)  # the classes optimize_for_cpu swaps between


def _set_class(module: torch.nn.Module, wanted: type, copy: type = BlockedWeight) -> bool:
    """Swap ``module`` in place between ``nn.Linear`` and the classes ``optimize_for_cpu`` makes
    (``PackedLinear``, ``KernelLinear`` with ``copy`` as its weight's copy); True when it changed."""
    if type(module) not in _OURS:  # a subclass of someone else's is left alone
        return False
    if type(module) is wanted and (wanted is not KernelLinear or type(module.__dict__.get("_hfs_blocked")) is copy):
        return False
    module.__dict__.pop("_hfs_packed", None)
    module.__dict__.pop("_hfs_blocked", None)
    module.__class__ = wanted
    if wanted is PackedLinear:
        module._hfs_packed = _Packed()
    elif wanted is KernelLinear:
        module._hfs_blocked = copy()
    return True
