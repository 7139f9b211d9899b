"""The CPU kernel's products alone on a model's shapes, from fp32, bf16 and int8 copies of the weights, and a bf16
model's products on the bf16 dot products (where the CPU has AVX512-BF16).

    python benchmarks/kernel_copies.py --shapes qwen1.5b --rows 1,2,4,6 [--isa avx2]

Every linear weight of the named model's shapes (random values rounded to bf16, so that the bf16 copy is exact, as
for a checkpoint saved in bf16), one thread; for each row count, the three copies take turns over 5 rounds and the
median milliseconds of all the model's products are printed. ``--isa avx2`` runs the AVX2 code for every row count
(``set_isa``), to compare with the CPU's choice (AVX-512 for bf16 and int8 copies from one row, for fp32 from 4).
``bf16-dot`` is a bf16 model's product (bf16 inputs and outputs, ``skinny_linear_bf16``), which has no AVX2 code.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def shapes(hidden: int, inter: int, layers: int, vocab: int, kv: int) -> list[tuple[int, int]]:
    per_layer = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (inter, hidden), (inter, hidden),
                 (hidden, inter)]
    return per_layer * layers + [(vocab, hidden)]


MODELS = {"qwen0.5b": shapes(896, 4864, 24, 151936, 128), "qwen1.5b": shapes(1536, 8960, 28, 151936, 256),
          "smollm2-135m": shapes(576, 1536, 30, 49152, 192)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="qwen1.5b", choices=sorted(MODELS))
    parser.add_argument("--rows", default="1,2,4,6")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--isa", default="auto", choices=["auto", "avx2", "avx512"])
    parser.add_argument("--copies", default="fp32,bf16,int8,bf16-dot", help="which copies (bf16-dot: AVX512-BF16 only)")
    args = parser.parse_args()

    from hf_speculative.cpu import kernel

    torch.set_num_threads(1)
    kernel.load_kernel().set_isa(args.isa)
    makers = {"fp32": lambda w: (kernel.block_weight(w), None),
              "bf16": lambda w: (kernel.block_weight(w, torch.bfloat16), None),
              "int8": kernel.quantize_int8}
    if kernel.bf16_dot_supported():
        makers["bf16-dot"] = lambda w: (kernel.block_pairs(w.bfloat16()), None)
    wanted = [name for name in args.copies.split(",") if name in makers]
    copies: dict[str, list] = {name: [] for name in wanted}
    for o, i in MODELS[args.shapes]:  # one weight at a time: the copies alone fill memory for a 1.5B model
        w = torch.randn(o, i).bfloat16().float()  # [out, in], bf16 values
        for name in wanted:
            copies[name].append(makers[name](w))
    print(f"{args.shapes}, isa {kernel.kernel_isa()}: ms for all the model's products (median of {args.rounds})")
    for rows in (int(r) for r in args.rows.split(",")):
        xs = [torch.randn(rows, i) for _, i in MODELS[args.shapes]]
        x16 = [x.bfloat16() for x in xs]
        took: dict[str, list[float]] = {name: [] for name in copies}
        for _ in range(args.rounds):
            for name, copy in copies.items():
                start = time.perf_counter()
                if name == "bf16-dot":
                    for (blocked, _), x in zip(copy, x16):
                        kernel.skinny_linear_bf16(x, blocked, None, blocked.shape[0] * 16)
                else:
                    for (blocked, scale), x in zip(copy, xs):
                        kernel.skinny_linear(x, blocked, None, blocked.shape[0] * 16, scale)
                took[name].append(time.perf_counter() - start)
        print(f"rows {rows}: " + ", ".join(f"{n} {statistics.median(t) * 1000:.1f}" for n, t in took.items()),
              flush=True)


if __name__ == "__main__":
    main()
