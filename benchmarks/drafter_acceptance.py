"""How often an EAGLE drafter's guesses survive on Spec-Bench, whatever the machine's speed.

    python benchmarks/drafter_acceptance.py --drafter smollm2-135m-instruct --per-category 3 --draft 5

Greedy generation with drafts of up to ``--draft`` tokens and no cost rule, so nothing depends on
timings (the longest draft drops by one after a rejection and grows by two after a fully kept draft,
transformers' "heuristic" schedule; ``benchmarks/tree_potential.py`` gives truly fixed chains):
τ per category, P(accepted >= i), the share of target forwards whose draft kept at least ``i``
tokens, "in vocab", the share of the target's tokens that the drafter's (possibly reduced)
vocabulary can propose at all: a ceiling on every guess, and how sure the target itself is of its
greedy tokens: "target p" (the mean probability it gives the token it picks) and "p < 0.5" (the
share of near coin flips, which no cheap drafter predicts reliably). Use it to compare drafters
and to judge how predictable a target is; speedups come from ``hf-speculative bench``.

``--by-confidence`` adds a second table: the drafter's first guess for every greedy token, teacher
forced (read from the target's true features, as right after a verification), by how sure the
target was of that token.
"""

from __future__ import annotations

import argparse
import collections

import torch

from hf_speculative.bench.spec_bench import DATASET, SPEC_BENCH_CATEGORIES, load_prompts
from hf_speculative.tooling.prompting import encode_prompt


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", default="smollm2-135m-instruct", help="folder or shipped drafter name")
    parser.add_argument("--dataset", default=str(DATASET), help="Spec-Bench question.jsonl (default: the shipped one)")
    parser.add_argument("--categories", default=",".join(SPEC_BENCH_CATEGORIES))
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--draft", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--by-confidence", action="store_true",
                        help="also: the first guess's agreement with the target by the target's confidence")
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
    columns = ["category", "τ", *(f"P(≥{i})" for i in range(1, args.draft + 1)), "in vocab", "target p", "p < 0.5"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    coverage_total: collections.Counter = collections.Counter()
    agreement: collections.Counter = collections.Counter()  # (bucket, "tokens" | "kept") -> count
    for category in args.categories.split(","):
        accepted: collections.Counter = collections.Counter()  # accepted length -> target forwards
        coverage: collections.Counter = collections.Counter()  # of the greedy output: "in_vocab", "tokens",
        # "p_sum" (the target's probability of its own token, summed) and "unsure" (tokens with p < 0.5)
        for prompt in load_prompts(args.dataset, [category], args.per_category):
            ids = encode_prompt(tokenizer, prompt.text)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                 do_sample=False, candidate_generator=eagle, output_scores=True,
                                 return_dict_in_generate=True)
            accepted.update(hfs.last_stats(model).accepted_lengths)
            new = out.sequences[0, ids.shape[1]:]  # [T] the target's greedy tokens
            sure = torch.softmax(torch.cat(out.scores).float(), dim=-1).max(-1).values  # [T] p of each greedy token
            coverage["p_sum"] += float(sure.sum())
            coverage["unsure"] += int((sure < 0.5).sum())
            coverage["in_vocab"] += len(new) if proposable is None else int(proposable[new].sum())
            coverage["tokens"] += len(new)
            if args.by_confidence:
                agreement.update(_first_guess_by_confidence(model, network, out.sequences, ids.shape[1], sure))
        total.update(accepted)
        coverage_total.update(coverage)
        print(_row(category, accepted, coverage, args.draft), flush=True)
    print(_row("overall", total, coverage_total, args.draft))
    if args.by_confidence:
        tokens = sum(n for (_, kind), n in agreement.items() if kind == "tokens")
        print("\n| target p of its token | share of tokens | first guess kept (teacher forced) |\n|---|---|---|")
        for label, _ in BUCKETS:
            n = agreement[label, "tokens"]
            print(f"| {label} | {n / max(tokens, 1):.2f} | {agreement[label, 'kept'] / max(n, 1):.2f} |")


BUCKETS = [("≥ 0.9", 0.9), ("0.5-0.9", 0.5), ("< 0.5", 0.0)]  # label, lower bound


@torch.no_grad()
def _first_guess_by_confidence(model, network, sequence: torch.Tensor, prompt_length: int,
                               sure: torch.Tensor) -> collections.Counter:
    """For each greedy token ``y_t`` (``sequence`` `[1, T]`, ``sure`` `[T - prompt_length]` its target
    probability): whether the drafter's step-0 guess from anchor ``t - 2`` is ``y_t``, by bucket of ``sure``."""
    from hf_speculative.core.features import tapped_features
    from hf_speculative.training.losses import unroll

    features = tapped_features(model, network.config.target_layers, sequence)  # [1, T, F]
    anchors = torch.arange(prompt_length - 2, sequence.shape[1] - 2)  # [A]: anchor p guesses the token at p + 2
    hidden = unroll(network, model.get_input_embeddings(), sequence, features, 1, anchors=anchors)[0]
    guess = network.to_target_ids(network.draft_logits(hidden[0], model.get_output_embeddings()).argmax(-1))  # [A]
    kept = guess == sequence[0, anchors + 2]
    counts: collections.Counter = collections.Counter()
    for p, ok in zip(sure.tolist(), kept.tolist()):
        label = next(name for name, low in BUCKETS if p >= low)
        counts[label, "tokens"] += 1
        counts[label, "kept"] += int(ok)
    return counts


def _row(label: str, accepted: collections.Counter, coverage: collections.Counter, draft: int) -> str:
    forwards = sum(accepted.values())
    tau = 1 + sum(a * n for a, n in accepted.items()) / forwards
    at_least = [sum(n for a, n in accepted.items() if a >= i) / forwards for i in range(1, draft + 1)]
    tokens = max(coverage["tokens"], 1)
    shares = [coverage["in_vocab"] / tokens, coverage["p_sum"] / tokens, coverage["unsure"] / tokens]
    return f"| {label} | {tau:.2f} | " + " | ".join(f"{p:.2f}" for p in at_least + shares) + " |"


if __name__ == "__main__":
    main()
