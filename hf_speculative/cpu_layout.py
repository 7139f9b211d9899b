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

    hfs.optimize_for_cpu(model)          # once, after loading
    hfs.optimize_for_cpu(model, False)   # back to the usual layout

Plain greedy ``generate`` runs on the same weights, so speedups measured against it stay fair.
"""

from __future__ import annotations

import torch

from .drafters import policy


def _converted(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.stride() == (1, weight.shape[0]) and weight.shape[1] > 1


def _eligible(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        isinstance(module, torch.nn.Linear)
        and isinstance(weight, torch.Tensor)
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
    )


LAYERS = ("all", "output")


def _modules(model: torch.nn.Module, layers: str) -> list[torch.nn.Module]:
    if layers not in LAYERS:
        raise ValueError(f"optimize_for_cpu(layers={layers!r}): use one of {LAYERS}.")
    if layers == "all":
        return list(model.modules())
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [] if head is None else [head]


def optimize_for_cpu(model: torch.nn.Module, enable: bool = True, *, layers: str = "all") -> int:
    """Store ``model``'s fp32 CPU ``nn.Linear`` weights column-major (``enable=True``) or back in
    PyTorch's usual row-major layout (``enable=False``), in place.

    Args:
        model (`torch.nn.Module`): any model; weights on other devices or in other dtypes are left
            alone (GPU GEMMs do not have this cliff).
        enable (`bool`, defaults to `True`): `False` undoes a previous call.
        layers (`str`, defaults to `"all"`): `"all"` linear layers, or only the `"output"` layer
            (the lm_head, whose large matrix gains at every row count; the decoder's smaller
            matrices lose a little with 2-3 rows and gain from 4).

    Returns:
        `int`: how many weights changed layout (0 when there was nothing to do, e.g. on a GPU).
    """
    changed, seen = 0, set()
    with torch.no_grad():
        for module in _modules(model, layers):
            if not _eligible(module) or id(module.weight) in seen:
                continue
            seen.add(id(module.weight))  # tied weights (lm_head = embeddings) are one parameter
            weight = module.weight
            if enable and not _converted(weight):
                weight.data = weight.data.t().contiguous().t()  # [out, in] seen through [in, out] storage
            elif not enable and _converted(weight):
                weight.data = weight.data.contiguous()
            else:
                continue
            changed += 1
    if changed:
        policy.forget_costs(model)  # verify costs measured in the old layout no longer hold
    return changed


def cpu_layout(model: torch.nn.Module) -> str:
    """Which of ``model``'s fp32 CPU linear weights are column-major: ``"all"``, ``"output"`` (the
    lm_head only), ``"none"`` (or no such weights), or ``"mixed"``."""
    weights = {id(m.weight): m.weight for m in model.modules() if _eligible(m)}
    converted = {key for key, w in weights.items() if _converted(w)}
    if not converted:
        return "none"
    if len(converted) == len(weights):
        return "all"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return "output" if head is not None and converted == {id(head.weight)} else "mixed"
