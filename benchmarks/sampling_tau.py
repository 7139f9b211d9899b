"""τ under sampling on Spec-Bench prompts: how often drafts match the target's draws, by drafter.

    python benchmarks/sampling_tau.py --per-category 4 --seeds 3 --temperature 0.7 --out sampling_tau.jsonl
    python benchmarks/sampling_tau.py --modes seeded,rejection ...     # both rules (speculative_sampling=)
    python benchmarks/sampling_tau.py --model qwen2.5-coder-1.5b-instruct --draft-model qwen2.5-coder-0.5b-instruct \
        --methods draft-model,lookup --modes seeded,rejection --device cuda           # the Qwen draft-model pair

Resumable: ``--resume`` keeps the prompts whose rows ``--out`` already holds at this temperature (every method and
mode asked, as many seeds) and runs the others, the summary pooling both; ``--no-timing`` runs no plain sampling and
times nothing (τ only: what does not depend on the machine's load, so it may run beside other work).
``--prompt-seeds`` seeds each prompt's calls with seeds of its own: the seeded rule keys its noise by absolute
position, so with the same few seeds for every prompt the prompts share noise fields and are not independent samples.

Uses only the public API (``torch.manual_seed`` then ``generate(do_sample=True, ...)``), so the same script
measures any version of the library: run it from two checkouts to compare their sampling rules. Drafters run
with fixed draft lengths (``adaptive=False``), so τ does not depend on this machine's timings. Every call is timed
after an untimed warm-up call of each arm, and plain sampling (no drafter, same seed) runs before each prompt's
drafted calls: the summary gives each method's tokens/s over plain's, pooled, and the median of the per-prompt
ratios (rows keep each prompt's tokens and seconds by arm); a speed figure only on a quiet machine or a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def strategies(hfs, model, args):
    made = {"lookup": lambda: hfs.PromptLookup(num_tokens=5, adaptive=False)}
    if any(m.startswith("eagle") for m in args.methods.split(",")):  # the shipped drafter fits SmolLM2 only
        eagle = hfs.Eagle.from_pretrained(args.drafter, target=model).drafter
        made["eagle-chain5"] = lambda: hfs.Eagle(eagle, num_tokens=5, confidence_threshold=0.0, adaptive=False)
        made["eagle-tree32"] = lambda: hfs.Eagle(eagle, adaptive=False,
                                                 tree=hfs.DynamicTree(nodes=32, depth=8, top_k=8))
    if "draft-model" in args.methods:
        if not args.draft_model:
            raise SystemExit("--methods draft-model needs --draft-model NAME (a registry model or a folder)")
        draft, _ = hfs.load_model(args.draft_model, device=None if args.device == "cpu" else args.device)
        made["draft-model"] = lambda: hfs.DraftModel(draft, num_tokens=5, confidence_threshold=0.0, adaptive=False)
    if "medusa-tree" in args.methods:
        heads = hfs.Medusa.from_pretrained(args.drafter, target=model, tree="calibrated")
        made["medusa-tree"] = lambda: hfs.Medusa(heads.heads, tree=heads.tree, adaptive=False)
    return made


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", default="smollm2-135m-instruct")
    parser.add_argument("--categories", default="mt-bench,translation,summarization,qa,math_reasoning,rag")
    parser.add_argument("--per-category", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--methods", default="eagle-chain5,eagle-tree32,lookup",
                        help="of eagle-chain5, eagle-tree32, lookup, medusa-tree, draft-model")
    parser.add_argument("--modes", default="", help="speculative_sampling= rules to compare, e.g. seeded,rejection "
                        "(default: none passed, the library's default)")
    parser.add_argument("--draft-model", default="", help="the draft model of --methods draft-model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="sampling_tau.jsonl")
    parser.add_argument("--resume", action="store_true",
                        help="skip the prompts --out already holds at this temperature (all methods, as many seeds)")
    parser.add_argument("--no-timing", action="store_true", help="τ only: no plain sampling, no speed figures")
    parser.add_argument("--prompt-seeds", action="store_true",
                        help="seed each call with (question id, seed) instead of the seed alone: the seeded rule's "
                        "noise is keyed by absolute position, so with shared seeds every prompt of the grid reads "
                        "the same few noise fields and the prompts are not independent samples")
    args = parser.parse_args(argv)
    if args.prompt_seeds and args.seeds > 1000:
        parser.error(f"--prompt-seeds keys seeds as question id * 1000 + seed: give --seeds 1000 or fewer, not "
                     f"{args.seeds}")

    import time

    import hf_speculative as hfs
    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.tooling.prompting import encode_prompt

    torch.set_num_threads(1)
    model, tokenizer = hfs.load_model(args.model, device=None if args.device == "cpu" else args.device)

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    hfs.enable(model)
    made = strategies(hfs, model, args)
    modes = [m for m in args.modes.split(",") if m] or [None]
    runs = [(method, mode) for method in args.methods.split(",") for mode in modes]
    methods = [method if mode is None else f"{method}/{mode}" for method, mode in runs]
    totals = {m: [0, 0, 0, 0] for m in methods}  # new tokens, target forwards, drafted, accepted
    seconds = {m: [0, 0.0] for m in ["plain", *methods]}  # new tokens, wall seconds
    done = finished(args, methods) if args.resume else {}

    def sample(ids, name, mode, max_new_tokens):  # one sampled call: plain when name is None, else the arm's drafter
        extra = {} if mode is None else {"speculative_sampling": mode}
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                              temperature=args.temperature, max_new_tokens=max_new_tokens,
                              candidate_generator=None if name is None else made[name](), **extra)

    if not args.no_timing:  # untimed warm-up of every arm: one-time costs (allocations, kernel setup) stay out
        warm_ids = encode_prompt(tokenizer, "Hello").to(model.device)
        for name, mode in [(None, None), *runs]:
            sample(warm_ids, name, mode, 8)
    prompt_rows = []  # the rows this run wrote (timed ones carry seconds)
    for prompt in load_prompts(categories=args.categories.split(","), per_category=args.per_category):
        if prompt.question_id in done:  # --resume: counted from --out, not run again
            for method in methods:
                for counts in done[prompt.question_id]["counts"][method]:
                    totals[method] = [a + b for a, b in zip(totals[method], counts)]
            continue
        ids = encode_prompt(tokenizer, prompt.text).to(model.device)
        timed_here = {m: [0, 0.0] for m in seconds}  # this prompt's new tokens and wall seconds, by arm
        for seed in range(0 if args.no_timing else args.seeds):  # plain sampling, the speed baseline
            torch.manual_seed(call_seed(args, prompt.question_id, seed))
            sync()
            start = time.perf_counter()
            out = sample(ids, None, None, args.max_new_tokens)
            sync()
            timed_here["plain"][0] += out.shape[1] - ids.shape[1]
            timed_here["plain"][1] += time.perf_counter() - start
        record = {"category": prompt.category, "question_id": prompt.question_id, "temperature": args.temperature,
                  "max_new_tokens": args.max_new_tokens, "counts": {}}
        if args.prompt_seeds:
            record["prompt_seeds"] = True
        for method, (name, mode) in zip(methods, runs):
            for seed in range(args.seeds):
                torch.manual_seed(call_seed(args, prompt.question_id, seed))
                sync()
                start = time.perf_counter()
                sample(ids, name, mode, args.max_new_tokens)
                sync()
                timed_here[method][1] += time.perf_counter() - start
                st = hfs.last_stats(model)
                timed_here[method][0] += st.new_tokens
                counts = [st.new_tokens, st.target_forwards, st.drafted_tokens, st.accepted_tokens]
                totals[method] = [a + b for a, b in zip(totals[method], counts)]
                record.setdefault(method, []).append(st.tau)
                record["counts"].setdefault(method, []).append(counts)
        for m, (new, wall) in timed_here.items():
            seconds[m] = [seconds[m][0] + new, seconds[m][1] + wall]
        if not args.no_timing:  # this prompt's [new tokens, wall seconds] by arm, for per-prompt ratios
            record["seconds"] = {m: [new, round(wall, 4)] for m, (new, wall) in timed_here.items()}
        print(prompt.category, prompt.question_id, {m: [round(t, 2) for t in record[m]] for m in methods}, flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
        prompt_rows.append(record)
    timed = seconds["plain"][1] > 0
    plain_rate = seconds["plain"][0] / max(seconds["plain"][1], 1e-9)
    if timed:
        print(f"plain sampling: {plain_rate:.2f} tokens/s (this run's prompts only)")
    ratios = prompt_ratios(prompt_rows, methods) if timed else {}
    for method, (new, forwards, drafted, accepted) in totals.items():
        line = (f"{method}: tau {new / max(forwards, 1):.3f} (tokens over forwards, pooled), acceptance "
                f"{accepted / max(drafted, 1):.3f}, {new} tokens")
        if timed and seconds[method][1] > 0:
            rate = seconds[method][0] / seconds[method][1]
            line += f"; {rate:.2f} tokens/s, {rate / plain_rate:.3f}x plain"
            if ratios.get(method):
                line += f" (median over {len(ratios[method])} prompts {statistics.median(ratios[method]):.3f}x)"
        print(line)


def prompt_ratios(rows: list[dict], methods: list[str]) -> dict[str, list[float]]:
    """Each method's speed over plain sampling's, prompt by prompt (tokens/s over tokens/s), from rows with seconds."""
    ratios = {m: [] for m in methods}
    for row in rows:
        timed = row.get("seconds", {})
        new, wall = timed.get("plain", (0, 0.0))
        if not wall:
            continue
        for m in methods:
            if timed.get(m, (0, 0.0))[1]:
                ratios[m].append((timed[m][0] / timed[m][1]) / (new / wall))
    return ratios


def call_seed(args, question_id: int, seed: int) -> int:
    """The seed set before a call: ``seed``, or with ``--prompt-seeds`` one of the prompt's own."""
    return question_id * 1000 + seed if args.prompt_seeds else seed


def finished(args, methods: list[str]) -> dict:
    """``--resume``: the rows of ``--out`` at this temperature and length, seeded the same way (``--prompt-seeds``),
    that hold every method with counts for ``--seeds`` seeds, by question id."""
    rows = {}
    try:
        with open(args.out) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return rows
    for row in lines:
        counts = row.get("counts", {})
        if (row.get("temperature") == args.temperature and row.get("max_new_tokens") == args.max_new_tokens
                and row.get("prompt_seeds", False) == getattr(args, "prompt_seeds", False)
                and all(len(counts.get(m, [])) == args.seeds for m in methods)):
            rows[row["question_id"]] = row
    return rows


if __name__ == "__main__":
    main()
