"""OpenVINO GenAI's side of ``benchmarks/peers/run.py``: a process that loads the pipelines once and answers requests.

Run with the OpenVINO venv's Python (``make install-openvino``: optimum-intel pins a transformers of its own, so
OpenVINO GenAI cannot live in the main venv)::

    .venv-ov/bin/python benchmarks/peers/openvino_worker.py export --model REGISTRY_FOLDER --out IR_FOLDER
    .venv-ov/bin/python benchmarks/peers/openvino_worker.py serve --model IR_FOLDER [--draft IR] [--eagle3 IR]

``export`` writes the fp32 OpenVINO IR of a Hugging Face folder with optimum-intel's ``optimum-cli export openvino``
(task ``text-generation-with-past``, ``--weight-format fp32``; the tokenizer converted beside it).

``serve`` loads one ``LLMPipeline`` per mode (``plain``; ``prompt_lookup``; ``draft_model`` with ``--draft``;
``eagle3`` with ``--eagle3``), on the CPU with ``INFERENCE_NUM_THREADS``, ``INFERENCE_PRECISION_HINT`` (f32 by
default: OpenVINO's default on a CPU with bf16 changes the outputs) and prefix caching off (runs do not share
prefills). It prints one JSON line, ``{"ready": true, "modes": [...], "versions": {...}}``, then answers one JSON
line per request line on stdin:

- ``{"op": "generate", "mode": "prompt_lookup", "input_ids": [...], "max_new_tokens": 128,
  "num_assistant_tokens": 5, "max_ngram_size": 3}`` (or ``"prompt": TEXT`` instead of ``input_ids``: the text as
  it is, the chat template already applied) ->
  ``{"ok": true, "output_ids": [...], "text": ..., "seconds": ..., "metrics": {...}}``: the new token ids, the wall
  time of the ``generate`` call alone, and what OpenVINO GenAI reports of the call (its own durations, accepted
  tokens where it counts them);
- ``{"op": "quit"}`` -> ``{"ok": true}``, and the process ends.

A request that fails is answered ``{"ok": false, "error": ...}`` and the process goes on. Only the protocol's lines
go to stdout (the libraries' own prints are sent to stderr). Nothing here imports openvino at module level, so the
protocol is tested with fake pipelines in the main venv (tests/bench/test_peers_openvino_worker.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, IO, Iterable

MODES = ("plain", "prompt_lookup", "draft_model", "eagle3")
"""What a pipeline runs: plain greedy, prompt lookup, a draft model, an EAGLE-3 drafter."""
SPECULATIVE = {"draft_model", "eagle3"}
EXPORTED = ("openvino_model.xml", "openvino_tokenizer.xml", "openvino_detokenizer.xml")
"""The files of a usable export: the model and its tokenizer and detokenizer (OpenVINO GenAI reads all three)."""


# -- the protocol: no openvino needed -----------------------------------------------------------------
def generation_config(genai: Any, request: dict, pipe: Any = None) -> Any:
    """The greedy ``GenerationConfig`` of ``request``: the pipeline's own (the model's ``generation_config.json``:
    its EOS), with ``max_new_tokens``, and for a speculative mode ``num_assistant_tokens`` (and ``max_ngram_size``
    for prompt lookup)."""
    mode = request["mode"]
    own = getattr(pipe, "get_generation_config", None)
    config = own() if own is not None else genai.GenerationConfig()
    config.max_new_tokens = int(request["max_new_tokens"])
    config.do_sample = False
    if mode != "plain":
        config.num_assistant_tokens = int(request.get("num_assistant_tokens") or 5)
    if mode == "prompt_lookup":
        config.max_ngram_size = int(request.get("max_ngram_size") or 3)
    return config


def _number(value: Any) -> float | int | None:
    """A metric as a JSON number: a ``MeanStdPair``'s mean, an int or a float; ``None`` otherwise."""
    value = getattr(value, "mean", value)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _call(obj: Any, name: str) -> Any:
    """``obj.name()`` (or the attribute), ``None`` when it is missing or fails."""
    try:
        value = getattr(obj, name)
        return value() if callable(value) else value
    except Exception:  # noqa: BLE001 - a metric the version lacks or cannot compute
        return None


def _perf(perf: Any, prefix: str = "") -> dict:
    """A ``PerfMetrics``' figures: durations (ms), token counts, and from its raw metrics the model's inferences and
    the tokens each produced (prompt lookup: 1 + the accepted ones)."""
    found: dict[str, Any] = {}
    for name, key in (("get_generate_duration", "generate_ms"), ("get_ttft", "ttft_ms"), ("get_tpot", "tpot_ms"),
                      ("get_num_generated_tokens", "generated_tokens"), ("get_num_input_tokens", "input_tokens"),
                      ("get_inference_duration", "inference_ms")):
        value = _number(_call(perf, name))
        if value is not None:
            found[prefix + key] = value
    raw = getattr(perf, "raw_metrics", None)
    try:
        found[prefix + "infer_calls"] = len(raw.token_infer_durations)
        found[prefix + "tokens_per_call"] = [int(b) for b in raw.m_batch_sizes]
    except (AttributeError, TypeError):
        pass
    return found


def metrics_of(result: Any) -> dict:
    """What OpenVINO GenAI reports of one call: its perf metrics (:func:`_perf`) and, for the draft-model modes, the
    extended metrics (accepted tokens; the main and draft models' own figures, prefixed ``main_`` and ``draft_``)."""
    perf = getattr(result, "perf_metrics", None)
    found = _perf(perf) if perf is not None else {}
    extended = getattr(result, "extended_perf_metrics", None)
    if extended is not None:
        value = _number(_call(extended, "get_num_accepted_tokens"))
        if value is not None:
            found["accepted_tokens"] = value
        for part in ("main", "draft"):
            sub = getattr(extended, f"{part}_model_metrics", None)
            if sub is not None:
                found.update(_perf(sub, f"{part}_"))
    return found


def new_token_ids(result: Any, prompt_ids: list[int] | None) -> list[int]:
    """The generated ids of the first sequence of an ``EncodedResults`` (the prompt dropped if it was echoed)."""
    tokens = [int(t) for t in list(result.tokens[0])]
    if prompt_ids and tokens[: len(prompt_ids)] == list(prompt_ids) and len(tokens) > len(prompt_ids):
        tokens = tokens[len(prompt_ids):]
    return tokens


def handle(request: dict, pipelines: dict[str, Any], genai: Any, make_inputs: Callable[[list[int]], Any],
           decode: Callable[[list[int]], str] | None = None, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Answer one request (see the module docstring); raises on a bad request (:func:`serve` turns it into
    ``{"ok": false}``)."""
    op = request.get("op", "generate")
    if op == "quit":
        return {"ok": True}
    if op == "ping":
        return {"ok": True, "modes": list(pipelines)}
    if op != "generate":
        raise ValueError(f"unknown op {op!r}: generate, ping or quit")
    mode = request.get("mode")
    if mode not in pipelines:
        raise ValueError(f"mode {mode!r} is not loaded; loaded: {', '.join(pipelines) or 'none'}")
    config = generation_config(genai, request, pipelines[mode])
    prompt_ids = request.get("input_ids")
    if prompt_ids is not None:
        inputs = make_inputs([int(t) for t in prompt_ids])
    elif isinstance(request.get("prompt"), str):
        inputs = request["prompt"]
    else:
        raise ValueError("a generate request needs input_ids (a list of token ids) or prompt (a text)")
    pipe = pipelines[mode]
    start = clock()
    result = pipe.generate(inputs, config) if prompt_ids is not None else pipe.generate([inputs], config)
    seconds = clock() - start
    reply: dict[str, Any] = {"ok": True, "mode": mode, "seconds": seconds, "metrics": metrics_of(result)}
    if prompt_ids is not None:
        ids = new_token_ids(result, prompt_ids)
        reply["output_ids"] = ids
        reply["text"] = decode(ids) if decode is not None else None
    else:
        texts = getattr(result, "texts", None)
        reply["text"] = texts[0] if texts else str(result)
    if "id" in request:
        reply["id"] = request["id"]
    return reply


def serve(lines: Iterable[str], out: IO[str], pipelines: dict[str, Any], genai: Any,
          make_inputs: Callable[[list[int]], Any], decode: Callable[[list[int]], str] | None = None,
          ready: dict | None = None) -> int:
    """Answer JSON requests, one per line of ``lines``, with one JSON line each on ``out``, until ``quit`` or the end
    of ``lines``; returns how many requests were answered."""

    def send(payload: dict) -> None:
        out.write(json.dumps(payload) + "\n")
        out.flush()

    send({"ready": True, "modes": list(pipelines), **(ready or {})})
    answered = 0
    for line in lines:
        if not line.strip():
            continue
        request = None
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            reply = handle(request, pipelines, genai, make_inputs, decode)
        except Exception as err:  # noqa: BLE001 - every failure is answered, the worker goes on
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            if isinstance(request, dict) and "id" in request:
                reply["id"] = request["id"]
        send(reply)
        answered += 1
        if reply.get("ok") and isinstance(request, dict) and request.get("op") == "quit":
            break
    return answered


def versions() -> dict[str, str]:
    """The versions of what this venv runs (each ``None`` when it is not installed)."""
    from importlib import metadata

    found = {}
    for name in ("openvino", "openvino-genai", "openvino-tokenizers", "optimum-intel", "optimum", "transformers",
                 "torch"):
        try:
            found[name.replace("-", "_")] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name.replace("-", "_")] = None
    return found


# -- OpenVINO ---------------------------------------------------------------------------------------
def device_properties(threads: int, precision: str) -> dict[str, Any]:
    """The CPU plugin's properties of every pipeline: threads, precision (``f32``; ``default`` leaves the plugin's
    own), and prefix caching off (through the scheduler config, set in :func:`load_pipelines`)."""
    props: dict[str, Any] = {"INFERENCE_NUM_THREADS": int(threads)}
    if precision != "default":
        props["INFERENCE_PRECISION_HINT"] = precision
    return props


def load_pipelines(genai: Any, model: str, modes: list[str], *, draft: str | None = None,
                   eagle3: str | None = None, threads: int = 1, precision: str = "f32",
                   cache_size_gb: float | None = None) -> dict[str, Any]:
    """One ``LLMPipeline`` per mode, on the CPU (see :func:`device_properties`)."""
    props = device_properties(threads, precision)

    def scheduler() -> Any:
        config = genai.SchedulerConfig()
        config.enable_prefix_caching = False
        if cache_size_gb:
            config.cache_size = cache_size_gb
        return config

    pipelines = {}
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: {', '.join(MODES)}")
        extra: dict[str, Any] = {"scheduler_config": scheduler()}
        if mode == "prompt_lookup":
            extra["prompt_lookup"] = True
        elif mode in SPECULATIVE:
            folder = draft if mode == "draft_model" else eagle3
            if not folder:
                raise ValueError(f"mode {mode} needs --{'draft' if mode == 'draft_model' else 'eagle3'} FOLDER")
            extra["draft_model"] = genai.draft_model(folder, "CPU", **props)
        pipelines[mode] = genai.LLMPipeline(model, "CPU", **extra, **props)
    return pipelines


def _protocol_stdout() -> IO[str]:
    """A stream onto the real stdout for the protocol; file descriptor 1 then goes to stderr, so that what the
    libraries print cannot break a reply line."""
    sys.stdout.flush()
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", encoding="utf-8", buffering=1)


def cmd_serve(args: argparse.Namespace) -> int:
    out = _protocol_stdout()
    import numpy as np
    import openvino
    import openvino_genai as genai

    modes = [m for m in args.modes.split(",") if m]
    pipelines = load_pipelines(genai, args.model, modes, draft=args.draft, eagle3=args.eagle3, threads=args.threads,
                               precision=args.precision, cache_size_gb=args.cache_size_gb)

    def make_inputs(ids: list[int]) -> Any:
        tensor = openvino.Tensor(np.asarray([ids], dtype=np.int64))
        mask = openvino.Tensor(np.ones((1, len(ids)), dtype=np.int64))
        return genai.TokenizedInputs(tensor, mask)

    tokenizer = next(iter(pipelines.values())).get_tokenizer() if pipelines else None

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids) if tokenizer is not None else ""

    ready = {"versions": versions(), "threads": args.threads, "precision": args.precision, "model": args.model}
    serve(sys.stdin, out, pipelines, genai, make_inputs, decode, ready)
    return 0


def export_command(python: str, model: str, out: str, weight_format: str = "fp32") -> list[str]:
    """optimum-intel's export of ``model`` (a Hugging Face folder) to an OpenVINO IR folder ``out``."""
    cli = Path(python).parent / "optimum-cli"
    head = [str(cli)] if cli.exists() else [python, "-m", "optimum.commands.optimum_cli"]
    return [*head, "export", "openvino", "--model", model, "--task", "text-generation-with-past",
            "--weight-format", weight_format, out]


def cmd_export(args: argparse.Namespace) -> int:
    """Export into a temporary folder beside ``--out``, then move it into place (a killed export leaves no folder
    that looks complete)."""
    final = Path(args.out)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    command = export_command(sys.executable, args.model, str(tmp), args.weight_format)
    print("exporting:", " ".join(command), file=sys.stderr, flush=True)
    done = subprocess.run(command, stdout=sys.stderr, check=False)
    missing = [name for name in EXPORTED if not (tmp / name).is_file()]
    if done.returncode != 0 or missing:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"export failed (exit code {done.returncode}; missing: {', '.join(missing) or 'nothing'}; the "
              "tokenizer's IR needs openvino-tokenizers)", file=sys.stderr)
        return done.returncode or 1
    info = {"source": str(args.model), "weight_format": args.weight_format, "versions": versions(),
            "source_marker": args.source_marker, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (tmp / "peers-export.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    export = sub.add_parser("export", help="Export a Hugging Face folder to an fp32 OpenVINO IR (optimum-intel).")
    export.add_argument("--model", required=True, help="The Hugging Face folder (a registry folder).")
    export.add_argument("--out", required=True)
    export.add_argument("--weight-format", default="fp32")
    export.add_argument("--source-marker", default=None, help="Stored with the export (what it was made from).")
    export.set_defaults(run=cmd_export)
    srv = sub.add_parser("serve", help="Load the pipelines and answer JSON-lines requests on stdin.")
    srv.add_argument("--model", required=True, help="The target's OpenVINO IR folder.")
    srv.add_argument("--modes", default="plain,prompt_lookup", help=f"Comma-separated: {', '.join(MODES)}.")
    srv.add_argument("--draft", default=None, help="The draft model's IR folder (mode draft_model).")
    srv.add_argument("--eagle3", default=None, help="The EAGLE-3 drafter's IR folder (mode eagle3).")
    srv.add_argument("--threads", type=int, default=1)
    srv.add_argument("--precision", default="f32", help="INFERENCE_PRECISION_HINT (f32, bf16; default: the plugin's).")
    srv.add_argument("--cache-size-gb", type=float, default=None, help="The scheduler's KV cache size.")
    srv.set_defaults(run=cmd_serve)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
