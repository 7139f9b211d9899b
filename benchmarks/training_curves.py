"""Validation curves of drafter training runs, for the recipe pages: τ by step as a Markdown table and a plot.

    python benchmarks/training_curves.py eagle=~/training/smollm2/eagle dflash=~/training/smollm2/dflash \
        medusa=~/training/smollm2/medusa --plot docs/img/training-curves.png

Each ``LABEL=FOLDER`` is a training run's output folder (its ``train_log.jsonl``) or an exported drafter (its
``training.json``'s ``train_log``, as ``tools.cpu_train``'s export step and the GPU agenda write it). A run's log has
one row per validation: the optimizer step, the tokens trained on so far (over every process), the seconds, and
τ of greedy speculative decoding on held-out prompts (``val_tau``; Medusa's ``val_tau_tree`` on its calibrated tree
and ``val_tau_chain``), with the teacher-forced top-1 of each drafted position (``val_acc``, Medusa's ``val_top1``).
The table prints every validation of every run; the plot draws the real τ against the tokens trained.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_curve(folder: Path) -> list[dict]:
    """The validations of the run or exported drafter in ``folder``, in order."""
    log = folder / "train_log.jsonl"
    if log.is_file():
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    meta = folder / "training.json"
    if meta.is_file():
        return list(json.loads(meta.read_text()).get("train_log") or [])
    raise SystemExit(f"{folder}: neither train_log.jsonl (a training run) nor training.json (an exported drafter)")


def tau_of(row: dict) -> float | None:
    """The real τ of a validation: ``val_tau``, or Medusa's on its tree."""
    return row.get("val_tau", row.get("val_tau_tree"))


def first_top1(row: dict) -> float | None:
    """The teacher-forced top-1 of the first drafted token."""
    accuracy = row.get("val_acc") or row.get("val_top1")
    return accuracy[0] if accuracy else None


def markdown(curves: dict[str, list[dict]]) -> str:
    """One table: every validation of every run (label, step, tokens in millions, hours, τ, first top-1)."""
    lines = ["| run | step | tokens trained | hours | τ (held-out) | top-1, first token |", "|---|---|---|---|---|---|"]
    for label, rows in curves.items():
        for row in rows:
            tau, top1 = tau_of(row), first_top1(row)
            chain = f" (chain {row['val_tau_chain']:.2f})" if "val_tau_chain" in row else ""
            lines.append(f"| {label} | {row['step']} | {row.get('tokens', 0) / 1e6:.2f}M | "
                         f"{row.get('seconds', 0) / 3600:.2f} | {'-' if tau is None else f'{tau:.2f}'}{chain} | "
                         f"{'-' if top1 is None else f'{top1:.3f}'} |")
    return "\n".join(lines)


def plot(curves: dict[str, list[dict]], path: str, title: str) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 3.8))
    axes = figure.add_subplot()
    for label, rows in curves.items():
        points = [(row.get("tokens", 0) / 1e6, tau_of(row)) for row in rows if tau_of(row) is not None]
        if points:
            axes.plot(*zip(*points), marker="o", label=label)
    axes.set_xlabel("tokens trained (millions)")
    axes.set_ylabel("τ on held-out prompts")
    axes.set_title(title, fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.savefig(path, dpi=120, bbox_inches="tight")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=FOLDER: a training run's folder or an exported drafter's")
    parser.add_argument("--plot", help="also draw τ against the tokens trained into this image")
    parser.add_argument("--title", default="smollm2-135m-instruct: τ of greedy drafting on held-out prompts")
    args = parser.parse_args(argv)
    curves = {}
    for spec in args.runs:
        label, sep, folder = spec.partition("=")
        if not sep or not label or not folder:
            parser.error(f"{spec}: give LABEL=FOLDER, e.g. eagle=~/training/smollm2/eagle")
        curves[label] = read_curve(Path(folder).expanduser())
    print(markdown(curves))
    if args.plot:
        plot(curves, args.plot, args.title)
        print(args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
