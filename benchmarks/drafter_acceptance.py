"""How often an EAGLE drafter's guesses survive on Spec-Bench, whatever the machine's speed.

    python benchmarks/drafter_acceptance.py --drafter smollm2-135m-instruct --per-category 3 --draft 5

Greedy generation with a fixed draft length (no cost policy, so nothing depends on timings):
τ per category, P(accepted >= i), the share of target forwards whose draft kept at least ``i``
tokens, and "in vocab", the share of the target's tokens that the drafter's (possibly reduced)
vocabulary can propose at all: a ceiling on every guess. Use it to compare drafters; speedups come
from ``hf-speculative bench``.
"""

from __future__ import annotations

import argparse
import collections

import torch

from hf_speculative.bench.runner import SPEC_BENCH_CATEGORIES, encode_prompt, load_prompts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", default="smollm2-135m-instruct", help="folder or shipped drafter name")
    parser.add_argument("--dataset", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--categories", default=",".join(SPEC_BENCH_CATEGORIES))
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--draft", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    import hf_speculative as hfs

    torch.set_num_threads(1)
    model, tokenizer = hfs.load_model(args.model)
    hfs.enable(model)
    eagle = hfs.Eagle.from_pretrained(args.drafter, target=model, num_tokens=args.draft, confidence_threshold=0.0,
                                      adaptive=False)
    network = eagle.drafter
    proposable = network.t2d.bool() if network.config.reduced_vocab else None  # [V] target ids it can draft
    total: collections.Counter = collections.Counter()
    print(f"| category | τ | " + " | ".join(f"P(≥{i})" for i in range(1, args.draft + 1)) + " | in vocab |")
    print("|---|---|" + "---|" * (args.draft + 1))
    coverage_total: collections.Counter = collections.Counter()
    for category in args.categories.split(","):
        accepted: collections.Counter = collections.Counter()  # accepted length -> target forwards
        coverage: collections.Counter = collections.Counter()  # "in_vocab" / "tokens" of the greedy output
        for prompt in load_prompts(args.dataset, [category], args.per_category):
            ids = encode_prompt(tokenizer, prompt.text)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                 do_sample=False, candidate_generator=eagle)
            accepted.update(hfs.last_stats(model).accepted_lengths)
            new = out[0, ids.shape[1]:]  # [T] the target's greedy tokens
            coverage["in_vocab"] += len(new) if proposable is None else int(proposable[new].sum())
            coverage["tokens"] += len(new)
        total.update(accepted)
        coverage_total.update(coverage)
        print(_row(category, accepted, coverage, args.draft), flush=True)
    print(_row("overall", total, coverage_total, args.draft))


def _row(label: str, accepted: collections.Counter, coverage: collections.Counter, draft: int) -> str:
    forwards = sum(accepted.values())
    tau = 1 + sum(a * n for a, n in accepted.items()) / forwards
    at_least = [sum(n for a, n in accepted.items() if a >= i) / forwards for i in range(1, draft + 1)]
    in_vocab = coverage["in_vocab"] / max(coverage["tokens"], 1)
    return f"| {label} | {tau:.2f} | " + " | ".join(f"{p:.2f}" for p in at_least) + f" | {in_vocab:.2f} |"


if __name__ == "__main__":
    main()
