"""One copy of the weights against two: ``optimize_for_cpu`` on a memory-mapped checkpoint leaves the fp32 weights the
kernel serves at every row count as views of the file and drops its pages (``hf_speculative/cpu/mapped.py``), against
``HFS_KERNEL_ONE_COPY=0`` (a column-major copy beside the blocked one, prefills past 192 rows on oneDNN), and plain
transformers without ``optimize_for_cpu`` for the memory.

    python benchmarks/one_copy_ab.py [--lengths 256,767,2048] [--new-tokens 128] [--repeats 3]

Each run is a process of its own (resident memory is per process), the modes taking turns (one, two, plain, one,
...): the resident set after loading, after ``optimize_for_cpu``, after the timings (``VmRSS``) and its peak
(``VmHWM``); a whole prefill (one forward of random token ids, ``logits_to_keep=1``, twice, the second timed) of each
length; plain greedy decoding of ``--new-tokens`` after a 64-token prompt, tokens/s. SmolLM2-135M-Instruct fp32, one
thread; medians over the runs. Run it alone (no other benchmark or test suite beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = {"one copy": {"HFS_KERNEL_ONE_COPY": "1"}, "two copies": {"HFS_KERNEL_ONE_COPY": "0"},
         "plain transformers": {}}


def _memory() -> dict[str, int]:
    """This process's resident set and its peak, MiB (Linux)."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) // 1024
    return fields


def child(args: argparse.Namespace) -> None:
    import torch

    import hf_speculative as hfs
    from hf_speculative import compat
    from hf_speculative.core.kv_cache import new_dynamic_cache

    torch.set_num_threads(1)
    record: dict = {"mode": args.child}
    model, _ = hfs.load_model(args.model)
    record["loaded"] = _memory()
    if args.child != "plain transformers":
        hfs.optimize_for_cpu(model, kernel=True)
    record["optimized"] = _memory()
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for length in (int(n) for n in args.lengths.split(",")):
            ids = torch.randint(100, 20000, (1, length), generator=generator)
            for _ in range(2):  # the first warms this length up
                start = time.perf_counter()
                model(ids, use_cache=True, logits_to_keep=1, **{compat.cache_kwarg(): new_dynamic_cache()})
                record[f"prefill {length}"] = time.perf_counter() - start
        prompt = torch.randint(100, 20000, (1, 64), generator=generator)
        model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
        record["decode tok/s"] = (out.shape[1] - prompt.shape[1]) / (time.perf_counter() - start)
        record["tokens"] = out[0, prompt.shape[1]:].tolist()
    record["after"] = _memory()
    print(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", default="256,767,2048")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=sorted(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    print(f"load at start: {os.getloadavg()}", flush=True)
    records: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode, env in MODES.items():
            command = [sys.executable, __file__, "--child", mode, "--model", args.model, "--lengths", args.lengths,
                       "--new-tokens", str(args.new_tokens)]
            done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=True)
            records[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    same = all(r["tokens"] == records["plain transformers"][0]["tokens"] for rs in records.values() for r in rs)
    lengths = [int(n) for n in args.lengths.split(",")]
    print(f"{args.model}, fp32, one thread, {args.repeats} runs a mode, medians; greedy tokens identical in every run: "
          f"{same}")
    print("| mode | RSS loaded | RSS optimized | RSS after | peak | "
          + " | ".join(f"prefill {n} (ms)" for n in lengths) + " | decode tok/s |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(lengths) + "---:|")
    for mode, rs in records.items():
        mib = [statistics.median(r[when][key] for r in rs) for when, key in
               (("loaded", "VmRSS"), ("optimized", "VmRSS"), ("after", "VmRSS"), ("after", "VmHWM"))]
        prefill = [statistics.median(r[f"prefill {n}"] for r in rs) * 1e3 for n in lengths]
        print(f"| {mode} | " + " | ".join(f"{v:,.0f} MiB" for v in mib) + " | "
              + " | ".join(f"{v:,.1f}" for v in prefill)
              + f" | {statistics.median(r['decode tok/s'] for r in rs):.2f} |")
    print(f"load at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
