"""A 16-bit model's attention on the CPU (hf_speculative/cpu/attention.py) with its rows on the kernel's few-query
attention against one SDPA call per row, for plain decoding, the draft model and prompt lookup.

    cd benchmarks && python cpu_attention_ab.py [--repeats 1]

On the peers' Spec-Bench prompts (``--per-category`` per category, first turn, chat template), one thread, both models
in bf16 with ``hfs.optimize_for_cpu``: for every prompt, each method with each route, interleaved (the route is the
process-wide choice of ``attention.fast_kernel()``, switched between calls); each route has its own copy of the drafter
(the drafter's measured costs and acceptance, which its gate reads, are kept per model). One untimed warm-up call per
arm on the first prompt, then ``--repeats`` rounds; medians. Every output is checked against its route's greedy
output of the round. Prints tokens/s per category and overall, τ and the ratio to the same route's greedy.
"""

from __future__ import annotations

import argparse
import os

import torch

from ab_runs import Runs, kernel_target, peers_prompts  # (benchmarks/ is this script's path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    import hf_speculative as hfs
    from hf_speculative.cpu import attention
    from hf_speculative.cpu.layout import follow_layout
    from hf_speculative.tooling.methods import run_method

    dtype = getattr(torch, args.dtype)
    model, tokenizer = kernel_target(args.model, dtype)
    categories, prompts, encoded = peers_prompts(tokenizer, args.per_category)
    kernel = attention.fast_kernel()
    assert kernel is not None, "the kernel could not be built here"
    arms = []
    for route in ("kernel", "sdpa per row"):
        drafter, _ = hfs.load_model(args.draft_model, dtype=dtype)
        follow_layout(drafter, model, "exact")
        arms += [(f"greedy, {route}", "greedy", {}, route), (f"draft model, {route}", "draft-model",
                 {"draft_model": drafter}, route), (f"prompt lookup, {route}", "prompt-lookup", {}, route)]
    runs = Runs()
    print(f"load at start: {os.getloadavg()}; prompt lengths {[int(ids.shape[1]) for ids in encoded]}", flush=True)
    for round_ in range(args.repeats + 1):  # round 0 warms every arm up on the first prompt
        for i, ids in enumerate(encoded if round_ else encoded[:1]):
            references = {}
            for label, method, options, route in arms:
                attention._FAST[:] = [kernel if route == "kernel" else None]
                done = run_method(method, model, tokenizer, ids, options=options, max_new_tokens=args.max_new_tokens)
                out = list(done.output_ids)
                reference = references.setdefault(route, out)
                if round_:
                    runs.record(label, i, done, out == reference)
            if round_:
                print(f"prompt {i} ({prompts[i].category}) done: "
                      + ", ".join(f"{label} {runs.seconds[label, i][-1]:.1f} s" for label, *_ in arms)
                      + f"; load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"load at end: {os.getloadavg()}")
    attention._FAST[:] = [kernel]
    route_of = {label: route for label, _, _, route in arms}
    print("\n".join(runs.table(list(route_of), prompts, categories, lambda label: f"greedy, {route_of[label]}",
                               "greedy (same route)", args.repeats)))


if __name__ == "__main__":
    main()
