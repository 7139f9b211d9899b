"""``gpu-check``'s ``real`` step: real weights end to end on Spec-Bench prompts, every arm in the same run.

    python -m tools.gpu.gpu_check --steps real --real-model /tmp/smollm2 \
        --real-drafter smollm2-135m-instruct --real-medusa smollm2-135m-instruct   # after `tools.carry join`

On the lent GPU the model comes in parts (``tools/carry.py``: each device call carries at most 64 MiB), the
drafter with the package (the shipped EAGLE drafters are a few MiB). Per prompt, after a warm-up round that also
compiles, each arm runs ``repeats`` times, interleaved: transformers' greedy eager (the reference) and on a static
cache (one cache size for every prompt, compiled by transformers where it compiles), prompt lookup chains and
32-node trees, SuffixDecoding, Medusa's calibrated tree (``--real-medusa``) and EAGLE chains and trees through our
loop, eager and compiled (``hfs.enable(model, compile=...)``: the target's forward and EAGLE's drafting steps). Reported
per arm: tokens/s, the median over prompts of its speed relative to each greedy, τ, the prompts whose output is
identical to the eager greedy's (bfloat16 near-ties can make two exact loops part ways: see the device battery),
and the median drafting and verification milliseconds per step. The longest prompt runs first, so the static caches
and graphs made for it serve every later prompt; ``--real-max-minutes`` starts no prompt past a time limit, and the
report is written after every prompt (a call cut off at its limit still returns what it measured).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

EAGER, STATIC = "transformers greedy (eager)", "transformers greedy (static cache)"  # the greedy arms' labels


def _arms(model: torch.nn.Module, drafter: str | None, medusa: str | None = None,
          fixed: bool = False, only: list[str] | None = None) -> dict[str, tuple[Any, Any]]:
    """label -> (strategy, compile): ``None`` strategies are transformers' greedy (compile ``"static"``: on a
    static cache). ``fixed`` adds compiled arms that draft their full budget every step (``adaptive=False``): what
    a drafter's τ and drafting cost are where the cost model chooses not to draft. ``only``: keep the arms whose
    label contains one of these strings (both greedy arms always stay: every speed is relative to them)."""
    import hf_speculative as hfs

    tree32 = hfs.DynamicTree(nodes=32)
    arms: dict[str, tuple[Any, Any]] = {EAGER: (None, False), STATIC: (None, "static"),
                                        "prompt lookup, compiled": (hfs.PromptLookup(), True),
                                        "prompt lookup tree 32, compiled": (hfs.PromptLookup(tree=tree32), True),
                                        "SuffixDecoding, compiled": (hfs.SuffixDecoding(), True)}
    if drafter is not None:
        chain = hfs.Eagle.from_pretrained(drafter, target=model)
        tree = hfs.Eagle.from_pretrained(drafter, target=model, tree=hfs.DynamicTree())
        arms.update({"EAGLE chain (eager)": (chain, False), "EAGLE chain, compiled": (chain, True),
                     "EAGLE tree 32 (eager)": (tree, False), "EAGLE tree 32, compiled": (tree, True)})
    if medusa is not None:
        arms["Medusa tree, compiled"] = (hfs.Medusa.from_pretrained(medusa, target=model, tree="calibrated"), True)
    if fixed:  # the same strategies (their loaded networks shared), drafting the whole budget every step
        for label in ("prompt lookup tree 32", "EAGLE chain", "EAGLE tree 32", "Medusa tree"):
            if f"{label}, compiled" in arms:
                strategy = arms[f"{label}, compiled"][0]
                arms[f"{label}, compiled, fixed"] = (dataclasses.replace(strategy, adaptive=False), True)
    from .gpu_check import keep_labels

    return keep_labels(arms, only, "--real-arms")


def _call(model: torch.nn.Module, strategy: Any, compile: Any, base: dict,
          capacity: int | None = None) -> Callable[[], torch.Tensor]:
    """One arm's call; transformers' static-cache greedy gets a fresh cache of ``capacity`` positions each call (one
    size for every prompt, so transformers compiles its decoding forward once rather than per prompt length). A
    strategy's ``compile``: ``True`` or a mode compiles our verification (on its static cache), ``"static"`` verifies
    on the static cache uncompiled (the CPU dry run of the inflated step), ``False`` on the dynamic cache."""
    import hf_speculative as hfs

    from hf_speculative.compat import cache_kwarg
    from hf_speculative.core.kv_cache import new_static_cache
    from hf_speculative.hf.checks import draft_budget

    if strategy is None:
        if compile != "static":
            return lambda: type(model).generate(model, **base)
        if capacity is None:
            return lambda: type(model).generate(model, **base, cache_implementation="static")
        return lambda: type(model).generate(model, **base, **{cache_kwarg(): new_static_cache(model, capacity)})
    static = {"cache_implementation": "static"} if compile == "static" else {}
    hfs.enable(model, compile=False if static else compile, static_budget=draft_budget(strategy))  # chains: own size
    return lambda: model.generate(**base, **static, candidate_generator=strategy)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_real(model_dir: Path, device: str, dtype: torch.dtype, *, drafter: str | None, per_category: int,
             new_tokens: int, repeats: int, medusa: str | None = None, fixed: bool = False,
             max_minutes: float | None = None, only: list[str] | None = None,
             on_prompt: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run every arm on Spec-Bench's first ``per_category`` prompts per category, longest prompt first (so that the
    static caches and compiled graphs made for it fit every later call: no recompiling per prompt length), then
    round robin. ``only``: the arms to run (:func:`_arms`). ``max_minutes``: start no prompt after that many minutes
    (a lent GPU's call has a time limit); ``on_prompt`` receives the report so far after each prompt."""
    import hf_speculative as hfs

    from hf_speculative.tooling.prompting import encode_prompt
    from .gpu_check import log
    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.drafters.suffix.history import outputs_held

    began = time.perf_counter()
    model, tokenizer = hfs.load_model(str(model_dir), dtype=dtype, device=device)
    # each arm's budget is a shape of the target's compiled forward, each drafting width one of the drafter's step:
    # more than torch's default of 8 graphs per function in one process (the library leaves the limit alone)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    hfs.enable(model)
    arms = _arms(model, drafter, medusa, fixed, only)
    prompts = [(prompt, encode_prompt(tokenizer, prompt.text).to(device))  # [1, L]
               for prompt in load_prompts(per_category=per_category)]
    longest = max(range(len(prompts)), key=lambda i: prompts[i][1].shape[1])
    prompts.insert(0, prompts.pop(longest))
    capacity = -(-(prompts[0][1].shape[1] + new_tokens + 1) // 256) * 256
    rows: dict[str, list[dict]] = {label: [] for label in arms}
    report = {"model": str(model_dir), "drafter": drafter, "medusa": medusa, "fixed": fixed,
              "dtype": str(dtype).replace("torch.", ""),
              "per_category": per_category, "new_tokens": new_tokens, "repeats": repeats, "rows": rows}
    for done, (prompt, ids) in enumerate(prompts):
        minutes = (time.perf_counter() - began) / 60
        if max_minutes is not None and done and minutes > max_minutes:
            log("real", f"stopping after {done} of {len(prompts)} prompts: {minutes:.1f} min > --real-max-minutes")
            report["stopped_after_prompts"] = done
            break
        # SuffixDecoding's history of outputs is the model's (a fresh strategy drafted the previous repeat's answer
        # too, τ 8.4 on both H200 runs): the repeats draft from the earlier prompts' outputs, never their own
        with outputs_held(model):
            _run_prompt(model, arms, prompt, ids, new_tokens, repeats, capacity, device, rows)
        log("real", f"{time.perf_counter() - began:.0f}s", prompt.category, prompt.question_id,
            {label: round(r[-1].get("seconds", float("nan")), 3) for label, r in rows.items()})
        report["arms"] = _summarize(rows)
        if on_prompt is not None:
            on_prompt(report)
    report["arms"] = _summarize(rows)
    return report


def _run_prompt(model: torch.nn.Module, arms: dict[str, tuple[Any, Any]], prompt: Any, ids: torch.Tensor,
                new_tokens: int, repeats: int, capacity: int, device: str, rows: dict[str, list[dict]],
                reference: str = EAGER, others: dict[str, torch.Tensor] | None = None) -> None:
    """One prompt: a warm-up round (it compiles), then ``repeats`` rounds of every arm in turn; a row per arm, its
    ``identical`` against the arm ``reference``'s output (and ``identical_to_static`` against the static-cache
    greedy's, ``identical_to_<name>`` against each of ``others``, outputs computed elsewhere)."""
    import hf_speculative as hfs

    from .gpu_check import _step_times

    base = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    times: dict[str, list[float]] = {label: [] for label in arms}
    outputs: dict[str, Any] = {}
    for repeat in range(repeats + 1):  # round 0 warms up and compiles
        for label, (strategy, compile) in arms.items():
            try:
                call = _call(model, strategy, compile, base, capacity)
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
    reference = outputs[reference][0]
    static = outputs.get(STATIC)
    static = static[0] if isinstance(static, tuple) else None
    new = reference.shape[1] - ids.shape[1]
    for label in arms:
        if isinstance(outputs.get(label), str) or not times[label]:
            rows[label].append({"question_id": prompt.question_id, "error": outputs.get(label, "not run")})
            continue
        out, stats = outputs[label]
        row = {"question_id": prompt.question_id, "category": prompt.category, "new_tokens": new,
               "seconds": statistics.median(times[label]), "identical": bool(torch.equal(out, reference)),
               "first_divergence": _first_divergence(out, reference, ids.shape[1])}
        if static is not None:
            row["identical_to_static"] = bool(torch.equal(out, static))
        for name, other in (others or {}).items():
            row[f"identical_to_{name}"] = bool(torch.equal(out.cpu(), other.cpu()))
            row[f"first_divergence_from_{name}"] = _first_divergence(out.cpu(), other.cpu(), ids.shape[1])
        if stats is not None:
            row.update(tau=round(stats.tau, 3), **_step_times(stats))
        rows[label].append(row)


def _first_divergence(out: torch.Tensor, reference: torch.Tensor, prompt: int) -> int | None:
    """The first new token (0-based) where ``out`` leaves ``reference``; ``None`` when they are identical."""
    a, b = out[0, prompt:].tolist(), reference[0, prompt:].tolist()
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _summarize(rows: dict[str, list[dict]], baselines: tuple[str, ...] = (EAGER, STATIC)) -> dict[str, dict[str, Any]]:
    """Per arm: tokens/s and the median of its per-prompt speed against each greedy of ``baselines``, τ, identical
    prompts (and ``identical_to_<name>`` counts for each such field of the rows)."""
    greedy = {label: {r["question_id"]: r["seconds"] for r in rows[label] if "seconds" in r}
              for label in baselines if label in rows}
    summary = {}
    for label, runs in rows.items():
        done = [r for r in runs if "seconds" in r]
        if not done:
            summary[label] = {"error": next((r["error"][-300:] for r in runs if "error" in r), "not run")}
            continue
        arm = {"prompts": len(done), "identical": sum(r["identical"] for r in done),
               "identical_to_static": sum(r.get("identical_to_static", False) for r in done),
               "tokens_per_s": round(sum(r["new_tokens"] for r in done) / sum(r["seconds"] for r in done), 2)}
        for name, by_id in greedy.items():
            ratios = [by_id[r["question_id"]] / r["seconds"] for r in done if r["question_id"] in by_id]
            if ratios:
                arm[f"vs {name}"] = round(statistics.median(ratios), 3)
        for key in sorted({k for r in done for k in r if k.startswith("identical_to_") and k != "identical_to_static"}):
            arm[key] = sum(r.get(key, False) for r in done)
        parted = [r["first_divergence"] for r in done if r.get("first_divergence") is not None]
        if parted:  # where bfloat16 near-ties part it from eager greedy: the new token's index, median
            arm["first_divergence"] = statistics.median(parted)
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
                                                         f"{arm['identical']}/{arm['prompts']}",
                                                         f"{arm.get('identical_to_static', 0)}/{arm['prompts']}",
                                                         arm.get("first_divergence", "")])
            for label, arm in real["arms"].items()]
    prompts = len(real["rows"][EAGER])
    return [f"## Real weights: {real['model']} ({real['dtype']}), EAGLE drafter {real['drafter']}, Medusa heads "
            f"{real.get('medusa')}, {prompts} Spec-Bench prompts (up to {real['per_category']} per category), "
            f"{real['new_tokens']} new tokens, median of {real['repeats']}", "",
            *table_lines(["arm", "tokens/s", "vs eager greedy", "vs static-cache greedy", "τ", "drafting ms/step",
                          "verification ms/step", "identical to eager greedy", "to static-cache greedy",
                          "parts from eager at (median)"], rows), ""]
