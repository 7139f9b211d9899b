"""τ and speed of draft trees in hf_speculative's own loop, by node budget, on Spec-Bench prompts.

    python benchmarks/tree_tau.py --per-category 10 --budgets chain5,4,8,16,32,64 --out tree_tau.jsonl
    python benchmarks/tree_tau.py --budgets chain5,32,medusa-chain4,medusa4,medusa8,medusa16,medusa32,medusa64

    python benchmarks/tree_tau.py --bench-out tree_tau_bench.jsonl --budgets chain5,8,16,32,dflash-chain5,dflash8,
        dflash16,dflash32,auto-chain,auto-32,auto-dflash-chain,auto-dflash32   (one list; then hf-speculative project)

Budgets: ``chainK`` (EAGLE chain of K), ``N`` (EAGLE dynamic tree of N nodes), ``lookupN`` (prompt-lookup tree),
``medusa-chainK`` (Medusa heads' top guesses, K at most), ``medusaN`` (the first N rank paths of the tree the heads
were calibrated with), ``dflash-chainK`` / ``dflashN`` (the DFlash block drafter's chain of K, its dynamic tree of N
nodes, the same shapes as EAGLE's). ``auto-`` before a budget lets the cost model choose each step's size up to it
(as ``--adaptive`` does for every budget); ``auto-chain`` and ``auto-dflash-chain`` are the drafters' default chains.
Each record holds the drafting and verification ms per step. With Medusa budgets each record also holds every
head's top-1 agreement with the target, teacher-forced on greedy's own output (``head_top1``: head k guesses the
token k+1 places after the state it reads).

Every method runs through the same loop (the ladder with an open drafter: ``tests/core/loop_harness.py``) with
``adaptive=False`` (fixed budgets, for measurement) or the cost-chosen budget (``--adaptive``); greedy is plain ``generate`` in the same run,
interleaved prompt by prompt. Each output is checked token for token against greedy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch


def make_strategy(hfs, drafter, budget: str, adaptive: bool, shapes, medusa=None, dflash=None):
    if budget == "auto-chain":  # the drafters' defaults: chains the cost model sizes (to nothing where none pays)
        return hfs.Eagle(drafter)
    if budget == "auto-dflash-chain":
        return hfs.DFlash(dflash)
    if budget.startswith("auto-"):
        return make_strategy(hfs, drafter, budget[5:], True, shapes, medusa, dflash)
    if budget.startswith("dflash-chain"):
        return hfs.DFlash(dflash, num_tokens=int(budget[12:]), confidence_threshold=0.0, adaptive=adaptive)
    if budget.startswith("dflash"):
        nodes = int(budget[6:])
        return hfs.DFlash(dflash, adaptive=adaptive,
                          tree=shapes.DynamicTree(nodes=nodes, depth=min(8, max(3, nodes // 4)), top_k=min(8, nodes)))
    if budget.startswith("medusa-chain"):
        return hfs.Medusa(medusa.heads, num_tokens=int(budget[12:]), confidence_threshold=0.0, adaptive=adaptive)
    if budget.startswith("medusa"):
        return hfs.Medusa(medusa.heads, tree=hfs.StaticTree(medusa.tree.paths[:int(budget[6:])]), adaptive=adaptive)
    if budget.startswith("chain"):
        return hfs.Eagle(drafter, num_tokens=int(budget[5:]), confidence_threshold=0.0, adaptive=adaptive)
    if budget.startswith("lookup"):
        return hfs.PromptLookup(tree=shapes.DynamicTree(nodes=int(budget[6:]), depth=8, top_k=4), adaptive=adaptive)
    nodes = int(budget)
    return hfs.Eagle(drafter, adaptive=adaptive,
                     tree=shapes.DynamicTree(nodes=nodes, depth=min(8, max(3, nodes // 4)), top_k=min(8, nodes)))


@torch.no_grad()
def head_ranks(model, heads, sequence: torch.Tensor, prompt_length: int) -> list[list[int]]:
    """``ranks[i][k]``: at the state ``q = prompt_length - 1 + i`` (the one that gave token ``q + 1``), the rank of
    token ``q + k + 2`` of ``sequence`` `[1, T]` among head k's guesses (0: its top guess), teacher-forced on the
    text; positions past the end are left out (shorter lists)."""
    final = model(sequence, output_hidden_states=True).hidden_states[-1][0]  # [T, H], after the final norm
    head = model.get_output_embeddings()
    T = sequence.shape[1]
    ranks: list[list[int]] = [[] for _ in range(prompt_length - 1, T - 1)]
    for k in range(heads.config.num_heads):
        states = final[prompt_length - 1: T - k - 2]  # [N, H]
        if states.shape[0] == 0:
            continue
        labels = sequence[0, prompt_length + k + 1:]  # [N]
        logits = heads.head_logits(states, k, head).float()  # [N, V]
        rank = (logits > logits.gather(1, labels[:, None])).sum(-1)  # [N]
        for i, r in enumerate(rank.tolist()):
            ranks[i].append(r)
    return ranks


def head_top1(ranks: list[list[int]], num_heads: int) -> list[list[int]]:
    """``[[hits, guesses]]`` per head from :func:`head_ranks`."""
    return [[sum(1 for r in ranks if len(r) > k and r[k] == 0), sum(1 for r in ranks if len(r) > k)]
            for k in range(num_heads)]


def simulated_tau(ranks: list[list[int]], paths, prompt_length: int, length: int) -> float:
    """τ of greedy decoding to ``length`` tokens with a static tree of rank ``paths`` verified whole at every step,
    from the teacher-forced ranks (exact for greedy: each step keeps the longest prefix of the true tokens' rank
    path that is in the tree, and the heads read the states the target gives the kept text)."""
    tree = set(map(tuple, paths))
    verified, forwards = prompt_length + 1, 1  # the prompt's forward gives the first token
    while verified < length:
        r = ranks[verified - 2 - (prompt_length - 1)]
        depth = 0
        while depth < min(len(r), length - verified - 1) and tuple(r[: depth + 1]) in tree:
            depth += 1
        verified += depth + 1
        forwards += 1
    return (length - prompt_length) / forwards


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", default="smollm2-135m-instruct")
    parser.add_argument("--medusa", default="smollm2-135m-instruct", help="Medusa heads for medusa* budgets")
    parser.add_argument("--dflash", default="smollm2-135m-instruct", help="DFlash drafter for dflash* budgets")
    parser.add_argument("--dataset", default=None, help="Spec-Bench question.jsonl (default: the package's copy)")
    parser.add_argument("--categories", default="mt-bench,translation,summarization,qa,math_reasoning,rag")
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--budgets", default="chain5,4,8,16,32,64")
    parser.add_argument("--adaptive", action="store_true", help="the cost model chooses the budget per step")
    parser.add_argument("--head-top1", action="store_true", help="each Medusa head's top-1 on greedy's output, "
                        "also without medusa budgets")
    parser.add_argument("--out", default="tree_tau.jsonl")
    parser.add_argument("--resume", action="store_true", help="skip the prompts --out holds already (a run stopped "
                        "early goes on where it stopped; each prompt's greedy is timed again beside its budgets)")
    parser.add_argument("--bench-out", default=None, help="also write every run as `hf-speculative bench` rows (the "
                        "budget as the method, greedy as the baseline, per-step records) for `hf-speculative project`")
    args = parser.parse_args(argv)

    import hf_speculative as hfs
    from hf_speculative.core import tree_shapes as shapes
    from hf_speculative.core.call import CallContext
    from hf_speculative.bench.runner import environment
    from hf_speculative.bench.spec_bench import DATASET, load_prompts
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests/ holds the harness
    from tests.core.loop_harness import run
    from hf_speculative.tooling.prompting import encode_prompt
    from hf_speculative.core.stats import SpeculativeStats
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

    torch.set_num_threads(1)
    model, tokenizer = hfs.load_model(args.model)
    drafter = hfs.Eagle.from_pretrained(args.drafter, target=model).drafter
    budgets = [b for b in args.budgets.split(",") if b]  # none: greedy only (with --head-top1)
    dflash = None
    if any("dflash" in b for b in budgets):
        dflash = hfs.DFlash.from_pretrained(args.dflash, target=model).network
    medusa = None
    if args.head_top1 or any(b.startswith("medusa") for b in budgets):
        medusa = hfs.Medusa.from_pretrained(args.medusa, target=model, tree="calibrated")
    results = []
    run_id = time.strftime("tree_tau-%Y%m%d-%H%M%S")
    machine = environment(model)
    prompts = load_prompts(args.dataset or DATASET, args.categories.split(","), args.per_category)
    # round robin over the categories: a run stopped early still covers every category alike
    rank = {id(p): i for c in {p.category for p in prompts}
            for i, p in enumerate(q for q in prompts if q.category == c)}
    done = set()
    if args.resume and os.path.exists(args.out):
        with open(args.out) as f:
            done = {json.loads(line)["question_id"] for line in f if line.strip()}
    for prompt in sorted(prompts, key=lambda p: rank[id(p)]):
        if prompt.question_id in done:
            continue
        ids = encode_prompt(tokenizer, prompt.text)
        max_length = ids.shape[1] + args.max_new_tokens
        start = time.perf_counter()
        greedy = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=args.max_new_tokens)
        greedy_s = time.perf_counter() - start
        record = {"category": prompt.category, "question_id": prompt.question_id, "greedy_s": greedy_s,
                  "new_tokens": greedy.shape[1] - ids.shape[1]}
        common = {"category": prompt.category, "question_id": prompt.question_id, "input_tokens": ids.shape[1],
                  "run_id": run_id, "max_new_tokens": args.max_new_tokens, **machine}
        rows = [{**common, "method": "greedy", "seconds": greedy_s, "new_tokens": record["new_tokens"]}]
        if medusa is not None:
            ranks = head_ranks(model, medusa.heads, greedy, ids.shape[1])
            record["head_top1"] = head_top1(ranks, medusa.heads.config.num_heads)
            record["simulated_tau"] = {str(n): simulated_tau(ranks, medusa.tree.paths[:n], ids.shape[1],
                                                             greedy.shape[1]) for n in (1, 2, 4, 8, 16, 32, 64)}
            record["simulated_tau"]["chain"] = simulated_tau(ranks, [(0,) * d for d in range(1, 5)], ids.shape[1],
                                                             greedy.shape[1])
        for budget in budgets:
            stopping = StoppingCriteriaList([MaxLengthCriteria(max_length),
                                             EosTokenCriteria(model.generation_config.eos_token_id)])
            ctx = CallContext(model, model.generation_config, None, stopping, SpeculativeStats(),
                              prompt_length=ids.shape[1])
            loop_drafter = (make_strategy(hfs, drafter, budget, args.adaptive, shapes, medusa, dflash).open(ctx))
            start = time.perf_counter()
            try:
                out = run(model, ids, loop_drafter, stopping_criteria=stopping, stats=ctx.stats, max_length=max_length)
            finally:
                loop_drafter.close()
            seconds = time.perf_counter() - start
            per_step = out.stats.steps()  # the first step's draft also reads the prompt (DFlash: its features)
            drafting = [s for n, s in zip(per_step["drafted"], per_step["draft_s"]) if n] or [0.0]
            record[budget] = {"tau": out.stats.tau, "seconds": seconds, "speedup": greedy_s / seconds,
                              "draft_ms": 1000 * statistics.median(drafting),  # a step that drafted, typically
                              "draft_ms_mean": 1000 * out.stats.draft_time_s / max(len(per_step["drafted"]), 1),
                              "verify_ms": 1000 * statistics.median(per_step["verify_s"] or [0.0]),
                              "identical": out.sequences[0].tolist() == greedy[0].tolist(),
                              "accepted_lengths": dict(out.stats.accepted_lengths)}
            rows.append({**common, "method": budget, "seconds": seconds, "new_tokens": out.stats.new_tokens,
                         "tau": out.stats.tau, "shape": "chain" if "chain" in budget else "tree",
                         "steps": out.stats.steps()})
        results.append(record)
        print(prompt.category, prompt.question_id, {b: (round(record[b]["tau"], 2), round(record[b]["speedup"], 2),
                                                 record[b]["identical"]) for b in budgets}, flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
        if args.bench_out:
            with open(args.bench_out, "a") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
    if args.resume:  # the table covers the whole run, the prompts of earlier invocations included
        with open(args.out) as f:
            results = [r for r in map(json.loads, filter(str.strip, f)) if all(b in r for b in budgets)]
    if not results:
        print("no prompts run")
        return
    print("\ncells: τ (pooled) / median speed against greedy / median over prompts of the median drafting ms of a "
          "step that drafted")
    print("\n| category | " + " | ".join(budgets) + " |\n|---|" + "---|" * len(budgets))
    for category in args.categories.split(",") + ["overall"]:
        picked = [r for r in results if category in ("overall", r["category"])]
        cells = []
        for b in budgets:
            tau = sum(r[b]["tau"] * r["new_tokens"] / r[b]["tau"] for r in picked) / max(
                sum(r["new_tokens"] / r[b]["tau"] for r in picked), 1e-9)  # tokens over forwards, pooled
            speed = statistics.median(r[b]["speedup"] for r in picked)
            draft_ms = statistics.median(r[b]["draft_ms"] for r in picked)
            cells.append(f"τ {tau:.2f} / {speed:.2f}× / {draft_ms:.1f} ms")
        print(f"| {category} | " + " | ".join(cells) + " |")
    if medusa is not None:
        hits = [sum(r["head_top1"][k][0] for r in results) for k in range(medusa.heads.config.num_heads)]
        seen = [sum(r["head_top1"][k][1] for r in results) for k in range(medusa.heads.config.num_heads)]
        print("Medusa head top-1 on greedy's output:", [f"{h / max(n, 1):.3f}" for h, n in zip(hits, seen)])
        tokens = sum(r["new_tokens"] for r in results)
        print("simulated τ (static tree of the first n calibrated paths, verified whole):",
              {n: round(tokens / sum(r["new_tokens"] / r["simulated_tau"][n] for r in results), 3)
               for n in results[0]["simulated_tau"]})
    print("identical:", sum(all(r[b]["identical"] for b in budgets) for r in results), "/", len(results))


if __name__ == "__main__":
    main()
