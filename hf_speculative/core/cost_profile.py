"""Decide by a profile of this model on this device instead of measuring during calls: ``hfs.use_profile``.

The cost models (``costs.py`` for one row, ``batch_costs.py`` for batches) measure the target's forwards as
calls run, which takes a few steps per draft size and follows the machine's load. A profile written by
``hf-speculative profile`` (:mod:`hf_speculative.bench.profile`) holds the same costs measured once, quietly:
loading it fixes the one-row ratios ``c(n) / c(0)`` (its tree or chain line, at the context asked) and, when
it was run with ``--batches``, the batch costs ``t(B, 1 + n)``. ``hfs.forget(model)`` goes back to measuring.

The reading side of the profile file lives here (:func:`load`, :func:`relative_cost`), below the benchmark that
writes it, so that the core never imports ``bench``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..options import MAX_VERIFY_TOKENS

FORMAT = "hf-speculative-profile/1"


def use_profile(model: torch.nn.Module, profile: str | Path | dict, *, context: int | None = None,
                shape: str = "tree") -> dict[str, Any]:
    """Fix ``model``'s verification costs to those of ``profile`` (a path, or the dict ``profile()`` returns).

    Args:
        context (`int`, *optional*): use the profile's context nearest to this (its first one by default).
        shape (`str`, defaults to ``"tree"``): the one-row line to use, ``"tree"`` or ``"chain"``.

    Returns:
        What was loaded: ``{"context": ..., "ratios": [c(0)/c(0), c(1)/c(0), ...], "batches": [B, ...]}``.
    """
    from .batch_costs import batch_costs_for
    from .costs import verify_costs_for

    data = profile if isinstance(profile, dict) else load(profile)
    if shape not in ("tree", "chain"):
        raise ValueError(f"use_profile(shape={shape!r}): use 'tree' or 'chain'.")
    device = next(model.parameters()).device
    measured_on = str(data.get("device", ""))
    if measured_on.startswith("cpu") != (device.type == "cpu"):
        raise ValueError(f"use_profile: the profile was measured on {measured_on or 'an unnamed device'} and the model "
                         f"is on {device}; profile it on this device: `hf-speculative profile --model ... --device "
                         f"{device.type}`.")
    at = nearest_context(data["relative"], context)
    largest = min(max(int(n) for by_shape in data["relative"].values() for sizes in by_shape.values() for n in sizes),
                  MAX_VERIFY_TOKENS)
    ratios = [1.0]
    for n in range(1, largest + 1):  # never decreasing (a noisy profile can dip): the cost model requires it
        ratios.append(max(ratios[-1], relative_cost(data, n, context=at, shape=shape)))
    verify_costs_for(model, largest).fix(ratios)
    batches = []
    if data.get("batch_seconds"):
        by_batch = data["batch_seconds"][str(nearest_context(data["batch_seconds"], at))]
        batch_costs_for(model).load({(int(b), 1 + int(n)): float(s) for b, sizes in by_batch.items()
                                     for n, s in sizes.items()})
        batches = sorted(int(b) for b in by_batch)
    return {"context": at, "ratios": ratios, "batches": batches}


def load(path: str | Path) -> dict[str, Any]:
    """A profile written by :func:`save`, checked to be one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not an hf-speculative profile (no format {FORMAT!r}); write one with "
                         f"`hf-speculative profile --out {path}`.")
    return data


def nearest_context(by_context: dict[str, Any], context: int | None) -> int:
    """The measured context (a key of ``by_context``, e.g. a profile's ``relative``) nearest to ``context``; the
    smallest if ``None``."""
    contexts = sorted(int(c) for c in by_context)
    return contexts[0] if context is None else min(contexts, key=lambda c: abs(c - context))


def relative_cost(result: dict[str, Any], n: int, *, context: int | None = None, shape: str = "tree") -> float:
    """Cost of verifying ``n`` draft tokens in one-token forwards, interpolated between measured sizes, at
    the measured context nearest to ``context`` (the first one if ``None``)."""
    at = result["relative"][str(nearest_context(result["relative"], context))]
    by_size = at.get(shape) or at["chain"]
    sizes = sorted(int(s) for s in by_size)
    if n <= sizes[0]:
        return float(by_size[str(sizes[0])])
    for lo, hi in zip(sizes, sizes[1:]):
        if n <= hi:
            w = (n - lo) / (hi - lo)
            return float(by_size[str(lo)]) * (1 - w) + float(by_size[str(hi)]) * w
    last, before = sizes[-1], sizes[-2] if len(sizes) > 1 else sizes[-1]
    slope = (by_size[str(last)] - by_size[str(before)]) / max(last - before, 1)
    return float(by_size[str(last)] + slope * (n - last))  # past the largest size: the last slope
