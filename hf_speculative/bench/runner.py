"""Times decoding methods on Spec-Bench prompts and writes one JSON line per (prompt, method).

Timing discipline (see :func:`run_bench`): a fixed number of CPU threads, one untimed warm-up
generation per method, then every prompt is decoded by plain greedy and each method in turn before
moving to the next prompt (so slow drifts of the machine hit all methods alike), with the median
time over ``repeats``. Every method's output is compared token by token with greedy's. A CPU run also records the
weights' bytes per token and this machine's read bandwidth, measured before the warm-up (``bandwidth.py``), and
greedy's records the weights' GB/s.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Iterable

import torch

from ..cpu.layout import cpu_layout
from ..drafters.suffix.history import outputs_held
from ..extras import require
from ..tooling.methods import MethodRun, MethodSpec, get_method, run_method
from ..tooling.prompting import encode_prompt
from .bandwidth import bandwidth_fields, weights_gbs
# the dataset's names, re-exported: benchmarks and older scripts import them from here
from .spec_bench import MT_BENCH, MT_BENCH_CATEGORIES, SPEC_BENCH_CATEGORIES, Prompt, default_dataset_path, load_prompts

BASELINE = "greedy"


def environment(model: Any = None, threads: int | None = None) -> dict[str, Any]:
    """Versions, thread count, device and CPU model, stored with every benchmark record."""
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    device = str(getattr(model, "device", "cpu"))
    if device.startswith("cuda") and torch.cuda.is_available():
        device = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": threads if threads is not None else torch.get_num_threads(),
        "device": device,
        "cpu": cpu,
        "python": platform.python_version(),
        # transformers' switch for grouped-query SDPA with a mask (see `--sdpa-gqa`), read per call
        "sdpa_force_gqa": os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA", "0") == "1",
        # which weights hfs.optimize_for_cpu re-laid out (see `--cpu-layout`)
        "cpu_layout": cpu_layout(model) if model is not None else "none",
        "dtype": str(getattr(model, "dtype", torch.float32)).removeprefix("torch."),  # see `--dtype`
    }


def _record(run: MethodRun, seconds: float, prompt: Prompt, greedy_ids: list[int], base: dict) -> dict:
    return {
        **base,
        "method": run.method,
        "category": prompt.category,
        "question_id": prompt.question_id,
        "new_tokens": run.new_tokens,
        "seconds": seconds,
        "tokens_per_s": run.new_tokens / seconds if seconds > 0 else 0.0,
        "tau": run.tau,
        "acceptance_rate": run.acceptance_rate,
        "target_forwards": run.target_forwards,
        "drafted": run.drafted,
        "accepted": run.accepted,
        "identical_to_greedy": run.output_ids == greedy_ids,
        **({"extra": run.extra} if run.extra else {}),
        **({"shape": run.shape} if run.shape else {}),
        # per verification step (hf_speculative's methods): what `hf-speculative project` reads
        **({"steps": run.steps} if run.steps is not None else {}),
    }


def run_bench(
    model: Any,
    tokenizer: Any,
    methods: Iterable[str | MethodSpec],
    prompts: list[Prompt],
    *,
    out: str | os.PathLike,
    model_name: str = "",
    options: dict | None = None,
    max_new_tokens: int = 128,
    threads: int = 1,
    repeats: int = 1,
    chat_template: bool = True,
    progress: bool = True,
    append: bool = False,
) -> list[dict]:
    """Benchmark ``methods`` against plain greedy on ``prompts``; write one JSON line per (prompt, method) to ``out``.

    Args:
        model, tokenizer: the target model and its tokenizer.
        methods: method names or specs; greedy is always run first (added if missing).
        prompts (`list[Prompt]`): from :func:`load_prompts`.
        out: the jsonl file to write (created with its folder if needed; replaced unless ``append``).
        model_name (`str`): stored in each record.
        options (`dict`, *optional*): method options (``num_tokens``, ``draft_model``...).
        max_new_tokens (`int`), threads (`int`), repeats (`int`): see the module docstring.
        chat_template (`bool`): apply the tokenizer's chat template to the prompts.
        progress (`bool`): show a tqdm bar.
        append (`bool`): add the records to the end of ``out`` instead of replacing it (each run's records carry
            their own ``run_id``, and the report shows runs apart).

    Returns:
        `list[dict]`: the records written, in order.
    """
    specs = [get_method(m) if isinstance(m, str) else m for m in methods]
    specs = [get_method(BASELINE)] + [s for s in specs if s.name != BASELINE]
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not prompts:
        raise ValueError("no prompts to run")
    options = {} if options is None else options
    torch.set_num_threads(threads)
    model.eval()
    base = {
        "run_id": time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}",
        "model": model_name or getattr(model.config, "_name_or_path", ""),
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        **environment(model, threads),
        # CPU runs: the weights' bytes per token and the machine's read bandwidth, measured here, before any timing
        **bandwidth_fields(model),
    }
    encoded = [encode_prompt(tokenizer, p.text, chat_template) for p in prompts]
    with outputs_held(model, keep=False):  # warm-up, untimed; SuffixDecoding's history does not keep it
        for spec in specs:
            run_method(spec, model, tokenizer, encoded[0], options=options, max_new_tokens=min(max_new_tokens, 16))

    tqdm = require("tqdm.auto", "cli", "The benchmark's progress bar").tqdm
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    bar = tqdm(total=len(prompts) * len(specs) * repeats, disable=not progress, desc="bench", unit="gen")
    with open(out, "a" if append else "w", encoding="utf-8") as f:
        for prompt, input_ids in zip(prompts, encoded):
            runs: dict[str, list[MethodRun]] = {s.name: [] for s in specs}
            # every repeat drafts from the same SuffixDecoding history (the earlier prompts' outputs), never from
            # its own previous run's output; this prompt's joins when its repeats are done
            with outputs_held(model):
                for _ in range(repeats):
                    for spec in specs:
                        runs[spec.name].append(run_method(spec, model, tokenizer, input_ids, options=options,
                                                          max_new_tokens=max_new_tokens))
                        bar.update()
            greedy_ids = runs[BASELINE][0].output_ids
            for spec in specs:
                first = runs[spec.name][0]
                seconds = statistics.median(r.seconds for r in runs[spec.name])
                record = _record(first, seconds, prompt, greedy_ids, base)
                record["input_tokens"] = int(input_ids.shape[1])
                if spec.name == BASELINE and "weight_bytes_per_token" in base:  # plain decoding: one read per token
                    record["weights_gbs"] = weights_gbs(base["weight_bytes_per_token"], record["tokens_per_s"])
                if repeats > 1:
                    record["seconds_all"] = [r.seconds for r in runs[spec.name]]
                f.write(json.dumps(record) + "\n")
                f.flush()
                records.append(record)
    bar.close()
    return records
