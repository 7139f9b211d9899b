"""Native decoder layers (hf_speculative/cpu/layers.py, which ``optimize_for_cpu`` now takes for fp32 Llama, Qwen2,
Qwen3 and Gemma3 layers) against the same layers' PyTorch operators around the kernel's products, for plain decoding,
prompt lookup and EAGLE + lookup.

    cd benchmarks && python native_layers_ab.py [--repeats 2] [--per-category 2]
    cd benchmarks && python native_layers_ab.py --forwards [--repeats 15]

``--forwards``: instead, forwards of 1, 2, 6 and 11 tokens after a 512-token context on each route, taking turns,
``--repeats`` rounds, median milliseconds, beside the time of the weights' products alone (every linear layer's
one-row product on the kernel, the lm_head included: what the forward cannot go below on this path).

On the peers' Spec-Bench prompts (``--per-category`` per category, first turn, chat template), one thread, the model
with ``hfs.optimize_for_cpu(model)`` and transformers' grouped-query SDPA (as the peers' kernel engine runs): for
every prompt, each method on each route, interleaved (switched between calls with ``optimize_for_cpu(model,
native=...)``, which keeps the kernel's copies). Untimed warm-up calls on the first two prompts, then ``--repeats``
rounds; medians. Every output is checked against its route's greedy output of the round.
"""

from __future__ import annotations

import argparse
import os

import torch

from ab_runs import Runs, kernel_target, peers_prompts  # (benchmarks/ is this script's path)

METHODS = ("greedy", "prompt-lookup", "eagle+lookup")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--forwards", action="store_true", help="time forwards of 1, 2, 6 and 11 tokens instead")
    args = parser.parse_args()

    import hf_speculative as hfs
    from hf_speculative.cpu.layers import native_layers
    from hf_speculative.tooling.methods import run_method

    model, tokenizer = kernel_target(args.model)
    assert native_layers(model), "the native layers did not take this model"
    if args.forwards:
        return time_forwards(model, args.repeats)
    categories, prompts, encoded = peers_prompts(tokenizer, args.per_category)
    methods = args.methods.split(",")
    arms = [(f"{method}, {route}", method, route) for route in ("native", "pytorch ops") for method in methods]
    runs = Runs()
    print(f"load at start: {os.getloadavg()}", flush=True)
    for round_ in range(args.repeats + 1):  # round 0 warms every arm up
        for i, ids in enumerate(encoded if round_ else encoded[:2]):
            references = {}
            for label, method, route in arms:
                hfs.optimize_for_cpu(model, native=None if route == "native" else False)
                done = run_method(method, model, tokenizer, ids, max_new_tokens=args.max_new_tokens)
                out = list(done.output_ids)
                reference = references.setdefault(route, out)
                if round_:
                    runs.record(label, i, done, out == reference)
        print(f"round {round_} done; load {os.getloadavg()[0]:.2f}", flush=True)
    hfs.optimize_for_cpu(model)
    n = len(encoded)
    route_of = {label: route for label, _, route in arms}
    print("\n".join(runs.table(list(route_of), prompts, categories, lambda label: f"greedy, {route_of[label]}",
                               "greedy (same route)", args.repeats)))
    for method in methods:
        print(f"{method}: native {runs.ratio(f'{method}, native', f'{method}, pytorch ops', n):.3f}× the speed of "
              "the PyTorch ops")
    print(f"load at end: {os.getloadavg()}")


def time_forwards(model, repeats: int, context: int = 512) -> None:
    """Median ms of a forward of 1, 2, 6 and 11 tokens after ``context`` tokens on each route, in turns, and of the
    weights' one-row products alone."""
    import statistics
    import time

    import hf_speculative as hfs
    from hf_speculative import compat
    from hf_speculative.core.kv_cache import new_dynamic_cache
    from hf_speculative.cpu.kernel import KernelLinear

    linears = [m for m in model.modules() if type(m) is KernelLinear]
    rows = {m: torch.randn(1, m.in_features) for m in linears}
    seconds: dict[tuple[str, int], list[float]] = {}
    with torch.inference_mode():
        cache = new_dynamic_cache()
        model(torch.randint(100, 20000, (1, context)), use_cache=True, **{compat.cache_kwarg(): cache})
        for _ in range(repeats):
            for route in ("native", "pytorch ops"):
                hfs.optimize_for_cpu(model, native=None if route == "native" else False)
                for k in (1, 2, 6, 11):
                    ids = torch.randint(100, 20000, (1, k))
                    start = time.perf_counter()
                    model(ids, use_cache=True, **{compat.cache_kwarg(): cache})
                    seconds.setdefault((route, k), []).append(time.perf_counter() - start)
                    compat.crop_cache(cache, k)
            start = time.perf_counter()
            for m in linears:
                m(rows[m])
            seconds.setdefault(("the linears' products alone", 1), []).append(time.perf_counter() - start)
    hfs.optimize_for_cpu(model)
    for (route, k), times in sorted(seconds.items()):
        print(f"{route}: {k} token(s) after {context}: {statistics.median(times) * 1e3:.2f} ms")
    time_eagle(model, repeats, context)
    print(f"load at end: {os.getloadavg()}")


def time_eagle(model, repeats: int, context: int) -> None:
    """Median ms of one drafting step of the shipped EAGLE-3 drafter (its layer over one position after ``context``
    cached ones, then its head over the draft vocabulary) on each route, and of its linears' one-row products alone."""
    import statistics
    import time

    from hf_speculative.cpu.kernel import KernelLinear
    from hf_speculative.drafters.eagle import model as eagle_model
    from hf_speculative.drafters.eagle.drafter import Eagle

    net = Eagle.from_pretrained("smollm2-135m-instruct", target=model).drafter
    hidden = net.config.hidden_size
    cache = eagle_model.DraftKVCache()
    with torch.inference_mode():
        net(torch.randn(1, context, hidden), torch.randn(1, context, net.fc.in_features), torch.arange(context)[None],
            cache, fused=True)
        linears = [m for m in net.modules() if type(m) is KernelLinear]
        rows = {m: torch.randn(1, m.in_features) for m in linears}
        native = eagle_model.drafter_kernel
        seconds: dict[str, list[float]] = {}
        for _ in range(repeats):
            for route in ("native", "pytorch ops"):
                eagle_model.drafter_kernel = native if route == "native" else (lambda *a: None)
                start = time.perf_counter()
                out = net(torch.randn(1, 1, hidden), torch.randn(1, 1, hidden), torch.tensor([[context]]), cache,
                          fused=False)
                net.draft_logits(out, None)
                seconds.setdefault(f"EAGLE-3 drafting step, {route}", []).append(time.perf_counter() - start)
                cache.crop(context)
            start = time.perf_counter()
            for m in linears:
                m(rows[m])
            seconds.setdefault("EAGLE-3's linears' products alone", []).append(time.perf_counter() - start)
        eagle_model.drafter_kernel = native
    weights = sum(m._hfs_blocked.get(m.weight)[0].numel() * m._hfs_blocked.get(m.weight)[0].element_size()
                  for m in linears)
    for label, times in sorted(seconds.items()):
        print(f"{label}: {statistics.median(times) * 1e3:.2f} ms")
    print(f"EAGLE-3's kernel copies: {weights / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
