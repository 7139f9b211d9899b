"""Prefill on the kernel layout: the products of more rows than the kernel's few-row code takes on oneDNN (the
column-major weight read as its ``[K, N]`` operand, ``hf_speculative/cpu/kernel.py: onednn_linear``) against
``F.linear`` (MKL) and against the kernel's own cache-blocked product (``gemm512``, AVX-512, up to 192 rows, with the
native layers up to 64), and whole prefills (one forward of the prompt, ``logits_to_keep=1``) before (MKL, SDPA), with
oneDNN's products, with the kernel's causal attention too (``csrc/prefill_attention.cpp``), and with the kernel's
product; then verification forwards of more than 16 rows after a ``--context``-token prompt, oneDNN's products and
the stock layers against the kernel's product and the native layers.

    python benchmarks/prefill_products.py [--lengths 40,64,93,767] [--verify 17,24,32,64] [--repeats 5]

SmolLM2-135M-Instruct fp32 with ``hfs.optimize_for_cpu(model)``, one thread; the routes take turns within each
repeat; medians. Run it alone (no other benchmark or test suite beside it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", default="40,64,93,767")
    parser.add_argument("--verify", default="17,24,32,64", help="verification forwards of these many rows")
    parser.add_argument("--context", type=int, default=700, help="the prompt before each verification forward")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import hf_speculative as hfs
    from hf_speculative import compat
    from hf_speculative.core.kv_cache import new_dynamic_cache
    from hf_speculative.cpu import attention, kernel
    from hf_speculative.cpu.kernel import KernelLinear

    torch.set_num_threads(1)
    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
    model, _ = hfs.load_model(args.model)
    hfs.optimize_for_cpu(model, kernel=True)
    onednn = kernel.onednn_linear()
    assert onednn is not None, "this PyTorch has no oneDNN product (torch.ops.mkldnn._linear_pointwise)"
    decoder = [m for name, m in model.named_modules() if type(m) is KernelLinear and "lm_head" not in name]
    gemm = kernel.kernel_gemm()
    routes = {"MKL + SDPA (before)": ([None], False, False), "oneDNN + SDPA": ([onednn], False, False),
              "oneDNN + prefill_attention": ([onednn], True, False)}
    if gemm:
        routes["kernel's product + prefill_attention, native layers"] = ([onednn], True, True)
    print(f"load at start: {os.getloadavg()}; {len(decoder)} decoder products", flush=True)
    seconds: dict[tuple[str, str, int], list[float]] = {}
    with torch.inference_mode():
        for length in (int(n) for n in args.lengths.split(",")):
            rows = {m: torch.randn(length, m.in_features) for m in decoder}
            ids = torch.randint(100, 20000, (1, length))
            for repeat in range(args.repeats + 1):  # repeat 0 warms each route up
                for route, (op, ours, own_gemm) in routes.items():
                    kernel._ONEDNN[:] = op
                    attention.PREFILL_KERNEL[:] = [ours]
                    kernel._GEMM[:] = [own_gemm]
                    start = time.perf_counter()
                    for m in decoder:
                        m(rows[m])
                    products = time.perf_counter() - start
                    start = time.perf_counter()
                    model(ids, use_cache=True, logits_to_keep=1, **{compat.cache_kwarg(): new_dynamic_cache()})
                    prefill = time.perf_counter() - start
                    if repeat:
                        if not ours or own_gemm:  # (the products' route does not depend on the attention's)
                            seconds.setdefault(("products", route, length), []).append(products)
                        seconds.setdefault(("prefill", route, length), []).append(prefill)
        kernel._ONEDNN[:] = [onednn]
        attention.PREFILL_KERNEL[:] = [True]
        context = torch.randint(100, 20000, (1, args.context))
        for repeat in range(args.repeats + 1) if gemm else ():
            for rows in (int(n) for n in args.verify.split(",")):
                new = torch.randint(100, 20000, (1, rows))
                for route, own_gemm in (("oneDNN, stock layers", False), ("kernel's product, native layers", True)):
                    kernel._GEMM[:] = [own_gemm]
                    cache = new_dynamic_cache()
                    model(context, use_cache=True, logits_to_keep=1, **{compat.cache_kwarg(): cache})
                    start = time.perf_counter()
                    model(new, use_cache=True, **{compat.cache_kwarg(): cache})
                    if repeat:
                        seconds.setdefault((f"verify {rows} rows", route, args.context), []).append(
                            time.perf_counter() - start)
    kernel._GEMM[:] = [gemm]
    weights = sum(m.in_features * m.out_features for m in decoder)
    flops = {n: 2 * n * weights for n in (int(x) for x in args.lengths.split(","))}
    for (what, route, length), times in sorted(seconds.items(), key=lambda item: (item[0][0] != "products",
                                                                                  item[0][0], item[0][2])):
        median = statistics.median(times)
        if what.startswith("verify"):
            print(f"{what} after {length} tokens, {route}: {median * 1e3:.1f} ms")
            continue
        rate = f", {flops[length] / median / 1e9:.0f} GFLOP/s" if what == "products" else ""
        print(f"{what} of {length} tokens, {route}: {median * 1e3:.1f} ms{rate}")
    print(f"load at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
