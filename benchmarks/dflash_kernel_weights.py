"""DFlash's network on PyTorch's products (as before it followed the target), or on the CPU kernel with exact or int8
copies (``hfs.DFlash(kernel_weights=...)``), the target on the kernel (``all+kernel``), one thread: drafting ms and τ.

    python benchmarks/dflash_kernel_weights.py --per-category 2 --repeats 3

Spec-Bench's mt-bench, qa, math_reasoning and translation prompts, fixed blocks of ``--num-tokens``; the settings
alternate prompt by prompt (their order reversed every other repeat), the first repeat a warm-up. Prints each
setting's median drafting ms of a step that drafted, τ, and its summed seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
from unittest import mock

import torch

CATEGORIES = ["mt-bench", "qa", "math_reasoning", "translation"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="the first is a warm-up")
    parser.add_argument("--num-tokens", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)

    import hf_speculative as hfs
    from hf_speculative.bench.spec_bench import DATASET, load_prompts
    from hf_speculative.cpu.layout import apply_layout
    from hf_speculative.drafters.dflash import drafter as dflash_drafter
    from hf_speculative.tooling.prompting import encode_prompt

    torch.set_num_threads(1)
    model, tokenizer = hfs.load_model("smollm2-135m-instruct")
    apply_layout(model, "all+kernel")
    hfs.enable(model)
    fixed = {"num_tokens": args.num_tokens, "adaptive": False, "confidence_threshold": 0.0}
    shipped = hfs.DFlash.from_pretrained("smollm2-135m-instruct", target=model, **fixed).network
    hfs.optimize_for_cpu(shipped, False)  # back on PyTorch's products: the "pytorch" setting, and the copies' source
    strategies = {"pytorch": hfs.DFlash(shipped, **fixed)}
    for weights in ("exact", "int8"):
        strategies[weights] = hfs.DFlash(copy.deepcopy(shipped), kernel_weights=weights, **fixed)
    prompts = load_prompts(DATASET, CATEGORIES, args.per_category)
    results = {name: {"draft": [], "seconds": 0.0, "tokens": 0, "forwards": 0} for name in strategies}
    for repeat in range(args.repeats):
        for prompt in prompts:
            ids = encode_prompt(tokenizer, prompt.text)
            for name in (list(strategies) if repeat % 2 == 0 else list(strategies)[::-1]):
                # "pytorch": the network as it ran before it followed the target (its open() lays out nothing)
                left = mock.patch.object(dflash_drafter, "follow_layout", lambda *a: 0) if name == "pytorch" else \
                    contextlib.nullcontext()
                with left:
                    start = time.perf_counter()
                    model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=args.max_new_tokens, candidate_generator=strategies[name])
                    seconds = time.perf_counter() - start
                if repeat == 0:
                    continue
                stats = hfs.last_stats(model)
                steps = stats.steps()
                result = results[name]
                result["draft"] += [s for n, s in zip(steps["drafted"], steps["draft_s"]) if n]
                result["seconds"] += seconds
                result["tokens"] += stats.new_tokens
                result["forwards"] += stats.target_forwards
    for name, result in results.items():
        print(f"{name}: drafting {1000 * statistics.median(result['draft']):.2f} ms a step that drafted, "
              f"tau {result['tokens'] / result['forwards']:.3f}, {result['seconds']:.2f} s")


if __name__ == "__main__":
    main()
