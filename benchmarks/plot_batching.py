"""The batching curve for docs/batching.md: speedup over batched greedy against the batch size, per method.

    python benchmarks/plot_batching.py --out docs/img/batching-speedup.png

Reads the batch benchmarks' JSONL (``hf-speculative bench --batch-size ...``): prompt lookup from the two runs the
docs table quotes (B = 1, 2 from the first, 4, 8, 16 from the second) and the 8-node EAGLE tree.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "batching"
SOURCES = [  # (file, batch sizes taken from it)
    ("2026-11-25-smollm2-batch-run1.jsonl", {1, 2}),
    ("2026-11-25-smollm2-batch-run2.jsonl", {4, 8, 16}),
    ("2026-11-25-smollm2-eagle-tree8-batch.jsonl", {1, 2, 4}),
]
LABELS = {"prompt-lookup": "prompt lookup, batch cost model", "prompt-lookup+always": "prompt lookup, drafting always",
          "eagle-tree": "EAGLE tree (8 nodes), batch cost model", "eagle-tree+always": "EAGLE tree (8 nodes), drafting always"}


def curves() -> dict[str, dict[int, float]]:
    from hf_speculative.bench.batch import summarize

    out: dict[str, dict[int, float]] = {}
    for name, sizes in SOURCES:
        records = [json.loads(line) for line in (RESULTS / name).read_text().splitlines() if line.strip()]
        for row in summarize([r for r in records if r["batch_size"] in sizes]):
            if row["method"] in LABELS and row["speedup"] is not None:
                out.setdefault(row["method"], {})[row["batch_size"]] = row["speedup"]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/img/batching-speedup.png")
    args = parser.parse_args(argv)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 3.8))
    axes = figure.add_subplot()
    for method, points in curves().items():
        sizes = sorted(points)
        style = "--" if method.endswith("+always") else "-"
        color = "tab:blue" if method.startswith("prompt-lookup") else "tab:green"  # a drafter's two arms alike
        axes.plot(sizes, [points[b] for b in sizes], style, color=color, marker="o", label=LABELS[method])
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xscale("log", base=2)
    axes.set_xticks([1, 2, 4, 8, 16], labels=["1", "2", "4", "8", "16"])
    axes.set_xlabel("batch size B")
    axes.set_ylabel("throughput / batched greedy's")
    axes.set_title("smollm2-135m-instruct, one CPU thread, 96 new tokens (Spec-Bench prompts)", fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.savefig(args.out, dpi=120, bbox_inches="tight")
    print(args.out)


if __name__ == "__main__":
    main()
