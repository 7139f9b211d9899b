"""How fast the target's features are cached for drafter training, one example per forward against
examples batched by length (``hf-speculative train-eagle --feature-batch-tokens``).

    python benchmarks/feature_cache_speed.py --data wn_3200_6000.jsonl --examples 120 --threads 2

The same examples (a seeded sample of ``--data``) are cached once per setting, after a warm-up,
with nothing else changed; prints examples/s per setting and the ratio to the first one. The
features go to a temporary folder that is removed.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--data", required=True, help="self-distillation rows or {'text': ...} documents (JSONL)")
    parser.add_argument("--examples", type=int, default=120)
    parser.add_argument("--batch-tokens", default="1,4096", help="settings to compare, comma-separated")
    parser.add_argument("--layers", default="", help="fused layers (default: the EAGLE-3 low/middle/high choice)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=1200)
    args = parser.parse_args(argv)
    import torch

    from hf_speculative.registry.models import load_model
    from hf_speculative.training.data import FeatureCache, read_examples

    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(args.model)
    target.eval()
    examples = read_examples(args.data, tokenizer, args.max_length)
    random.Random(0).shuffle(examples)
    examples = examples[: args.examples]
    if args.layers:
        layers = [int(x) for x in args.layers.split(",")]
    else:
        from hf_speculative import compat
        from hf_speculative.drafters.eagle.config import default_target_layers

        layers = default_target_layers(int(compat.text_config(target.config).num_hidden_layers))
    settings = [int(x) for x in args.batch_tokens.split(",")]
    tokens = sum(len(ex.ids) for ex in examples)
    print(f"{len(examples)} examples, {tokens} tokens, layers {layers}, {args.threads} threads")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        FeatureCache.build(Path(tmp) / "warm", target, examples[:4], layers, batch_tokens=settings[0], progress=False)
        for setting in settings:
            started = time.perf_counter()
            FeatureCache.build(Path(tmp) / f"b{setting}", target, examples, layers, batch_tokens=setting, progress=False)
            seconds = time.perf_counter() - started
            results.append({"batch_tokens": setting, "seconds": seconds, "examples_per_s": len(examples) / seconds})
    for r in results:
        print(f"batch_tokens {r['batch_tokens']}: {r['seconds']:.1f} s, {r['examples_per_s']:.2f} examples/s, "
              f"{r['examples_per_s'] / results[0]['examples_per_s']:.2f}x")
    return results


if __name__ == "__main__":
    main()
