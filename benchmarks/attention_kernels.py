"""The kernel's attention for a few query rows (``csrc/few_query_attention.cpp``: decoding, drafting and
verification rows) and its causal prefill attention (``csrc/prefill_attention.cpp``) alone, at SmolLM2-135M's head
shapes (9 heads of 64 over 3 KV heads), one thread: microseconds a layer and GFLOP/s over a grid of row counts and
contexts, and the prefill attention against SDPA. (``few_query_attention.py`` checks the few-query kernel's rows
against SDPA and alone, at one context.)

    python benchmarks/attention_kernels.py [--repeats 21]

Run it alone (no other benchmark or test suite beside it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()

    from hf_speculative.cpu.kernel import load_kernel

    torch.set_num_threads(1)
    kernel = load_kernel()
    print(f"load at start: {os.getloadavg()}; isa {kernel.isa()}", flush=True)
    heads, kv_heads, dim = 9, 3, 64
    for context in (64, 512, 800, 2048):
        for rows in (1, 2, 6, 11, 16):
            q = torch.randn(1, heads, rows, dim)
            k, v = torch.randn(1, kv_heads, context + rows, dim), torch.randn(1, kv_heads, context + rows, dim)
            ms = _median_ms(lambda q=q, k=k, v=v: kernel.few_query_attention(q, k, v, None, dim ** -0.5), args.repeats)
            flops = heads * rows * (context + rows) * dim * 4  # scores and values, a multiply-add each
            print(f"few-query: {rows} rows after {context} keys: {ms * 1e3:.0f} us a layer, "
                  f"{flops / ms / 1e6:.1f} GFLOP/s", flush=True)
    if kernel.has_prefill_attention():
        for length in (40, 93, 256, 767, 2048):
            q = torch.randn(1, heads, length, dim)
            k, v = torch.randn(1, kv_heads, length, dim), torch.randn(1, kv_heads, length, dim)
            ours = _median_ms(lambda q=q, k=k, v=v: kernel.prefill_attention(q, k, v, dim ** -0.5), max(3, args.repeats // 3))
            sdpa = _median_ms(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                      enable_gqa=True),
                              max(3, args.repeats // 3))
            print(f"prefill of {length}: prefill_attention {ours:.3f} ms, SDPA {sdpa:.3f} ms a layer "
                  f"({sdpa / ours:.2f}x)", flush=True)
    print(f"load at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
