"""A/B: transformers' batched greedy ``generate()`` against ``training/batch_greedy.greedy_rows`` (each row dropped at
the step it ends), on the target's answers to a prompt file, batched as ``self-distill`` batches them (sorted by
length, left-padded), one thread, the two alternating round by round; prints each run's seconds, the medians, their
ratio and how many answers are token-identical.

    python -m tools.prompts wordnet 32 --seed 7 --out wn32.jsonl
    python benchmarks/self_distill_rows_ab.py wn32.jsonl          # 2 batches of 16, 192 new tokens, 2 rounds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/ (the team's, outside the package)

from hf_speculative import compat
from hf_speculative.training.batch_greedy import greedy_rows
from hf_speculative.training.selfdistill import chat_text, left_padded
from tools.corpus.answers import load_target


def sorted_batches(prompts: list[list[int]], size: int, pad: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The prompts' ids sorted by length in batches of ``size``, as ``self-distill`` left-pads them."""
    prompts = sorted(prompts, key=len)
    return [left_padded(prompts[b: b + size], pad) for b in range(0, len(prompts), size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", help="a JSONL file of {'prompt': ...} rows")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok = load_target(args.model, threads=1)
    eos = set(compat.eos_token_ids(model.generation_config))
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    with open(args.prompts, encoding="utf-8") as f:
        texts = [json.loads(line)["prompt"] for line in f if line.strip()]
    batches = sorted_batches([tok(chat_text(tok, t), add_special_tokens=False)["input_ids"] for t in texts],
                          args.batch_size, pad)

    def with_generate(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=args.max_new_tokens,
                             pad_token_id=pad)
        rows = []
        for seq in out[:, ids.shape[1]:].tolist():  # each row cut after its first EOS
            end = next((j for j, token in enumerate(seq) if token in eos), len(seq) - 1)
            rows.append(seq[: end + 1])
        return rows

    def with_rows(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        return greedy_rows(model, ids, mask, max_new_tokens=args.max_new_tokens, eos_ids=eos)

    arms = {"generate": with_generate, "greedy_rows": with_rows}
    seconds, answers = {name: [] for name in arms}, {}
    for round_ in range(args.rounds):
        for name in (list(arms) if round_ % 2 == 0 else list(arms)[::-1]):  # alternating which goes first
            start = time.perf_counter()
            answers[name] = [row for ids, mask in batches for row in arms[name](ids, mask)]
            seconds[name].append(time.perf_counter() - start)
            print(name, round(seconds[name][-1], 2), flush=True)
    same = sum(a == b for a, b in zip(answers["generate"], answers["greedy_rows"]))
    lengths = [len(row) for row in answers["generate"]]
    print("identical answers", same, "/", len(lengths), "mean answer", sum(lengths) / len(lengths), "at the limit",
          sum(n == args.max_new_tokens for n in lengths))
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    print("median generate", medians["generate"], "greedy_rows", medians["greedy_rows"], "ratio",
          medians["generate"] / medians["greedy_rows"])


if __name__ == "__main__":
    main()
