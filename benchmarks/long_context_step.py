"""One decoding step at long contexts: a forward of ``q`` new tokens per row over ``B`` rows that each hold a
``T``-token cache (random keys and values, written in place as our loop's are: ``core/kv_room.py``), the time of the
whole forward and of its attention alone (the kernel's ``few_query_attention`` on the same tensors, every layer).

    python benchmarks/long_context_step.py [--rows 8] [--contexts 2048,4096] [--tokens 1,2,4] [--repeats 5]

SmolLM2-135M-Instruct fp32 with ``hfs.optimize_for_cpu(model)``, one thread; medians. What the cache reads: ``rows x
T x 46 KB``; the attention's rate is those bytes over its time. Run it alone; compare two builds of the kernel with
``TORCH_EXTENSIONS_DIR`` set apart for each checkout.
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
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--contexts", default="2048,4096")
    parser.add_argument("--tokens", default="1,2,4", help="new tokens per row in a step (1: plain decoding)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import hf_speculative as hfs
    from hf_speculative import compat
    from hf_speculative.core.kv_cache import new_dynamic_cache
    from hf_speculative.core.kv_room import make_room
    from hf_speculative.cpu.kernel import few_query_attention

    torch.set_num_threads(1)
    model, _ = hfs.load_model(args.model)
    hfs.optimize_for_cpu(model)
    config = model.config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    print(f"load at start: {os.getloadavg()}", flush=True)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for context in (int(n) for n in args.contexts.split(",")):
            cache = new_dynamic_cache()
            for layer in range(layers):
                shape = (args.rows, kv_heads, context, head_dim)
                cache.update(torch.randn(shape, generator=generator), torch.randn(shape, generator=generator), layer)
            make_room(cache)
            cache_bytes = 2 * layers * args.rows * kv_heads * context * head_dim * 4
            for tokens in (int(n) for n in args.tokens.split(",")):
                ids = torch.randint(100, 20000, (args.rows, tokens), generator=generator)
                positions = torch.arange(context, context + tokens).expand(args.rows, -1)
                mask = torch.ones(args.rows, context + tokens, dtype=torch.long)
                query = torch.randn(args.rows, config.num_attention_heads, tokens, head_dim, generator=generator)
                steps, attention = [], []
                for repeat in range(args.repeats + 1):  # the first warms up
                    start = time.perf_counter()
                    model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                          **{compat.cache_kwarg(): cache})
                    step = time.perf_counter() - start
                    compat.crop_cache(cache, tokens)
                    start = time.perf_counter()
                    for layer in cache.layers:
                        few_query_attention(query, layer.keys, layer.values, None, head_dim ** -0.5)
                    if repeat:
                        steps.append(step)
                        attention.append(time.perf_counter() - start)
                step, attend = statistics.median(steps), statistics.median(attention)
                print(f"{args.rows} rows x {context} tokens, {tokens} new a row: step {step * 1e3:.1f} ms, attention "
                      f"{attend * 1e3:.1f} ms ({cache_bytes / attend / 1e9:.1f} GB/s of cache)", flush=True)
    print(f"load at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
