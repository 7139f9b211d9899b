"""Batched throughput: generated tokens per second over a batch, for batch sizes B, against batched greedy.

``hf-speculative bench --batch-size 1,2,4,8,16`` runs this instead of the one-prompt runner. The prompts are
cut into batches of B (left-padded, as transformers' tokenizers pad for generation); every batch is decoded by
transformers' own batched greedy and by each method in turn before the next batch (slow drifts of a shared
machine hit all methods alike), and the batch sizes alternate their order from one repeat to the next.
Throughput is the new tokens of every row (up to its EOS) over the batch's wall time; each row of each method
is compared token by token with greedy's.

Besides the methods asked for, ``<method>+always`` runs the same drafter with the batch cost model told that
verification is free (it drafts at every step, as much as the drafter proposes): the curve where speculation
stops paying, against which the cost model's own choice (``<method>``) is judged (B > 1 only: one row runs
the single-row loops, which the batch cost model does not steer).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Iterable

import torch

from ..tooling.methods import MethodSpec, get_method, pad_token_id
from ..tooling.prompting import encode_prompt
from .runner import BASELINE, environment
from .spec_bench import Prompt

ALWAYS = "+always"


@contextlib.contextmanager
def free_verification(model: Any):
    """Within: the batch loop's cost model of ``model`` says verification costs nothing (always draft)."""
    from ..core.batch_costs import BatchCostModel
    from ..core.state import state_of

    always = BatchCostModel()
    always.fix(overhead=1.0, per_token=1e-9)
    state = state_of(model)
    with state.lock:
        saved, state.batch_costs = state.batch_costs, always
    try:
        yield
    finally:
        with state.lock:
            state.batch_costs = saved


def _left_pad(rows: list[torch.Tensor], pad: int) -> dict[str, torch.Tensor]:
    width = max(r.shape[1] for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - row.shape[1]:] = row[0]
        mask[i, width - row.shape[1]:] = 1
    return {"input_ids": ids, "attention_mask": mask}


def _new_tokens(out: torch.Tensor, width: int, eos: set[int], max_new_tokens: int) -> list[list[int]]:
    rows = []
    for row in out[:, width: width + max_new_tokens].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return rows


def _eos_ids(model: Any) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos]))


def run_batch_bench(model: Any, tokenizer: Any, methods: Iterable[str | MethodSpec], prompts: list[Prompt], *,
                    batch_sizes: list[int], out: str | os.PathLike, model_name: str = "", options: dict | None = None,
                    max_new_tokens: int = 128, threads: int = 1, repeats: int = 1, chat_template: bool = True,
                    always: bool = True, progress: bool = True) -> list[dict]:
    """Benchmark ``methods`` against transformers' batched greedy at each of ``batch_sizes``; append one JSON line
    per (batch, method, repeat) to ``out``. Returns the records."""
    import hf_speculative as hfs

    from ..extras import require

    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ValueError(f"--batch-size: batch sizes must be >= 1, got {batch_sizes}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not prompts:
        raise ValueError("no prompts to run")
    specs = [get_method(m) if isinstance(m, str) else m for m in methods]
    specs = [s for s in specs if s.name != BASELINE]
    bad = [s.name for s in specs if s.kind != "hfs"]
    if bad:
        raise ValueError(f"--batch-size runs hf_speculative's methods only (transformers' assisted loop refuses "
                         f"batches); drop {', '.join(bad)}.")
    options = {} if options is None else options
    torch.set_num_threads(threads)
    model.eval()
    hfs.enable(model)
    pad = pad_token_id(model, tokenizer)
    eos = _eos_ids(model)
    encoded = [encode_prompt(tokenizer, p.text, chat_template) for p in prompts]
    runs = [(BASELINE, None, False)]
    for spec in specs:
        runs.append((spec.name, spec, False))
        if always:
            runs.append((spec.name + ALWAYS, spec, True))
    base = {"run_id": time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}",
            "model": model_name or getattr(model.config, "_name_or_path", ""),
            "max_new_tokens": max_new_tokens, **environment(model, threads)}

    def generate(name: str, spec: MethodSpec | None, free: bool, inputs: dict, limit: int):
        extra = {"candidate_generator": None} if spec is None else spec.build(model, tokenizer, options)
        with contextlib.ExitStack() as stack:
            if free:
                stack.enter_context(free_verification(model))
            with torch.inference_mode():
                start = time.perf_counter()
                result = model.generate(**{k: v.to(model.device) for k, v in inputs.items()}, max_new_tokens=limit,
                                        do_sample=False, pad_token_id=pad, **extra)
                seconds = time.perf_counter() - start
        return result, seconds, (hfs.last_stats(model) if spec is not None else None)

    warm = _left_pad(encoded[:min(2, len(encoded))], pad)
    for name, spec, free in runs:  # warm-up, untimed
        generate(name, spec, free, warm, min(max_new_tokens, 16))
    tqdm = require("tqdm.auto", "cli", "The benchmark's progress bar").tqdm
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    total = repeats * sum((len(encoded) + b - 1) // b * (len(runs) if b > 1 else len(specs) + 1) for b in batch_sizes)
    bar = tqdm(total=total, disable=not progress, desc="bench", unit="batch")
    records: list[dict] = []
    with open(out, "a", encoding="utf-8") as f:
        for repeat in range(repeats):
            for size in (batch_sizes if repeat % 2 == 0 else batch_sizes[::-1]):
                for start in range(0, len(encoded), size):
                    chunk = encoded[start: start + size]
                    inputs = _left_pad(chunk, pad)
                    width = inputs["input_ids"].shape[1]
                    greedy_rows = None
                    for name, spec, free in runs:
                        if free and size == 1:
                            continue  # one row runs the single-row loops, which the batch cost model does not steer
                        result, seconds, stats = generate(name, spec, free, inputs, max_new_tokens)
                        rows = _new_tokens(result.cpu(), width, eos, max_new_tokens)
                        greedy_rows = rows if spec is None else greedy_rows
                        tokens = sum(len(r) for r in rows)
                        record = {**base, "method": name, "batch_size": size, "rows": len(chunk), "repeat": repeat,
                                  "question_ids": [p.question_id for p in prompts[start: start + size]],
                                  "new_tokens": tokens, "seconds": seconds,
                                  "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
                                  "identical_to_greedy": rows == greedy_rows}
                        if stats is not None:
                            steps = stats.steps()["drafted"]
                            record.update(target_forwards=stats.target_forwards, drafted=stats.drafted_tokens,
                                          accepted=stats.accepted_tokens,
                                          drafting_steps=sum(1 for d in steps if d) / max(len(steps), 1))
                        f.write(json.dumps(record) + "\n")
                        f.flush()
                        records.append(record)
                        bar.update()
    bar.close()
    return records


def summarize(records: list[dict]) -> list[dict]:
    """Per (batch size, method): tokens, seconds, throughput, speedup over greedy at that batch size, identity, and
    the share of verification steps that drafted."""
    cells: dict[tuple[int, str], dict] = {}
    for r in records:
        cell = cells.setdefault((r["batch_size"], r["method"]), {"tokens": 0, "seconds": 0.0, "identical": True,
                                                                 "drafting": [], "accepted": 0, "drafted": 0})
        cell["tokens"] += r["new_tokens"]
        cell["seconds"] += r["seconds"]
        cell["identical"] &= bool(r["identical_to_greedy"])
        if "drafting_steps" in r:
            cell["drafting"].append(r["drafting_steps"])
            cell["accepted"] += r["accepted"]
            cell["drafted"] += r["drafted"]
    rows = []
    for (size, method), cell in sorted(cells.items()):
        greedy = cells.get((size, BASELINE))
        rate = cell["tokens"] / cell["seconds"] if cell["seconds"] else 0.0
        base = greedy["tokens"] / greedy["seconds"] if greedy and greedy["seconds"] else 0.0
        rows.append({"batch_size": size, "method": method, "tokens": cell["tokens"],
                     "seconds": round(cell["seconds"], 3), "tokens_per_s": round(rate, 2), "speedup": round(rate / base, 3) if base else None,
                     "identical": cell["identical"],
                     "drafting_steps": (round(sum(cell["drafting"]) / len(cell["drafting"]), 3)
                                        if cell["drafting"] else None),
                     "acceptance": round(cell["accepted"] / cell["drafted"], 3) if cell["drafted"] else None})
    return rows


def format_summary(rows: list[dict]) -> str:
    """The summary as a markdown table."""
    lines = ["| B | method | tokens/s | speedup vs batched greedy | steps that drafted | acceptance | identical |",
             "|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        drafting = "" if r["drafting_steps"] is None else f"{r['drafting_steps']:.0%}"
        acceptance = "" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        speedup = "" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        lines.append(f"| {r['batch_size']} | {r['method']} | {r['tokens_per_s']:.1f} | {speedup} | {drafting} | "
                     f"{acceptance} | {'yes' if r['identical'] else 'NO'} |")
    return "\n".join(lines)
