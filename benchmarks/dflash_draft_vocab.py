"""What a reduced draft vocabulary would give the DFlash drafter: its logits over the top-N tokens of the training
answers only (the target's lm_head rows of those tokens, -inf elsewhere), measured with tree_tau.py's budgets.

    python benchmarks/dflash_draft_vocab.py --vocab 8192 --answers dflash-smollm2/answers.jsonl \
        --per-category 2 --max-new-tokens 32 --budgets dflash-chain5,dflash32 --out vocab8k.jsonl
    python benchmarks/dflash_draft_vocab.py --vocab 0 ... --out full.jsonl          # the same run, full vocabulary

An experiment before the drafter's folder can carry such a vocabulary: this process replaces
``DFlashDraftModel.draft_logits`` for its own run (nothing else is touched). Drafts stay exact either way: the
target verifies every token; a token outside the vocabulary is never drafted. ``--answers``: the self-distilled
answers of ``hf-speculative train-dflash``'s recipe (JSON lines with a ``text`` field), whose token counts pick the
vocabulary, so no Spec-Bench text decides it.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


def vocabulary(answers: Path, tokenizer, size: int) -> tuple[torch.Tensor, float]:
    """The ``size`` most frequent token ids of the answers' texts (sorted) and the share of tokens they cover."""
    counts: collections.Counter[int] = collections.Counter()
    with open(answers) as f:
        for line in f:
            counts.update(tokenizer(json.loads(line)["text"])["input_ids"])
    ids = sorted(i for i, _ in counts.most_common(size))
    return torch.tensor(ids, dtype=torch.long), sum(counts[i] for i in ids) / max(sum(counts.values()), 1)


def use_vocabulary(ids: torch.Tensor) -> None:
    """Make every DFlash drafter of this process draw its logits from the target's lm_head rows ``ids`` only."""
    from hf_speculative.drafters.dflash import model as dflash_model

    copy: dict = {}

    def draft_logits(self, hidden: torch.Tensor, target_head: torch.nn.Module) -> torch.Tensor:
        weight = target_head.weight
        key = (weight.data_ptr(), weight._version)
        if copy.get("key") != key:  # the rows, copied once (again after an in-place change)
            copy["key"], copy["rows"] = key, weight.detach()[ids.to(weight.device)].contiguous()  # [N, H]
        logits = F.linear(hidden[:, 1:], copy["rows"])  # [B, W - 1, N]
        full = logits.new_full((*logits.shape[:-1], weight.shape[0]), float("-inf"))  # [B, W - 1, V]
        full[..., ids.to(logits.device)] = logits
        return full

    dflash_model.DFlashDraftModel.draft_logits = draft_logits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=True)
    parser.add_argument("--vocab", type=int, required=True, help="draft vocabulary size (0: the full vocabulary)")
    parser.add_argument("--answers", type=Path, default=None, help="the training answers (JSON lines, `text`)")
    args, rest = parser.parse_known_args(argv)
    if args.vocab:
        if args.answers is None:
            parser.error("--vocab N needs --answers (the drafter's training answers pick the vocabulary)")
        from transformers import AutoTokenizer

        from hf_speculative.registry.models import model_path

        model = next((rest[i + 1] for i, a in enumerate(rest[:-1]) if a == "--model"), "smollm2-135m-instruct")
        tokenizer = AutoTokenizer.from_pretrained(str(model_path(model)))
        ids, cover = vocabulary(args.answers, tokenizer, args.vocab)
        print(f"draft vocabulary: {len(ids)} ids cover {cover:.4f} of the answers' tokens", flush=True)
        use_vocabulary(ids)
    sys.path.insert(0, str(Path(__file__).parent))
    import tree_tau

    tree_tau.main(rest)


if __name__ == "__main__":
    main()
