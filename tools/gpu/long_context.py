"""Issue 71's agenda on a lent GPU: MagicDec's grid (batch x context) at 8B shapes, where MagicDec reports its gains.

    make gpu-check GPU_STEPS=magicdec GPU_PARTS=/tmp/parts          # there (docs/gpu.md)
    make gpu-check DEVICE=cpu TINY=1 GPU_STEPS=magicdec             # the dry run on this CPU (tests/tools)

The target is the registry's SmolLM2-135M inflated to Llama-3.1-8B's shape (``inflate.py``: the small model's
function, so its own acceptance, at the large shape's cost: every figure is labelled ``inflated (cost model)``), in
float32 on the device (bfloat16 parts from batched greedy at near-ties, as the device battery allows; the grid asks
every row to be greedy's). Memory at 16 rows of 8,000 tokens: the weights' 29 GB, the shared prefill's cache 34 GB
and one call's own as much again (greedy's deep copy, or our verifier's cache): about 100 GB of an H200's 139. The
grid is ``benchmarks/magicdec_grid.py``'s: the long documents of its docstring as left-padded batches, one shared
prefill per cell that every call starts from, transformers' batched greedy against ``magicdec`` (the cost rule's
choice), ``magicdec-always`` (drafting at every step) and ``prompt-lookup``, every row checked token for token
against greedy's, decoding timed alone (``decode_speedup``). On a memory-bound device a verification of a few tokens
a row costs about a plain step, so where the compressed cache is much smaller than the whole one, MagicDec's drafts
should pay: the question this step answers, which this CPU cannot (its verification is compute-bound:
docs/drafters/magicdec.md).

Sized for one call of a lent H200 (at most 10 minutes): the cells run smallest first and none starts after
``max_minutes``; the records are appended to ``magicdec_grid.jsonl`` as they come, and ``magicdec.json`` keeps the
summary (``benchmarks/magicdec_grid.py --summary`` reads the JSONL too).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("magicdec", "magicdec-always", "prompt-lookup")
# the grid at the 8B shape: the batches it names, the contexts where the cache outweighs the weights
BATCH_SIZES, CONTEXTS = (1, 4, 8, 16), (2048, 4096, 8000)
TINY = {"batch_sizes": (1, 3), "contexts": (96, 160), "window": 32, "sinks": 4, "new_tokens": 8}


def grid_module() -> Any:
    """``benchmarks/magicdec_grid.py`` as a module (the benchmarks are scripts: run from the clone's root)."""
    name = "benchmarks_magicdec_grid"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "magicdec_grid.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_long_context(model_dir: str | Path, device: str, dtype: torch.dtype, *, shape: str, out: Path,
                     batch_sizes: tuple[int, ...] = BATCH_SIZES, contexts: tuple[int, ...] = CONTEXTS,
                     methods: tuple[str, ...] = METHODS, window: int = 512, sinks: int = 4, new_tokens: int = 64,
                     repeats: int = 2, prefill_tokens: int = 8192, max_minutes: float | None = None) -> dict[str, Any]:
    """The grid on ``model_dir`` inflated to ``shape`` in ``dtype`` on ``device``; records appended to
    ``out / "magicdec_grid.jsonl"``. Returns the report: the summary rows, whether every row was greedy's, the
    compressed caches' bytes against the full ones, the seconds."""
    import hf_speculative as hfs

    from .gpu_check import log
    from .inflate import COST_MODEL, inflate_model, is_inflated, shipped_shape

    began = time.perf_counter()
    grid = grid_module()
    small, tokenizer = hfs.load_model(str(model_dir), dtype=torch.float32, device=device)
    config = small.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shaped = shipped_shape(shape, head_dim)
    big = inflate_model(small, shaped, dtype=dtype, name=Path(str(model_dir)).name)
    del small
    log("magicdec", COST_MODEL, f"-> {shaped.name}, {sum(p.numel() for p in big.parameters()) / 1e9:.2f} B parameters, "
        f"built in {time.perf_counter() - began:.0f} s")
    positions = getattr(big.config, "max_position_embeddings", None)
    contexts = tuple(c for c in contexts if not positions or c + new_tokens <= positions)
    tokenizer.padding_side = "left"
    text_ids = tokenizer(grid.long_text(), add_special_tokens=False).input_ids
    jsonl = out / "magicdec_grid.jsonl"
    records = grid.run_grid(big, tokenizer,
                            lambda context, rows: grid.document_prompts(tokenizer, text_ids, context, rows),
                            batch_sizes=list(batch_sizes), contexts=list(contexts), methods=list(methods),
                            options={"window": window, "sinks": sinks}, max_new_tokens=new_tokens, repeats=repeats,
                            out=jsonl, model_name=f"{Path(str(model_dir)).name} {COST_MODEL} {shaped.name}",
                            prefill_tokens=prefill_tokens, max_minutes=max_minutes)
    rows = grid.summarize(records)
    full = {(r["context"], r["batch_size"]): r["batch_size"] * r["prompt_tokens"] for r in records}
    bound = hfs.MagicDec(window=window, sinks=sinks).cache_bytes(big, 1)  # a row's compressed caches, in bytes
    per_token = bound // (window + sinks)
    return {"label": COST_MODEL, "inflated": is_inflated(big), "shape": dataclasses.asdict(shaped),
            "dtype": str(dtype).replace("torch.", ""), "device": device, "window": window, "sinks": sinks,
            "new_tokens": new_tokens, "repeats": repeats, "records": str(jsonl), "rows": rows,
            "identical": all(r["identical_to_greedy"] for r in records),
            "cells": sorted({(r["context"], r["batch_size"]) for r in records}),
            "memory": {f"{c} x {b}": {"full_cache_bytes": tokens * per_token, "compressed_bytes": b * bound}
                       for (c, b), tokens in sorted(full.items())},
            "seconds": round(time.perf_counter() - began, 1)}


def summary_lines(report: dict[str, Any]) -> list[str]:
    """``summary.md``'s section: decoding's speedup over batched greedy per cell and method (τ in brackets)."""
    settings = (f"Window {report['window']} + {report['sinks']} sinks, {report['new_tokens']} new tokens a row, "
                f"{report['repeats']} repeats in each cell; every row identical to batched greedy: "
                f"{report['identical']}. Decoding's speedup over transformers' batched greedy (the shared prefill left "
                "out), τ in brackets.")
    lines = ["", f"## MagicDec at long contexts ({report['label']}, {report['shape']['name']}, {report['dtype']})", "",
             settings, ""]
    methods = sorted({r["method"] for r in report["rows"] if r["method"] != "greedy"})
    lines += ["| context x batch | greedy tok/s | " + " | ".join(methods) + " |", "|---" * (2 + len(methods)) + "|"]
    cells: dict[tuple, dict] = {}
    for row in report["rows"]:
        cells.setdefault((row["context"], row["batch_size"]), {})[row["method"]] = row
    for (context, batch), by in sorted(cells.items()):
        greedy = by.get("greedy", {})
        entries = []
        for method in methods:
            row = by.get(method)
            if row is None or row.get("decode_speedup") is None:
                entries.append("-")
                continue
            tau = f" (τ {row['tau']:.2f})" if row.get("tau") else ""
            entries.append(f"{row['decode_speedup']:.2f}x{tau}")
        lines.append(f"| {context} x {batch} | {greedy.get('tokens_per_s', '-')} | " + " | ".join(entries) + " |")
    return lines
