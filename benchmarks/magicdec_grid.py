"""MagicDec where it pays (issue 71): tokens/s and τ over batch size × context, against batched greedy and the other
batch drafters at the same points, every row checked token for token against greedy's.

    python benchmarks/magicdec_grid.py --out benchmarks/results/magicdec/grid.jsonl \
        --batch-sizes 1,4,8,16 --contexts 512,2048,4096,8000 --methods magicdec,magicdec-always,prompt-lookup,eagle
    python benchmarks/magicdec_grid.py --summary benchmarks/results/magicdec/grid.jsonl --plot docs/img/magicdec.png
    python benchmarks/magicdec_grid.py --dry-run      # a tiny random model, tiny sizes: identity only, no figures

Prompts are long documents available offline: Spec-Bench's RAG and summarization questions (shipped with the
package) concatenated, then Python's reference documentation (``pydoc_data``), as one long text; row ``b`` of a batch
reads its own slice of it, cut in tokens so that the prompt (the slice, then a request to summarise it, in the
model's chat template) is the cell's context. ``min_new_tokens = max_new_tokens``: every row writes the same number of
tokens under every method (EOS is held back alike in all of them), so τ is exact: the tokens of a row per target
forward, ``new tokens / (target forwards x rows)``.

Each cell (context, batch) runs transformers' batched greedy and each method on the same left-padded batch, one
after another (the order alternates by repeat, so slow drifts of a shared machine hit all alike), after an untimed
warm-up of every method. ``magicdec`` is the cost model's choice, ``magicdec-always`` the same drafter drafting at
every step it can (``adaptive=False``, and the batch loop's cost model told verification is free): the curve
against which the cost model is judged. Records (JSONL, one per
cell, method and repeat): ``tokens_per_s``, ``speedup`` over greedy of the same repeat, ``tau``, drafted and accepted
tokens, ``identical_to_greedy``, and for MagicDec the compressed caches' bound in bytes (``cache_bytes``).

At long contexts the prompt's forward (the prefill, the same in every method) takes most of a call's time: at 16
rows of 8,000 tokens about ten minutes of this CPU, for every method and repeat. So by default a cell prefills its
batch once (every column but the last, in chunks of at most ``--prefill-tokens`` tokens of the batch, so that no
``[B, H, T, T]`` attention is ever held whole) into a ``DynamicCache`` that every call of the cell starts from: our
batches read a passed cache without filling it (``docs/batching.md``), transformers' batched greedy fills its own
deep copy (so does a one-row call of ours). Its records say ``shared_prefill`` and carry the prefill's seconds
(``cell_prefill_s``); their ``seconds`` and ``speedup`` are then the calls' own (the last column, then decoding),
and ``speedup_with_prefill`` adds the prefill to both sides (what the calls would have been had each prefilled). The
repeats run inside the cell (the order of the methods alternating), so the prefill is paid once per cell.
``--no-shared-prefill``: each call prefills its prompts, as the records before this change did.

Each record also times decoding alone: a streamer notes when the first new tokens come out (the prefill's token, or our
loop's first step), and ``decode_tokens_per_s`` counts the tokens after those over the time after it;
``decode_speedup`` is that rate against greedy's of the same repeat. ``prefill_s`` is the time to the first new token.

The target runs in float32 with ``hfs.optimize_for_cpu`` (``--no-optimize`` leaves it as loaded). A context plus
``--max-new-tokens`` must fit in the model's positions (SmolLM2: 8192). Memory: greedy's cache at 16 rows of 8k
tokens of SmolLM2-135M is 6 GB in float32 (46 KB a token), and a verification holds one more copy while it grows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GREEDY = "greedy"
REQUEST = "Summarise the text above in a few sentences."


# -- prompts -------------------------------------------------------------------------------------------
def long_text() -> str:
    """Spec-Bench's RAG and summarization prompts, then Python's reference documentation: one long text."""
    from hf_speculative.bench.spec_bench import load_prompts

    parts = [p.text for p in load_prompts(categories=["rag", "summarization"])]
    try:
        from pydoc_data.topics import topics

        parts += [topics[key] for key in sorted(topics)]
    except ImportError:  # a stripped Python: Spec-Bench alone (about 150k tokens of SmolLM2's)
        pass
    return "\n\n".join(parts)


def document_prompts(tokenizer: Any, text_ids: list[int], context: int, rows: int) -> list[list[int]]:
    """``rows`` prompts of about ``context`` tokens: each a slice of ``text_ids`` (row ``b`` starts ``b`` slices in),
    then :data:`REQUEST`, in the tokenizer's chat template."""
    from hf_speculative.tooling.prompting import encode_prompt

    overhead = encode_prompt(tokenizer, "\n\n" + REQUEST).shape[1]
    size = max(context - overhead, 16)
    if size * rows > len(text_ids):
        raise SystemExit(f"the text has {len(text_ids)} tokens, fewer than {rows} rows of {size}: lower --contexts "
                         "or --batch-sizes")
    prompts = []
    for row in range(rows):
        piece = tokenizer.decode(text_ids[row * size: (row + 1) * size])
        prompts.append(encode_prompt(tokenizer, f"{piece}\n\n{REQUEST}")[0].tolist())
    return prompts


def left_padded(prompts: list[list[int]], pad: int, device: Any = None) -> dict[str, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return {"input_ids": ids, "attention_mask": mask}


# -- one cell ------------------------------------------------------------------------------------------
def strategy_for(method: str, model: Any, tokenizer: Any, options: dict) -> Any:
    """``None`` for greedy; ``magicdec-always``: MagicDec drafting at every step; else the tools' method."""
    if method == GREEDY:
        return None
    if method == "magicdec-always":
        method, options = "magicdec", {**options, "adaptive": False}
    from hf_speculative.tooling.methods import get_method

    return get_method(method).build(model, tokenizer, options)["candidate_generator"]


class FirstTokens:
    """A streamer that notes when the first new tokens arrive and how many columns they were (the prompt comes first,
    then ``[B]`` columns, or ``[1, k]`` blocks for one row in our loop)."""

    def __init__(self) -> None:
        self.puts, self.at, self.columns = 0, None, 0

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.at = time.perf_counter()
            self.columns = value.shape[-1] if value.dim() == 2 else 1

    def end(self) -> None:
        pass


def shared_prefill(model: Any, inputs: dict, tokens: int) -> tuple[Any, float]:
    """``hfs.prefill`` of every column of the left-padded batch but the last, in chunks of at most ``tokens`` tokens of
    the batch; and its seconds."""
    import hf_speculative as hfs

    start = time.perf_counter()
    cache = hfs.prefill(model, inputs, chunk_tokens=tokens)
    return cache, time.perf_counter() - start


def run_cell(model: Any, inputs: dict, methods: list[str], strategies: dict, max_new_tokens: int, pad: int,
             cache: Any = None) -> dict:
    """Every method on one batch: ``{method: (new rows, seconds, stats, (prefill seconds, decode seconds, decoded
    columns))}``. ``cache``: the batch's shared prefill (:func:`shared_prefill`), which every call starts from (greedy
    and one-row calls from a deep copy: transformers' loop and our one-row calls fill the cache they are given)."""
    import copy

    import hf_speculative as hfs
    from hf_speculative import compat
    from hf_speculative.bench.batch import free_verification

    out = {}
    width = inputs["input_ids"].shape[1]
    for method in methods:
        first = FirstTokens()
        # magicdec-always: the batch loop's width too (its cost model told verification is free, as the bench's
        # "+always"): a fixed drafter budget alone still lets the batch cost model decline a step
        always = free_verification(model) if method == "magicdec-always" else contextlib.nullcontext()
        given = {}
        if cache is not None:
            # (a one-row call fills the cache it is given, as transformers does: it gets a copy too)
            filled = method == GREEDY or inputs["input_ids"].shape[0] == 1
            given = {compat.cache_kwarg(): copy.deepcopy(cache) if filled else cache}
        with torch.inference_mode(), always:
            start = time.perf_counter()
            result = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens,
                                    min_new_tokens=max_new_tokens, pad_token_id=pad,
                                    candidate_generator=strategies[method], streamer=first, **given)
            if result.is_cuda:
                torch.cuda.synchronize()
            end = time.perf_counter()
        del given
        if cache is not None and cache.get_seq_length() != width - 1:
            raise RuntimeError(f"{method} changed the shared prefill's cache ({cache.get_seq_length()} positions, "
                               f"not {width - 1}): the next calls would not start from the same prompts")
        stats = hfs.last_stats(model) if strategies[method] is not None else None
        new = result[:, width:]
        decode = (first.at - start, end - first.at, new.shape[1] - first.columns) if first.at else (None, None, 0)
        out[method] = (new.tolist(), end - start, stats, decode)
    return out


def decode_rate(decode: tuple, rows: int) -> float | None:
    """Tokens of every row after the first new ones, per second after they came out."""
    _, seconds, columns = decode
    return rows * columns / seconds if seconds and columns > 0 else None


def records_of(cell: dict, base: dict, rows: int, strategies: dict, model: Any, prefill_s: float | None = None
               ) -> list[dict]:
    """The cell's records; ``prefill_s``: the shared prefill's seconds (``None``: each call prefilled)."""
    greedy_rows, greedy_s, _, greedy_decode = cell[GREEDY]
    greedy_rate = decode_rate(greedy_decode, rows)
    out = []
    for method, (new, seconds, stats, decode) in cell.items():
        tokens = sum(len(r) for r in new)
        rate = decode_rate(decode, rows)
        record = {**base, "method": method, "new_tokens": tokens, "seconds": seconds,
                  "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
                  "speedup": greedy_s / seconds if seconds > 0 else None, "identical_to_greedy": new == greedy_rows,
                  "prefill_s": decode[0], "decode_tokens_per_s": rate,
                  "decode_speedup": rate / greedy_rate if rate and greedy_rate else None,
                  "shared_prefill": prefill_s is not None}
        if prefill_s is not None:
            record.update(cell_prefill_s=prefill_s, speedup_with_prefill=(greedy_s + prefill_s) / (seconds + prefill_s))
        if stats is not None:
            record.update(target_forwards=stats.target_forwards, drafted=stats.drafted_tokens,
                          accepted=stats.accepted_tokens,
                          tau=stats.new_tokens / (stats.target_forwards * rows) if stats.target_forwards else None)
        if method.startswith("magicdec"):
            record["cache_bytes"] = strategies[method].cache_bytes(model, rows)
        out.append(record)
    return out


# -- the grid -----------------------------------------------------------------------------------------------
def run_grid(model: Any, tokenizer: Any, prompts_for: Any, *, batch_sizes: list[int], contexts: list[int],
             methods: list[str], options: dict, max_new_tokens: int, repeats: int, out: Path | None,
             model_name: str, prefill_tokens: int | None = None, max_minutes: float | None = None) -> list[dict]:
    """Every (context, batch size) cell ``repeats`` times; ``prompts_for(context, rows)`` gives the prompts.
    ``prefill_tokens``: each cell prefills once (:func:`shared_prefill`, chunks of that many tokens), its repeats run
    inside it; ``None``: every call prefills, the repeats outermost. ``max_minutes``: start no cell after that
    long (a lent GPU's call is bounded)."""
    import hf_speculative as hfs

    began = time.perf_counter()
    hfs.enable(model)
    pad = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
    methods = [GREEDY, *[m for m in methods if m != GREEDY]]
    given = dict(options)  # (the builds cache loaded drafters in `options`, under "_" keys)
    strategies = {m: strategy_for(m, model, tokenizer, options) for m in methods}
    device = model.get_input_embeddings().weight.device
    warm = left_padded(prompts_for(min(contexts), 2), pad, device)
    warm_cache = None if prefill_tokens is None else shared_prefill(model, warm, prefill_tokens)[0]
    run_cell(model, warm, methods, strategies, 8, pad, warm_cache)  # warm-up
    del warm_cache
    records: list[dict] = []
    commit = _commit()  # the code measured: records of several commits share a file
    if prefill_tokens is None:  # (context, rows, the repeats run on one prefill)
        cells = [(context, rows, [repeat]) for repeat in range(repeats) for context in contexts
                 for rows in (batch_sizes if repeat % 2 == 0 else batch_sizes[::-1])]
    else:
        cells = [(context, rows, list(range(repeats))) for context in contexts for rows in batch_sizes]
    with contextlib.ExitStack() as stack:
        handle = None if out is None else stack.enter_context(open(out, "a", encoding="utf-8"))
        for done, (context, rows, cell_repeats) in enumerate(cells):
            if max_minutes is not None and (time.perf_counter() - began) / 60 > max_minutes:
                print(f"stopping after {done} of {len(cells)} cells: over {max_minutes} minutes", flush=True)
                break
            inputs = left_padded(prompts_for(context, rows), pad, device)
            cache, prefill_s = (None, None) if prefill_tokens is None else shared_prefill(model, inputs,
                                                                                           prefill_tokens)
            for repeat in cell_repeats:
                order = methods if repeat % 2 == 0 else [GREEDY, *methods[:0:-1]]
                cell = run_cell(model, inputs, order, strategies, max_new_tokens, pad, cache)
                base = {"model": model_name, "context": context, "prompt_tokens": inputs["input_ids"].shape[1],
                        "batch_size": rows, "repeat": repeat, "max_new_tokens": max_new_tokens,
                        "threads": torch.get_num_threads(), "options": given, "commit": commit}
                for record in records_of(cell, base, rows, strategies, model, prefill_s):
                    records.append(record)
                    if handle is not None:
                        handle.write(json.dumps(record) + "\n")
                        handle.flush()
                print(f"context {context}, batch {rows}, repeat {repeat}"
                      + ("" if prefill_s is None else f" (shared prefill {prefill_s:.1f} s)") + ": "
                      + ", ".join(f"{r['method']} identical={r['identical_to_greedy']}"
                                  for r in records[-len(methods):]), flush=True)
            del cache
    return records


def _commit() -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def summarize(records: list[dict]) -> list[dict]:
    """Per (context, batch, method): the median speedup and τ over the repeats, and whether every row was greedy's.
    A cell measured again at a later commit is summarised from the latest commit's records alone (the file's order)."""
    from statistics import median

    cells: dict[tuple, list[dict]] = {}
    for r in records:
        cells.setdefault((r["context"], r["batch_size"], r["method"]), []).append(r)
    rows = []
    for (context, batch, method), group in sorted(cells.items()):
        latest = group[-1].get("commit")
        group = [r for r in group if r.get("commit") == latest]
        taus = [r["tau"] for r in group if r.get("tau") is not None]
        decode = [r["decode_speedup"] for r in group if r.get("decode_speedup") is not None]
        with_prefill = [r["speedup_with_prefill"] for r in group if r.get("speedup_with_prefill") is not None]
        rows.append({"context": context, "batch_size": batch, "method": method,
                     "speedup": round(median(r["speedup"] for r in group), 3),
                     "speedup_with_prefill": round(median(with_prefill), 3) if with_prefill else None,
                     "shared_prefill": any(r.get("shared_prefill") for r in group),
                     "decode_speedup": round(median(decode), 3) if decode else None,
                     "tokens_per_s": round(median(r["tokens_per_s"] for r in group), 2),
                     "tau": round(median(taus), 3) if taus else None,
                     "identical": all(r["identical_to_greedy"] for r in group), "commit": latest})
    return rows


def plot(rows: list[dict], path: str) -> None:
    """Decoding's speedup over batched greedy (the prefill left out) against the batch size, one panel per context,
    one line per method."""
    from matplotlib.figure import Figure

    contexts = sorted({r["context"] for r in rows})
    figure = Figure(figsize=(3.2 * len(contexts), 3.4))
    for i, context in enumerate(contexts):
        axes = figure.add_subplot(1, len(contexts), i + 1)
        for method in sorted({r["method"] for r in rows if r["method"] != GREEDY}):
            points = sorted((r["batch_size"], r["decode_speedup"]) for r in rows  # (an untimed record: not drawn)
                            if r["context"] == context and r["method"] == method and r["decode_speedup"] is not None)
            axes.plot([b for b, _ in points], [s for _, s in points], marker="o", label=method)
        axes.axhline(1.0, color="grey", linewidth=0.8)
        axes.set_xscale("log", base=2)
        axes.set_title(f"context {context}")
        axes.set_xlabel("batch size")
        if i == 0:
            axes.set_ylabel("decoding speedup over batched greedy")
    figure.axes[-1].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


# -- the dry run: tiny sizes, identity only -----------------------------------------------------------------
def dry_run() -> int:
    """A tiny random Llama (no download), contexts 24 and 48, batches 1 and 3, a window of 8: every method's rows must
    be greedy's, and MagicDec must have drafted. Prints no timing."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                                         eos_token_id=2, bos_token_id=3)).eval()
    generator = torch.Generator().manual_seed(1)

    def prompts_for(context: int, rows: int) -> list[list[int]]:  # ragged: the rows differ in length by a few
        return [torch.randint(4, 96, (context - 2 * row,), generator=generator).tolist() for row in range(rows)]

    failed = False
    for prefill_tokens in (None, 40):  # each call prefilling; one shared prefill per cell, in chunks
        records = run_grid(model, None, prompts_for, batch_sizes=[1, 3], contexts=[24, 48],
                           methods=["magicdec", "magicdec-always", "prompt-lookup"], options={"window": 8, "sinks": 2},
                           max_new_tokens=12, repeats=2 if prefill_tokens else 1, out=None,
                           model_name="tiny-random-llama", prefill_tokens=prefill_tokens)
        wrong = [(r["context"], r["batch_size"], r["method"]) for r in records if not r["identical_to_greedy"]]
        drafted = sum(r.get("drafted", 0) for r in records if r["method"] == "magicdec-always")
        untimed = [(r["context"], r["batch_size"], r["method"]) for r in records if not r["decode_tokens_per_s"]]
        shared = {r["shared_prefill"] for r in records} == {prefill_tokens is not None}
        print(f"dry run (shared prefill: {prefill_tokens is not None}): {len(records)} records, {len(wrong)} differ "
              f"from greedy {wrong}; magicdec-always drafted {drafted} tokens; decoding not timed in {untimed}")
        failed = failed or bool(wrong) or not drafted or bool(untimed) or not shared
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch-sizes", default="1,4,8,16")
    parser.add_argument("--contexts", default="512,2048,4096,8000")
    parser.add_argument("--methods", default="magicdec,magicdec-always,prompt-lookup,eagle")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prefill-tokens", type=int, default=4096,
                        help="a cell's shared prefill runs in chunks of this many tokens of the batch")
    parser.add_argument("--no-shared-prefill", action="store_true",
                        help="every call prefills its prompts (the repeats outermost), as before the shared prefill")
    parser.add_argument("--no-optimize", action="store_true", help="leave the model as loaded (no optimize_for_cpu)")
    parser.add_argument("--out", default=None, help="JSONL file the records are appended to")
    parser.add_argument("--summary", default=None, help="summarise a JSONL file instead of running")
    parser.add_argument("--plot", default=None, help="with --summary: write the speedup plot (PNG) here")
    parser.add_argument("--dry-run", action="store_true", help="tiny random model, tiny sizes: identity only")
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry_run()
    if args.summary:
        rows = summarize([json.loads(line) for line in Path(args.summary).read_text().splitlines() if line.strip()])
        for row in rows:
            print(json.dumps(row))
        if args.plot:
            plot(rows, args.plot)
        return 0
    import hf_speculative as hfs

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = hfs.load_model(args.model, dtype=torch.float32)
    if not args.no_optimize:
        hfs.optimize_for_cpu(model)
    contexts = [int(c) for c in args.contexts.split(",")]
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions and max(contexts) + args.max_new_tokens > positions:
        raise SystemExit(f"--contexts {max(contexts)} + --max-new-tokens {args.max_new_tokens} exceeds the model's "
                         f"{positions} positions")
    tokenizer.padding_side = "left"
    text_ids = tokenizer(long_text(), add_special_tokens=False).input_ids
    run_grid(model, tokenizer, lambda context, rows: document_prompts(tokenizer, text_ids, context, rows),
             batch_sizes=[int(b) for b in args.batch_sizes.split(",")], contexts=contexts,
             methods=args.methods.split(","), options={"window": args.window, "sinks": args.sinks},
             max_new_tokens=args.max_new_tokens, repeats=args.repeats,
             out=Path(args.out) if args.out else None, model_name=args.model,
             prefill_tokens=None if args.no_shared_prefill else args.prefill_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
