"""The CPU kernel's attention for a few query tokens against PyTorch's SDPA (issue 48).

    python benchmarks/few_query_attention.py [--context 517] [--repeats 300]

``hf_speculative/cpu/csrc/few_query_attention.cpp`` (the kernel's extension; it runs the rows of 16-bit models'
short forwards, hf_speculative/cpu/attention.py) computes every query row of every head on its own arithmetic
(scores in key order, a polynomial exp, sums in key order), so a verification row is bitwise what plain decoding
computes at that position, and reads each block of keys once for all the rows of a kv head's group, the values once
for 3 rows at a time. Shapes are SmolLM2-135M's (9 query heads over 3 kv heads of 64) at one context, keys and values
as strided views of a larger store (as the loop's cache holds them). Prints, per number of query tokens: the largest
difference from SDPA, whether each row computed alone gives the same bits, and the median microseconds of both
(SDPA with the causal mask verification passes, none for one token), interleaved. One thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def build():
    from hf_speculative.cpu.kernel import load_kernel

    return load_kernel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=517)
    parser.add_argument("--tokens", default="1,2,4,6,9")
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ext = build()
    torch.manual_seed(0)
    length = args.context
    keys, values = torch.randn(1, 3, length + 256, 64), torch.randn(1, 3, length + 256, 64)
    key, value = keys[:, :, :length], values[:, :, :length]  # [1, 3, L, 64] views
    print(f"context {length}, 9 query heads over 3 kv heads of 64, {torch.__version__}, one thread")
    print("| query tokens | max diff vs SDPA | rows alone bitwise equal | SDPA µs | this kernel µs | ratio |")
    print("|---|---|---|---|---|---|")
    for q_len in (int(t) for t in args.tokens.split(",")):
        query = torch.randn(1, 9, q_len, 64)
        mask = torch.ones(q_len, length, dtype=torch.bool).tril(length - q_len)  # [q, L]: causal over the cache
        ours = ext.few_query_attention(query, key, value, None, 0.125)  # [1, q, 9, 64]
        reference = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True).transpose(1, 2)
        alone = torch.cat([ext.few_query_attention(query[:, :, i:i + 1], key[:, :, :length - q_len + i + 1],
                                                   value[:, :, :length - q_len + i + 1], None, 0.125)
                           for i in range(q_len)], dim=1)
        sdpa_mask = mask if q_len > 1 else None  # decoding's call passes none
        calls = {"sdpa": lambda: F.scaled_dot_product_attention(query, key, value, attn_mask=sdpa_mask,
                                                                enable_gqa=True),
                 "ours": lambda: ext.few_query_attention(query, key, value, None, 0.125)}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for round_ in range(args.repeats + 20):
            for name, call in calls.items():
                tick = time.perf_counter()
                call()
                if round_ >= 20:
                    times[name].append(time.perf_counter() - tick)
        sdpa, mine = (1e6 * statistics.median(times[name]) for name in ("sdpa", "ours"))
        print(f"| {q_len} | {float((ours - reference).abs().max()):.1e} | {torch.equal(ours, alone)} | {sdpa:.1f} | "
              f"{mine:.1f} | {mine / sdpa:.2f} |")


if __name__ == "__main__":
    main()
