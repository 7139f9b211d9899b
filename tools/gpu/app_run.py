"""The demo app's comparison on a lent GPU, without its web page: the page's own engine on the real model.

    python -m tools.gpu.app_run --model-dir /tmp/lent/model --out $OUT/app      # after tools/gpu/lent_real.sh

A lent GPU machine reaches no registry, so neither gradio nor a browser can travel there within a call's 64 MiB.
What the page runs behind its button can: :class:`hf_speculative.app.session.Comparison` on a model from the
app's :class:`~hf_speculative.app.cache.ModelCache` (the page's device choice: CUDA when visible; its warm-up
after loading), the page's methods and its request limits (greedy and at most three methods). Each example
prompt of the page runs ``--rounds`` times in turn; every round's ``Comparison.results()`` (the page's "raw
results" JSON) is kept, with each method's token times and accepted lengths, so that the page's plot can be drawn
afterwards where matplotlib is (:func:`figure_from_results`).

The model folder is the registry model converted there (``lent_real.sh``; ``--name`` is its registry name, so the
shipped drafters resolve as on the page).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_METHODS = ("prompt-lookup", "eagle-tree", "medusa-tree")


def run_app(model_dir: Path, name: str, methods: list[str], prompts: dict[str, str], max_new_tokens: int,
            rounds: int, device: str | None = None) -> dict[str, Any]:
    """Every prompt ``rounds`` times through the page's ``Comparison``; the report keeps every round."""
    import torch

    from hf_speculative.app.cache import ModelCache, describe_device
    from hf_speculative.app.request import MAX_PANES, CompareRequest, Sources
    from hf_speculative.app.session import Comparison
    from hf_speculative.registry.models import load_model

    if len(methods) > MAX_PANES - 1:
        raise SystemExit(f"--methods: the page shows greedy and at most {MAX_PANES - 1} methods, got {len(methods)}.")

    if Path(name).name == name != model_dir.name:  # the page finds shipped drafters by the registry folder's name
        import tempfile

        link = Path(tempfile.mkdtemp()) / name
        link.symlink_to(model_dir.resolve(), target_is_directory=True)
        model_dir = link

    def loader(_name: str, device: Any = None) -> tuple[Any, Any]:
        return load_model(str(model_dir), device=device)

    cache = ModelCache(loader, device=None if device is None else torch.device(device))
    tick = time.perf_counter()
    loaded = cache.get(name)
    report: dict[str, Any] = {"model": name, "model_dir": str(model_dir), "device": describe_device(loaded.device),
                              "dtype": str(loaded.model.dtype).replace("torch.", ""),
                              "load_and_warmup_s": round(time.perf_counter() - tick, 2),
                              "methods": ["greedy", *methods], "max_new_tokens": max_new_tokens, "rounds": rounds,
                              "prompts": {}}
    sources = Sources.offered(name)
    for label, prompt in prompts.items():
        runs = []
        for _ in range(rounds):
            request = CompareRequest(prompt=prompt, model=name, methods=["greedy", *methods],
                                     max_new_tokens=max_new_tokens, options={})
            comparison = Comparison(loaded, request, cache, 4096, sources)
            for _running in comparison.run(interval=0.05):
                pass
            result = comparison.results()
            for row, trace in zip(result["methods"], comparison.traces):
                row["token_times"] = [list(t) for t in trace.token_times]
                row["route"] = trace.route
            runs.append(result)
            print(label, [(r["method"], r["status"], _round(r["tokens_per_s"]), _round(r["speedup"]), _round(r["tau"]),
                           r["identical_to_baseline"]) for r in result["methods"]], flush=True)
        report["prompts"][label] = runs
    report["summary"] = summarize(report)
    return report


def _round(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def summarize(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per method: the median over prompts of the median over rounds after the first (the first round of a prompt
    is reported too: it is what a visitor's first click shows)."""
    summary = {}
    for method in report["methods"]:
        later, first = [], []
        for runs in report["prompts"].values():
            rows = [next(r for r in run["methods"] if r["method"] == method) for run in runs]
            first.append(rows[0])
            later.append(rows[1:] or rows)
        done = [[r for r in rows if r["status"] == "done"] for rows in later]
        if not all(done):
            summary[method] = {"error": next((r["error"] for rows in later for r in rows if r["error"]), "not run")}
            continue
        arm = {"tokens_per_s": _median([_median([r["tokens_per_s"] for r in rows]) for rows in done]),
               "speedup": _median([_median([r["speedup"] for r in rows]) for rows in done]),
               "first_click_speedup": _median([r["speedup"] for r in first if r["speedup"] is not None]),
               "identical": sum(all(r["identical_to_baseline"] is not False for r in rows) for rows in done),
               "prompts": len(done)}
        taus = [r["tau"] for rows in done for r in rows if r["tau"] is not None]
        if taus:
            arm["tau"] = _median(taus)
        summary[method] = arm
    return summary


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def figure_from_results(result: dict[str, Any]):
    """The page's figure (:func:`hf_speculative.app.plots.comparison_figure`) from one round's saved results."""
    from hf_speculative.app.plots import comparison_figure
    from hf_speculative.app.streaming import MethodTrace
    from hf_speculative.tooling.methods import get_method

    traces = []
    for row in result["methods"]:
        trace = MethodTrace(get_method(row["method"]), result["max_new_tokens"])
        trace.token_times = [tuple(t) for t in row["token_times"]]
        trace.ids = list(row["output_ids"])
        trace.accepted_lengths = list(row["accepted_lengths"])
        traces.append(trace)
    return comparison_figure(traces)


def main(argv: list[str] | None = None) -> int:
    from hf_speculative.app.examples import EXAMPLES
    from hf_speculative.registry.models import DEFAULT_MODEL

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="the registry model's converted folder")
    parser.add_argument("--name", default=DEFAULT_MODEL, help="its registry name (the shipped drafters follow it)")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each prompt (the first is a visitor's first)")
    parser.add_argument("--examples", default=None, help="comma-separated labels of the page's examples (default all)")
    parser.add_argument("--device", default=None, help="default: the page's choice (CUDA when visible)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plots", type=Path, default=None,
                        help="draw the page's figure for each prompt's last round of an earlier --out (here, no GPU)")
    args = parser.parse_args(argv)
    from .gpu_check import comma_list

    if args.plots is not None:
        report = json.loads((args.plots / "app_results.json").read_text())
        for index, runs in enumerate(report["prompts"].values()):
            figure = figure_from_results(runs[-1])
            if figure is not None:
                figure.savefig(args.out / f"app_plot_{index}.png", dpi=90)
        return 0
    labels = list(EXAMPLES) if args.examples is None else comma_list(args.examples)
    unknown = [label for label in labels if label not in EXAMPLES]
    if unknown:
        parser.error(f"--examples: unknown {unknown}; the page's examples are {list(EXAMPLES)}.")
    args.out.mkdir(parents=True, exist_ok=True)
    report = run_app(args.model_dir, args.name, comma_list(args.methods),
                     {label: EXAMPLES[label] for label in labels}, args.max_new_tokens, args.rounds, args.device)
    (args.out / "app_results.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
