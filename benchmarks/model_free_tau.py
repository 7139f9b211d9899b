"""τ of the model-free tree drafters with their full trees at every step (``adaptive=False``): what they would
keep where verified rows are free (a GPU at batch size 1), measured on this CPU, where they are not.

    python benchmarks/model_free_tau.py --dataset hf_speculative/bench/data/repeated/question.jsonl \
        --max-new-tokens 96 --out benchmarks/results/2026-11-25-model-free-tau.json

Every output is checked against plain greedy token for token; the wall time of each call is recorded beside τ
(one thread, shared machine: times are indicative only).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import hf_speculative as hfs
from hf_speculative.bench.spec_bench import load_prompts
from hf_speculative.tooling.prompting import encode_prompt


def strategies() -> dict:
    return {
        "prompt-lookup-tree": hfs.PromptLookup(tree=hfs.DynamicTree(nodes=24, depth=10, top_k=4), adaptive=False),
        "suffix": hfs.SuffixDecoding(adaptive=False),
        "suffix-no-history": hfs.SuffixDecoding(adaptive=False, history_tokens=0),
        "lookahead": hfs.Lookahead(adaptive=False),
        "lookahead-jacobi-only": hfs.Lookahead(adaptive=False, text_ngrams=False),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--categories", default=None)
    parser.add_argument("--per-category", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = hfs.load_model("smollm2-135m-instruct")
    model = hfs.enable(model)
    prompts = load_prompts(args.dataset, args.categories.split(",") if args.categories else None, args.per_category)
    rows = []
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt.text, True)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        start = time.perf_counter()
        greedy = model.generate(**inputs, do_sample=False, max_new_tokens=args.max_new_tokens)
        row = {"question_id": prompt.question_id, "category": prompt.category,
               "new_tokens": greedy.shape[1] - ids.shape[1], "greedy_s": time.perf_counter() - start}
        for name, strategy in strategies().items():
            start = time.perf_counter()
            out = model.generate(**inputs, do_sample=False, max_new_tokens=args.max_new_tokens,
                                 candidate_generator=strategy)
            stats = hfs.last_stats(model)
            row[name] = {"seconds": time.perf_counter() - start, "tau": stats.new_tokens / stats.target_forwards,
                         "drafted": stats.drafted_tokens, "accepted": stats.accepted_tokens,
                         "identical": out.tolist() == greedy.tolist()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {}
    for name in strategies():
        tokens = sum(r["new_tokens"] for r in rows)
        forwards = sum(r["new_tokens"] / r[name]["tau"] for r in rows)
        summary[name] = {"tau": tokens / forwards, "speedup": sum(r["greedy_s"] for r in rows)
                         / sum(r[name]["seconds"] for r in rows),
                         "identical": all(r[name]["identical"] for r in rows)}
    print(json.dumps(summary, indent=1))
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "summary": summary, "max_new_tokens": args.max_new_tokens}, f, indent=1)


if __name__ == "__main__":
    main()
