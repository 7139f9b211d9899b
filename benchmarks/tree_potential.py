"""What a draft tree would gain over a chain with a given EAGLE drafter, whatever the machine's speed.

    python benchmarks/tree_potential.py --drafter smollm2-135m-instruct --per-category 10

A draft tree proposes several guesses per position and the target verifies all its nodes in one
forward (tree attention); a node is kept when its whole path matches the target's greedy tokens.
Along the target's true path, a tree node's drafter state is exactly the chain state after the
true tokens (the same tokens, the drafter's own hidden states): training's unrolled step ``j``
(``hf_speculative.training.losses.unroll``). So one teacher-forced unroll per answer gives, at every
anchor, the rank ``r_j`` of the target's token among the drafter's guesses at depth ``j``, and a
tree, as a set of rank paths (``(0,)`` the top guess, ``(0, 1)`` the runner-up after it, ...), keeps
the longest prefix of ``(r_0, r_1, ...)`` that it contains.

The trees are the best static ones for a node budget (Medusa's construction): rank paths added in
order of how often they are the target's path, counted over every anchor of the calibration half of
the prompts (even positions in the list), and measured on the other half. τ is what decoding the
greedy answers with the tree gives: each verification keeps the longest prefix of the target's path
in the tree plus the target's own token, and the next draft starts after them (an average over every
anchor instead reads ~0.1 high: easy stretches are crossed in few verifications). The chain of
the same drafter is the tree ``(0,), (0, 0), ...``. Speedups need the verify cost of ``nodes + 1`` tokens
(``benchmarks/verify_costs.py``); on a GPU it is about one forward for tens of tokens.
"""

from __future__ import annotations

import argparse
import collections

import torch

from hf_speculative.bench.spec_bench import DATASET, SPEC_BENCH_CATEGORIES, load_prompts
from hf_speculative.tooling.prompting import encode_prompt

Path = tuple[int, ...]


@torch.no_grad()
def rank_paths(model, network, sequence: torch.Tensor, prompt_length: int, depth: int,
               ended_by_eos: bool = False) -> list[Path]:
    """For every anchor of the answer in ``sequence`` `[1, T]`: the ranks of the target's tokens
    among the drafter's guesses at depths ``0..depth-1`` along the true path, cut at the first
    token the drafter cannot propose (out of its vocabulary) and where no draft can reach: the last
    token of an answer cut by ``max_new_tokens`` is always the target's own (a draft may only
    reach an end-of-sequence token, ``ended_by_eos``)."""
    from hf_speculative.drafters.generator import to_target_vocab
    from hf_speculative.core.features import tapped_features
    from hf_speculative.training.losses import unroll

    features = tapped_features(model, network.config.target_layers, sequence)  # [1, T, F]
    t = sequence.shape[1]
    last = t - 1 if ended_by_eos else t - 2  # the last position a draft can reach
    # anchor p (feature f_p, token x_{p+1}) guesses x_{p+2}: the first draft of a call follows the prefill
    anchors = torch.arange(prompt_length - 1, t - 2)  # [A]
    hidden = unroll(network, model.get_input_embeddings(), sequence, features, depth, anchors=anchors)
    draft_ids = network.target_ids()  # [V_d] or None
    head = model.get_output_embeddings()
    ranks = []
    for j, h in enumerate(hidden):
        # the drafter's guesses over the target's vocabulary, -inf where it cannot propose
        logits = to_target_vocab(network.draft_logits(h[0], head), head.weight.shape[0], draft_ids)  # [A, V]
        where = (anchors + j + 2).clamp(max=t - 1)  # [A] position of the true token at depth j
        true = logits.gather(1, sequence[0, where][:, None])  # [A, 1]
        rank = (logits > true).sum(-1)  # [A]
        rank[torch.isinf(true[:, 0])] = -1  # not proposable
        rank[anchors + j + 2 > last] = -1  # past the end
        ranks.append(rank)
    paths = []
    for row in torch.stack(ranks, dim=1).tolist():  # [A, depth]
        cut = row.index(-1) if -1 in row else len(row)
        paths.append(tuple(row[:cut]))
    return paths


def best_tree(paths: list[Path], nodes: int) -> set[Path]:
    """The ``nodes`` rank paths most often on the target's path (each with its parent in the tree):
    ``hfs.StaticTree.calibrate``, the construction the library drafts with."""
    from hf_speculative.core.tree_shapes import StaticTree

    return set(StaticTree.calibrate(paths, nodes).paths)


def kept(path: Path, tree: set[Path]) -> int:
    """Drafted tokens a verification keeps: the longest prefix of the target's path in ``tree``."""
    depth = 0
    while depth < len(path) and path[: depth + 1] in tree:
        depth += 1
    return depth


def decode(paths: list[Path], tree: set[Path]) -> list[int]:
    """Drafted tokens kept by each verification when decoding one answer with ``tree``, as in real
    decoding: the next draft starts from the anchor after the kept tokens and the target's own one
    (``paths`` are the answer's anchors in order, the first one right after the prefill)."""
    kept_per_forward, anchor = [], 0
    while anchor < len(paths):
        kept_per_forward.append(kept(paths[anchor], tree))
        anchor += 1 + kept_per_forward[-1]
    return kept_per_forward


def tau(answers: list[list[Path]], tree: set[Path]) -> float:
    """Tokens per verifying forward when decoding every answer with ``tree``."""
    counts = [k for paths in answers for k in decode(paths, tree)]
    return (len(counts) + sum(counts)) / len(counts) if counts else 1.0


def chain(length: int) -> set[Path]:
    return {(0,) * i for i in range(1, length + 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", default="smollm2-135m-instruct", help="folder or shipped drafter name")
    parser.add_argument("--dataset", default=str(DATASET), help="Spec-Bench question.jsonl (default: the shipped one)")
    parser.add_argument("--categories", default=",".join(SPEC_BENCH_CATEGORIES))
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--depth", type=int, default=8, help="deepest tree level measured")
    parser.add_argument("--nodes", default="1,2,4,8,16,32,64,128", help="tree sizes (drafted tokens per forward)")
    args = parser.parse_args(argv)
    import hf_speculative as hfs
    from hf_speculative import compat

    torch.set_num_threads(1)
    model, tokenizer = hfs.load_model(args.model)
    network = hfs.Eagle.from_pretrained(args.drafter, target=model).drafter
    sizes = [int(n) for n in args.nodes.split(",")]
    calibration: list[Path] = []
    measured: dict[str, list[list[Path]]] = collections.defaultdict(list)  # category -> answers -> anchors
    for category in args.categories.split(","):
        for i, prompt in enumerate(load_prompts(args.dataset, [category], args.per_category)):
            ids = encode_prompt(tokenizer, prompt.text)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                 do_sample=False)
            ended_by_eos = int(out[0, -1]) in compat.eos_token_ids(model.generation_config)
            paths = rank_paths(model, network, out, ids.shape[1], args.depth, ended_by_eos)
            if i % 2 == 0:
                calibration.extend(paths)
            else:
                measured[category].append(paths)
        print(f"{category}: {sum(map(len, measured[category]))} anchors measured", flush=True)
    measured["overall"] = [answer for c in list(measured) for answer in measured[c]]
    trees = {n: best_tree(calibration, n) for n in sizes}
    print(f"\ncalibration: {len(calibration)} anchors; τ by drafted tokens per target forward (nodes)\n")
    print("| category | chain of 1 / 3 / 5 | " + " | ".join(f"tree of {n}" for n in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for category, answers in measured.items():
        chains = " / ".join(f"{tau(answers, chain(k)):.2f}" for k in (1, 3, 5))
        print(f"| {category} | {chains} | " + " | ".join(f"{tau(answers, trees[n]):.2f}" for n in sizes) + " |")
    anchors = [p for answer in measured["overall"] for p in answer]
    top = collections.Counter(min(p[0], 8) if p else -1 for p in anchors)
    shares = [sum(n for r, n in top.items() if 0 <= r < k) / max(len(anchors), 1) for k in (1, 2, 4, 8)]
    print("\nfirst guess: target's token in the drafter's top 1 / 2 / 4 / 8: " + " / ".join(f"{s:.2f}" for s in shares))
    widest = max(sizes)
    print(f"\ntree of {widest}, nodes per depth: "
          + ", ".join(f"{d}: {sum(len(p) == d for p in trees[widest])}" for d in range(1, args.depth + 1)))


if __name__ == "__main__":
    main()
