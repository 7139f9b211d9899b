"""What the DFlash drafter's draft vocabulary gives: its logits over a reduced set of target ids only (the target's
lm_head rows of those ids), against the full vocabulary, measured with tree_tau.py's budgets.

    python benchmarks/dflash_draft_vocab.py --vocab shipped --per-category 2 --max-new-tokens 32 \
        --budgets dflash-chain5,dflash32 --out shipped.jsonl          # the shipped draft_vocab.safetensors
    python benchmarks/dflash_draft_vocab.py --vocab 0 ... --out full.jsonl          # the same run, full vocabulary
    python benchmarks/dflash_draft_vocab.py --vocab 4096 --answers dflash-smollm2/answers.jsonl ...  # another size

``--vocab 0`` and ``--vocab N`` replace what a drafter folder's ``draft_vocab.safetensors`` holds for this process
only (``checkpoints.read_draft_vocab``; nothing else is touched). Drafts stay exact either way: the target verifies
every token; a token outside the vocabulary is never drafted. ``--answers``: the self-distilled answers of
``hf-speculative train-dflash``'s recipe (JSON lines with a ``text`` field), whose token counts pick the vocabulary,
so no Spec-Bench text decides it.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch


def vocabulary(answers: Path, tokenizer, size: int) -> tuple[torch.Tensor, float]:
    """The ``size`` most frequent token ids of the answers' texts (sorted) and the share of tokens they cover."""
    counts: collections.Counter[int] = collections.Counter()
    with open(answers) as f:
        for line in f:
            counts.update(tokenizer(json.loads(line)["text"])["input_ids"])
    ids = sorted(i for i, _ in counts.most_common(size))
    return torch.tensor(ids, dtype=torch.long), sum(counts[i] for i in ids) / max(sum(counts.values()), 1)


def use_vocabulary(ids: torch.Tensor | None) -> None:
    """Make every DFlash drafter this process loads use ``ids`` (``None``: the full vocabulary), not its folder's."""
    from hf_speculative.drafters.dflash import checkpoints

    checkpoints.read_draft_vocab = lambda directory: ids


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=True)
    parser.add_argument("--vocab", required=True,
                        help="'shipped' (the drafter folder's own), 0 (the full vocabulary) or a size picked "
                             "from --answers")
    parser.add_argument("--answers", type=Path, default=None, help="the training answers (JSON lines, `text`)")
    args, rest = parser.parse_known_args(argv)
    if args.vocab == "0":
        use_vocabulary(None)
    elif args.vocab != "shipped":
        if args.answers is None:
            parser.error("--vocab N needs --answers (the drafter's training answers pick the vocabulary)")
        from transformers import AutoTokenizer

        from hf_speculative.registry.models import model_path

        model = next((rest[i + 1] for i, a in enumerate(rest[:-1]) if a == "--model"), "smollm2-135m-instruct")
        tokenizer = AutoTokenizer.from_pretrained(str(model_path(model)))
        ids, cover = vocabulary(args.answers, tokenizer, int(args.vocab))
        print(f"draft vocabulary: {len(ids)} ids cover {cover:.4f} of the answers' tokens", flush=True)
        use_vocabulary(ids)
    sys.path.insert(0, str(Path(__file__).parent))
    import tree_tau

    tree_tau.main(rest)


if __name__ == "__main__":
    main()
