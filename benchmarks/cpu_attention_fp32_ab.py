"""An fp32 model on the CPU kernel with the kernel's few-query attention (hf_speculative/cpu/attention.py, which
``optimize_for_cpu`` now sets on it) against transformers' SDPA over all rows at once, for plain decoding and prompt
lookup.

    cd benchmarks && python cpu_attention_fp32_ab.py [--repeats 2] [--per-category 2]
    cd benchmarks && python cpu_attention_fp32_ab.py --forwards [--repeats 15]

``--forwards``: instead, forwards of 1, 2 and 6 tokens after a 512-token context under each attention, taking turns,
``--repeats`` rounds, median milliseconds.

On the peers' Spec-Bench prompts (``--per-category`` per category, first turn, chat template), one thread, the model
with ``hfs.optimize_for_cpu(model, kernel=True)`` and transformers' grouped-query SDPA (as the peers' kernel engine
runs): for every prompt, each method under each attention, interleaved (switched between calls with
``model.set_attn_implementation``). Untimed warm-up calls on the first two prompts, then ``--repeats`` rounds;
medians. Every output is checked against its route's greedy output of the round.
"""

from __future__ import annotations

import argparse
import os

import torch

from ab_runs import Runs, kernel_target, peers_prompts  # (benchmarks/ is this script's path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--forwards", action="store_true", help="time forwards of 1, 2 and 6 tokens instead")
    args = parser.parse_args()

    from hf_speculative.core.sdpa import CPU_ATTENTION
    from hf_speculative.cpu import attention
    from hf_speculative.tooling.methods import run_method

    model, tokenizer = kernel_target(args.model)
    attention.register()
    assert attention.fast_kernel() is not None, "the kernel could not be built here"
    if args.forwards:
        return time_forwards(model, CPU_ATTENTION, args.repeats)
    categories, prompts, encoded = peers_prompts(tokenizer, args.per_category)
    arms = [(f"{method}, {route}", method, route) for route in ("kernel attention", "sdpa")
            for method in ("greedy", "prompt-lookup")]
    runs = Runs()
    print(f"load at start: {os.getloadavg()}", flush=True)
    try:
        for round_ in range(args.repeats + 1):  # round 0 warms every arm up
            for i, ids in enumerate(encoded if round_ else encoded[:2]):
                references = {}
                for label, method, route in arms:
                    model.set_attn_implementation(CPU_ATTENTION if route == "kernel attention" else "sdpa")
                    done = run_method(method, model, tokenizer, ids, max_new_tokens=args.max_new_tokens)
                    out = list(done.output_ids)
                    reference = references.setdefault(route, out)
                    if round_:
                        runs.record(label, i, done, out == reference)
            print(f"round {round_} done; load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        model.set_attn_implementation(CPU_ATTENTION)
    n = len(encoded)
    route_of = {label: route for label, _, route in arms}
    print("\n".join(runs.table(list(route_of), prompts, categories, lambda label: f"greedy, {route_of[label]}",
                               "greedy (same route)", args.repeats)))
    for method in ("greedy", "prompt-lookup"):
        print(f"{method}: kernel attention {runs.ratio(f'{method}, kernel attention', f'{method}, sdpa', n):.3f}× "
              "the speed of SDPA")


def time_forwards(model, cpu_attention: str, repeats: int, context: int = 512) -> None:
    """Median ms of a forward of 1, 2 and 6 tokens after ``context`` tokens under each attention, in turns."""
    import statistics
    import time

    from hf_speculative import compat

    seconds: dict[tuple[str, int], list[float]] = {}
    with torch.inference_mode():
        cache = model(torch.randint(100, 20000, (1, context)), use_cache=True).past_key_values
        for _ in range(repeats):
            for route in (cpu_attention, "sdpa"):
                model.set_attn_implementation(route)
                for k in (1, 2, 6):
                    ids = torch.randint(100, 20000, (1, k))
                    start = time.perf_counter()
                    model(ids, past_key_values=cache, use_cache=True)
                    seconds.setdefault((route, k), []).append(time.perf_counter() - start)
                    compat.crop_cache(cache, k)
    model.set_attn_implementation(cpu_attention)
    for (route, k), times in sorted(seconds.items()):
        print(f"{route}: {k} token(s) after {context}: {statistics.median(times) * 1e3:.2f} ms")
    print(f"load at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
