"""Give an already trained DFlash drafter folder the draft vocabulary ``train-dflash --draft-vocab N`` would have
saved with it: the ``N`` most frequent tokens of its training examples (read as training reads them, the
held-out examples left out), written as ``draft_vocab.safetensors``. Used once for the shipped smollm2 drafter,
trained before the option existed; afterwards run ``python -m tools.drafter_manifests`` for its sha256 manifest.

    python -m tools.dflash_draft_vocab --drafter hf_speculative/drafters/dflash/pretrained/smollm2-135m-instruct \
        --target smollm2-135m-instruct --data /work/dflash_run/wn_1000_answers.jsonl --size 8192
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--data", action="append", required=True, help="the training JSONL files (repeatable)")
    parser.add_argument("--size", type=int, required=True)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from hf_speculative.drafters.dflash.checkpoints import write_draft_vocab
    from hf_speculative.registry.models import resolve
    from hf_speculative.training.data import read_examples
    from hf_speculative.training.dflash import DFlashTrainConfig, draft_vocabulary_all_tokens, vocabulary_coverage

    training = json.loads((args.drafter / "training.json").read_text()).get("train_config", {})
    defaults = DFlashTrainConfig(target=args.target, data=["-"], out="-")
    max_length = training.get("max_length", defaults.max_length)
    val_every = training.get("val_every", defaults.val_every)
    tokenizer = AutoTokenizer.from_pretrained(resolve(args.target))
    examples = [ex for path in args.data for ex in read_examples(path, tokenizer, max_length)]
    train = [ex for i, ex in enumerate(examples) if i % val_every]
    held_out = [ex for i, ex in enumerate(examples) if i % val_every == 0]
    ids = draft_vocabulary_all_tokens(train, args.size)
    write_draft_vocab(args.drafter, ids)
    print(f"{args.drafter}: {ids.numel()} ids from {len(train)} training examples; they cover "
          f"{vocabulary_coverage(held_out, ids):.4f} of the {len(held_out)} held-out examples' learnt tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
