"""Projected speedup on another device: ``hf-speculative project BENCH.jsonl --profile PROFILE.json``.

A benchmark run (``hf-speculative bench``) says, for every verification step of every speculative run,
how many draft tokens the target verified, how many it accepted and how long the draft took
(:meth:`hf_speculative.core.stats.SpeculativeStats.steps`). A profile (``hf-speculative profile``) says what
one target forward verifying ``n`` draft tokens costs on its device, in one-token forwards:
``r(n, c)`` at context ``c`` (:func:`~hf_speculative.core.cost_profile.relative_cost`, as a chain or as a
tree). Together they give the speedup the benchmark's drafts would have on the profile's device.

The model, per prompt ``q`` of the benchmark (``L`` prompt tokens, greedy made ``N_g`` tokens in
``T_g`` seconds on the benchmark machine; the method made ``N_m`` tokens in steps ``i = 0..S-1``):

- one plain greedy token costs 1: one one-token forward at its context;
- speculative step ``i`` verified ``n_i`` draft tokens at context ``c_i = L + sum_{j<i} (a_j + 1)`` (the
  prompt and the tokens so far; ``a_j`` tokens accepted at step ``j``) and costs
  ``k_i = r(n_i, c_i) + d_i + o_i`` one-token forwards, the shape (chain or tree) being the method's;
- ``d_i``, the drafting cost, is by default the run's own: ``d_i = draft_s_i / (T_g / N_g)``, the step's
  draft seconds over greedy's seconds per token at the same prompt on the benchmark machine. This
  assumes that drafting scales like the target's forward between the two devices. ``draft_cost=``
  (``--draft-cost``) replaces it with a fixed number per step (0 for prompt lookup, whose CPU work a GPU
  hides or not; a drafter's own measured cost relative to the target).
- ``o_i``, the loop's own work in the step, is likewise the run's own by default: ``o_i = other_s_i / (T_g /
  N_g)``, the step's seconds between its verification's end and the next draft's start (the tokens appended,
  stops checked, the drafter's ``observe``; :meth:`~hf_speculative.core.stats.SpeculativeStats.steps`), with the
  same assumption; ``loop_cost=`` (``--loop-cost``) fixes it, 0 leaves it out. Files written before steps
  recorded ``other_s`` project with 0 and say so.

A one-token forward does not cost the same at every context, so costs are summed in the profile's
seconds: ``w(c)`` is the profile's one-token forward at the measured context nearest to ``c`` (the
context :func:`~hf_speculative.core.cost_profile.relative_cost` reads too). Projected seconds:
``P_g(q) = sum_{t<N_g} w(L + t)`` for greedy and ``P_m(q) = sum_i w(c_i) k_i`` for the method. As
``bench-report`` computes measured speedups (aggregate tokens per second over greedy's in the same run),
the projected speedup of a set of prompts is ``(sum N_m / sum P_m) / (sum N_g / sum P_g)``; with one
context, constant ``r``, ``d`` and ``o`` and every step alike that is ``tau / (r + d + o)``, ``tau = N_m / S``. The
median over prompts of the per-prompt ratio is given as well.

What it cannot know: the prefill (left out, for greedy and the method alike) and the work of a verification
besides its forward (acceptance, the cache's cut to the accepted path: inside ``verify_s``, which the profile's
forward stands for), or greedy's own per-token loop work; whether the drafter and the loop's host work scale like
the target (the ``d_i`` and ``o_i`` assumptions above: on a GPU host work does not shrink with the forward, so
there the projection runs high by what the host adds); the cost of sizes the profile did not measure (interpolated;
a CPU's forward costs are not linear between sizes: profile the sizes the methods verify); and, when the profile is of
another model, whether that model would accept the same drafts: the benchmark's acceptance is assumed.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path
from typing import Any, Mapping

from ..core import cost_profile as profiling
from .report import BASELINE, OVERALL, _ordered, format_value, load_records

FORMAT = "hf-speculative-projection/1"
STEP_KEYS = ("drafted", "accepted", "draft_s", "verify_s")
OPTIONAL_STEP_KEYS = ("other_s",)  # recorded since the loop's own work was projected; older files project it as 0
_ROW_KEYS = ("method", "category", "question_id", "new_tokens", "seconds")
RERUN = ("re-run the benchmark with this version of hf_speculative (`hf-speculative bench ... --out FILE`), "
         "which records every step")


# -- inputs -------------------------------------------------------------------------------------
def load_benchmark(path: str | os.PathLike) -> list[dict]:
    """The records of a benchmark JSONL, checked to be one (old files without per-step records load)."""
    try:
        records = load_records(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        hint = " (a profile? pass it as --profile)" if _is_profile(path) else ""
        raise ValueError(f"{path} is not a benchmark JSONL{hint}: {err}; pass the --out file of "
                         "`hf-speculative bench`.") from None
    for number, record in enumerate(records, 1):
        missing = [key for key in _ROW_KEYS if not isinstance(record, dict) or key not in record]
        if missing:
            hint = " (a profile? pass it as --profile)" if _is_profile(path) else ""
            raise ValueError(f"{path} is not a benchmark JSONL{hint}: line {number} has no {', '.join(missing)}; "
                             "pass the --out file of `hf-speculative bench`.")
        steps = record.get("steps")
        present = [k for k in OPTIONAL_STEP_KEYS if isinstance(steps, dict) and k in steps]
        broken = steps is not None and (not isinstance(steps, dict)
                                        or any(not isinstance(steps.get(k), list) for k in (*STEP_KEYS, *present))
                                        or len({len(steps[k]) for k in (*STEP_KEYS, *present)}) != 1)
        if broken:
            raise ValueError(f"{path}: line {number} has broken per-step records (want lists {', '.join(STEP_KEYS)} "
                             f"(and {', '.join(OPTIONAL_STEP_KEYS)} if present) of one length); {RERUN}.")
    if not records:
        raise ValueError(f"{path} is not a benchmark JSONL: it holds no record; pass the --out file of "
                         "`hf-speculative bench`.")
    return records


def _is_profile(path: str | os.PathLike) -> bool:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == profiling.FORMAT


def load_profile(path: str | os.PathLike) -> dict[str, Any]:
    """A profile written by ``hf-speculative profile`` (:func:`hf_speculative.core.cost_profile.load`)."""
    return profiling.load(path)


# -- the model ----------------------------------------------------------------------------------
def _nearest(profile: Mapping[str, Any], context: int) -> str:
    return str(profiling.nearest_context(profile["relative"], context))


def forward_seconds(profile: Mapping[str, Any], context: int) -> float:
    """``w(c)``: the profile's one-token forward (seconds) at the measured context nearest to ``context``;
    1.0 for a profile without seconds (only relative costs: every context weighs the same)."""
    seconds = profile.get("seconds")
    if not seconds:
        return 1.0
    by_shape = seconds[_nearest(profile, context)]
    return float((by_shape.get("chain") or by_shape["tree"])["0"])


def _draft_cost_for(draft_cost: float | Mapping[str, float] | None, method: str) -> float | None:
    """A method's fixed cost per step from a number, a mapping by method (``"*"``: the others) or ``None``."""
    if isinstance(draft_cost, Mapping):
        return draft_cost.get(method, draft_cost.get("*"))
    return draft_cost


def check_draft_cost(draft_cost: float | Mapping[str, float] | None, name: str = "draft_cost") -> None:
    """Refuse a cost (``draft_cost`` or ``loop_cost``) that is not ``None``, a number >= 0 or a mapping of them."""
    values = draft_cost.values() if isinstance(draft_cost, Mapping) else [] if draft_cost is None else [draft_cost]
    what = name.split("_")[0]
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}={value!r}: give a finite number >= 0 (one-token forwards per step), or "
                             f"None to take each step's {what} cost from the benchmark itself.")


def project_run(record: Mapping[str, Any], greedy: Mapping[str, Any], profile: Mapping[str, Any], *,
                draft_cost: float | None = None, loop_cost: float | None = None) -> dict[str, Any]:
    """One prompt: the projected seconds of ``record``'s steps and of ``greedy``'s tokens on the profile's
    device, with the per-step costs summed (see the module docstring)."""
    steps = record["steps"]
    shape = record.get("shape") or "chain"
    per_token_s = greedy["seconds"] / greedy["new_tokens"] if greedy["new_tokens"] else 0.0
    start = int(record.get("input_tokens") or greedy.get("input_tokens") or 0)
    context, method_s, draft_units, verify_units, loop_units = start, 0.0, 0.0, 0.0, 0.0
    other = steps.get("other_s") or [0.0] * len(steps["drafted"])
    for n, accepted, draft_s, other_s in zip(steps["drafted"], steps["accepted"], steps["draft_s"], other):
        r = profiling.relative_cost(profile, int(n), context=context, shape=shape)
        d = draft_cost if draft_cost is not None else (draft_s / per_token_s if per_token_s > 0 else 0.0)
        o = loop_cost if loop_cost is not None else (other_s / per_token_s if per_token_s > 0 else 0.0)
        method_s += forward_seconds(profile, context) * (r + d + o)
        draft_units, verify_units, loop_units = draft_units + d, verify_units + r, loop_units + o
        context += int(accepted) + 1
    greedy_s = sum(forward_seconds(profile, start + t) for t in range(int(greedy["new_tokens"])))
    return {"method_s": method_s, "greedy_s": greedy_s, "steps": len(steps["drafted"]),
            "draft_units": draft_units, "verify_units": verify_units, "loop_units": loop_units,
            "drafted": sum(steps["drafted"]),
            "contexts": (start, context), "max_drafted": max(steps["drafted"], default=0)}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _summarize(pairs: list[tuple[dict, dict, dict]]) -> dict[str, Any]:
    """Figures of ``(method record, greedy record, projection)`` triples, aggregated as bench-report does."""
    n_m = sum(m["new_tokens"] for m, _, _ in pairs)
    n_g = sum(g["new_tokens"] for _, g, _ in pairs)
    measured = _ratio(_ratio(n_m, sum(m["seconds"] for m, _, _ in pairs)) or 0.0,
                      _ratio(n_g, sum(g["seconds"] for _, g, _ in pairs)) or 0.0)
    projected = _ratio(_ratio(n_m, sum(p["method_s"] for _, _, p in pairs)) or 0.0,
                       _ratio(n_g, sum(p["greedy_s"] for _, _, p in pairs)) or 0.0)
    per_prompt = [_ratio(m["new_tokens"] * p["greedy_s"], g["new_tokens"] * p["method_s"])
                  for m, g, p in pairs if p["method_s"] > 0 and g["new_tokens"]]
    steps = sum(p["steps"] for _, _, p in pairs)
    tau = _ratio(n_m, steps)
    return {
        "prompts": len(pairs),
        "steps": steps,
        "tau": tau,
        "measured_speedup": measured,
        "projected_speedup": projected,
        "projected_median_speedup": statistics.median(per_prompt) if per_prompt else None,
        "projected_speedup_per_tau": _ratio(projected, tau) if projected is not None else None,
        "draft_cost_per_step": _ratio(sum(p["draft_units"] for _, _, p in pairs), steps),
        "verify_cost_per_step": _ratio(sum(p["verify_units"] for _, _, p in pairs), steps),
        "loop_cost_per_step": _ratio(sum(p["loop_units"] for _, _, p in pairs), steps),
        "drafted_per_step": _ratio(sum(p["drafted"] for _, _, p in pairs), steps),
    }


def same_device(profile: Mapping[str, Any], record: Mapping[str, Any]) -> bool:
    """Whether the benchmark ran on the profile's device (a CPU of the same model name, or the same GPU)."""
    device, bench = str(profile.get("device", "")), str(record.get("device", ""))
    if device.startswith("cpu"):
        return bench == "cpu" and profile.get("cpu") in (None, record.get("cpu"))
    return bench.startswith("cuda") and bench.endswith(f"({device})")


def project(records: list[dict], profile: Mapping[str, Any], *, draft_cost: float | Mapping[str, float] | None = None,
            loop_cost: float | Mapping[str, float] | None = None, source: str = "the benchmark") -> dict[str, Any]:
    """Project every method of every run of ``records`` (a benchmark JSONL's) onto ``profile``'s device.

    Args:
        records: from :func:`load_benchmark`; methods without per-step records (greedy, transformers' own
            methods, files written before per-step records) are listed as skipped.
        profile: from :func:`load_profile`.
        draft_cost: one-token forwards of drafting per step, for every method (a number) or per method (a
            mapping, ``"*"`` for the others); ``None``: each step's own, from the benchmark (module docstring).
        loop_cost: the same for the loop's own work per step (``o_i`` in the module docstring); 0 leaves it out.
        source: the benchmark's name, for messages.

    Returns:
        A JSON-ready dict: the profile's device, dtype and label, the draft-cost rule, and per run a row per
        method and category (``OVERALL`` too when there are several) with ``tau``, ``measured_speedup``
        (``None`` unless the benchmark ran on the profile's device), ``projected_speedup``,
        ``projected_median_speedup``, ``projected_speedup_per_tau``, ``draft_cost_per_step``,
        ``verify_cost_per_step`` and ``loop_cost_per_step`` (one-token forwards), plus notes.
    """
    check_draft_cost(draft_cost)
    check_draft_cost(loop_cost, "loop_cost")
    if not any(r.get("steps") is not None for r in records):
        methods = sorted({r["method"] for r in records if r["method"] != BASELINE}) or ["none"]
        raise ValueError(f"{source} has no per-step records (methods: {', '.join(methods)}); it was written before "
                         f"hf_speculative recorded them, or holds only transformers' own methods: {RERUN}.")
    runs = []
    for run_id in _ordered(r.get("run_id", "") for r in records):
        run = [r for r in records if r.get("run_id", "") == run_id]
        first = run[0]
        greedy = {(r["category"], r["question_id"]): r for r in run if r["method"] == BASELINE}
        if not greedy:
            raise ValueError(f"{source}: run {run_id or '(unnamed)'} has no {BASELINE} rows to compare with; every "
                             "`hf-speculative bench` run writes them: pass a JSONL that bench wrote, unfiltered.")
        notes: list[str] = []
        methods = [m for m in _ordered(r["method"] for r in run) if m != BASELINE]
        skipped = [m for m in methods if all(r.get("steps") is None for r in run if r["method"] == m)]
        if skipped:
            notes.append(f"not projected (no per-step records; transformers' own methods are not observed step by "
                         f"step): {', '.join(skipped)}")
        categories = _ordered(r["category"] for r in run)
        rows, lo, hi, beyond = [], None, None, 0
        largest = max(int(n) for by_shape in profile["relative"].values() for sizes in by_shape.values() for n in sizes)
        for method in (m for m in methods if m not in skipped):
            cost, loop = _draft_cost_for(draft_cost, method), _draft_cost_for(loop_cost, method)
            pairs, unmatched, unlooped = [], 0, 0
            for r in run:
                if r["method"] != method or r.get("steps") is None:
                    continue
                g = greedy.get((r["category"], r["question_id"]))
                if g is None:
                    unmatched += 1
                    continue
                p = project_run(r, g, profile, draft_cost=cost, loop_cost=loop)
                pairs.append((r, g, p))
                unlooped += loop is None and "other_s" not in r["steps"]
                lo = p["contexts"][0] if lo is None else min(lo, p["contexts"][0])
                hi = p["contexts"][1] if hi is None else max(hi, p["contexts"][1])
                beyond += sum(1 for n in r["steps"]["drafted"] if n > largest)
            if unmatched:
                notes.append(f"{method}: {unmatched} run(s) without a greedy run of the same prompt left out")
            if unlooped:
                notes.append(f"{method}: {unlooped} run(s) written before steps recorded the loop's own work "
                             "(other_s): projected without it")
            shape = next((r.get("shape") for r, _, _ in pairs if r.get("shape")), "chain")
            for category in categories + ([OVERALL] if len(categories) > 1 else []):
                subset = [t for t in pairs if category == OVERALL or t[0]["category"] == category]
                if subset:
                    rows.append({"method": method, "category": category, "shape": shape,
                                 "draft_cost": "measured" if cost is None else cost,
                                 "loop_cost": "measured" if loop is None else loop, **_summarize(subset)})
        contexts = sorted(int(c) for c in profile["relative"])
        if lo is not None and (lo < contexts[0] / 2 or hi > contexts[-1] * 2):
            notes.append(f"steps ran at contexts {lo}-{hi}, the profile measured {', '.join(map(str, contexts))}: "
                         "the nearest one was used")
        if beyond:
            notes.append(f"{beyond} step(s) verified more than the profile's largest size ({largest}): extrapolated "
                         "with its last slope")
        same = same_device(profile, first)
        if not same:
            for row in rows:
                row["measured_speedup"] = None
        runs.append({
            "run_id": run_id, "model": first.get("model", ""), "device": first.get("device", ""),
            "cpu": first.get("cpu", ""), "threads": first.get("threads"), "torch": first.get("torch"),
            "transformers": first.get("transformers"), "max_new_tokens": first.get("max_new_tokens"),
            "same_device": same, "rows": rows, "notes": notes,
        })
    return {
        "format": FORMAT,
        "benchmark": source,
        "profile": {key: profile.get(key) for key in ("label", "device", "cpu", "dtype", "torch", "transformers",
                                                      "threads")},
        "profile_contexts": sorted(int(c) for c in profile["relative"]),
        "draft_cost": describe_draft_cost(draft_cost),
        "loop_cost": describe_draft_cost(loop_cost, "loop"),
        "runs": runs,
    }


def describe_draft_cost(draft_cost: float | Mapping[str, float] | None, what: str = "draft") -> str:
    """The draft-cost (or, ``what="loop"``, loop-cost) rule in words, for the report."""
    measured = ("each step's draft seconds on the benchmark machine over greedy's seconds per token there "
                "(assumes drafting scales like the target forward between the two devices)") if what == "draft" else (
                "each step's seconds outside drafting and verifying (other_s) on the benchmark machine over greedy's "
                "seconds per token there (assumes the loop's host work scales like the target forward)")
    if draft_cost is None:
        return measured
    if isinstance(draft_cost, Mapping):
        given = ", ".join(f"{m}: {v:g}" for m, v in draft_cost.items() if m != "*")
        rest = f"{draft_cost['*']:g} per step" if "*" in draft_cost else measured
        return f"fixed per step (one-token forwards) for {given}; the other methods: {rest}"
    return f"fixed: {draft_cost:g} one-token forwards per step (--{what}-cost)"


# -- output -------------------------------------------------------------------------------------
def _device_name(result: Mapping[str, Any]) -> str:
    """The profile's device: the GPU's name, or ``cpu (MODEL)`` when the profile names the CPU's model."""
    device, cpu = str(result["profile"].get("device") or "?"), result["profile"].get("cpu")
    return f"cpu ({cpu})" if device.startswith("cpu") and cpu else device


def format_markdown(result: Mapping[str, Any]) -> str:
    """The projection as markdown: a title naming the profile's device, dtype and label, then per run a table
    of method x category."""
    prof = result["profile"]
    device = _device_name(result)
    parts = [f"# Projected speedup on {device} ({prof.get('dtype', '?')})",
             f"Projected from `{result['benchmark']}` with the verification profile of {prof.get('label', '?')} on "
             f"{device} ({prof.get('dtype', '?')}, torch {prof.get('torch', '?')}, transformers "
             f"{prof.get('transformers', '?')}; contexts {', '.join(map(str, result['profile_contexts']))}). "
             "Projected: one target forward verifying n draft tokens costs the profile's relative cost at the step's "
             "context, plus the draft cost and the loop's own work, against one one-token forward per greedy token; τ "
             f"and the drafts are the benchmark's. Draft cost: {result['draft_cost']}. Loop cost: "
             f"{result.get('loop_cost', 'none')}."]
    for run in result["runs"]:
        machine = run["device"] + (f" ({run['cpu']})" if run["device"] == "cpu" and run.get("cpu") else "")
        parts.append(f"## {run['model'] or '?'}" + (f" (run {run['run_id']})" if run["run_id"] else ""))
        measured_note = ("measured speedups are this run's, on the profile's device" if run["same_device"] else
                         "the profile's device is another: measured speedups are not comparable and not shown")
        parts.append(f"Benchmark machine: {machine}, {run.get('threads')} thread(s), torch {run.get('torch')}, "
                     f"transformers {run.get('transformers')}, max_new_tokens {run.get('max_new_tokens')}; "
                     f"{measured_note}.")
        header = ["method", "category", "prompts", "τ", "measured speedup (benchmark machine)",
                  f"projected speedup ({device})", "projected speedup / τ",
                  "projected draft cost / step", "projected verify cost / step", "projected loop cost / step"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in run["rows"]:
            lines.append("| " + " | ".join([
                f"{row['method']} ({row['shape']})", row["category"], str(row["prompts"]),
                format_value(row["tau"], "{:.2f}"),
                format_value(row["measured_speedup"], "{:.2f}×"),
                format_value(row["projected_speedup"], "{:.2f}×"),
                format_value(row["projected_speedup_per_tau"], "{:.2f}"),
                format_value(row["draft_cost_per_step"], "{:.3f}"),
                format_value(row["verify_cost_per_step"], "{:.3f}"),
                format_value(row.get("loop_cost_per_step"), "{:.3f}"),
            ]) + " |")
        parts.append("\n".join(lines) if run["rows"] else "No method with per-step records in this run.")
        if run["notes"]:
            parts.append("\n".join(f"- {note}" for note in run["notes"]))
    parts.append("Costs are in one-token forwards of the profile's device (draft and loop cost: see above). The "
                 "projection leaves out the prefill, for greedy and the methods alike, a verification's work besides "
                 "its forward (acceptance, the cache's cut) and greedy's own loop work per token.")
    return "\n\n".join(parts) + "\n"


def save(result: Mapping[str, Any], path: str | os.PathLike) -> tuple[Path, Path]:
    """Write the projection as JSON to ``path`` and as markdown beside it (``.md``); returns both paths."""
    path = Path(path)
    json_path = path if path.suffix == ".json" else path.with_suffix(".json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    md_path = json_path.with_suffix(".md")
    md_path.write_text(format_markdown(result), encoding="utf-8")
    return json_path, md_path
