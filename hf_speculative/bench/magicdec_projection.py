"""MagicDec projected onto a GPU: ``hf-speculative project GRID.jsonl --profile PROFILE.json --magicdec``.

A cost model: bytes over bandwidth, the acceptance measured on the CPU (``benchmarks/magicdec_grid.py``'s records say,
per cell of context and batch, how many tokens MagicDec drafted and how many the target kept). Decoding a batch on a
GPU is memory-bound: a forward's time is the bytes it reads over the device's bandwidth. For a target reading ``W``
weight bytes per forward (``cpu/weight_bytes.py``'s rule: one row of the input embedding, a tied head whole) with
``K`` bytes of keys and values per token (layers x 2 x key-value heads x head size x dtype bytes), ``B`` rows at
context ``c`` and a compressed cache of ``S = sinks + window`` slots per row:

- a plain step reads ``P = W + B c K`` and makes one token per row;
- draft step ``j = 0..n-1`` reads ``D_j = W + B (min(S, c) + j) K`` (the compressed caches, then the chain's drafts);
- verifying ``n`` draft tokens per row reads ``V = W + B c K = P``: the forward over ``B (1 + n)`` tokens is assumed
  to stay memory-bound (the keys and values it writes, ``B (1 + n) K``, are left out);
- a forward reading ``bytes`` for ``T`` tokens takes ``t = max(bytes / BW, T F / FLOPS) + h``: ``F = 2 W / e +
  4 c L H d`` FLOPs a token (``e`` bytes a weight; ``L`` layers of ``H`` query heads of ``d``), the compute floor only
  where ``tflops`` is given (default: none, memory-bound); ``h`` a fixed host overhead per forward (``overhead_ms``,
  default 0: decoding under CUDA graphs; a profile records none);
- with a per-token acceptance ``a``, a chain of ``n`` keeps ``E(n) = 1 + a + ... + a^n = (1 - a^(n+1)) / (1 - a)``
  tokens per row per step (``n + 1`` at ``a = 1``), so ``s(n) = E(n) t(P, B) / (t(V, B (1 + n)) + sum_j t(D_j, B))``.
  The projection takes the best ``n <= num_tokens`` (the grid's, MagicDec's default 4) and says "declines" where it
  is at most 1.0x (the drafter's cost rule would draft nothing). With ``h = 0`` and no compute floor the bandwidth
  cancels: ``s(n) = E(n) P / (P + sum_j D_j)``, a ratio of bytes. Where ``c <= S`` the cache is not compressed and
  MagicDec drafts nothing ("uncompressed").

``a`` is ``accepted / drafted`` of the grid's ``magicdec-always`` records (drafting at every step), pooled over the
repeats of the measured cell nearest in log2 (context first, then batch; a tie goes to the longer context, the larger
batch). Of chains of up to ``n`` tokens that ratio is below the per-token rate (a token counts only when the ones
before it were kept), so it errs low. Cells beyond the measured contexts take the longest one's (how a window of 512
fares at 32k is not measured), and the acceptance is the small CPU model's, not the target's.

The bandwidth is ``bandwidth_gbs``, else effective from the profile: its one-token forward ``t0`` at its shortest
context ``c0``, for the model its label names (``"llama-3.1-8b (random weights)"``: a shipped config), ``BW = (W +
c0 K) / (t0 - h)``. The device's memory is ``memory_gb``, else the GB in the profile's device name (``NVIDIA H100
80GB HBM3``; an H200: 141); a cell whose stored weights, plain caches ``B c K`` and compressed ones ``B S K`` exceed
it is flagged, not projected (activations left out). Units are decimal (1 GB = 10**9 bytes).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FORMAT = "hf-speculative-magicdec-projection/1"
ALWAYS = "magicdec-always"
GRID_KEYS = ("context", "batch_size", "method")
ALWAYS_KEYS = ("drafted", "accepted")
BATCHES = (1, 4, 8, 16, 32, 64)
CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
NAMED_MEMORY_GB = {"H200": 141.0}  # device names that carry no size
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
RANDOM = " (random weights)"
GRID_FIX = "pass the --out JSONL of benchmarks/magicdec_grid.py"


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a forward of the target reads: ``weight_bytes`` (per forward), ``stored_bytes`` (every weight held),
    ``kv_bytes`` (keys and values of one token, every layer), ``attention`` (layers x query heads x head size)."""
    name: str
    dtype_bytes: int
    weight_bytes: int
    stored_bytes: int
    kv_bytes: int
    attention: int


def target_shape(config: str | os.PathLike, dtype: str = "bfloat16") -> Shape:
    """The shape of ``config``: a shipped config's name (``hf-speculative profile --config``'s) or a transformers
    ``config.json`` (its path, or its folder), built on the meta device (nothing allocated, nothing downloaded)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .. import compat
    from ..cpu.weight_bytes import weight_bytes
    from .profile import CONFIG_DIR, shipped_configs

    path = Path(config)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        path = CONFIG_DIR / f"{config}.json"
    if not path.is_file():
        raise ValueError(f"--config {config}: give a transformers config.json (a path) or one of "
                         f"{', '.join(shipped_configs())}.")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: the profile's dtype must be one of {', '.join(DTYPE_BYTES)}.")
    fields = {k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items() if not k.startswith("_")}
    if "model_type" not in fields:
        raise ValueError(f"{path}: no model_type; give a transformers config.json of a causal LM.")
    text = AutoConfig.for_model(**fields)
    text = text.get_text_config() if hasattr(text, "get_text_config") else text
    if any(kind != "full_attention" for kind in getattr(text, "layer_types", None) or ()):
        raise ValueError(f"{path}: layers other than full attention ({sorted(set(text.layer_types))}); MagicDec "
                         "refuses them: project a model with full attention in every layer.")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(text, **compat.dtype_kwargs(getattr(torch, dtype)))
    stored = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    layers, size = text.num_hidden_layers, DTYPE_BYTES[dtype]
    name = path.parent.name if path.name == "config.json" else path.stem
    return Shape(name, size, weight_bytes(model), stored, layers * 2 * kv_heads * head_dim * size,
                 layers * heads * head_dim)


# -- inputs ---------------------------------------------------------------------------------------------
def _records(path: str | os.PathLike) -> list[Any]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a MagicDec grid ({err}); {GRID_FIX}.") from None


def is_grid(path: str | os.PathLike) -> bool:
    """Whether ``path``'s first record is a grid cell's (a context and a batch size, no benchmark question)."""
    try:
        with open(path, encoding="utf-8") as lines:
            first = json.loads(next((line for line in lines if line.strip()), "null"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(first, dict) and "question_id" not in first and all(key in first for key in GRID_KEYS)


def load_grid(path: str | os.PathLike) -> list[dict]:
    """The records of a grid JSONL, checked: every record has ``context``, ``batch_size`` and ``method``, every
    ``magicdec-always`` record ``drafted`` and ``accepted``, and there is at least one that drafted."""
    records = _records(path)
    for number, record in enumerate(records, 1):
        wanted = GRID_KEYS + (ALWAYS_KEYS if isinstance(record, dict) and record.get("method") == ALWAYS else ())
        missing = [key for key in wanted if not isinstance(record, dict) or key not in record]
        if missing:
            raise ValueError(f"{path}: line {number} has no {', '.join(missing)}; {GRID_FIX}.")
    if not any(r["method"] == ALWAYS for r in records):
        raise ValueError(f"{path} holds no {ALWAYS} records (its acceptance is what is projected): run "
                         f"benchmarks/magicdec_grid.py with --methods {ALWAYS} (drafting at every step).")
    if not any(r["method"] == ALWAYS and r["drafted"] for r in records):
        raise ValueError(f"{path}: its {ALWAYS} records drafted nothing, so they measured no acceptance; run the grid "
                         "at contexts longer than sinks + window.")
    return records


def acceptance(records: list[dict]) -> dict[tuple[int, int], dict[str, Any]]:
    """``(context, batch) -> {"alpha", "drafted", "accepted"}`` of the ``magicdec-always`` records that drafted."""
    cells: dict[tuple[int, int], list[int]] = {}
    for r in records:
        if r["method"] == ALWAYS and r["drafted"]:
            cell = cells.setdefault((int(r["context"]), int(r["batch_size"])), [0, 0])
            cell[0], cell[1] = cell[0] + int(r["drafted"]), cell[1] + int(r["accepted"])
    return {key: {"alpha": min(1.0, accepted / drafted), "drafted": drafted, "accepted": accepted}
            for key, (drafted, accepted) in sorted(cells.items())}


def nearest_cell(cells: Mapping[tuple[int, int], Any], context: int, batch: int) -> tuple[int, int]:
    """The measured cell nearest ``(context, batch)`` in log2: context first, then batch; ties to the larger."""
    return min(cells, key=lambda cell: (abs(math.log2(cell[0] / context)), -cell[0],
                                        abs(math.log2(cell[1] / batch)), -cell[1]))


def _options(records: list[dict]) -> tuple[int, int, int]:
    """``(sinks, window, num_tokens)`` of the ``magicdec-always`` records (MagicDec's defaults where not given)."""
    found = {(o.get("sinks", 4), o.get("window", 512), o.get("num_tokens") or 4)
             for o in (r.get("options") or {} for r in records if r["method"] == ALWAYS)}
    if len(found) != 1:
        raise ValueError(f"the {ALWAYS} records ran several settings (sinks, window, num_tokens) {sorted(found)}; "
                         "pass a grid of one setting (keep those records alone in a JSONL).")
    return found.pop()


def device_memory_gb(name: str) -> float | None:
    """The GB in a device's name (``NVIDIA H100 80GB HBM3``: 80), or a known one's (an H200: 141), else None."""
    size = re.search(r"(\d+(?:\.\d+)?)\s*GB", name, re.IGNORECASE)
    if size:
        return float(size.group(1))
    return next((gb for known, gb in NAMED_MEMORY_GB.items() if known in name), None)


# -- the model ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Device:
    """``bandwidth`` (bytes/s), ``overhead`` (s per forward), ``flops`` (FLOP/s, None: no compute floor)."""
    bandwidth: float
    overhead: float = 0.0
    flops: float | None = None

    def seconds(self, shape: Shape, nbytes: float, tokens: int, context: int) -> float:
        """A forward reading ``nbytes`` for ``tokens`` tokens at ``context`` (the module docstring's ``t``)."""
        memory = nbytes / self.bandwidth
        if self.flops:
            per_token = 2 * shape.weight_bytes / shape.dtype_bytes + 4 * context * shape.attention
            memory = max(memory, tokens * per_token / self.flops)
        return memory + self.overhead


def expected_tokens(alpha: float, n: int) -> float:
    """``E(n) = 1 + a + ... + a^n``: tokens a row keeps per step with a chain of ``n`` at acceptance ``alpha``."""
    return float(n + 1) if alpha >= 1.0 else (1.0 - alpha ** (n + 1)) / (1.0 - alpha)


def project_cell(shape: Shape, device: Device, alpha: float, batch: int, context: int, slots: int,
                 num_tokens: int) -> dict[str, Any]:
    """The best chain for ``batch`` rows at ``context`` (the module docstring's ``s(n)``): ``n``, ``speedup``,
    ``status`` (``"pays"``, ``"declines"`` or ``"uncompressed"``) and the seconds of a plain step."""
    cache = batch * context * shape.kv_bytes
    plain = device.seconds(shape, shape.weight_bytes + cache, batch, context)
    cell = {"batch": batch, "context": context, "alpha": alpha, "plain_step_ms": plain * 1e3}
    if context <= slots:
        return {**cell, "status": "uncompressed", "n": 0, "speedup": None}
    best_n, best = 0, 0.0
    for n in range(1, num_tokens + 1):
        drafts = sum(device.seconds(shape, shape.weight_bytes + batch * (slots + j) * shape.kv_bytes, batch, slots + j)
                     for j in range(n))
        verify = device.seconds(shape, shape.weight_bytes + cache, batch * (1 + n), context)
        speedup = expected_tokens(alpha, n) * plain / (verify + drafts)
        if speedup > best:
            best_n, best = n, speedup
    return {**cell, "status": "pays" if best > 1.0 else "declines", "n": best_n if best > 1.0 else 0,
            "speedup": best, "best_chain": best_n}


def effective_bandwidth(profile: Mapping[str, Any], overhead: float, dtype: str) -> tuple[float, str]:
    """Bytes/s of the profile's one-token forward at its shortest context (see the module docstring), and how."""
    from .profile import CONFIG_DIR
    from .projection import forward_seconds

    label = str(profile.get("label", ""))
    name = label.removesuffix(RANDOM)
    if not profile.get("seconds") or not (CONFIG_DIR / f"{name}.json").is_file():
        raise ValueError(f"the profile ({label or 'no label'}) is not of a shipped config's random weights, so its "
                         "bytes per forward are unknown here: give the device's bandwidth with --bandwidth-gbs.")
    shape, context = target_shape(name, dtype), min(int(c) for c in profile["seconds"])
    seconds = forward_seconds(profile, context)
    if seconds <= overhead:
        raise ValueError(f"the profile's one-token forward ({seconds * 1e3:.2f} ms) is no longer than the overhead "
                         f"given ({overhead * 1e3:.2f} ms): lower --overhead-ms, or give --bandwidth-gbs.")
    return ((shape.weight_bytes + context * shape.kv_bytes) / (seconds - overhead),
            f"effective: {name}'s one-token forward at {context} tokens in the profile, {seconds * 1e3:.2f} ms")


def project(records: list[dict], profile: Mapping[str, Any], *, config: str | os.PathLike | None = None,
            bandwidth_gbs: float | None = None, overhead_ms: float | None = None, tflops: float | None = None,
            memory_gb: float | None = None, batches=BATCHES, contexts=CONTEXTS, source: str = "the grid"
            ) -> dict[str, Any]:
    """Project the acceptance of ``records`` (:func:`load_grid`) onto ``profile``'s device at ``config``'s shape
    (default: the model the profile's label names) over ``batches`` x ``contexts``."""
    for flag, value, least in (("--bandwidth-gbs", bandwidth_gbs, "above 0"), ("--overhead-ms", overhead_ms, ">= 0"),
                               ("--tflops", tflops, "above 0"), ("--memory-gb", memory_gb, "above 0")):
        if value is not None and not (math.isfinite(value) and (value > 0 or (value == 0 and least == ">= 0"))):
            raise ValueError(f"{flag} {value}: give a finite number {least} (or leave it out).")
    dtype = str(profile.get("dtype", "bfloat16"))
    label = str(profile.get("label", ""))
    if config is None:
        if not label.endswith(RANDOM):
            raise ValueError(f"the profile's model ({label or 'no label'}) is not a shipped config: give the target's "
                             "shape with --config NAME or --config PATH/config.json.")
        config = label.removesuffix(RANDOM)
    shape = target_shape(config, dtype)
    overhead = (overhead_ms or 0.0) / 1e3
    if bandwidth_gbs is not None:
        bandwidth, how = bandwidth_gbs * 1e9, "given (--bandwidth-gbs)"
    else:
        bandwidth, how = effective_bandwidth(profile, overhead, dtype)
    device = Device(bandwidth, overhead, tflops * 1e12 if tflops else None)
    name = str(profile.get("device", "the profile's device"))
    memory = memory_gb if memory_gb is not None else device_memory_gb(name)
    sinks, window, num_tokens = _options(records)
    cells, rows = acceptance(records), []
    for context in contexts:
        for batch in batches:
            need = shape.stored_bytes + batch * (context + sinks + window) * shape.kv_bytes
            measured = nearest_cell(cells, context, batch)
            if memory is not None and need > memory * 1e9:
                rows.append({"batch": batch, "context": context, "status": "exceeds memory", "n": 0, "speedup": None,
                             "memory_gb": need / 1e9})
                continue
            row = project_cell(shape, device, cells[measured]["alpha"], batch, context, sinks + window, num_tokens)
            rows.append({**row, "alpha_from": list(measured), "memory_gb": need / 1e9})
    models = sorted({str(r.get("model", "?")) for r in records if r["method"] == ALWAYS})
    return {"format": FORMAT, "label": f"a cost model: bytes over bandwidth, acceptance measured on the CPU with "
                                       f"{', '.join(models)}",
            "source": source, "device": name, "profile_label": label, "dtype": dtype, "target": shape.name,
            "weight_bytes": shape.weight_bytes, "stored_bytes": shape.stored_bytes, "kv_bytes": shape.kv_bytes,
            "sinks": sinks, "window": window, "num_tokens": num_tokens, "bandwidth_gbs": bandwidth / 1e9,
            "bandwidth_from": how, "overhead_ms": overhead * 1e3, "tflops": tflops, "memory_gb": memory,
            "acceptance": [{"context": c, "batch": b, **v} for (c, b), v in cells.items()],
            "batches": list(batches), "contexts": list(contexts), "cells": rows}


# -- output ---------------------------------------------------------------------------------------------
def _cell_text(cell: Mapping[str, Any]) -> str:
    status = cell["status"]
    if status == "pays":
        return f"**{cell['speedup']:.2f}×** (n {cell['n']})"
    if status == "declines":
        return f"declines ({cell['speedup']:.2f}×)"
    return "uncompressed" if status == "uncompressed" else f"exceeds ({cell['memory_gb']:.0f} GB)"


def format_markdown(result: Mapping[str, Any]) -> str:
    """The projection as markdown: a table of context x batch, then what it assumes."""
    by_cell = {(c["context"], c["batch"]): c for c in result["cells"]}
    label = result["label"][0].upper() + result["label"][1:]
    lines = [f"# MagicDec projected on {result['device']}: {result['target']} ({result['dtype']})", "",
             (f"**{label}** (`{result['source']}`). Speedup of MagicDec over plain decoding (the best chain of n <= "
              f"{result['num_tokens']} drafts), per context (rows) and batch (columns)."), "",
             "| context | " + " | ".join(f"batch {b}" for b in result["batches"]) + " |",
             "|---|" + "---|" * len(result["batches"])]
    for context in result["contexts"]:
        lines.append(f"| {context:,} | " + " | ".join(_cell_text(by_cell[context, b]) for b in result["batches"])
                     + " |")
    measured = ", ".join(f"{a['context']} x {a['batch']}: {a['alpha']:.2f} ({a['accepted']}/{a['drafted']})"
                         for a in result["acceptance"])
    memory = f"{result['memory_gb']:g} GB" if result["memory_gb"] is not None else "unknown (not checked)"
    floor = f"{result['tflops']:g} TFLOP/s (--tflops)" if result["tflops"] else "none (memory-bound)"
    lines += ["", (f"- Target {result['target']}: {result['weight_bytes'] / 1e9:.2f} GB of weights read per forward "
                   f"({result['stored_bytes'] / 1e9:.2f} GB stored), {result['kv_bytes'] / 1e3:.0f} kB of keys and "
                   f"values per token; compressed cache {result['sinks']} sinks + window {result['window']}."),
              (f"- Bandwidth {result['bandwidth_gbs']:.0f} GB/s ({result['bandwidth_from']}); host overhead per "
               f"forward {result['overhead_ms']:g} ms; compute floor {floor}; device memory {memory} (weights and "
               "caches; activations left out)."
               + ("" if result["overhead_ms"] or result["tflops"] else " Without an overhead or a compute floor the "
                  "bandwidth cancels: the speedups are ratios of bytes.")),
              (f"- Acceptance (accepted / drafted of `{ALWAYS}`, per context x batch measured): {measured}; each "
               "cell takes the nearest measured cell's (log2, context first)."),
              ("- A step reads the weights plus each row's cache: plain and verifying steps the whole context, a "
               "draft step sinks + window (+ its drafts); verification of B (1 + n) tokens is assumed memory-bound. "
               "`declines`: no chain beats plain decoding; `uncompressed`: the context fits in sinks + window, "
               "nothing to draft from; `exceeds`: weights and caches do not fit in the device's memory.")]
    return "\n".join(lines) + "\n"


def save(result: Mapping[str, Any], path: str | os.PathLike) -> tuple[Path, Path]:
    """Write the projection as JSON to ``path`` (``.json`` added) and as markdown beside it (``.md``)."""
    path = Path(path)
    json_path = path if path.suffix == ".json" else path.with_name(path.name + ".json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    md_path = json_path.with_suffix(".md")
    md_path.write_text(format_markdown(result), encoding="utf-8")
    return json_path, md_path
