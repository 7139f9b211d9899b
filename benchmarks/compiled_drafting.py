"""A drafter's drafting cost, eager against fixed-shape compiled drafting (``hfs.enable(model, compile=...)``, where
each step is one captured region: ``core/regions.py``).

    python benchmarks/compiled_drafting.py --per-category 2 --new-tokens 96 --out benchmarks/results/compiled-drafting
    python benchmarks/compiled_drafting.py --drafter medusa     # the shipped heads and their calibrated tree
    python benchmarks/compiled_drafting.py --drafter dflash     # the shipped DFlash drafter, a dynamic tree

Per Spec-Bench prompt, three calls, interleaved and repeated (the first round warms up and compiles):
plain greedy (eager), the drafter's tree (EAGLE's and DFlash's a ``DynamicTree`` of ``--nodes``, ``--depth``,
``--top-k``; Medusa's the calibrated static tree) on a static cache with eager drafting (``cache_implementation="static"``),
and the same with the target and the drafter compiled (``compile=True``). Every output is checked against
greedy. Reported: the median drafting seconds per step (each depth is one drafter forward), the median
verification seconds per step, τ and tokens/s relative to greedy. The tree is verified whole at every step
(``adaptive=False``) so that both arms draft the same trees.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", choices=("eagle", "medusa", "dflash"), default="eagle",
                        help="the drafter shipped for --model")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="writes <out>.json and <out>.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import hf_speculative as hfs
    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.tooling.prompting import encode_prompt

    model, tokenizer = hfs.load_model(args.model)
    hfs.enable(model)
    tree = hfs.DynamicTree(nodes=args.nodes, depth=args.depth, top_k=args.top_k)
    if args.drafter == "medusa":
        strategy = hfs.Medusa.from_pretrained(args.model, target=model, adaptive=False, tree="calibrated")
    else:
        kind = {"eagle": hfs.Eagle, "dflash": hfs.DFlash}[args.drafter]
        strategy = kind.from_pretrained(args.model, target=model, adaptive=False, tree=tree)
    prompts = load_prompts(per_category=args.per_category)
    arms = {"greedy": None, "eager drafting": False, "compiled drafting": True}
    rows = []
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt.text)  # [1, L]
        base = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens, do_sample=False)
        times = {arm: [] for arm in arms}
        steps = {}
        reference = None
        for repeat in range(args.repeats + 1):  # round 0 warms up (and compiles)
            for arm, compile in arms.items():
                if compile is None:
                    hfs.enable(model, compile=False)
                    tick = time.perf_counter()
                    out = type(model).generate(model, **base)
                else:
                    hfs.enable(model, compile=compile)
                    tick = time.perf_counter()
                    out = model.generate(**base, candidate_generator=strategy, cache_implementation="static")
                seconds = time.perf_counter() - tick
                reference = out if reference is None else reference
                assert out.tolist() == reference.tolist(), (prompt.category, arm)
                if repeat:
                    times[arm].append(seconds)
                    if compile is not None:
                        stats = hfs.last_stats(model)
                        record = stats.steps()
                        steps.setdefault(arm, {"draft_s": [], "verify_s": [], "tau": stats.tau})
                        steps[arm]["draft_s"] += [d for d, n in zip(record["draft_s"], record["drafted"]) if n]
                        steps[arm]["verify_s"] += record["verify_s"]
        hfs.enable(model, compile=False)
        new = reference.shape[1] - ids.shape[1]
        greedy = statistics.median(times["greedy"])
        row = {"category": prompt.category, "question_id": prompt.question_id, "new_tokens": new,
               "greedy_s": round(greedy, 4)}
        for arm in ("eager drafting", "compiled drafting"):
            row[arm] = {"speedup": round(greedy / statistics.median(times[arm]), 3), "tau": round(steps[arm]["tau"], 3),
                        "draft_ms_per_step": round(1e3 * statistics.median(steps[arm]["draft_s"]), 3),
                        "verify_ms_per_step": round(1e3 * statistics.median(steps[arm]["verify_s"]), 3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {arm: {key: round(statistics.median(r[arm][key] for r in rows), 3)
                     for key in ("speedup", "tau", "draft_ms_per_step", "verify_ms_per_step")}
               for arm in ("eager drafting", "compiled drafting")}
    summary["greedy_ms_per_token"] = round(1e3 * statistics.median(r["greedy_s"] / r["new_tokens"] for r in rows), 3)
    print(json.dumps(summary))
    if args.out is not None:
        from hf_speculative.bench.runner import environment

        args.out.parent.mkdir(parents=True, exist_ok=True)
        shape = ("calibrated" if args.drafter == "medusa" else
                 {"nodes": args.nodes, "depth": args.depth, "top_k": args.top_k})
        meta = {"model": args.model, "drafter": args.drafter, "tree": shape,
                "per_category": args.per_category, "new_tokens": args.new_tokens, "repeats": args.repeats,
                "environment": environment(model, args.threads)}
        args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows, "summary": summary}, indent=1))
        lines = ["| arm | speedup vs greedy | τ | drafting ms/step | verification ms/step |", "|---|---|---|---|---|"]
        lines += [f"| {arm} | {s['speedup']:.2f}x | {s['tau']:.2f} | {s['draft_ms_per_step']:.1f} | "
                  f"{s['verify_ms_per_step']:.1f} |" for arm, s in summary.items() if isinstance(s, dict)]
        lines.append(f"\ngreedy: {summary['greedy_ms_per_token']:.1f} ms per token; medians over {len(rows)} prompts.")
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
