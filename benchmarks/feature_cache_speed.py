"""How fast the target's features are cached for drafter training, one example per forward against
examples batched by length (``hf-speculative train-eagle --feature-batch-tokens``), and on the stock
PyTorch path against ``hfs.optimize_for_cpu``'s (``FeatureCache.build(fast_cpu=...)``).

    python benchmarks/feature_cache_speed.py --data wn_3200_6000.jsonl --examples 120 --threads 2
    python benchmarks/feature_cache_speed.py --data CORPUS/answers/train.jsonl --batch-tokens 1 --paths stock,fast \
        --threads 1 --repeats 3

The same examples (a seeded sample of ``--data``) are cached once per setting and repeat, the settings taking
turns, after a warm-up, with nothing else changed (the fast path's ``optimize_for_cpu`` and its undo are timed:
a run pays them once); prints the median examples/s and tokens/s per setting and the ratio to the first one. The
features go to a temporary folder that is removed. Run it alone.
"""

from __future__ import annotations

import argparse
import random
import statistics
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
    parser.add_argument("--paths", default="stock", help="stock (PyTorch as loaded), fast (optimize_for_cpu's "
                        "path), or both comma-separated")
    parser.add_argument("--repeats", type=int, default=1)
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
    settings = [(int(b), path) for b in args.batch_tokens.split(",") for path in args.paths.split(",")]
    if any(path not in ("stock", "fast") for _, path in settings):
        parser.error(f"--paths {args.paths}: stock, fast or both")
    tokens = sum(len(ex.ids) for ex in examples)
    print(f"{len(examples)} examples, {tokens} tokens, layers {layers}, {args.threads} threads")
    times: dict[tuple[int, str], list[float]] = {setting: [] for setting in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for path in {path for _, path in settings}:
            FeatureCache.build(Path(tmp) / f"warm-{path}", target, examples[:4], layers, batch_tokens=settings[0][0],
                               progress=False, fast_cpu=path == "fast")
        for repeat in range(args.repeats):
            for batch_tokens, path in settings:
                started = time.perf_counter()
                FeatureCache.build(Path(tmp) / f"b{batch_tokens}-{path}-{repeat}", target, examples, layers,
                                   batch_tokens=batch_tokens, progress=False, fast_cpu=path == "fast")
                times[(batch_tokens, path)].append(time.perf_counter() - started)
    results = [{"batch_tokens": b, "path": path, "seconds": statistics.median(times[(b, path)]),
                "runs": [round(t, 2) for t in times[(b, path)]]} for b, path in settings]
    for r in results:
        r["examples_per_s"] = len(examples) / r["seconds"]
        print(f"batch_tokens {r['batch_tokens']}, {r['path']}: {r['seconds']:.1f} s (runs {r['runs']}), "
              f"{r['examples_per_s']:.2f} examples/s, {tokens / r['seconds']:.0f} tokens/s, "
              f"{r['examples_per_s'] / results[0]['examples_per_s']:.2f}x")
    return results


if __name__ == "__main__":
    main()
