"""Where a prompt-lookup call's time goes on the CPU fast path (issue 48): cProfile over greedy calls with
``hfs.PromptLookup()`` on the kernel layout (``hfs.optimize_for_cpu(model, kernel=True)``), one thread.

    python benchmarks/profile_lookup_cpu.py [--categories summarization,rag,translation] [--prompts 4]

Prints the wall time of the same prompts with greedy and with prompt lookup (after a warm-up of each), the last
call's statistics, then the profile of one prompt-lookup pass sorted by own time and by cumulative time. A profile,
not a speed figure: cProfile slows Python-heavy code more than kernels (`hf-speculative bench` measures speed).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--categories", default="summarization,rag,translation")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rows", type=int, default=35, help="profile rows printed per ordering")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    import hf_speculative as hfs
    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.tooling.prompting import encode_prompt

    model, tokenizer = hfs.load_model(args.model)
    hfs.optimize_for_cpu(model, kernel=True)
    hfs.enable(model)
    wanted = args.categories.split(",")
    prompts = [p for p in load_prompts(per_category=2) if p.category in wanted][: args.prompts]
    inputs = [encode_prompt(tokenizer, p.text) for p in prompts]

    def run(strategy) -> None:
        for ids in inputs:
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                           do_sample=False, candidate_generator=strategy)

    run(hfs.PromptLookup())
    run(None)
    for name, strategy in (("greedy", None), ("prompt lookup", hfs.PromptLookup())):
        tick = time.perf_counter()
        run(strategy)
        print(f"{name}: {time.perf_counter() - tick:.2f} s")
    print(hfs.last_stats(model).summary())
    profile = cProfile.Profile()
    profile.enable()
    run(hfs.PromptLookup())
    profile.disable()
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(args.rows)
        print(out.getvalue())


if __name__ == "__main__":
    main()
