"""Which loop should verify chains by default: hf_speculative's own, or transformers' assisted loop?

    python benchmarks/loop_vs_assisted.py [--per-category 2] [--new-tokens 128] [--methods prompt-lookup,eagle]

The same strategies through ``generate()`` twice, ``speculative_loop="hf_speculative"`` (the default) and
``speculative_loop="transformers"``, on Spec-Bench prompts (first turn, chat template), interleaved with plain
greedy per prompt, one thread; after one warm-up prompt, every (prompt, route) runs ``--repeats`` times and the
median is kept. Every output is checked against greedy. Prints per route: median tokens/s, the median of per-prompt
speedups over greedy, mean tau. Run it alone on a quiet machine (check ``uptime``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", default="prompt-lookup,eagle")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import hf_speculative as hfs
    from hf_speculative.bench.spec_bench import DATASET
    from hf_speculative.tooling.methods import get_method, pad_token_id
    from hf_speculative.tooling.prompting import encode_prompt

    model, tok = hfs.load_model("smollm2-135m-instruct")
    hfs.enable(model)
    questions = [json.loads(line) for line in open(DATASET)]
    cats: dict[str, list] = {}
    for q in questions:
        cat = q["category"] if q["category"] in {"translation", "summarization", "qa", "math_reasoning", "rag"} \
            else "mt-bench"
        cats.setdefault(cat, []).append(q)
    prompts = [q for qs in cats.values() for q in qs[: args.per_category]]
    methods = args.methods.split(",")
    routes = [(m, loop) for m in methods for loop in ("hf_speculative", "transformers")]
    speeds: dict = {r: [] for r in [("greedy", None), *routes]}
    ratios: dict = {r: [] for r in routes}
    taus: dict = {r: [] for r in routes}
    pad = pad_token_id(model, tok)

    def timed(kwargs):
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                                 do_sample=False, pad_token_id=pad, **kwargs)
        return out, time.perf_counter() - start

    for index, q in enumerate([prompts[0], *prompts]):
        warm = index == 0
        ids = encode_prompt(tok, q["turns"][0])
        seconds: dict = {r: [] for r in speeds}
        for _ in range(1 if warm else args.repeats):
            greedy, t = timed({"candidate_generator": None})
            seconds[("greedy", None)].append(t)
            for method, loop in routes:
                extra = get_method(method).build(model, tok, {})
                out, t = timed({**extra, "speculative_loop": loop})
                assert out[0].tolist() == greedy[0].tolist(), (q["question_id"], method, loop)
                seconds[(method, loop)].append(t)
                if not warm:
                    taus[(method, loop)].append(hfs.last_stats(model).tau)
        if warm:
            continue
        new = greedy.shape[1] - ids.shape[1]
        for r, values in seconds.items():
            speeds[r].append(new / statistics.median(values))
        for r in routes:
            ratios[r].append(statistics.median(seconds[("greedy", None)]) / statistics.median(seconds[r]))
        print(q["category"], {f"{m}/{loop}": round(speeds[(m, loop)][-1], 1) for m, loop in speeds}, flush=True)
    summary = {f"{m}/{loop}": {"tok_s": round(statistics.median(v), 2),
                                "speedup": None if loop is None else round(statistics.median(ratios[(m, loop)]), 3),
                                "tau": None if loop is None else round(statistics.mean(taus[(m, loop)]), 2)}
               for (m, loop), v in speeds.items()}
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"prompts": len(prompts), "new_tokens": args.new_tokens, "repeats": args.repeats,
                       "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
