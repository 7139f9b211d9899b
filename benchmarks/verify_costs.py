"""What a target forward on k tokens costs, relative to a one-token forward, per weight layout.

    python benchmarks/verify_costs.py --model smollm2-135m-instruct --context 512 --repeats 25

A speculative step verifies k - 1 drafted tokens in one forward on k tokens, so this table is what
decides which draft lengths can pay. The layouts are loaded side by side and timed interleaved (one
forward of each size and layout in turn, on its own KV cache cropped back after every forward), so that a busy
machine slows them alike; medians after dropping the first 20% of the runs.

    python benchmarks/verify_costs.py --linears --layouts all,all+kernel --tokens 1,2,4,8

times the model's linear products alone instead (every ``nn.Linear`` in order, on random rows):
what the weights cost, without attention and the per-op overhead. ``all+kernel@avx2`` and ``all+kernel@avx512`` run
the kernel on one instruction set (interleaved in one process; without ``@`` it runs the CPU's best):

    python benchmarks/verify_costs.py --linears --layouts all+kernel@avx2,all+kernel@avx512 --tokens 1,2,4,8,16

``#gqa`` / ``#repeat`` after a layout set transformers' ``TRANSFORMERS_SDPA_FORCE_GQA`` to 1 / 0 before each of its
forwards (grouped-query SDPA, or ``repeat_kv`` copies, in masked multi-token forwards; hf_speculative leaves the
variable to the user: ``core/sdpa.py``):

    python benchmarks/verify_costs.py --layouts "all+kernel#repeat,all+kernel#gqa" --tokens 1,2,6,11

``~bfloat16`` at the end of a layout loads that arm's model in bf16 (``none~bfloat16``: PyTorch's bf16 products and
attention; ``all+kernel~bfloat16``: ``optimize_for_cpu`` on the bf16 model, its products on the CPU's bf16 dot
products and its attention in fp32, row by row):

    python benchmarks/verify_costs.py --model qwen2.5-coder-1.5b-instruct --layouts \
        "all+kernel,none~bfloat16,all+kernel~bfloat16" --tokens 1,2,4,6 --repeats 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

LAYOUTS = ("none", "output", "all", "all+packed", "all+kernel")


def build_models(name: str, layouts: tuple[str, ...]) -> dict:
    import hf_speculative as hfs
    from hf_speculative.cpu.layout import apply_layout

    models = {}
    for layout in layouts:
        spec, _, dtype = layout.partition("~")
        model, _ = hfs.load_model(name, dtype=getattr(torch, dtype or "float32"))
        apply_layout(model, spec.partition("#")[0].partition("@")[0])
        models[layout] = model.eval()
    return models


def select_variant(layout: str) -> None:
    """Before timing ``layout``: the kernel's instruction set it names after ``@`` (else the CPU's best), and the
    grouped-query SDPA switch it names after ``#``."""
    import os

    name, _, attention = layout.partition("~")[0].partition("#")
    if attention:
        os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1" if attention == "gqa" else "0"
    if "kernel" in name:
        from hf_speculative.cpu.kernel import load_kernel

        load_kernel().set_isa(name.partition("@")[2] or "auto")


def prefill(models: dict, context: int, seed: int = 0) -> dict:
    from transformers import DynamicCache

    from hf_speculative import compat

    ids = torch.randint(100, 20000, (1, context), generator=torch.Generator().manual_seed(seed))
    caches = {}
    for layout, model in models.items():
        caches[layout] = DynamicCache()
        model(ids, **{compat.cache_kwarg(): caches[layout]}, use_cache=True)
    return caches


def interleaved_seconds(run, layouts, tokens: list[int], repeats: int, after=None) -> dict[int, dict[str, float]]:
    """Median seconds of ``run(k, layout)`` per ``k`` and layout (``after(k, layout)``, untimed,
    follows each run); every repeat runs every (k, layout) once in turn, so that a machine whose
    speed drifts slows all of them alike. The first 20% of the repeats are warm-up."""
    times: dict[tuple[int, str], list[float]] = {(k, layout): [] for k in tokens for layout in layouts}
    for _ in range(repeats):
        for k in tokens:
            for layout in layouts:
                select_variant(layout)
                start = time.perf_counter()
                run(k, layout)
                times[k, layout].append(time.perf_counter() - start)
                if after is not None:
                    after(k, layout)
    warm = repeats // 5
    return {k: {layout: statistics.median(times[k, layout][warm:]) for layout in layouts} for k in tokens}


def forward_seconds(models: dict, caches: dict, tokens: list[int], repeats: int) -> dict[int, dict[str, float]]:
    """Median seconds of a forward on ``k`` tokens per layout, each on its own KV cache."""
    from hf_speculative import compat

    ids = {k: torch.randint(100, 20000, (1, k), generator=torch.Generator().manual_seed(k)) for k in tokens}

    def forward(k: int, layout: str) -> None:
        models[layout](ids[k], **{compat.cache_kwarg(): caches[layout]}, use_cache=True)

    def crop(k: int, layout: str) -> None:
        caches[layout].crop(-k)  # back to the context: every forward sees the same cache length

    return interleaved_seconds(forward, models, tokens, repeats, after=crop)


def linear_seconds(models: dict, tokens: list[int], repeats: int) -> dict[int, dict[str, float]]:
    """Median seconds of all of a model's linear products on ``k`` rows per layout (each layout's own
    modules: MKL, packed copies or the kernel)."""
    linears = {layout: [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
               for layout, model in models.items()}
    sizes = {m.in_features for mods in linears.values() for m in mods}
    rows = {k: {n: torch.randn(1, k, n, generator=torch.Generator().manual_seed(k)) for n in sizes} for k in tokens}
    narrow = {k: {n: x.bfloat16() for n, x in by_size.items()} for k, by_size in rows.items()}

    def products(k: int, layout: str) -> None:
        for module in linears[layout]:
            module((narrow if module.weight.dtype == torch.bfloat16 else rows)[k][module.in_features])

    return interleaved_seconds(products, models, tokens, repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--tokens", default="1,2,3,4,5,6,8,10")
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--linears", action="store_true", help="time the linear products alone, not forwards")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    layouts = tuple(args.layouts.split(","))
    tokens = [int(k) for k in args.tokens.split(",")]
    with torch.no_grad():
        models = build_models(args.model, layouts)
        if args.linears:
            seconds = linear_seconds(models, tokens, args.repeats)
        else:
            seconds = forward_seconds(models, prefill(models, args.context), tokens, args.repeats)
    base = seconds[1]["none"] if "none" in layouts and 1 in seconds else None
    what = "linear products alone" if args.linears else f"context {args.context}"
    print(f"{args.model}, {what}, {args.threads} thread(s), torch {torch.__version__}")
    print("| layout | " + " | ".join(f"k={k}" for k in tokens) + " |")
    print("|---|" + "---|" * len(tokens))
    for layout in layouts:
        own = seconds[1][layout] if 1 in seconds else None
        cells = []
        for k in tokens:
            ms = seconds[k][layout] * 1e3
            ratio = seconds[k][layout] / own if own else float("nan")
            cells.append(f"{ms:.1f} ms ({ratio:.2f}×)")
        print(f"| {layout} | " + " | ".join(cells) + " |")
    if base:
        print(f"one row: none {base * 1e3:.1f} ms; ratios are to each layout's own one-row time")


if __name__ == "__main__":
    main()
