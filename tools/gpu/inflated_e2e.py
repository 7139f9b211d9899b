"""``gpu-check``'s ``inflated`` step: a real small model and its shipped drafters inflated to a large shape, end to end.

    python -m tools.gpu.gpu_check --device cuda --steps inflated --real-model /tmp/lent/model   # on a lent GPU
    python -m tools.gpu.gpu_check --device cpu --tiny --steps inflated                           # the dry run

SmolLM2-135M (``--real-model``: a folder, or a registry name) and its shipped EAGLE-3, DFlash and Medusa drafters
are inflated to ``--inflate-shape`` (default Llama-3.1-8B's: ``tools/gpu/inflate.py``) on the device: verification
and drafting cost what they cost at that shape while every prediction is SmolLM2's, so τ is real. **Every figure is
a cost model** (``inflated (cost model)`` heads every table and the report), not a measurement of a real 8B model.

Arms (label -> what runs), all through our loop on the static cache, compiled (``reduce-overhead`` on CUDA; the
CPU dry run verifies on the same static cache uncompiled, as inductor's CPU compiles take minutes): transformers'
greedy on a static cache (compiled by transformers on CUDA: the baseline and the identity reference), prompt lookup,
EAGLE chains and 32-node trees, DFlash 32-node trees, Medusa's calibrated tree, each as the cost model sizes it and
(``fixed``) drafting its whole budget every step. Per arm: tokens/s, speed over compiled greedy (median per prompt),
τ, speedup/τ, drafting and verification ms per step, drafting in compiled greedy's tokens, outputs identical to
compiled greedy's and to the small model's own eager greedy (float32 by default: token-exact, so a parting is a
finding). The budgets share compiled shapes (chains of 8, trees of 16 and 32, prompt lookup's copies capped at 32).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .inflate import COST_MODEL
from .real_e2e import STATIC, _run_prompt, _summarize

# The prompts, one per Spec-Bench category in this order (the longest runs first: its graphs serve the others).
CATEGORIES = ("summarization", "coding", "writing", "rag", "math", "reasoning", "extraction", "qa")
TINY_CATEGORIES = ("qa",)  # the dry run's: the shortest prompt


def _arms(strategies: dict[str, Any], compile: Any, fixed: bool, only: list[str] | None) -> dict[str, tuple[Any, Any]]:
    """label -> (strategy, compile) for the inflated drafters ``strategies`` (``eagle``, ``dflash``, ``medusa``); the
    static-cache greedy always stays (the baseline). ``fixed`` adds each drafter arm with ``adaptive=False``."""
    import hf_speculative as hfs

    from .gpu_check import keep_labels

    tree32 = hfs.DynamicTree(nodes=32)
    eagle, dflash, medusa = strategies["eagle"], strategies["dflash"], strategies["medusa"]
    drafters = {"EAGLE tree 32": dataclasses.replace(eagle, tree=tree32),
                "EAGLE chain": dataclasses.replace(eagle, tree=None),
                "DFlash tree 32": dataclasses.replace(dflash, tree=tree32),
                "Medusa tree": medusa,
                "prompt lookup": hfs.PromptLookup(copy_tokens=32)}
    arms: dict[str, tuple[Any, Any]] = {STATIC: (None, "static")}
    for label, strategy in drafters.items():
        arms[f"{label}, compiled"] = (strategy, compile)
        if fixed and label != "prompt lookup":
            arms[f"{label}, compiled, fixed"] = (dataclasses.replace(strategy, adaptive=False), compile)
    return keep_labels(arms, only, "--inflated-arms")


def _inflated(model_dir: str, drafters: str, shape_name: str, device: str, dtype: torch.dtype) -> tuple:
    """``(small, tokenizer, big, strategies, shape)``: the small model in float32 on ``device`` (the identity
    reference), its shipped drafters and the model inflated to ``shape_name`` in ``dtype``, the drafters with it."""
    import hf_speculative as hfs

    from .inflate import inflate_model, shipped_shape
    from .inflate_drafters import METHODS, inflate_strategy, load_shipped

    small, tokenizer = hfs.load_model(str(model_dir), dtype=torch.float32, device=device)
    config = small.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shape = shipped_shape(shape_name, head_dim)
    big = inflate_model(small, shape, dtype=dtype, name=drafters)
    strategies = {m: inflate_strategy(load_shipped(m, drafters, small), big, shape, drafters) for m in METHODS}
    return small, tokenizer, big, strategies, shape


def run_inflated(model_dir: str | Path, device: str, dtype: torch.dtype, *, drafters: str, shape: str,
                 categories: tuple[str, ...], new_tokens: int, repeats: int, compile: Any, fixed: bool = True,
                 max_minutes: float | None = None, only: list[str] | None = None,
                 on_prompt: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every arm on one Spec-Bench prompt per category of ``categories``, longest first, after a warm-up round per
    prompt (the first one compiles); ``max_minutes``: start no prompt after that; ``on_prompt`` gets the report so far
    after each prompt. ``compile``: each arm's (``True``: ``hfs.enable``'s mode for the device, a torch.compile mode,
    or ``"static"``: the static cache uncompiled)."""
    import hf_speculative as hfs
    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.tooling.prompting import encode_prompt

    from .gpu_check import log
    from .inflate import is_inflated

    began = time.perf_counter()
    small, tokenizer, big, strategies, shaped = _inflated(str(model_dir), drafters, shape, device, dtype)
    log("inflated", COST_MODEL, f"{drafters} -> {shaped}, {sum(p.numel() for p in big.parameters()) / 1e9:.2f} B "
        f"parameters, built in {time.perf_counter() - began:.0f} s")
    # every budget is a shape of the compiled target forward, every drafting width one of EAGLE's compiled step
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    hfs.enable(big)
    arms = _arms(strategies, compile, fixed, only)
    chosen = {p.category: p for p in load_prompts(categories=list(categories), per_category=1)}
    prompts = [(chosen[c], encode_prompt(tokenizer, chosen[c].text).to(device)) for c in categories if c in chosen]
    prompts.sort(key=lambda pair: -pair[1].shape[1])
    capacity = -(-(prompts[0][1].shape[1] + new_tokens + 1) // 256) * 256
    rows: dict[str, list[dict]] = {label: [] for label in arms}
    report: dict[str, Any] = {"label": COST_MODEL, "inflated": is_inflated(big), "model": str(model_dir),
                              "drafters": drafters, "shape": dataclasses.asdict(shaped),
                              "dtype": str(dtype).replace("torch.", ""), "fixed": fixed,
                              "compile": ("reduce-overhead" if device == "cuda" else "default") if compile is True
                              else compile,
                              "new_tokens": new_tokens, "repeats": repeats, "rows": rows}
    for done, (prompt, ids) in enumerate(prompts):
        minutes = (time.perf_counter() - began) / 60
        if max_minutes is not None and done and minutes > max_minutes:
            log("inflated", f"stopping after {done} of {len(prompts)} prompts: {minutes:.1f} min > the limit")
            report["stopped_after_prompts"] = done
            break
        kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
        small_greedy = type(small).generate(small, **kwargs)  # the small model itself: the inflation's identity
        _run_prompt(big, arms, prompt, ids, new_tokens, repeats, capacity, device, rows, reference=STATIC,
                    others={"small": small_greedy})
        report["arms"] = summarize(rows)
        log("inflated", f"{time.perf_counter() - began:.0f}s", prompt.category,
            {label: arm.get("tokens_per_s", "error") for label, arm in report["arms"].items()})
        if on_prompt is not None:
            on_prompt(report)
    report["arms"] = summarize(rows)
    report["seconds"] = round(time.perf_counter() - began, 1)
    return report


def summarize(rows: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    """``real_e2e``'s per-arm summary against compiled greedy, with speedup/τ and drafting in greedy's tokens (the
    median over prompts of drafting ms per step over compiled greedy's ms per token)."""
    arms = _summarize(rows, baselines=(STATIC,))
    per_token = {r["question_id"]: 1e3 * r["seconds"] / r["new_tokens"] for r in rows[STATIC] if "seconds" in r}
    for label, arm in arms.items():
        speed, tau = arm.get(f"vs {STATIC}"), arm.get("tau")
        if speed is not None and tau:
            arm["speedup_per_tau"] = round(speed / tau, 3)
        drafting = [r["draft_ms_per_step"] / per_token[r["question_id"]] for r in rows[label]
                    if "draft_ms_per_step" in r and per_token.get(r["question_id"])]
        if drafting:
            arm["drafting_in_greedy_tokens"] = round(statistics.median(drafting), 3)
    return arms


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The step's table for ``summary.md``, headed as a cost model."""
    from .gpu_check import table_lines

    shape, uncompiled = report["shape"], report["compile"] == "static"
    greedy = "static-cache greedy (uncompiled)" if uncompiled else "compiled greedy"
    keys = ("tokens_per_s", f"vs {STATIC}", "tau", "speedup_per_tau", "draft_ms_per_step", "verify_ms_per_step",
            "drafting_in_greedy_tokens")
    rows = []
    for label, arm in report.get("arms", {}).items():
        if "error" in arm:
            rows.append((label, arm["error"]))
            continue
        rows.append((label, [*(arm.get(k, "") for k in keys), f"{arm['identical']}/{arm['prompts']}",
                             f"{arm.get('identical_to_small', 0)}/{arm['prompts']}", arm.get("first_divergence", "")]))
    prompts = len([r for r in report["rows"][STATIC] if "seconds" in r])
    how = "static cache, uncompiled" if uncompiled else f"compiled ({report['compile']})"
    heading = (f"## {COST_MODEL}: {report['drafters']} -> {shape['name']} (hidden {shape['hidden_size']}, "
               f"{shape['num_layers']} layers, {shape['num_heads']}/{shape['num_kv_heads']} heads, MLP "
               f"{shape['intermediate_size']}), {report['dtype']}, {how}, {prompts} Spec-Bench prompts, "
               f"{report['new_tokens']} new tokens, median of {report['repeats']}")
    note = (f"Every figure here is {COST_MODEL}: SmolLM2's predictions at the large shape's cost, not a real large "
            "model.")
    columns = ["arm (inflated, cost model)", "tokens/s", f"vs {greedy}", "τ", "speedup/τ", "drafting ms/step",
               "verification ms/step", "drafting / greedy token", f"identical to {greedy}",
               "identical to the small model", "parts at (median)"]
    return [heading, "", note, "", *table_lines(columns, rows), ""]
