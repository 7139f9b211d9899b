"""``gpu-check``'s ``real`` step: real weights end to end on Spec-Bench prompts, every arm in the same run.

    python -m tools.gpu.gpu_check --steps real --real-model /tmp/smollm2 \
        --real-drafter smollm2-135m-instruct                      # after `python -m tools.carry join carry /tmp/smollm2`

On the lent GPU the model comes in parts (``tools/carry.py``: each device call carries at most 64 MiB), the
drafter with the package (the shipped EAGLE drafters are a few MiB). Per prompt, after a warm-up round that also
compiles, each arm runs ``repeats`` times, interleaved: transformers' greedy eager (the reference) and on a static
cache (compiled by transformers where it compiles), prompt lookup and EAGLE chains and trees through our loop,
eager and compiled (``hfs.enable(model, compile=...)``: the target's forward and EAGLE's drafting steps). Reported
per arm: tokens/s, the median over prompts of its speed relative to each greedy, τ, the prompts whose output is
identical to the eager greedy's (bfloat16 near-ties can make two exact loops part ways: see the device battery),
and the median drafting and verification milliseconds per step.
"""

from __future__ import annotations

import statistics
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch


def _arms(model: torch.nn.Module, drafter: str | None) -> dict[str, tuple[Any, Any]]:
    """label -> (strategy, compile): ``None`` strategies are transformers' greedy (compile ``"static"``: on a
    static cache)."""
    import hf_speculative as hfs

    arms: dict[str, tuple[Any, Any]] = {"transformers greedy (eager)": (None, False),
                                        "transformers greedy (static cache)": (None, "static"),
                                        "prompt lookup, compiled": (hfs.PromptLookup(), True)}
    if drafter is not None:
        chain = hfs.Eagle.from_pretrained(drafter, target=model)
        tree = hfs.Eagle.from_pretrained(drafter, target=model, tree=hfs.DynamicTree())
        arms.update({"EAGLE chain (eager)": (chain, False), "EAGLE chain, compiled": (chain, True),
                     "EAGLE tree 32 (eager)": (tree, False), "EAGLE tree 32, compiled": (tree, True)})
    return arms


def _call(model: torch.nn.Module, strategy: Any, compile: Any, base: dict) -> Callable[[], torch.Tensor]:
    import hf_speculative as hfs

    from hf_speculative.hf.checks import draft_budget

    if strategy is None:
        extra = {"cache_implementation": "static"} if compile == "static" else {}
        return lambda: type(model).generate(model, **base, **extra)
    hfs.enable(model, compile=compile, static_budget=draft_budget(strategy))  # chains are not padded to a tree's size
    return lambda: model.generate(**base, candidate_generator=strategy)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_real(model_dir: Path, device: str, dtype: torch.dtype, *, drafter: str | None, per_category: int,
             new_tokens: int, repeats: int) -> dict[str, Any]:
    import hf_speculative as hfs

    from hf_speculative.tooling.prompting import encode_prompt
    from .gpu_check import _step_times, log
    from hf_speculative.bench.spec_bench import load_prompts

    model, tokenizer = hfs.load_model(str(model_dir), dtype=dtype, device=device)
    # each arm's budget is a shape of the target's compiled forward, each drafting width one of the drafter's step:
    # more than torch's default of 8 graphs per function in one process (the library leaves the limit alone)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    hfs.enable(model)
    arms = _arms(model, drafter)
    rows: dict[str, list[dict]] = {label: [] for label in arms}
    for prompt in load_prompts(per_category=per_category):
        ids = encode_prompt(tokenizer, prompt.text).to(device)  # [1, L]
        base = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
        times: dict[str, list[float]] = {label: [] for label in arms}
        outputs: dict[str, Any] = {}
        for repeat in range(repeats + 1):  # round 0 warms up and compiles
            for label, (strategy, compile) in arms.items():
                try:
                    call = _call(model, strategy, compile, base)
                    _sync(device)
                    tick = time.perf_counter()
                    out = call()
                    _sync(device)
                    seconds = time.perf_counter() - tick
                except Exception:  # noqa: BLE001 - one failing arm must not lose the others
                    outputs[label] = traceback.format_exc()[-1500:]
                    continue
                finally:
                    hfs.enable(model, compile=False)
                if repeat:
                    times[label].append(seconds)
                outputs[label] = (out, hfs.last_stats(model) if strategy is not None else None)
        reference = outputs["transformers greedy (eager)"][0]
        new = reference.shape[1] - ids.shape[1]
        for label in arms:
            if isinstance(outputs.get(label), str) or not times[label]:
                rows[label].append({"question_id": prompt.question_id, "error": outputs.get(label, "not run")})
                continue
            out, stats = outputs[label]
            row = {"question_id": prompt.question_id, "category": prompt.category, "new_tokens": new,
                   "seconds": statistics.median(times[label]), "identical": bool(torch.equal(out, reference))}
            if stats is not None:
                row.update(tau=round(stats.tau, 3), **_step_times(stats))
            rows[label].append(row)
        log("real", prompt.category, prompt.question_id,
            {label: round(r[-1].get("seconds", float("nan")), 3) for label, r in rows.items()})
    return {"model": str(model_dir), "drafter": drafter, "dtype": str(dtype).replace("torch.", ""),
            "per_category": per_category, "new_tokens": new_tokens, "repeats": repeats,
            "arms": _summarize(rows), "rows": rows}


def _summarize(rows: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    """Per arm: tokens/s and the median of its per-prompt speed against each greedy, τ, identical prompts."""
    greedy = {label: {r["question_id"]: r["seconds"] for r in rows[label] if "seconds" in r}
              for label in ("transformers greedy (eager)", "transformers greedy (static cache)")}
    summary = {}
    for label, runs in rows.items():
        done = [r for r in runs if "seconds" in r]
        if not done:
            summary[label] = {"error": next((r["error"][-300:] for r in runs if "error" in r), "not run")}
            continue
        arm = {"prompts": len(done), "identical": sum(r["identical"] for r in done),
               "tokens_per_s": round(sum(r["new_tokens"] for r in done) / sum(r["seconds"] for r in done), 2)}
        for name, by_id in greedy.items():
            ratios = [by_id[r["question_id"]] / r["seconds"] for r in done if r["question_id"] in by_id]
            if ratios:
                arm[f"vs {name}"] = round(statistics.median(ratios), 3)
        for key in ("tau", "draft_ms_per_step", "verify_ms_per_step"):
            values = [r[key] for r in done if key in r]
            if values:
                arm[key] = round(statistics.median(values), 3)
        summary[label] = arm
    return summary


def summary_lines(real: dict[str, Any]) -> list[str]:
    """The ``real`` step's table for ``summary.md``."""
    from .gpu_check import table_lines

    keys = ("tokens_per_s", "vs transformers greedy (eager)", "vs transformers greedy (static cache)", "tau",
            "draft_ms_per_step", "verify_ms_per_step")
    rows = [(label, arm["error"] if "error" in arm else [*(arm.get(k, "") for k in keys),
                                                         f"{arm['identical']}/{arm['prompts']}"])
            for label, arm in real["arms"].items()]
    return [f"## Real weights: {real['model']} ({real['dtype']}), drafter {real['drafter']}, {real['per_category']} "
            f"Spec-Bench prompts per category, {real['new_tokens']} new tokens, median of {real['repeats']}", "",
            *table_lines(["arm", "tokens/s", "vs eager greedy", "vs static-cache greedy", "τ", "drafting ms/step",
                          "verification ms/step", "identical"], rows), ""]
