"""EAGLE with exact or int8 kernel copies of its network (``hfs.Eagle(kernel_weights=...)``) against plain greedy, on
Spec-Bench, the target on hf_speculative's CPU kernel (``--cpu-layout all+kernel``), one thread, interleaved prompt by
prompt (greedy, then each setting), every output checked against greedy's.

    python benchmarks/eagle_kernel_weights.py --per-category 10 --max-new-tokens 64 --out eagle_int8.jsonl

``--budget auto`` is the drafter's default (the cost rule sizes each chain, to nothing where none pays); ``chain5`` a
fixed chain of 5. Prints, per setting, τ (tokens over target forwards), the median drafting ms of a step that drafted,
and the speed against greedy (the ratio of summed times, and the median of per-prompt ratios).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def strategy(hfs, model, weights: str, budget: str):
    fixed = {} if budget == "auto" else {"num_tokens": int(budget[5:]), "adaptive": False, "confidence_threshold": 0.0}
    return hfs.Eagle.from_pretrained("smollm2-135m-instruct", target=model, kernel_weights=weights, **fixed)


def timed(model, ids, **kwargs) -> tuple[torch.Tensor, float]:
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, **kwargs)
    return out, time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--budget", default="auto", help="auto (the drafter's default) or chainK (a fixed chain)")
    parser.add_argument("--weights", default="exact,int8")
    parser.add_argument("--out", default="eagle_kernel_weights.jsonl")
    args = parser.parse_args(argv)

    import hf_speculative as hfs
    from hf_speculative.bench.spec_bench import DATASET, SPEC_BENCH_CATEGORIES, load_prompts
    from hf_speculative.cpu.layout import apply_layout
    from hf_speculative.tooling.prompting import encode_prompt

    torch.set_num_threads(1)
    model, tokenizer = hfs.load_model("smollm2-135m-instruct")
    apply_layout(model, "all+kernel")
    hfs.enable(model)
    settings = args.weights.split(",")
    prompts = load_prompts(DATASET, list(SPEC_BENCH_CATEGORIES), args.per_category)
    warm = encode_prompt(tokenizer, prompts[0].text)
    for weights in settings:  # warm-up: the kernel's copies, the cost rule's first measurements
        timed(model, warm, max_new_tokens=16, candidate_generator=strategy(hfs, model, weights, args.budget))
    rows = []
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt.text)
        greedy, greedy_s = timed(model, ids, max_new_tokens=args.max_new_tokens)
        row = {"category": prompt.category, "question_id": prompt.question_id, "greedy_s": greedy_s,
               "new_tokens": greedy.shape[1] - ids.shape[1]}
        for weights in settings:
            out, seconds = timed(model, ids, max_new_tokens=args.max_new_tokens,
                                 candidate_generator=strategy(hfs, model, weights, args.budget))
            stats = hfs.last_stats(model)
            steps = stats.steps()
            row[weights] = {"seconds": seconds, "forwards": stats.target_forwards,
                            "identical": out.tolist() == greedy.tolist(),
                            "draft_ms": [1000 * s for n, s in zip(steps["drafted"], steps["draft_s"]) if n]}
        rows.append(row)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    for weights in settings:
        drafted = [ms for r in rows for ms in r[weights]["draft_ms"]]
        tau = sum(r["new_tokens"] for r in rows) / sum(r[weights]["forwards"] for r in rows)
        speed = sum(r["greedy_s"] for r in rows) / sum(r[weights]["seconds"] for r in rows)
        median = statistics.median(r["greedy_s"] / r[weights]["seconds"] for r in rows)
        print(f"{weights}: tau {tau:.3f}, drafting {statistics.median(drafted) if drafted else 0:.1f} ms a step that "
              f"drafted ({len(drafted)} such steps), {speed:.3f}x greedy (median per prompt {median:.3f}x), "
              f"{sum(r[weights]['identical'] for r in rows)}/{len(rows)} identical")


if __name__ == "__main__":
    main()
