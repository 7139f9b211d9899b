"""What writing the cache in place (hf_speculative/core/kv_room.py) gives our loop, against transformers' torch.cat.

    python benchmarks/kv_room_ab.py --methods prompt-lookup,eagle+lookup --repeats 2

On the peers' 12 Spec-Bench prompts (2 per category, first turn, chat template), one thread, the CPU kernel on
(``hfs.optimize_for_cpu(model)``) unless ``--no-kernel``: for every prompt, transformers' greedy and each method
twice, once with the in-place cache and once with ``make_room`` switched off (our loop then grows transformers'
DynamicCache by concatenation), all arms interleaved after a warm-up round; medians over ``--repeats``. Every output
is checked against greedy. Prints tokens/s per arm and category and the ratio of the two caches.
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch

from ab_runs import Runs, peers_prompts  # (benchmarks/ is this script's path)


@contextlib.contextmanager
def cat_cache(off: bool):
    """``make_room`` a no-op while ``off``: the loop's cache stays transformers' (concatenating) one."""
    from hf_speculative.core import verify

    original = verify.make_room
    if off:
        verify.make_room = lambda cache: 0
    try:
        yield
    finally:
        verify.make_room = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--methods", default="prompt-lookup")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-kernel", action="store_true")
    args = parser.parse_args()

    import hf_speculative as hfs
    from hf_speculative.tooling.methods import run_method

    torch.set_num_threads(1)
    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"  # as the peers' kernel engine runs
    model, tokenizer = hfs.load_model(args.model)
    if not args.no_kernel:
        hfs.optimize_for_cpu(model, kernel=True)
    categories, prompts, encoded = peers_prompts(tokenizer, args.per_category)
    arms = [("greedy", "greedy", False)] + [(f"{m} in place", m, False) for m in args.methods.split(",")] + \
        [(f"{m} cat", m, True) for m in args.methods.split(",")]
    runs = Runs()
    print(f"load at start: {os.getloadavg()}", flush=True)
    for round_ in range(args.repeats + 1):  # round 0 warms up
        for i, ids in enumerate(encoded):
            reference = None
            for label, method, off in arms:
                with cat_cache(off):
                    done = run_method(method, model, tokenizer, ids, options={}, max_new_tokens=args.max_new_tokens)
                out = list(done.output_ids)
                if method == "greedy":
                    reference = out
                if round_:
                    runs.record(label, i, done, out == reference)
        print(f"round {round_} done, load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"load at end: {os.getloadavg()}")
    print("| arm | " + " | ".join(categories) + " | overall | identical |")
    print("|---" * (len(categories) + 3) + "|")
    for label, _, _ in arms:
        print(f"| {label} | " + " | ".join(runs.rates(label, prompts, categories))
              + f" | {runs.identical[label]}/{len(prompts) * args.repeats} |")


if __name__ == "__main__":
    main()
