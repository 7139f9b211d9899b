"""The draft model's long catch-up (its prefill on the prompt) weighed against the budget left, as before, against the
smaller of the budget left and the tokens the call has generated so far (the ski-rental rule of
``ChainLengthPolicy.catch_up_pays``), with plain decoding interleaved.

    cd benchmarks && python catch_up_ab.py [--repeats 2]

On the peers' Spec-Bench prompts (``--per-category`` per category, first turn, chat template), one thread, both models
in ``--dtype`` with ``hfs.optimize_for_cpu``: for every prompt, greedy and the draft model under each rule,
interleaved; each rule has its own copy of the drafter (the drafter's measured catch-up cost and acceptance, which the
rule reads, are kept per model). One untimed warm-up call per arm on the first prompt, then ``--repeats`` rounds;
medians. Every output is checked against greedy's of the round. Prints tokens/s per category and overall, τ and the
ratio to greedy.
"""

from __future__ import annotations

import argparse
import os

import torch

from ab_runs import Runs, kernel_target, peers_prompts  # (benchmarks/ is this script's path)


def budget_left_only(self, plan, tokens: int, length: int) -> bool:
    """The rule before the ski-rental change: the whole budget left is the rest of the call."""
    from hf_speculative.core.state import state_of
    from hf_speculative.drafters.draft_model.feed import LONG_CATCH_UP

    if tokens < LONG_CATCH_UP:
        return True
    state = state_of(self.drafter)
    per_token, step = state.catch_up_token_s, self.verify_costs.seconds(0)
    if per_token is None or not step:
        return True
    return plan.catch_up_pays(tokens * per_token / step, self.ctx.max_length - length, state.accept_rate)


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
    from hf_speculative.cpu.layout import follow_layout
    from hf_speculative.drafters.draft_model.drafter import DraftModelCandidateGenerator as Generator
    from hf_speculative.tooling.methods import run_method

    dtype = getattr(torch, args.dtype)
    model, tokenizer = kernel_target(args.model, dtype)
    categories, prompts, encoded = peers_prompts(tokenizer, args.per_category)
    rules = {"generated so far": Generator._catch_up_pays, "budget left": budget_left_only}
    arms = [("greedy", "greedy", {}, None)]
    for rule in rules:
        drafter, _ = hfs.load_model(args.draft_model, dtype=dtype)
        follow_layout(drafter, model, "exact")
        arms.append((f"draft model, {rule}", "draft-model", {"draft_model": drafter}, rule))
    runs = Runs()
    print(f"load at start: {os.getloadavg()}; prompt lengths {[int(ids.shape[1]) for ids in encoded]}", flush=True)
    try:
        for round_ in range(args.repeats + 1):  # round 0 warms every arm up on the first prompt
            for i, ids in enumerate(encoded if round_ else encoded[:1]):
                reference = None
                for label, method, options, rule in arms:
                    if rule is not None:
                        Generator._catch_up_pays = rules[rule]
                    done = run_method(method, model, tokenizer, ids, options=options,
                                      max_new_tokens=args.max_new_tokens)
                    out = list(done.output_ids)
                    reference = out if reference is None else reference
                    if round_:
                        runs.record(label, i, done, out == reference)
                if round_:
                    print(f"prompt {i} ({prompts[i].category}) done: "
                          + ", ".join(f"{label} {runs.seconds[label, i][-1]:.2f} s" for label, *_ in arms)
                          + f"; load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        Generator._catch_up_pays = rules["generated so far"]
    print(f"load at end: {os.getloadavg()}")
    print("\n".join(runs.table([label for label, *_ in arms], prompts, categories, lambda label: "greedy", "greedy",
                               args.repeats)))


if __name__ == "__main__":
    main()
