"""The bytes of weights one token's forward reads, the CPU kernel's blocked copies included.

One rule shared by the bandwidth report (``bench/bandwidth.py``: a run's weights GB/s) and MagicDec's cost prior
(``drafters/magicdec/costs.py``: a draft step's bytes against a plain step's), so the two never disagree about what a
step reads. Here, below both: drafters and the core do not import the benchmark.
"""

from __future__ import annotations

import torch

from . import kernel as _kernel


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _on_kernel(module: torch.nn.Module) -> bool:
    """Whether a one-row product of ``module`` (a ``KernelLinear``) reads the kernel's copy of its weight: the
    conditions of ``KernelLinear.forward`` that a model's own one-token forward can meet."""
    weight = module.weight
    if type(module) is not _kernel.KernelLinear or module.__dict__.get("_hfs_blocked") is None:
        return False
    if weight.device.type != "cpu":
        return False
    return weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and _kernel.bf16_dot_supported())


def _linear_weight_bytes(module: torch.nn.Linear) -> int:
    if not _on_kernel(module):
        return _nbytes(module.weight)
    # made now if it is not yet (the next forward would make it): its bytes are what the products read
    blocked, scale = module._hfs_blocked.get(module.weight)
    return _nbytes(blocked) + (0 if scale is None else _nbytes(scale))


def weight_bytes(model: torch.nn.Module) -> int:
    """The bytes of weights one token's forward of ``model`` reads: every parameter once, except that

    - an ``nn.Embedding``'s table (the input embedding, learned positions) is read one row per token: one row counts;
    - a table that is also a linear layer's weight (an lm_head tied to the input embedding) is read whole by that
      layer: counted once, whole, as the lm_head's read;
    - a linear layer that runs on the CPU kernel (``optimize_for_cpu``: ``KernelLinear``) reads the kernel's copy of
      its weight, not the weight: the copy's bytes count (bf16 for an fp32 weight whose values are all bf16
      numbers, int8 values and their fp32 scales for ``weights="int8"``, padded to 16 output columns).

    Buffers (rotary tables, masks) are not counted, nor the KV cache: they are not weights.
    """
    modules = list(model.modules())
    # linear layers first, so that a tied table is counted as the lm_head's whole read, not as an embedding row
    ordered = [m for m in modules if isinstance(m, torch.nn.Linear)]
    ordered += [m for m in modules if not isinstance(m, torch.nn.Linear)]
    seen: set[int] = set()
    total = 0
    for module in ordered:
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if name == "weight" and isinstance(module, torch.nn.Linear):
                total += _linear_weight_bytes(module)
            elif name == "weight" and isinstance(module, torch.nn.Embedding) and param.dim() == 2:
                total += param.shape[1] * param.element_size()
            else:
                total += _nbytes(param)
    return total
