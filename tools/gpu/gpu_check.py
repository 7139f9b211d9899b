"""``make gpu-check``: everything worth knowing about a GPU (or this CPU) in one command, under one folder.

    python -m tools.gpu.gpu_check --device cuda --out gpu-check/     # what `make gpu-check` runs
    python -m tools.gpu.gpu_check --device cpu --tiny --out /tmp/gc  # the same pipeline in minutes

``--tiny`` (the CPU dry run that keeps this pipeline working between GPU runs, tests/bench/test_gpu_check.py): every
step at minimal sizes, on smollm2-135m with ``TINY_LAYERS`` decoder layers instead of 30 (its width, heads and
vocabulary kept; ``--layers``): the same code paths and compiled graphs as the full depth, without paying for 30
layers in every forward and every torch.compile trace.

Steps (``--steps``, default all), each writing under ``--out``:

- ``tests``: the device battery (tests/test_device.py) in float32 (token-identical) and bfloat16 (divergences
  allowed only at near-ties, listed in ``near_ties_bfloat16.json``).
- ``profile``: verification cost on the shipped real-size configs with random weights (nothing downloaded),
  eager on a dynamic cache and compiled on a static cache: ``profile_<config>_<mode>.json``.
- ``e2e``: end-to-end decoding on a random-weight config, every method timed in the same run (warm-up, then
  the median of ``--repeats``): transformers' greedy (eager, and static cache + compile), transformers' assisted
  loop and prompt lookup, and hf_speculative's loop (eager and compiled), with :class:`SyntheticDrafter` drafts
  of one acceptance for both loops, so their tau is equal and their speed difference is the loop's; and an
  EAGLE-3 tree of 32 nodes from a random drafter of the config's shape, eager and compiled (its features from
  the compiled forward's outputs), for the machinery's cost: ``e2e.json``.
- ``project``: ``hf-speculative project`` of the benchmark JSONLs given with ``--bench`` onto each profile.
- ``real`` (with ``--real-model``): real weights end to end on Spec-Bench prompts, greedy against prompt lookup and
  EAGLE chains and trees, eager and compiled (``tools/gpu/real_e2e.py``): ``real_e2e.json``.
- ``inflated`` (only when asked for): ``--real-model`` (default: the registry's smollm2-135m-instruct) and its
  shipped EAGLE, DFlash and Medusa drafters inflated to ``--inflate-shape`` (Llama-3.1-8B's by default), every
  drafter compiled against compiled greedy, in float32 (``tools/gpu/inflated_e2e.py``): ``inflated_e2e.json``, every
  table headed ``inflated (cost model)``.
- ``train`` (only when asked for): issue 72's corpus of the target's own answers built on the device, EAGLE-3, DFlash
  and Medusa trained on it side by side within ``--train-minutes``, exported in the shipped format and cut into parts
  of at most 15.5 MiB in ``train/`` (``tools/gpu/train_drafters.py``; ``unpack`` there brings them back in).
- ``magicdec`` (only when asked for): issue 71's grid, batch x context, MagicDec against batched greedy on
  ``--real-model`` inflated to ``--inflate-shape`` in float32, one shared prefill per cell
  (``tools/gpu/long_context.py``): ``magicdec.json`` and the records in ``magicdec_grid.jsonl``.

Then ``summary.md`` gathers the figures. Nothing is fetched; a bare machine needs only torch, transformers and
this package (``pip install --no-deps --no-build-isolation -e .``), and a clone of the repository (this runner and
the device battery it runs are the team's tools and tests, not part of the installed package): run it from the
clone's root.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

STEPS = ("tests", "profile", "e2e", "project", "real", "inflated", "train", "magicdec")
# the inflated, train and magicdec steps run when asked for (GPU_STEPS=inflated, GPU_STEPS=train, GPU_STEPS=magicdec)
DEFAULT_STEPS = tuple(step for step in STEPS if step not in ("inflated", "train", "magicdec"))
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# --tiny's depth. The random EAGLE-3 drafter then reads target layers 1, 1 and 0 (distinct from 7 layers on): what
# its features hold changes nothing checked here (verification keeps every output greedy's), and 8 layers cost
# the e2e step twice 4's
TINY_LAYERS = 4


def log(*parts: Any) -> None:
    print("[gpu-check]", *parts, flush=True)


def environment(device: str) -> dict[str, Any]:
    import transformers

    import hf_speculative

    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "hf_speculative": hf_speculative.__version__, "device": device}
    if device == "cuda":
        info.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    else:
        from hf_speculative.bench.profile import cpu_model

        info.update(cpu=cpu_model(), threads=torch.get_num_threads())
    return info


# -- tests ---------------------------------------------------------------------------------------------
def run_tests(out: Path, device: str, tiny: bool) -> dict[str, Any]:
    """tests/test_device.py in float32 and bfloat16 on ``device``. On the CPU the float32 battery is the normal
    suite's own run of that file (``make test``, both transformers versions), so the CPU run adds bfloat16 only."""
    results, dtypes = {}, ("float32", "bfloat16")
    if device == "cpu":
        dtypes = ("bfloat16",)
        results["float32"] = {"returncode": 0, "summary": "skipped on the CPU: make test runs tests/test_device.py "
                              "in float32", "seconds": 0.0}
    for dtype in dtypes:
        env = dict(os.environ, HFS_TEST_DEVICE=device, HFS_TEST_DTYPE=dtype,
                   HFS_TEST_REPORT=str(out / f"near_ties_{dtype}.json"))
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_device.py"]
        if not tiny:
            command += ["-m", "slow or not slow"]  # the compiled cases too
        tick = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        (out / f"tests_{dtype}.log").write_text(done.stdout[-20000:] + done.stderr[-5000:])
        last = (done.stdout.strip().splitlines() or [""])[-1]
        results[dtype] = {"returncode": done.returncode, "summary": last, "seconds": round(time.perf_counter() - tick, 1)}
        log("tests", dtype, last)
    return results


# -- models --------------------------------------------------------------------------------------------
def config_label(name: str, layers: int | None) -> str:
    """How the reports name a shipped config built with ``layers`` decoder layers, or with its own (``None``)."""
    return name if layers is None else f"{name}-{layers}layers"


def config_model(name: str, device: str, dtype: torch.dtype, layers: int | None = None) -> torch.nn.Module:
    """A shipped config's architecture with random weights (``profile.random_model``); with ``layers``, that many
    decoder layers instead of its own (width, heads, vocabulary and everything else as shipped): the dry run's model."""
    from hf_speculative.bench import profile as profiling

    path = profiling.CONFIG_DIR / f"{name}.json"
    if layers is None or not path.is_file():  # the whole model, or random_model's error naming the shipped configs
        return profiling.random_model(name, device, dtype)
    from transformers import AutoConfig, AutoModelForCausalLM

    from hf_speculative import compat

    # random_model's build with one field changed (it takes no depth)
    fields = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    fields["num_hidden_layers"] = layers
    config = AutoConfig.for_model(**fields)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, **compat.dtype_kwargs(dtype))
    return model.eval()


# -- profiles ------------------------------------------------------------------------------------------
def run_profiles(out: Path, device: str, dtype: torch.dtype, configs: list[str], contexts: tuple[int, ...],
                 sizes: tuple[int, ...], compile_mode: str, repeats: int,
                 batches: tuple[int, ...] = (), layers: int | None = None) -> dict[str, Any]:
    """Each config's profile, eager (with ``batches``: the batch loop's forwards too) and compiled; ``layers``: each
    config built with that many decoder layers (:func:`config_model`)."""
    from hf_speculative.bench import profile as profiling

    summary: dict[str, Any] = {}
    for name in configs:
        model = config_model(name, device, dtype, layers)
        for mode in (None, compile_mode):
            key = f"{config_label(name, layers)}_{mode or 'eager'}"
            try:
                settings = profiling.ProfileSettings(contexts=contexts, sizes=sizes, repeats=repeats, compile=mode,
                                                     batches=batches if mode is None else ())
                tick = time.perf_counter()
                result = profiling.profile(model, settings, label=f"{name} (random weights)")
                result["wall_s"] = round(time.perf_counter() - tick, 1)
                profiling.save(result, out / f"profile_{key}.json")
                summary[key] = {"one_token_ms": {c: round(v["chain"]["0"] * 1e3, 3) for c, v in result["seconds"].items()},
                                "relative_tree": {c: {n: round(r, 3) for n, r in v["tree"].items()}
                                                  for c, v in result["relative"].items()},
                                "wall_s": result["wall_s"],
                                **({"batch_relative": {c: {b: {n: round(r, 3) for n, r in v.items()} for b, v in by.items()}
                                                       for c, by in result["batch_relative"].items()}}
                                   if "batch_relative" in result else {})}
            except Exception:  # noqa: BLE001 - one failed profile must not lose the others
                summary[key] = {"error": traceback.format_exc()[-2000:]}
            log("profile", key, json.dumps(summary[key])[:400])
        del model
        _free(device)
    return summary


DRAFT_VOCAB = 32000  # the reduced vocabulary of the published EAGLE-3 drafters (Llama-3.1-8B's: 32k of 128k)


def _random_eagle(model: torch.nn.Module) -> torch.nn.Module:
    """An EAGLE-3 drafter shaped for ``model`` (a 32k draft vocabulary, as published ones have), random weights, on
    its device and dtype."""
    from hf_speculative.drafters.eagle.config import EagleConfig
    from hf_speculative.drafters.eagle.model import EagleDraftModel

    weight = model.get_input_embeddings().weight
    vocab = int(model.config.vocab_size)
    net = EagleDraftModel(EagleConfig.for_target(model.config, version=3, draft_vocab_size=min(DRAFT_VOCAB, vocab)))
    return net.to(device=weight.device, dtype=weight.dtype).eval().requires_grad_(False)


def _free(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def comma_list(text: str | None) -> list[str] | None:
    """A comma-separated option's parts, stripped, empty ones dropped; ``None`` for an option not given."""
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def keep_labels(rows: dict[str, Any], only: list[str] | None, option: str) -> dict[str, Any]:
    """The entries of ``rows`` whose label contains one of ``only`` (all without it), and transformers' greedy
    rows always (every speed is relative to them); a part that matches no label is refused, naming the labels."""
    if not only:
        return rows
    unknown = [o for o in only if not any(o in label for label in rows)]
    if unknown:
        raise ValueError(f"{option}: {unknown} match nothing; use parts of: {', '.join(rows)}.")
    return {label: row for label, row in rows.items()
            if label.startswith("transformers greedy") or any(o in label for o in only)}


# -- end to end ----------------------------------------------------------------------------------------
def _timed(fn: Callable[[], Any], device: str, repeats: int) -> tuple[float, Any]:
    fn()  # warm-up (and compilation)
    times, result = [], None
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        tick = time.perf_counter()
        result = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - tick)
    return statistics.median(times), result


def _step_times(stats: Any) -> dict[str, float]:
    """Median milliseconds of a drafting step (the steps that drafted) and of a verification step."""
    steps = stats.steps()
    drafting = [s for s, n in zip(steps["draft_s"], steps["drafted"]) if n]
    times = {}
    if drafting:
        times["draft_ms_per_step"] = round(1e3 * statistics.median(drafting), 3)
    if steps["verify_s"]:
        times["verify_ms_per_step"] = round(1e3 * statistics.median(steps["verify_s"]), 3)
    return times


def run_e2e(out: Path, device: str, dtype: torch.dtype, config: str, prompt_tokens: int, new_tokens: int,
            acceptance: float, num_tokens: int, repeats: int, compile_mode: str, only: list[str] | None = None,
            on_method: Callable[[dict[str, Any]], None] | None = None, layers: int | None = None,
            tree_depth: int = 8) -> dict[str, Any]:
    """Every method of the table below timed in one run. ``only``: parts of method labels to keep (both
    transformers greedy rows always run: the reference and the compiled baseline); ``on_method`` gets the results
    so far after each method, so that a call cut off at a lent machine's limit keeps what it measured; ``layers``:
    the config built with that many decoder layers (:func:`config_model`); ``tree_depth``: the levels of the
    32-node trees (the CPU dry run's 4: an EAGLE tree region's compile grows with its levels, 96 s of its run at 8)."""
    import hf_speculative as hfs

    from .synthetic import SyntheticDrafter

    model = config_model(config, device, dtype, layers)
    model.generation_config.pad_token_id = model.generation_config.eos_token_id = None
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    # a prompt that repeats itself, so that prompt lookup finds matches (its acceptance is the model's business)
    block = torch.randint(3, vocab, (max(prompt_tokens // 4, 1),), generator=generator)
    ids = block.repeat(4)[None, :prompt_tokens].to(device)
    base = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                do_sample=False)
    reference = model.generate(**base)
    synthetic = SyntheticDrafter(reference[0], num_tokens=num_tokens, acceptance=acceptance, vocab_size=vocab)
    hfs.enable(model)
    tree = hfs.DynamicTree(nodes=32, depth=tree_depth, top_k=4)
    drafter = _random_eagle(model)  # the machinery's cost: it drafts at random, the whole tree or chain every step
    eagle = hfs.Eagle(drafter, tree=tree, adaptive=False)
    eagle_chain = hfs.Eagle(drafter, num_tokens=num_tokens, adaptive=False, confidence_threshold=0.0)
    methods: dict[str, Callable[[], Any]] = {
        "transformers greedy (eager)": lambda: type(model).generate(model, **base),
        "transformers greedy (static cache, compiled)": lambda: type(model).generate(
            model, **base, cache_implementation="static"),
        "transformers assisted loop (synthetic drafter)": lambda: model.generate(
            **base, candidate_generator=synthetic, speculative_loop="transformers"),
        "transformers prompt lookup": lambda: type(model).generate(model, **base, prompt_lookup_num_tokens=num_tokens),
        "hf_speculative loop, static cache (synthetic drafter)": lambda: model.generate(
            **base, candidate_generator=synthetic, cache_implementation="static"),
        "hf_speculative loop, compiled (synthetic drafter)": "compiled-synthetic",
        "hf_speculative loop, compiled (prompt lookup)": "compiled-lookup",
        "hf_speculative loop, compiled (lookup tree 32)": "compiled-tree",
        "hf_speculative loop (EAGLE tree 32, random drafter)": lambda: model.generate(**base, candidate_generator=eagle),
        "hf_speculative loop, compiled (EAGLE tree 32, random drafter)": "compiled-eagle",
        "hf_speculative loop (EAGLE chain, random drafter)": lambda: model.generate(**base, candidate_generator=eagle_chain),
        "hf_speculative loop, compiled (EAGLE chain, random drafter)": "compiled-eagle-chain",
    }
    compiled = {"compiled-synthetic": synthetic, "compiled-lookup": hfs.PromptLookup(num_tokens=num_tokens, adaptive=False),
                "compiled-tree": hfs.PromptLookup(tree=tree, adaptive=False), "compiled-eagle": eagle,
                "compiled-eagle-chain": eagle_chain}
    methods = keep_labels(methods, only, "--e2e-methods")
    results: dict[str, Any] = {"config": config_label(config, layers), "dtype": str(dtype).replace("torch.", ""),
                               "prompt_tokens": prompt_tokens,
                               "new_tokens": new_tokens, "acceptance": acceptance, "num_tokens": num_tokens,
                               "tree_depth": tree_depth,
                               "repeats": repeats, "compile": compile_mode, "methods": {}}
    for label, fn in methods.items():
        try:
            if isinstance(fn, str):
                strategy = compiled[fn]
                hfs.enable(model, compile=compile_mode,
                           static_budget=32 if fn in ("compiled-tree", "compiled-eagle") else num_tokens)
                fn = (lambda s: lambda: model.generate(**base, candidate_generator=s))(strategy)
            else:
                hfs.enable(model, compile=False)
            seconds, output = _timed(fn, device, repeats)
            stats = hfs.last_stats(model) if "hf_speculative" in label or "assisted loop" in label else None
            row = {"seconds": round(seconds, 4), "tokens_per_s": round(new_tokens / seconds, 2),
                   "identical": bool(torch.equal(output, reference))}
            if stats is not None:
                row.update(tau=round(stats.tau, 3), target_forwards=stats.target_forwards, **_step_times(stats))
        except Exception:  # noqa: BLE001
            row = {"error": traceback.format_exc()[-2000:]}
        results["methods"][label] = row
        log("e2e", label, json.dumps(row)[:300])
        if on_method is not None:
            on_method(results)
    hfs.enable(model, compile=False)
    greedy = results["methods"]["transformers greedy (eager)"].get("seconds")
    for row in results["methods"].values():
        if greedy and "seconds" in row:
            row["speedup_vs_eager_greedy"] = round(greedy / row["seconds"], 3)
    del model
    _free(device)
    return results


# -- projection and summary ----------------------------------------------------------------------------
MEASURED_DRAFTING = {"eagle-tree": "hf_speculative loop, compiled (EAGLE tree 32, random drafter)",
                     "eagle": "hf_speculative loop, compiled (EAGLE chain, random drafter)"}


def measured_drafting(e2e: dict[str, Any]) -> dict[str, float]:
    """EAGLE's drafting cost per step on this device, in one-token forwards: e2e's compiled random-drafter runs
    over the compiled greedy's seconds per token, by benchmark method name. Both are fixed budgets (``adaptive=False``):
    the tree drafts its whole 32 nodes every step and the chain its ``num_tokens`` (upper bounds for adaptive
    drafting); results from before issue 69 had the chain shrink by one after each rejected draft, so random drafts
    left it at 1-2 tokens a step (a lower bound for a long chain's cost). Empty when e2e did not time them."""
    greedy = e2e.get("methods", {}).get("transformers greedy (static cache, compiled)", {})
    if "seconds" not in greedy:
        return {}
    per_token_ms = 1e3 * greedy["seconds"] / e2e["new_tokens"]
    costs = {}
    for method, label in MEASURED_DRAFTING.items():
        row = e2e["methods"].get(label, {})
        if "draft_ms_per_step" in row:
            costs[method] = round(row["draft_ms_per_step"] / per_token_ms, 4)
    return costs


def run_projections(out: Path, benches: list[Path], drafting: dict[str, float] | None = None) -> dict[str, Any]:
    """Each benchmark onto each profile; with ``drafting`` (:func:`measured_drafting`), once more with those
    drafting costs for the EAGLE methods (``...@drafting-measured``; the other methods keep the benchmark's own)."""
    from hf_speculative.bench import projection

    results = {}
    for bench in benches:
        records = projection.load_benchmark(bench)
        for path in sorted(out.glob("profile_*.json")):
            for suffix, cost in (("", None), ("@drafting-measured", drafting)):
                if suffix and not cost:
                    continue
                key = f"{bench.stem}@{path.stem}{suffix}"
                try:
                    result = projection.project(records, projection.load_profile(path), draft_cost=cost)
                    projection.save(result, out / f"projection_{key}.json")
                    results[key] = projection.format_markdown(result)
                except Exception as err:  # noqa: BLE001
                    results[key] = f"error: {err}"
                log("project", key)
    return results


def table_lines(columns: list[str], rows: list[tuple[str, list[Any] | str]]) -> list[str]:
    """A markdown table of ``rows``, each a label and its cells, or an error's text (its last line is shown)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for label, cells in rows:
        if isinstance(cells, str):
            cells = [f"error: {cells.strip().splitlines()[-1][:120]}"] + [""] * (len(columns) - 2)
        lines.append("| " + " | ".join([label, *map(str, cells)]) + " |")
    return lines


def write_summary(out: Path, report: dict[str, Any]) -> Path:
    lines = ["# gpu-check", "", "```", json.dumps(report.get("environment", {}), indent=1), "```", ""]
    if "tests" in report:
        lines += ["## Device battery", ""] + [f"- {k}: {v['summary']} ({v['seconds']} s)" for k, v in report["tests"].items()]
        lines.append("")
    for key, value in report.get("profile", {}).items():
        if "error" in value:
            lines += [f"## Profile {key}: failed", "", "```", value["error"][-600:], "```", ""]
            continue
        lines += [f"## Profile {key}", "", f"one-token forward (ms) by context: {value['one_token_ms']}", ""]
        for context, by_size in value["relative_tree"].items():
            lines.append(f"- context {context}, tree of n nodes / one token: "
                         + ", ".join(f"{n}: {r}" for n, r in by_size.items()))
        lines.append("")
    if "e2e" in report:
        e2e = report["e2e"]
        lines += [f"## End to end: {e2e['config']} (random weights, {e2e['dtype']}), {e2e['prompt_tokens']} prompt + "
                  f"{e2e['new_tokens']} new tokens, synthetic acceptance {e2e['acceptance']}, drafts of "
                  f"{e2e['num_tokens']}, median of {e2e['repeats']}", ""]
        keys = ("seconds", "tokens_per_s", "tau", "speedup_vs_eager_greedy", "draft_ms_per_step", "verify_ms_per_step",
                "identical")
        lines += table_lines(["method", "s", "tokens/s", "tau", "speedup vs eager greedy", "drafting ms/step",
                              "verification ms/step", "identical"],
                             [(label, row["error"] if "error" in row else [row.get(k, "") for k in keys])
                              for label, row in e2e["methods"].items()])
        lines.append("")
    if report.get("drafting_measured"):
        lines += ["## EAGLE's drafting measured here", "", "One-token forwards per step (e2e's compiled random-drafter "
                  "runs, whole tree or chain every step), used by the `@drafting-measured` projections: "
                  + ", ".join(f"{m}: {c}" for m, c in report["drafting_measured"].items()), ""]
    for key, text in report.get("project", {}).items():
        lines += [f"## Projection {key}", "", text, ""]
    if "real" in report:
        from .real_e2e import summary_lines

        lines += summary_lines(report["real"])
    if "inflated" in report:
        from . import inflated_e2e

        lines += inflated_e2e.summary_lines(report["inflated"])
    if "magicdec" in report:
        from . import long_context

        lines += long_context.summary_lines(report["magicdec"])
    if "train" in report:
        from . import train_drafters

        lines += train_drafters.summary_lines(report["train"])
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_inflated_step(args: argparse.Namespace, report: dict[str, Any], save: Callable[[], None]) -> None:
    """The ``inflated`` step with ``args``'s options, its report saved after every prompt (``inflated_e2e.json``)."""
    from . import inflated_e2e

    def saved(result: dict) -> None:
        report["inflated"] = result
        (args.out / "inflated_e2e.json").write_text(json.dumps(result, indent=1) + "\n")
        save()

    tiny = args.tiny
    compile_arg = args.inflated_compile or ("static" if args.device == "cpu" else True)  # True: as the real step
    # sized for a lent H200's last call (docs/gpu.md): one timed run after each prompt's warm-up, no prompt begun
    # after 6 minutes (the first prompt's warm-up compiles every graph: most of it)
    max_minutes = args.inflated_max_minutes if args.inflated_max_minutes is not None else (None if tiny else 6.0)
    saved(inflated_e2e.run_inflated(
        args.real_model or "smollm2-135m-instruct", args.device, DTYPES[args.inflated_dtype],
        drafters=args.inflated_drafters, shape=args.inflate_shape or ("smollm2-wide" if tiny else "llama-3.1-8b"),
        categories=tuple(comma_list(args.inflated_categories) or (inflated_e2e.TINY_CATEGORIES if tiny
                                                                   else inflated_e2e.CATEGORIES)),
        new_tokens=args.real_new_tokens or (6 if tiny else 128), repeats=args.real_repeats or 1,
        compile=compile_arg, fixed=not args.inflated_no_fixed, max_minutes=max_minutes or None,
        only=comma_list(args.inflated_arms) or None, on_prompt=saved))


def run_magicdec_step(args: argparse.Namespace, report: dict[str, Any], save: Callable[[], None]) -> None:
    """The ``magicdec`` step (issue 71's grid at the inflated shape), its report in ``magicdec.json``."""
    from . import long_context

    tiny = args.tiny
    sizes = long_context.TINY if tiny else {}
    # sized for one call of a lent H200 (at most 10 minutes): no cell begun after 7 minutes
    max_minutes = args.magicdec_max_minutes if args.magicdec_max_minutes is not None else (None if tiny else 7.0)
    result = long_context.run_long_context(
        args.real_model or "smollm2-135m-instruct", args.device, DTYPES[args.magicdec_dtype], out=args.out,
        shape=args.inflate_shape or ("smollm2-wide" if tiny else "llama-3.1-8b"),
        batch_sizes=tuple(int(b) for b in comma_list(args.magicdec_batch_sizes) or [])
        or sizes.get("batch_sizes", long_context.BATCH_SIZES),
        contexts=tuple(int(c) for c in comma_list(args.magicdec_contexts) or [])
        or sizes.get("contexts", long_context.CONTEXTS),
        window=sizes.get("window", 512), sinks=sizes.get("sinks", 4), new_tokens=sizes.get("new_tokens", 64),
        repeats=1 if tiny else 2, max_minutes=max_minutes or None)
    report["magicdec"] = result
    (args.out / "magicdec.json").write_text(json.dumps(result, indent=1) + "\n")
    save()


def run_train_step(args: argparse.Namespace, report: dict[str, Any], save: Callable[[], None]) -> None:
    """The ``train`` step with ``args``'s options, its report saved after every phase."""
    import tempfile

    from . import train_drafters

    def saved(result: dict) -> None:
        report["train"] = result
        save()

    tiny = args.tiny
    size = train_drafters.sizes(tiny, answers=args.train_answers, batch=args.train_batch, epochs=args.train_epochs,
                                batch_size=args.train_batch_size)
    minutes = args.train_minutes if args.train_minutes is not None else (None if tiny else 8.0)
    corpus_minutes = args.train_corpus_minutes if args.train_corpus_minutes is not None else (None if tiny else 3.5)
    budget = train_drafters.Budget(minutes or None, corpus_minutes or None)
    work = args.train_work or (Path(tempfile.mkdtemp(prefix="hfs-train-")) if tiny else Path("/tmp/hfs-train"))
    kinds = tuple(comma_list(args.train_drafters) or train_drafters.DRAFTERS)
    unknown = set(kinds) - set(train_drafters.DRAFTERS)
    if unknown:
        raise SystemExit(f"--train-drafters: unknown {sorted(unknown)}; use some of {', '.join(train_drafters.DRAFTERS)}.")
    train_drafters.run_train(args.out, args.device, target=str(args.real_model or args.train_name),
                             name=args.train_name, tiny=tiny, work=work, carried=args.carried, size=size,
                             budget=budget, kinds=kinds, precision=args.train_precision,
                             with_corpus=not args.train_no_corpus, on_update=saved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--tiny", action="store_true",
                        help=f"the small CPU run: smollm2-135m with {TINY_LAYERS} layers, short contexts, few tokens")
    parser.add_argument("--layers", type=int, default=None,
                        help="build the profile and e2e configs with N decoder layers (default: their own; "
                             f"--tiny: {TINY_LAYERS})")
    parser.add_argument("--steps", default=",".join(DEFAULT_STEPS), help=f"some of {', '.join(STEPS)}")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--configs", default=None, help="profile configs (default: llama-3.1-8b on cuda)")
    parser.add_argument("--e2e-config", default=None)
    parser.add_argument("--e2e-methods", default=None,
                        help="comma-separated parts of e2e's method labels to run, e.g. 'EAGLE' (greedy stays)")
    parser.add_argument("--bench", type=Path, action="append", default=[], help="benchmark JSONL to project")
    parser.add_argument("--real-model", type=Path, default=None,
                        help="the real step's model folder (on a lent GPU: carried in parts, tools/carry.py)")
    parser.add_argument("--real-drafter", default=None, help="the real step's EAGLE drafter: a shipped name or a folder")
    parser.add_argument("--real-per-category", type=int, default=2)
    parser.add_argument("--real-medusa", default=None, help="the real step's Medusa heads: a shipped name or a folder")
    parser.add_argument("--real-fixed", action="store_true",
                        help="also compiled arms drafting their full budget every step (adaptive=False)")
    parser.add_argument("--real-arms", default=None,
                        help="comma-separated parts of the real step's arm labels to run, e.g. 'fixed' (greedy stays)")
    parser.add_argument("--real-repeats", type=int, default=None,
                        help="timed runs per arm and prompt, of the real and inflated steps (default 3 and 1)")
    parser.add_argument("--real-new-tokens", type=int, default=None,
                        help="new tokens per call, of the real and inflated steps (default 128)")
    parser.add_argument("--real-max-minutes", type=float, default=None,
                        help="start no prompt after this many minutes of the real step (a lent GPU's call is limited)")
    inflated = parser.add_argument_group("the inflated step (a cost model: tools/gpu/inflate.py)")
    inflated.add_argument("--inflate-shape", default=None,
                          help="the large shape: a shipped config (default llama-3.1-8b; --tiny: smollm2-wide)")
    inflated.add_argument("--inflated-drafters", default="smollm2-135m-instruct",
                          help="the registry name whose shipped EAGLE, DFlash and Medusa drafters are inflated")
    inflated.add_argument("--inflated-dtype", default="float32", choices=sorted(DTYPES),
                          help="float32 (default): outputs token-identical to greedy; bfloat16: a user's precision")
    inflated.add_argument("--inflated-compile", default=None,
                          help="a torch.compile mode, or 'static' for the static cache uncompiled (default: "
                               "reduce-overhead on cuda, static on the cpu: inductor's CPU compiles take minutes)")
    inflated.add_argument("--inflated-categories", default=None, help="Spec-Bench categories, one prompt each")
    inflated.add_argument("--inflated-arms", default=None, help="parts of the arms' labels to run (greedy stays)")
    inflated.add_argument("--inflated-no-fixed", action="store_true", help="leave out the arms drafting every step")
    inflated.add_argument("--inflated-max-minutes", type=float, default=None,
                          help="start no prompt after this many minutes of the step (default 6 on a GPU, sized for "
                               "a lent call's 10 minutes; 0: no limit)")
    train = parser.add_argument_group("the train step (issue 72: tools/gpu/train_drafters.py)")
    train.add_argument("--train-name", default="smollm2-135m-instruct",
                       help="the registry name the drafters are for (their target; --real-model: its folder there)")
    train.add_argument("--carried", type=Path, default=None,
                       help="the joined parts' folder (tools/gpu/lent_real.sh's $WORK/pkg): the corpus's lists")
    train.add_argument("--train-work", type=Path, default=None,
                       help="corpus, runs and logs (default /tmp/hfs-train, where a second call resumes; --tiny: a "
                            "new temporary folder)")
    train.add_argument("--train-answers", type=int, default=None,
                       help="the corpus's answers (default 20000; --tiny 20)")
    train.add_argument("--train-minutes", type=float, default=None,
                       help="the whole step's minutes (default 8: a lent call's 10 less the model's conversion; "
                            "0: no limit; --tiny: none)")
    train.add_argument("--train-corpus-minutes", type=float, default=None,
                       help="the corpus's minutes at most (default 3.5; 0: no limit)")
    train.add_argument("--train-batch", type=int, default=None,
                       help="prompts answered (and Magpie messages sampled) together (default 1024; --tiny 20 and 16)")
    train.add_argument("--train-epochs", type=float, default=None, help="every trainer's epochs (default 2; --tiny 1)")
    train.add_argument("--train-batch-size", type=int, default=None,
                       help="every trainer's sequences per optimizer step (default 32; --tiny 4)")
    train.add_argument("--train-drafters", default=None, help="some of eagle,dflash,medusa (default all three)")
    train.add_argument("--train-precision", default="bf16", choices=("bf16", "fp16", "no"),
                       help="the trainers' autocast on a GPU (accelerate's mixed precision; default bf16)")
    train.add_argument("--train-no-corpus", action="store_true", help="bring the drafters back without the corpus")
    magicdec = parser.add_argument_group("the magicdec step (issue 71: tools/gpu/long_context.py)")
    magicdec.add_argument("--magicdec-contexts", default=None, help="default 2048,4096,8000 (--tiny: 96,160)")
    magicdec.add_argument("--magicdec-batch-sizes", default=None, help="default 1,4,8,16 (--tiny: 1,3)")
    magicdec.add_argument("--magicdec-dtype", default="float32", choices=sorted(DTYPES),
                          help="float32 (default): every row must be greedy's; bfloat16 parts from it at near-ties")
    magicdec.add_argument("--magicdec-max-minutes", type=float, default=None,
                          help="begin no cell after this many minutes (default 7; --tiny: no limit)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; use --device cpu (with --tiny for a quick run).")
    steps = [s for s in args.steps.split(",") if s]
    unknown = set(steps) - set(STEPS)
    if unknown:
        parser.error(f"--steps: unknown {sorted(unknown)}; use some of {', '.join(STEPS)}.")
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers {args.layers}: give at least one decoder layer (or leave it out for the whole config).")
    dtype = DTYPES[args.dtype or ("bfloat16" if args.device == "cuda" else "float32")]
    compile_mode = "reduce-overhead" if args.device == "cuda" else "default"
    if args.device == "cpu":
        torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    report_path = args.out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report["environment"] = environment(args.device)

    def save() -> None:
        report_path.write_text(json.dumps(report, indent=1) + "\n")
        write_summary(args.out, report)

    tiny = args.tiny
    configs = (args.configs.split(",") if args.configs else ["smollm2-135m"] if tiny else ["llama-3.1-8b"])
    layers = args.layers if args.layers is not None else (TINY_LAYERS if tiny else None)
    if "tests" in steps:
        report["tests"] = run_tests(args.out, args.device, tiny)
        save()
    if "profile" in steps:
        report.setdefault("profile", {}).update(run_profiles(
            args.out, args.device, dtype, configs, contexts=(128,) if tiny else (512, 2048),
            sizes=(0, 4, 16) if tiny else (0, 8, 16, 32, 64), compile_mode=compile_mode, repeats=3 if tiny else 10,
            batches=(1, 2) if tiny else (1, 2, 4, 8, 16), layers=layers))
        save()
    if "e2e" in steps:
        def e2e_saved(e2e: dict) -> None:
            report["e2e"] = e2e
            save()

        only = comma_list(args.e2e_methods) or None
        e2e_saved(run_e2e(args.out, args.device, dtype, args.e2e_config or configs[0],
                          prompt_tokens=64 if tiny else 512, new_tokens=12 if tiny else 128, acceptance=0.7,
                          num_tokens=4 if tiny else 8, repeats=1 if tiny else 3, compile_mode=compile_mode,
                          only=only, on_method=e2e_saved, layers=layers, tree_depth=4 if tiny else 8))
    if "project" in steps and args.bench:
        report["drafting_measured"] = measured_drafting(report.get("e2e", {}))
        report["project"] = run_projections(args.out, args.bench, report["drafting_measured"])
        save()
    if "real" in steps and args.real_model is not None:
        from .real_e2e import run_real

        def saved(real: dict) -> None:  # after every prompt: a call cut off at its limit keeps what it measured
            report["real"] = real
            (args.out / "real_e2e.json").write_text(json.dumps(real, indent=1) + "\n")
            save()

        saved(run_real(args.real_model, args.device, dtype, drafter=args.real_drafter, medusa=args.real_medusa,
                       fixed=args.real_fixed, per_category=args.real_per_category,
                       only=comma_list(args.real_arms) or None,
                       new_tokens=args.real_new_tokens or (24 if tiny else 128),
                       repeats=args.real_repeats or (1 if tiny else 3), max_minutes=args.real_max_minutes,
                       on_prompt=saved))
    if "inflated" in steps:
        run_inflated_step(args, report, save)
    if "train" in steps:
        run_train_step(args, report, save)
    if "magicdec" in steps:
        run_magicdec_step(args, report, save)
    log("summary:", args.out / "summary.md")
    failed = [k for k, v in report.get("tests", {}).items() if v["returncode"] != 0]
    if "magicdec" in steps and not report.get("magicdec", {}).get("identical", False):
        failed.append("magicdec")  # a row that parted from batched greedy's
    if "train" in steps:  # a phase that failed (a drafter's run or export, the corpus) fails the command
        train = report.get("train", {})
        parts = [train, train.get("corpus", {}), *train.get("runs", {}).values()]
        failed += ["train"] if any("error" in part or "export_error" in part for part in parts) else []
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
