"""hf_speculative beside the CPU peers: OpenVINO GenAI and llama.cpp on the same prompts, interleaved (issue 48).

    .venv/bin/python benchmarks/peers/run.py --repeats 3 --out benchmarks/results/peers --write-docs

Engines (``--engines``):

- ``hfs-default``: hf_speculative with its defaults (PyTorch fp32, the registry's weights);
- ``hfs-kernel``: the same with ``hfs.optimize_for_cpu(model)`` on every linear layer and transformers'
  grouped-query SDPA (``hf-speculative bench --cpu-layout all+kernel --sdpa-gqa``);
- ``openvino``: OpenVINO GenAI on the target's fp32 IR, exported once by optimum-intel into the cache
  (``~/.cache/hf_speculative/peers/openvino``), run by ``openvino_worker.py`` in the OpenVINO venv (``make
  install-openvino``), a process of its own that answers one request at a time;
- ``vllm``: vLLM's CPU build on the registry's fp32 weights, run by ``vllm_worker.py`` in the vLLM venv (``make
  install-vllm``), a process of its own that answers one request at a time;
- ``llamacpp``: a built llama.cpp tree (``--llama-cpp DIR``) on a GGUF file (``--gguf``); skipped with a note
  without them.

Methods (``--methods``) are hf_speculative's names; each engine runs those it has: ``prompt-lookup`` (OpenVINO's
``prompt_lookup``, llama.cpp's ``llama-lookup``), ``draft-model`` (with ``--draft-model``: OpenVINO's
``draft_model``, llama.cpp's ``llama-speculative-simple`` with ``--draft-gguf``), ``eagle`` (OpenVINO's EAGLE-3
pipeline with ``--openvino-eagle3 DIR``; vLLM's ``eagle3`` with our shipped drafter's export, or ``--vllm-eagle3``);
vLLM's ``ngram`` is its ``prompt-lookup``; the others (``hybrid``, ``hf-prompt-lookup``...) run on our engines
only. Every engine runs its own plain greedy decoding, the baseline its speedups and identical counts refer to.

Discipline, as ``hf-speculative bench``'s (:func:`hf_speculative.bench.runner.run_bench`): one thread everywhere,
an untimed warm-up of every engine and method, then for each prompt every engine's greedy and methods in turn,
``--repeats`` times, the median time kept per (engine, prompt, method); one engine works at a time (the OpenVINO
worker waits for its next request while our engines run). Our engines' runs are ``run_method`` calls and their rows
are ``hf-speculative bench``'s rows (``engine`` added), so ``report.summarize`` gives the same figures
(aggregate tokens/s, speedup over the engine's greedy, median speedup, τ, acceptance, identical outputs).

Writes ``<out>/<model>.jsonl`` (one row per engine, prompt and method, written as each prompt finishes) and
``<out>/<model>.md`` (the tables with the machine, the versions, the command and the date); ``--write-docs`` puts
the same text between ``<!-- peers:begin -->`` and ``<!-- peers:end -->`` in docs/benchmark.md.

This file is the command line; beside it: ``engines.py`` (:class:`Run`, :class:`Engine` and the interleaved driver),
``hfs_engine.py``, ``openvino_engine.py`` (the client of ``openvino_worker.py``), ``llamacpp_engine.py`` and
``tables.py`` (the markdown and the docs section).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(HERE) not in sys.path:  # the sibling modules, also when this file is loaded by path (the tests)
    sys.path.insert(0, str(HERE))

from engines import BASELINE, Engine, run_all
from hfs_engine import HfsEngine
from llamacpp_engine import LlamaCppEngine
from openvino_engine import OpenVinoEngine, openvino_problem, openvino_python, registry_folder
from tables import markdown, write_docs
from vllm_engine import VllmEngine, vllm_problem, vllm_python

DOCS = ROOT / "docs" / "benchmark.md"
ENGINES = ("hfs-default", "hfs-kernel", "openvino", "vllm", "llamacpp")
CATEGORIES = ("writing", "summarization", "qa", "math_reasoning", "rag", "translation")
"""Spec-Bench's categories in the order of the table: MT-bench's writing (question ids 81, 82), then the five
Spec-Bench ones."""
DEFAULT_METHODS = ("prompt-lookup", "eagle", "hybrid", "hf-prompt-lookup")


# -- the machine -----------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        import platform

        return platform.processor() or platform.machine()


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# -- main --------------------------------------------------------------------------------------------
def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="Registry name of the target.")
    parser.add_argument("--draft-model", default=None, help="Registry name of a draft model (method draft-model).")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"Comma-separated: {', '.join(ENGINES)}.")
    parser.add_argument("--methods", default=None,
                        help=f"hf_speculative method names, comma-separated (greedy always runs); default "
                             f"{','.join(DEFAULT_METHODS)} (and draft-model with --draft-model).")
    parser.add_argument("--categories", default=",".join(CATEGORIES))
    parser.add_argument("--prompts-per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1, help="Rounds per prompt; the median time is kept.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="Our engines' model and draft model dtype (bfloat16: as Qwen2.5's checkpoints are saved).")
    parser.add_argument("--openvino-precision", default="f32", choices=["f32", "bf16"],
                        help="OpenVINO's INFERENCE_PRECISION_HINT (its default on a CPU with bf16 instructions: bf16).")
    parser.add_argument("--openvino-venv", default=".venv-ov", help="The OpenVINO venv (make install-openvino).")
    parser.add_argument("--openvino-eagle3", default=None, help="An EAGLE-3 drafter's OpenVINO IR folder (eagle).")
    parser.add_argument("--num-assistant-tokens", type=int, default=5,
                        help="OpenVINO's draft length (vLLM's num_speculative_tokens).")
    parser.add_argument("--max-ngram-size", type=int, default=3,
                        help="OpenVINO's prompt-lookup n-gram (vLLM's prompt_lookup_max).")
    parser.add_argument("--vllm-venv", default=".venv-vllm", help="The vLLM venv (make install-vllm).")
    parser.add_argument("--vllm-eagle3", default=None,
                        help="An EAGLE-3 drafter folder for vLLM (export-eagle --format vllm); default: the shipped "
                             "drafter of --model, exported once into the cache.")
    parser.add_argument("--vllm-preload", default="auto",
                        help="vLLM's LD_PRELOAD: auto (the venv's Intel OpenMP, as vLLM's CPU guide asks), none, "
                             "or paths.")
    parser.add_argument("--llama-cpp", default=None, help="A built llama.cpp tree (its bin/ or build/bin/).")
    parser.add_argument("--gguf", default=None, help="The target's GGUF file (llama.cpp).")
    parser.add_argument("--draft-gguf", default=None, help="The draft model's GGUF file (llama.cpp).")
    parser.add_argument("--draft-max", type=int, default=3, help="llama.cpp's draft length.")
    parser.add_argument("--out", default="benchmarks/results/peers", help="Folder of the jsonl and markdown.")
    parser.add_argument("--write-docs", nargs="?", const=str(DOCS), default=None, metavar="PAGE",
                        help=f"Put the tables between the peers markers of PAGE (default {DOCS.relative_to(ROOT)}).")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.max_new_tokens < 1 or args.prompts_per_category < 1:
        parser.error("--repeats, --max-new-tokens and --prompts-per-category must be at least 1")
    return args


def build_engines(args: argparse.Namespace, prompts: list[Any], encoded: list[Any], texts: list[str], meta: dict,
                  out: Path, say: Callable[[str], None]) -> tuple[list[Engine], list[str]]:
    """The engines asked for, in ``--engines`` order; an engine that cannot run here is left out with a note."""
    from hf_speculative.tooling.methods import get_method

    methods = _split(args.methods) if args.methods else list(DEFAULT_METHODS) + (
        ["draft-model"] if args.draft_model else [])
    for name in methods:
        get_method(name)  # an unknown name fails here, naming the close match
    methods = [m for m in methods if m != BASELINE]
    options = {"draft_model": args.draft_model} if args.draft_model else {}
    engines: list[Engine] = []
    skipped: list[str] = []
    for name in _split(args.engines):
        if name not in ENGINES:
            raise SystemExit(f"unknown engine {name!r}: {', '.join(ENGINES)}")
        if name in ("hfs-default", "hfs-kernel"):
            engines.append(HfsEngine(name, args.model, methods, options, encoded, kernel=name == "hfs-kernel",
                                     threads=args.threads, meta=meta, dtype=args.dtype))
        elif name == "openvino":
            python = openvino_python(args.openvino_venv)
            problem = openvino_problem(python)
            if problem:
                skipped.append(f"openvino: {problem}")
                continue
            engines.append(OpenVinoEngine(
                args.model, methods, [ids[0].tolist() for ids in encoded], python=python, draft_model=args.draft_model,
                eagle3=args.openvino_eagle3, threads=args.threads, num_assistant_tokens=args.num_assistant_tokens,
                max_ngram_size=args.max_ngram_size, log=out / f"{args.model}.openvino.log", meta=meta,
                precision=args.openvino_precision))
        elif name == "vllm":
            python = vllm_python(args.vllm_venv)
            problem = vllm_problem(python)
            if problem:
                skipped.append(f"vllm: {problem}")
                continue
            engines.append(VllmEngine(
                args.model, methods, [ids[0].tolist() for ids in encoded], python=python, eagle3=args.vllm_eagle3,
                threads=args.threads, num_speculative_tokens=args.num_assistant_tokens,
                max_ngram_size=args.max_ngram_size, log=out / f"{args.model}.vllm.log", meta=meta,
                preload_choice=args.vllm_preload))
        elif name == "llamacpp":
            if not args.llama_cpp or not args.gguf:
                skipped.append("llama.cpp: no --llama-cpp DIR (a built tree) and --gguf FILE given")
                continue
            engines.append(LlamaCppEngine(
                Path(args.llama_cpp), Path(args.gguf), methods, texts,
                draft_gguf=Path(args.draft_gguf) if args.draft_gguf else None, threads=args.threads,
                draft_max=args.draft_max, meta=meta, workdir=Path(tempfile.mkdtemp(prefix="peers-llama-"))))
    for note in skipped:
        say(f"skipped {note}")
    return engines, skipped


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    say = (lambda line: print(line, file=sys.stderr, flush=True))

    import torch
    from transformers import AutoTokenizer

    import hf_speculative
    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.tooling.prompting import encode_prompt

    torch.set_num_threads(args.threads)
    prompts = load_prompts(categories=_split(args.categories), per_category=args.prompts_per_category)
    tokenizer = AutoTokenizer.from_pretrained(str(registry_folder(args.model)))
    encoded = [encode_prompt(tokenizer, p.text, True) for p in prompts]
    texts = [tokenizer.decode(ids[0].tolist()) for ids in encoded]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "run_id": time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}", "model": args.model,
        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "threads": args.threads,
        "dtype": args.dtype, "openvino_precision": args.openvino_precision,
        "hf_speculative": hf_speculative.__version__, "cpu": cpu_model(), "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "command": "python benchmarks/peers/run.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        "prompts": [p.question_id for p in prompts], "load": {"start": load_average()},
    }
    engines, meta["skipped"] = build_engines(args, prompts, encoded, texts, meta, out, say)
    if not engines:
        raise SystemExit("no engine can run: " + "; ".join(meta["skipped"]))
    jsonl = out / f"{args.model}.jsonl"
    try:
        for engine in engines:
            say(f"starting {engine.name}...")
            engine.start()
            for note in engine.notes:
                say(f"{engine.name} skips {note}")
        with open(jsonl, "w", encoding="utf-8") as f:
            def write(row: dict) -> None:
                f.write(json.dumps(row) + "\n")
                f.flush()

            rows = run_all(engines, prompts, [int(ids.shape[1]) for ids in encoded],
                           max_new_tokens=args.max_new_tokens, repeats=args.repeats, on_row=write,
                           progress=None if args.no_progress else say)
        meta["load"]["end"] = load_average()
        versions: dict[str, Any] = {}
        for engine in engines:
            if isinstance(engine, OpenVinoEngine):
                versions["openvino_venv"] = engine.versions()
            elif isinstance(engine, VllmEngine):
                versions["vllm_venv"] = engine.versions()
            else:
                versions.update(engine.versions())
        meta["versions"] = versions
        meta["engines"] = [{"name": e.name, "label": e.label, "weights": e.weights, "notes": e.notes}
                           for e in engines]
    finally:
        for engine in engines:
            engine.close()
    text = markdown(rows, meta)
    (out / f"{args.model}.md").write_text(text, encoding="utf-8")
    (out / f"{args.model}.meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(text)
    if args.write_docs:
        write_docs(Path(args.write_docs), text)
        say(f"wrote the section of {args.write_docs}")
    say(f"rows in {jsonl}; tables in {out / f'{args.model}.md'}")
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # the repository's hf_speculative when run from a clone without installing it
    main()
