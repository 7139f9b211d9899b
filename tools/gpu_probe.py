"""First look at a GPU machine: does the package run there, what does eager verification cost, and what do a
static cache and ``torch.compile`` give on the real-size configs (random weights). Team tooling, run through
the device tool; ``make gpu-check`` is the user-facing pipeline.

    python -m tools.gpu_probe --out $OUT
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch


DEVICE = "cuda"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def log(*parts):
    print(*parts, flush=True)


def environment() -> dict:
    import transformers

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    log("environment", info)
    return info


def tiny_identity(device: str) -> dict:
    """Our loop and transformers' assisted loop against stock greedy on tiny fp32 models on ``device``."""
    import hf_speculative as hfs
    from tests.conftest import PROMPT, build_model, sibling_model, stock_generate

    results = {}
    for arch in ("llama", "qwen2", "gemma3"):
        target = build_model(arch).to(device)
        ids = torch.tensor([PROMPT], device=device)
        reference = stock_generate(target, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                                   do_sample=False)
        hfs.enable(target)
        strategies = {
            "lookup-chain": hfs.PromptLookup(),
            "lookup-tree": hfs.PromptLookup(tree=hfs.DynamicTree(nodes=16, depth=6)),
            "draft-model-chain": hfs.DraftModel(sibling_model(target).to(device)),
            "draft-model-copy": hfs.DraftModel(copy.deepcopy(target)),
        }
        for name, strategy in strategies.items():
            try:
                out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                                      do_sample=False, candidate_generator=strategy)
                results[f"{arch}/{name}"] = bool(torch.equal(out, reference))
            except Exception as err:  # noqa: BLE001 - a probe reports every failure
                results[f"{arch}/{name}"] = f"error: {err!r}"[:300]
        hfs.disable(target)
    log("tiny identity", results)
    return results


def eager_profiles(out: Path, configs: list[str], dtype: torch.dtype) -> dict:
    from hf_speculative.bench import profile as profiling

    summary = {}
    for name in configs:
        try:
            model = profiling.random_model(name, DEVICE, dtype)
            settings = profiling.ProfileSettings(contexts=(512, 2048), sizes=(0, 1, 2, 4, 8, 16, 32, 64), repeats=10)
            result = profiling.profile(model, settings, label=f"{name} (random weights)")
            profiling.save(result, out / f"profile_eager_{name}.json")
            summary[name] = {c: {s: {n: round(v, 3) for n, v in sizes.items()} for s, sizes in shapes.items()}
                             for c, shapes in result["relative"].items()}
            summary[name]["one_token_ms"] = {c: round(shapes["chain"]["0"] * 1e3, 2)
                                             for c, shapes in result["seconds"].items()}
            log("eager", name, json.dumps(summary[name]))
            del model
            torch.cuda.empty_cache() if DEVICE == "cuda" else None
        except Exception:  # noqa: BLE001
            summary[name] = traceback.format_exc()[-1500:]
            log(summary[name])
    return summary


def static_compile(name: str, dtype: torch.dtype, sizes=(0, 32, 64), context: int = 2048, modes=("eager", "default",
                   "reduce-overhead")) -> dict:
    """Fixed-shape verification on a static cache: eager, compiled, compiled with CUDA graphs."""
    from transformers import StaticCache

    from hf_speculative import compat
    from hf_speculative.bench import profile as profiling

    model = profiling.random_model(name, DEVICE, dtype)
    capacity = context + 128
    cache = StaticCache(config=model.config, max_cache_len=capacity)
    takes_position = "cache_position" in inspect.signature(model.forward).parameters
    prefill = torch.randint(3, 1000, (1, context - 1), device=DEVICE)
    extra = {"cache_position": torch.arange(context - 1, device=DEVICE)} if takes_position else {}
    with torch.no_grad():
        model(input_ids=prefill, use_cache=True, **{compat.CACHE_KWARG: cache}, **extra)
    start = context - 1

    def reset():
        for layer in getattr(cache, "layers", []):
            if hasattr(layer, "cumulative_length") and isinstance(layer.cumulative_length, torch.Tensor):
                layer.cumulative_length.fill_(start)

    results = {"takes_cache_position": takes_position}
    for mode in modes:
        forward = model if mode == "eager" else torch.compile(model, mode=mode, dynamic=False)
        for n in sizes:
            q = 1 + n
            ids = torch.randint(3, 1000, (1, q), device=DEVICE)
            pos = torch.arange(start, start + q, device=DEVICE)[None]
            seen = torch.zeros(q, capacity, dtype=torch.bool, device=DEVICE)
            seen[:, :start] = True
            seen[:, start:start + q] = torch.ones(q, q, dtype=torch.bool, device=DEVICE).tril()
            mask = torch.zeros(1, 1, q, capacity, dtype=dtype, device=DEVICE).masked_fill_(~seen, torch.finfo(dtype).min)
            kwargs = dict(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True,
                          **{compat.CACHE_KWARG: cache})
            if takes_position:
                kwargs["cache_position"] = pos[0]
            times = []
            try:
                with torch.no_grad():
                    tick = time.perf_counter()
                    reset()
                    forward(**kwargs)
                    sync()
                    first = time.perf_counter() - tick
                    for i in range(25):
                        reset()
                        sync()
                        tick = time.perf_counter()
                        forward(**kwargs)
                        sync()
                        if i >= 5:
                            times.append(time.perf_counter() - tick)
                results[f"{mode}/{n}"] = {"first_s": round(first, 2), "ms": round(statistics.median(times) * 1e3, 3)}
            except Exception:  # noqa: BLE001
                results[f"{mode}/{n}"] = traceback.format_exc()[-1200:]
            log("static", name, mode, n, results[f"{mode}/{n}"])
    for mode in modes:
        base = results.get(f"{mode}/0")
        for n in sizes:
            cell = results.get(f"{mode}/{n}")
            if isinstance(base, dict) and isinstance(cell, dict):
                cell["relative"] = round(cell["ms"] / base["ms"], 3)
    del model, cache
    torch.cuda.empty_cache() if DEVICE == "cuda" else None
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip", default="")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--static-config", default="llama-3.1-8b")
    parser.add_argument("--modes", default="eager,default,reduce-overhead")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    skip = set(args.skip.split(","))
    report = {"environment": environment()}

    def save():
        (args.out / "probe.json").write_text(json.dumps(report, indent=1) + "\n")

    save()
    if "tiny" not in skip:
        report["tiny_identity_fp32"] = tiny_identity(DEVICE)
        save()
    if "static" not in skip:
        for name in (args.static_config,):
            report[f"static_compile_{name}"] = static_compile(name, torch.bfloat16, modes=tuple(args.modes.split(",")))
            save()
    if "eager" not in skip:
        report["eager_bf16"] = eager_profiles(args.out, ["llama-3.1-8b", "qwen2.5-7b", "qwen2.5-1.5b", "smollm2-135m"],
                                              torch.bfloat16)
        save()


if __name__ == "__main__":
    main()
