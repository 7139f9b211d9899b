"""Batches end to end with real weights: transformers' batched greedy against our loop's batched prompt lookup.

    python -m tools.gpu.batch_e2e --model-dir /tmp/lent/model --out $OUT/batch      # after tools/gpu/lent_real.sh

Spec-Bench prompts (one category after another, the first ``max(--sizes)``), left-padded into batches of each size;
per size, after a warm-up round, ``--repeats`` interleaved rounds of both arms (eager, the model's dtype on the
device). Reported per size: tokens/s over the batch (new tokens of every row up to its EOS), the speed ratio,
whether every row equals the batched greedy's row, and our loop's target forwards (greedy's: one per new token of
the longest row) and tokens per batched forward (every row's tokens: up to the batch size times τ). Rows of a
batched greedy can differ from the same prompt alone (padding changes the reduction order): the reference is the
batched greedy of the same batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch


def run_batches(model_dir: Path, sizes: list[int], new_tokens: int, repeats: int, device: str,
                dtype: Any = None, categories: list[str] | None = None) -> dict[str, Any]:
    import hf_speculative as hfs

    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.tooling.prompting import encode_prompt

    model, tokenizer = hfs.load_model(str(model_dir), device=device, dtype=dtype)
    hfs.enable(model)
    # the first prompts of each category asked for (default every one), one category after another
    per_category = -(-max(sizes) // len(categories)) if categories else -(-max(sizes) // 6)
    prompts = load_prompts(categories=categories, per_category=per_category)[: max(sizes)]
    encoded = [encode_prompt(tokenizer, p.text)[0].tolist() for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    report: dict[str, Any] = {"model": str(model_dir), "dtype": str(model.dtype).replace("torch.", ""),
                              "new_tokens": new_tokens, "repeats": repeats,
                              "categories": sorted({p.category for p in prompts}),
                              "sizes": {}}
    for size in sizes:
        rows = encoded[:size]
        width = max(map(len, rows))
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)  # [B, L], left-padded
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        base = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": new_tokens, "do_sample": False,
                "pad_token_id": pad}
        arms = {"transformers batched greedy": lambda: type(model).generate(model, **base),
                "prompt lookup (our loop)": lambda: model.generate(**base, candidate_generator=hfs.PromptLookup())}
        times: dict[str, list[float]] = {label: [] for label in arms}
        outputs: dict[str, torch.Tensor] = {}
        for repeat in range(repeats + 1):
            for label, call in arms.items():
                _sync(device)
                tick = time.perf_counter()
                with torch.inference_mode():
                    outputs[label] = call()
                _sync(device)
                if repeat:
                    times[label].append(time.perf_counter() - tick)
                if label != "transformers batched greedy":
                    stats = hfs.last_stats(model)
        reference = outputs["transformers batched greedy"]
        new = int((reference[:, width:] != pad).sum())
        entry = {}
        for label in arms:
            seconds = statistics.median(times[label])
            same = [bool(torch.equal(a[width:], b[width:])) for a, b in zip(outputs[label], reference)]
            entry[label] = {"seconds": round(seconds, 4), "tokens_per_s": round(new / seconds, 2),
                            "identical_rows": f"{sum(same)}/{size}"}
        entry["prompt lookup (our loop)"].update(target_forwards=stats.target_forwards,
                                                 tokens_per_batched_forward=round(stats.tau, 3))
        entry["speedup"] = round(entry["transformers batched greedy"]["seconds"]
                                 / entry["prompt lookup (our loop)"]["seconds"], 3)
        report["sizes"][str(size)] = entry
        print(size, json.dumps(entry), flush=True)
    return report


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--sizes", default="1,4,8,16")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--categories", default=None,
                        help="comma-separated Spec-Bench categories (e.g. summarization,rag: answers that copy)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from .gpu_check import comma_list

    args.out.mkdir(parents=True, exist_ok=True)
    report = run_batches(args.model_dir, [int(s) for s in args.sizes.split(",")], args.new_tokens, args.repeats,
                         args.device, args.dtype,
                         comma_list(args.categories) or None)
    (args.out / "batch_e2e.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
