"""Markdown summary of a benchmark jsonl written by :func:`hf_speculative.bench.runner.run_bench`.

Everything is computed from the jsonl alone, so a report can be re-made from a file at any time
(``hf-speculative bench-report FILE``). Records are grouped by run (``run_id``: one ``bench``
invocation); within a run there is one table per category and, when there are several, one for all
of them together.

Per method:

- **tokens/s**: aggregate, total new tokens / total seconds;
- **speedup**: aggregate tokens/s over greedy's aggregate tokens/s in the same run;
- **median speedup**: median over prompts of (method tokens/s / greedy tokens/s on that prompt);
- **tau**: total new tokens / total target forwards (records where forwards were counted);
- **acceptance**: total accepted / total drafted tokens (methods that report them; ``no drafts`` when such a
  method drafted nothing, ``–`` when the method does not report them);
- **identical**: how many outputs equal greedy's token for token, e.g. ``10/10``;
- **vs <ref>** (with ``reference``): aggregate tokens/s over the reference method's.

Under each table of a CPU run, greedy's aggregate tokens/s as the weights' read rate, against the machine's
single-thread read bandwidth the run measured (``bandwidth.py``): how far plain decoding is from the memory limit.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any, Iterable

from ..core.stats import format_acceptance

BASELINE = "greedy"
OVERALL = "overall"


def load_records(path: str | os.PathLike) -> list[dict]:
    """The records of a benchmark jsonl file (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _ordered(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _aggregate_tps(records: list[dict]) -> float | None:
    seconds = sum(r["seconds"] for r in records)
    return sum(r["new_tokens"] for r in records) / seconds if seconds > 0 else None


def summarize(records: list[dict], reference: str | None = None) -> list[dict]:
    """One row per method (in order of appearance) for ``records`` of one run and one category set.

    Returns:
        `list[dict]` with keys method, prompts, new_tokens, seconds, tokens_per_s, speedup,
        median_speedup, tau, acceptance_rate, drafted, identical, vs_reference (``None`` where unknown;
        ``drafted``, the tokens drafted in all, is ``None`` for methods that do not report it).
    """
    by_method: dict[str, list[dict]] = {}
    for r in records:
        by_method.setdefault(r["method"], []).append(r)
    greedy = by_method.get(BASELINE, [])
    greedy_tps = _aggregate_tps(greedy) if greedy else None
    greedy_by_prompt = {(r["category"], r["question_id"]): r for r in greedy}
    ref_tps = _aggregate_tps(by_method[reference]) if reference in by_method else None
    rows = []
    for method, rs in by_method.items():
        tps = _aggregate_tps(rs)
        ratios = []
        for r in rs:
            g = greedy_by_prompt.get((r["category"], r["question_id"]))
            if g is not None and g["tokens_per_s"] and r["seconds"] > 0:
                ratios.append(r["tokens_per_s"] / g["tokens_per_s"])
        counted = [r for r in rs if r.get("target_forwards")]
        drafted = sum(r.get("drafted") or 0 for r in rs)
        reported = any(r.get("drafted") is not None for r in rs)
        rows.append(
            {
                "method": method,
                "prompts": len(rs),
                "new_tokens": sum(r["new_tokens"] for r in rs),
                "seconds": sum(r["seconds"] for r in rs),
                "tokens_per_s": tps,
                "speedup": _ratio(tps, greedy_tps),
                "median_speedup": statistics.median(ratios) if ratios else None,
                "tau": _ratio(sum(r["new_tokens"] for r in counted), sum(r["target_forwards"] for r in counted)),
                "acceptance_rate": _ratio(sum(r.get("accepted") or 0 for r in rs), drafted),
                "drafted": drafted if reported else None,
                "identical": sum(bool(r.get("identical_to_greedy")) for r in rs),
                "vs_reference": _ratio(tps, ref_tps),
            }
        )
    return rows


def format_value(value: float | None, pattern: str) -> str:
    """``pattern.format(value)``, or an en dash for an unknown (``None``) value."""
    return "–" if value is None else pattern.format(value)


def markdown_table(rows: list[dict], reference: str | None = None) -> str:
    """A markdown table of :func:`summarize` rows."""
    header = ["method", "prompts", "tokens/s", "speedup", "median speedup", "tau", "acceptance", "identical"]
    if reference:
        header.append(f"vs {reference}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [
            row["method"],
            str(row["prompts"]),
            format_value(row["tokens_per_s"], "{:.2f}"),
            format_value(row["speedup"], "{:.2f}×"),
            format_value(row["median_speedup"], "{:.2f}×"),
            format_value(row["tau"], "{:.2f}"),
            format_acceptance(row["acceptance_rate"], row.get("drafted")),
            f"{row['identical']}/{row['prompts']}",
        ]
        if reference:
            cells.append(format_value(row["vs_reference"], "{:.2f}×"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_report(records: list[dict], reference: str | None = None) -> str:
    """The full markdown report: per run, a table per category and one overall (if several categories)."""
    if not records:
        return "No benchmark records.\n"
    from .bandwidth import describe as describe_bandwidth  # torch: the command line's printing commands load none

    parts = ["# Speculative decoding benchmark"]
    for run_id in _ordered(r.get("run_id", "") for r in records):
        run = [r for r in records if r.get("run_id", "") == run_id]
        first = run[0]
        parts.append(f"## {first.get('model', '?')}" + (f" (run {run_id})" if run_id else ""))
        env = ", ".join(
            f"{key} {first[key]}"
            for key in ("max_new_tokens", "repeats", "threads", "device", "cpu", "torch", "transformers")
            if key in first
        )
        if first.get("sdpa_force_gqa"):
            env += ", TRANSFORMERS_SDPA_FORCE_GQA=1"
        if first.get("cpu_layout", "none") != "none":
            env += f", weights column-major ({first['cpu_layout']}, hfs.optimize_for_cpu)"
        parts.append(env)
        categories = _ordered(r["category"] for r in run)
        for category in categories + ([OVERALL] if len(categories) > 1 else []):
            subset = run if category == OVERALL else [r for r in run if r["category"] == category]
            parts.append(f"### {category}")
            rows = summarize(subset, reference)
            parts.append(markdown_table(rows, reference))
            greedy = next((row for row in rows if row["method"] == BASELINE and row["tokens_per_s"]), None)
            line = greedy and describe_bandwidth(first, tokens_per_s=greedy["tokens_per_s"],
                                                 threads=first.get("threads", 1))
            if line:
                parts.append(f"{BASELINE} (plain decoding): {line}")
    return "\n\n".join(parts) + "\n"


def write_report(path: str | os.PathLike, reference: str | None = None,
                 records: list[dict] | None = None) -> tuple[str, Path]:
    """Make the report of the jsonl ``path`` and write it next to it as ``.md``.

    Args:
        path: the benchmark jsonl.
        reference (`str`, *optional*): add a "vs METHOD" column.
        records (`list[dict]`, *optional*): report these records (one run's) instead of the whole file.

    Returns:
        `tuple[str, Path]`: the markdown text and the path it was written to.
    """
    path = Path(path)
    text = format_report(load_records(path) if records is None else records, reference)
    md_path = path.with_suffix(".md")
    md_path.write_text(text, encoding="utf-8")
    return text, md_path

