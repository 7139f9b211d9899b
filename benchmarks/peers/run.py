"""hf_speculative beside the CPU peers: OpenVINO GenAI and llama.cpp on the same prompts, interleaved (issue 48).

    .venv/bin/python benchmarks/peers/run.py --repeats 3 --out benchmarks/results/peers --write-docs

Engines (``--engines``):

- ``hfs-default``: hf_speculative with its defaults (PyTorch fp32, the registry's weights);
- ``hfs-kernel``: the same with ``hfs.optimize_for_cpu(model)`` on every linear layer and transformers'
  grouped-query SDPA (``hf-speculative bench --cpu-layout all+kernel --sdpa-gqa``);
- ``openvino``: OpenVINO GenAI on the target's fp32 IR, exported once by optimum-intel into the cache
  (``~/.cache/hf_speculative/peers/openvino``), run by ``openvino_worker.py`` in the OpenVINO venv (``make
  install-openvino``), a process of its own that answers one request at a time;
- ``llamacpp``: a built llama.cpp tree (``--llama-cpp DIR``) on a GGUF file (``--gguf``); skipped with a note
  without them.

Methods (``--methods``) are hf_speculative's names; each engine runs those it has: ``prompt-lookup`` (OpenVINO's
``prompt_lookup``, llama.cpp's ``llama-lookup``), ``draft-model`` (with ``--draft-model``: OpenVINO's
``draft_model``, llama.cpp's ``llama-speculative-simple`` with ``--draft-gguf``), ``eagle`` (OpenVINO's EAGLE-3
pipeline with ``--openvino-eagle3 DIR``); the others (``eagle+lookup``, ``hf-prompt-lookup``...) run on our engines
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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "openvino_worker.py"
DOCS = ROOT / "docs" / "benchmark.md"
BEGIN, END = "<!-- peers:begin -->", "<!-- peers:end -->"
ENGINES = ("hfs-default", "hfs-kernel", "openvino", "llamacpp")
CATEGORIES = ("writing", "summarization", "qa", "math_reasoning", "rag", "translation")
"""Spec-Bench's categories in the order of the table: MT-bench's writing (question ids 81, 82), then the five
Spec-Bench ones."""
DEFAULT_METHODS = ("prompt-lookup", "eagle", "eagle+lookup", "hf-prompt-lookup")
BASELINE = "greedy"
KERNEL_LAYOUT = "all+kernel"
OPENVINO_MODES = {BASELINE: "plain", "prompt-lookup": "prompt_lookup", "draft-model": "draft_model",
                  "eagle": "eagle3"}
"""hf_speculative's method names -> the OpenVINO worker's modes."""
LLAMA_TOOLS = {BASELINE: ("llama-completion", "llama-cli"), "prompt-lookup": ("llama-lookup",),
               "draft-model": ("llama-speculative-simple",)}
"""hf_speculative's method names -> the llama.cpp programs that run them (the first one found)."""


# -- one timed generation ---------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    """One generation of one engine: its output (token ids, or text where the engine gives no ids), its new
    tokens, its wall time, and the speculation figures it reports (``None`` where unknown). ``source`` is the
    :class:`hf_speculative.tooling.methods.MethodRun` of our engines (their rows are ``hf-speculative bench``'s)."""

    method: str
    output: list[int] | str
    new_tokens: int
    seconds: float
    target_forwards: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    extra: dict | None = None
    source: Any = None

    @property
    def tau(self) -> float | None:
        return self.new_tokens / self.target_forwards if self.target_forwards else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted and self.accepted is not None else None


class Engine:
    """What the driver asks of an engine: ``name``, ``label`` and ``weights`` (for the table), ``methods`` (greedy
    first), ``notes`` (what it skipped and why), ``start()``, ``run(index, method, max_new_tokens)``,
    ``method_label(method)``, ``versions()`` and ``close()``."""

    name = ""
    label = ""
    weights = ""

    def __init__(self) -> None:
        self.methods: list[str] = [BASELINE]
        self.notes: list[str] = []
        self.base: dict = {}

    def start(self) -> None:
        pass

    def run(self, index: int, method: str, max_new_tokens: int) -> Run:
        raise NotImplementedError

    def method_label(self, method: str) -> str:
        return method

    def versions(self) -> dict:
        return {}

    def close(self) -> None:
        pass


# -- interleaving -------------------------------------------------------------------------------------
def interleave(engines: list[Engine], prompts: int, repeats: int) -> Iterator[tuple[int, int, Engine, str]]:
    """The order of the timed runs: for each prompt, ``repeats`` rounds of every engine's greedy and methods in turn
    (``(prompt index, round, engine, method)``)."""
    for index in range(prompts):
        for round_ in range(repeats):
            for engine in engines:
                for method in engine.methods:
                    yield index, round_, engine, method


def median_run(runs: list[Run]) -> tuple[Run, float]:
    """The first run (its output and figures) and the median time of ``runs``."""
    return runs[0], statistics.median(r.seconds for r in runs)


def record(engine: Engine, runs: list[Run], prompt: Any, greedy: Run, input_tokens: int) -> dict:
    """The JSON row of ``runs`` (one engine, one prompt, one method): ``hf-speculative bench``'s row (its own
    ``_record`` for our engines), plus ``engine``, the engine's name for the method, and every repeat's time."""
    from hf_speculative.bench.runner import _record

    first, seconds = median_run(runs)
    if first.source is not None and isinstance(greedy.output, list):
        row = _record(first.source, seconds, prompt, greedy.output, engine.base)
    else:
        row = {
            **engine.base,
            "method": first.method,
            "category": prompt.category,
            "question_id": prompt.question_id,
            "new_tokens": first.new_tokens,
            "seconds": seconds,
            "tokens_per_s": first.new_tokens / seconds if seconds > 0 else 0.0,
            "tau": first.tau,
            "acceptance_rate": first.acceptance_rate,
            "target_forwards": first.target_forwards,
            "drafted": first.drafted,
            "accepted": first.accepted,
            "identical_to_greedy": first.output == greedy.output,
            **({"extra": first.extra} if first.extra else {}),
        }
    row["engine"] = engine.name
    row["engine_method"] = engine.method_label(first.method)
    row["input_tokens"] = input_tokens
    if len(runs) > 1:
        row["seconds_all"] = [r.seconds for r in runs]
    return row


def run_all(engines: list[Engine], prompts: list[Any], input_tokens: list[int], *, max_new_tokens: int,
            repeats: int, warmup_tokens: int = 16, on_row: Callable[[dict], None] | None = None,
            progress: Callable[[str], None] | None = None) -> list[dict]:
    """Warm every engine and method up on the first prompt (``warmup_tokens``, untimed), then run
    :func:`interleave`'s order and return the rows (``on_row`` gets each as soon as its prompt is done)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for engine in engines:
        for method in engine.methods:
            engine.run(0, method, min(max_new_tokens, warmup_tokens))
    rows: list[dict] = []
    runs: dict[tuple[str, str], list[Run]] = {}
    total = len(prompts) * repeats * sum(len(e.methods) for e in engines)
    for done, (index, round_, engine, method) in enumerate(interleave(engines, len(prompts), repeats), 1):
        runs.setdefault((engine.name, method), []).append(engine.run(index, method, max_new_tokens))
        if progress is not None:
            progress(f"[{done}/{total}] prompt {index + 1}/{len(prompts)} round {round_ + 1}: {engine.name} {method}")
        if round_ == repeats - 1 and engine is engines[-1] and method == engine.methods[-1]:
            for e in engines:
                greedy = runs[(e.name, BASELINE)][0]
                for m in e.methods:
                    row = record(e, runs[(e.name, m)], prompts[index], greedy, input_tokens[index])
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
            runs.clear()
    return rows


# -- our engines -----------------------------------------------------------------------------------
@contextmanager
def sdpa_gqa(enabled: bool) -> Iterator[None]:
    """``TRANSFORMERS_SDPA_FORCE_GQA=1`` while ``enabled`` (``--sdpa-gqa``; transformers reads it per call), unset
    otherwise, as before afterwards."""
    key = "TRANSFORMERS_SDPA_FORCE_GQA"
    before = os.environ.get(key)
    if enabled:
        os.environ[key] = "1"
    else:
        os.environ.pop(key, None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


class HfsEngine(Engine):
    """hf_speculative in this process: defaults, or the kernel layout with grouped-query SDPA."""

    def __init__(self, name: str, model_name: str, methods: list[str], options: dict, encoded: list[Any],
                 *, kernel: bool, threads: int, meta: dict):
        super().__init__()
        self.name, self.kernel, self.model_name, self.encoded = name, kernel, model_name, encoded
        self.wanted, self.options, self.threads, self.meta = methods, dict(options), threads, meta
        self.weights = "fp32 (registry)"
        self.model = self.tokenizer = None

    @property
    def label(self) -> str:  # type: ignore[override]
        version = self.meta.get("hf_speculative", "")
        if self.kernel:
            return (f"hf_speculative {version} with `hfs.optimize_for_cpu(model)` + GQA SDPA "
                    "(`--cpu-layout all+kernel --sdpa-gqa`)")
        return f"hf_speculative {version} defaults (PyTorch fp32)"

    def start(self) -> None:
        import torch

        from hf_speculative.bench.runner import environment
        from hf_speculative.cpu.layout import apply_layout
        from hf_speculative.registry.models import load_model
        from hf_speculative.tooling.methods import get_method, problem_on

        torch.set_num_threads(self.threads)
        self.model, self.tokenizer = load_model(self.model_name)
        self.model.eval()
        if self.kernel:
            apply_layout(self.model, KERNEL_LAYOUT)
        for name in self.wanted:
            spec = get_method(name)
            if spec.needs_draft_model and not self.options.get("draft_model"):
                self.notes.append(f"{name}: needs --draft-model")
                continue
            problem = problem_on(spec, self.model, self.tokenizer, self.options)
            if problem:
                self.notes.append(f"{name}: {problem}")
                continue
            self.methods.append(name)
        with sdpa_gqa(self.kernel):
            self.base = {"run_id": self.meta["run_id"], "model": self.model_name, "engine": self.name,
                         "max_new_tokens": self.meta["max_new_tokens"], "repeats": self.meta["repeats"],
                         **environment(self.model, self.threads)}

    def run(self, index: int, method: str, max_new_tokens: int) -> Run:
        from hf_speculative.tooling.methods import run_method

        with sdpa_gqa(self.kernel):
            done = run_method(method, self.model, self.tokenizer, self.encoded[index], options=self.options,
                              max_new_tokens=max_new_tokens)
        return Run(method, done.output_ids, done.new_tokens, done.seconds, done.target_forwards, done.drafted,
                   done.accepted, done.extra, source=done)

    def method_label(self, method: str) -> str:
        from hf_speculative.tooling.methods import get_method

        if method == BASELINE:
            return BASELINE
        label = get_method(method).label.replace(" (hfs)", "")
        first = label.split()[0]
        if first[1:].islower() and first != "Medusa":  # "Prompt lookup" -> "prompt lookup"; names stay
            label = label[0].lower() + label[1:]
        if label.endswith(" (transformers)"):
            label = "transformers' " + label[: -len(" (transformers)")]
        return label

    def versions(self) -> dict:
        import torch
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__,
                "hf_speculative": self.meta.get("hf_speculative")}

    def close(self) -> None:
        self.model = None


# -- OpenVINO GenAI ------------------------------------------------------------------------------------
def openvino_python(venv: str | os.PathLike) -> Path:
    venv = Path(venv)
    return (venv if venv.is_absolute() else ROOT / venv) / "bin" / "python"


def openvino_problem(python: Path) -> str | None:
    """Why the OpenVINO venv cannot serve (``None``: it can)."""
    if not python.exists():
        return f"no {python} (make install-openvino)"
    done = subprocess.run([str(python), "-c", "import openvino_genai, optimum.intel"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"{python} cannot import openvino_genai and optimum.intel: {done.stderr.strip().splitlines()[-1:]}"
    return None


def registry_folder(name: str) -> Path:
    from hf_speculative.registry.models import resolve

    return Path(resolve(name))


def source_marker(folder: Path) -> str | None:
    """What an export was made from: the registry entry's weights hash (``None`` for a folder without a marker)."""
    marker = folder / "hf_speculative.json"
    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("safetensors_sha256")
    except (OSError, ValueError):
        return None


def exported(name: str, python: Path, *, progress: Callable[[str], None] = print) -> Path:
    """The fp32 OpenVINO IR of registry model ``name``, exported once into the cache (again when the registry's
    weights changed)."""
    from hf_speculative.registry.models import cache_dir

    folder = registry_folder(name)
    out = cache_dir() / "peers" / "openvino" / f"{name}-fp32"
    marker = source_marker(folder)
    info = out / "peers-export.json"
    if info.is_file():
        try:
            known = json.loads(info.read_text(encoding="utf-8")).get("source_marker")
        except ValueError:
            known = "?"
        if known == marker:
            return out
    progress(f"exporting {name} to an fp32 OpenVINO IR in {out} (optimum-intel, once)...")
    command = [str(python), str(WORKER), "export", "--model", str(folder), "--out", str(out)]
    if marker:
        command += ["--source-marker", marker]
    if subprocess.run(command, check=False).returncode != 0:
        raise RuntimeError(f"exporting {name} to OpenVINO failed: {shlex.join(command)}")
    return out


class OpenVinoEngine(Engine):
    """OpenVINO GenAI, in ``openvino_worker.py serve`` under the OpenVINO venv's Python."""

    name = "openvino"
    weights = "fp32 IR (optimum-intel)"

    def __init__(self, model_name: str, methods: list[str], encoded: list[list[int]], *, python: Path,
                 draft_model: str | None, eagle3: str | None, threads: int, num_assistant_tokens: int,
                 max_ngram_size: int, log: Path, meta: dict, precision: str = "f32"):
        super().__init__()
        self.model_name, self.wanted, self.encoded, self.python = model_name, methods, encoded, python
        self.draft_model, self.eagle3, self.threads, self.log, self.meta = draft_model, eagle3, threads, log, meta
        self.num_assistant_tokens, self.max_ngram_size, self.precision = num_assistant_tokens, max_ngram_size, precision
        self.process: subprocess.Popen | None = None
        self.ready: dict = {}

    @property
    def label(self) -> str:  # type: ignore[override]
        v = self.ready.get("versions", {})
        return (f"OpenVINO GenAI {v.get('openvino_genai', '?')} (optimum-intel {v.get('optimum_intel', '?')} export, "
                f"fp32 IR, `INFERENCE_PRECISION_HINT={self.precision}`)")

    def plan(self) -> list[str]:
        """The worker's modes for the wanted methods (greedy first); the rest go to ``notes``."""
        modes = ["plain"]
        for name in self.wanted:
            mode = OPENVINO_MODES.get(name)
            if mode is None:
                self.notes.append(f"{name}: no counterpart")
            elif mode == "draft_model" and not self.draft_model:
                self.notes.append(f"{name}: needs --draft-model")
            elif mode == "eagle3" and not self.eagle3:
                self.notes.append(f"{name}: OpenVINO's EAGLE-3 pipeline needs --openvino-eagle3 DIR "
                                  "(hf-speculative export-eagle --format openvino)")
            else:
                self.methods.append(name)
                modes.append(mode)
        return modes

    def command(self, model_ir: Path, draft_ir: Path | None) -> list[str]:
        command = [str(self.python), str(WORKER), "serve", "--model", str(model_ir), "--modes", ",".join(self.plan()),
                   "--threads", str(self.threads), "--precision", self.precision]
        if draft_ir is not None:
            command += ["--draft", str(draft_ir)]
        if self.eagle3:
            command += ["--eagle3", str(self.eagle3)]
        return command

    def start(self) -> None:
        model_ir = exported(self.model_name, self.python)
        draft_ir = exported(self.draft_model, self.python) if self.draft_model and "draft-model" in self.wanted \
            else None
        command = self.command(model_ir, draft_ir)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads)}
        with open(self.log, "w", encoding="utf-8") as err:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                            text=True, bufsize=1, env=env)
        self.ready = self._read()
        if not self.ready.get("ready"):
            raise RuntimeError(f"the OpenVINO worker did not start: {self.ready} (see {self.log})")
        self.base = {"run_id": self.meta["run_id"], "model": self.model_name, "engine": self.name,
                     "max_new_tokens": self.meta["max_new_tokens"], "repeats": self.meta["repeats"],
                     "threads": self.threads, "device": "cpu", "cpu": self.meta.get("cpu"),
                     "precision": self.precision, "ir": str(model_ir), **self.ready.get("versions", {})}

    def _read(self) -> dict:
        assert self.process is not None and self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            tail = self.log.read_text(encoding="utf-8", errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"the OpenVINO worker ended (exit code {self.process.poll()}); its log {self.log} "
                               f"ends:\n{tail}")
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        reply = self._read()
        if not reply.get("ok"):
            raise RuntimeError(f"the OpenVINO worker failed on {request.get('mode')}: {reply.get('error')}")
        return reply

    def request(self, index: int, method: str, max_new_tokens: int) -> dict:
        return {"op": "generate", "mode": OPENVINO_MODES[method], "input_ids": self.encoded[index],
                "max_new_tokens": max_new_tokens, "num_assistant_tokens": self.num_assistant_tokens,
                "max_ngram_size": self.max_ngram_size}

    def run(self, index: int, method: str, max_new_tokens: int) -> Run:
        return run_of_reply(method, self.ask(self.request(index, method, max_new_tokens)))

    def method_label(self, method: str) -> str:
        if method == "prompt-lookup":
            return f"prompt lookup (num_assistant_tokens={self.num_assistant_tokens}, " \
                   f"max_ngram_size={self.max_ngram_size})"
        if method == "draft-model":
            return f"draft model {self.draft_model} (num_assistant_tokens={self.num_assistant_tokens})"
        if method == "eagle":
            return f"EAGLE-3 (num_assistant_tokens={self.num_assistant_tokens})"
        return method

    def versions(self) -> dict:
        return dict(self.ready.get("versions", {}))

    def close(self) -> None:
        if self.process is None:
            return
        try:
            if self.process.poll() is None:
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.process.stdin.flush()
                self.process.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            self.process.kill()
            self.process.wait()
        self.process = None


def run_of_reply(method: str, reply: dict) -> Run:
    """A :class:`Run` from the worker's reply: ids, time, and the counts OpenVINO GenAI reports (the main model's
    inferences, hence τ; accepted tokens where it counts them)."""
    ids = [int(t) for t in reply["output_ids"]]
    metrics = reply.get("metrics") or {}
    forwards = metrics.get("main_infer_calls") or metrics.get("infer_calls") or None
    accepted = metrics.get("accepted_tokens") if method != BASELINE else None
    return Run(method, ids, len(ids), float(reply["seconds"]), target_forwards=forwards, accepted=accepted,
               extra={"openvino": metrics} if metrics else None)


# -- llama.cpp -------------------------------------------------------------------------------------
def find_tool(folder: Path, names: Iterable[str]) -> Path | None:
    """The first of ``names`` in ``folder``, ``folder/bin`` or ``folder/build/bin``."""
    for name in names:
        for sub in ("", "bin", "build/bin"):
            path = folder / sub / name
            if path.is_file() and os.access(path, os.X_OK):
                return path
    return None


_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


def parse_llama(log: str) -> dict:
    """The figures llama.cpp prints: its context's prompt-eval and eval times (ms, runs), and the speculative
    programs' encoded/decoded tokens and seconds, drafted and accepted counts."""
    found: dict[str, float] = {}
    patterns = {
        "prompt_ms": rf"prompt eval time\s*=\s*{_NUMBER} ms",
        "eval_ms": rf"\s(?<!prompt )eval time\s*=\s*{_NUMBER} ms",
        "eval_runs": rf"\s(?<!prompt )eval time\s*=\s*{_NUMBER} ms\s*/\s*([0-9]+) runs",
        "encoded_s": rf"encoded\s+[0-9]+ tokens in\s+{_NUMBER} seconds",
        "decoded_tokens": r"decoded\s+([0-9]+) tokens in",
        "decoded_s": rf"decoded\s+[0-9]+ tokens in\s+{_NUMBER} seconds",
        "n_drafted": r"n_drafted\s*=\s*([0-9]+)",
        "n_accept": r"n_accept\s*=\s*([0-9]+)",
        "n_predict": r"n_predict\s*=\s*([0-9]+)",
    }
    for key, pattern in patterns.items():
        match = re.search(pattern, log)
        if match:
            found[key] = float(match.group(match.lastindex or 1))
    return found


def llama_text(stdout: str, prompt: str) -> str:
    """The generated text of a llama.cpp program's stdout: the echoed prompt and the end marker dropped."""
    text = stdout
    if prompt and text.lstrip().startswith(prompt.strip()):
        text = text.lstrip()[len(prompt.strip()):]
    return text.replace("[end of text]", "").strip()


class LlamaCppEngine(Engine):
    """llama.cpp's programs, one process per generation, one thread: the completion program for greedy,
    ``llama-lookup`` (prompt lookup), ``llama-speculative-simple`` (a draft model). Times are what the program
    prints (prompt processing and decoding, not the model's load); the new tokens are its count (greedy: the eval
    runs plus the token sampled from the prompt); outputs are compared as text."""

    name = "llamacpp"

    def __init__(self, folder: Path, gguf: Path, methods: list[str], texts: list[str], *, draft_gguf: Path | None,
                 threads: int, draft_max: int, meta: dict, workdir: Path):
        super().__init__()
        self.folder, self.gguf, self.wanted, self.texts, self.draft_gguf = folder, gguf, methods, texts, draft_gguf
        self.threads, self.draft_max, self.meta, self.workdir = threads, draft_max, meta, workdir
        self.weights = f"GGUF ({gguf.name})"
        self.tools: dict[str, Path] = {}
        self.version = ""

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"llama.cpp {self.version or ''} ({', '.join(p.name for p in self.tools.values())})".replace("  ", " ")

    def start(self) -> None:
        greedy = find_tool(self.folder, LLAMA_TOOLS[BASELINE])
        if greedy is None:
            raise RuntimeError(f"no {' or '.join(LLAMA_TOOLS[BASELINE])} in {self.folder} (bin/, build/bin/)")
        self.tools[BASELINE] = greedy
        for name in self.wanted:
            tools = LLAMA_TOOLS.get(name)
            tool = find_tool(self.folder, tools) if tools else None
            if tools is None:
                self.notes.append(f"{name}: no counterpart")
            elif tool is None:
                self.notes.append(f"{name}: no {' or '.join(tools)} in {self.folder}")
            elif name == "draft-model" and self.draft_gguf is None:
                self.notes.append(f"{name}: needs --draft-gguf")
            else:
                self.tools[name] = tool
                self.methods.append(name)
        done = subprocess.run([str(greedy), "--version"], capture_output=True, text=True, check=False)
        self.version = next((line.split(":", 1)[1].strip() for line in (done.stdout + done.stderr).splitlines()
                             if line.startswith("version")), "")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(self.texts):
            (self.workdir / f"prompt-{i}.txt").write_text(text, encoding="utf-8")
        self.base = {"run_id": self.meta["run_id"], "model": self.meta["model"], "engine": self.name,
                     "max_new_tokens": self.meta["max_new_tokens"], "repeats": self.meta["repeats"],
                     "threads": self.threads, "device": "cpu", "cpu": self.meta.get("cpu"), "gguf": str(self.gguf),
                     "llama_cpp": self.version}

    def command(self, index: int, method: str, max_new_tokens: int) -> list[str]:
        tool = self.tools[method]
        command = [str(tool), "-m", str(self.gguf), "-f", str(self.workdir / f"prompt-{index}.txt"),
                   "-n", str(max_new_tokens), "--temp", "0", "-t", str(self.threads), "-tb", str(self.threads),
                   "-s", "1"]
        if method == BASELINE and tool.name == "llama-cli":
            command.append("-no-cnv")
        if method != BASELINE:
            command += ["--draft-max", str(self.draft_max)]
        if method == "draft-model":
            command += ["-md", str(self.draft_gguf), "-tbd", str(self.threads), "-td", str(self.threads)]
        return command

    def run(self, index: int, method: str, max_new_tokens: int) -> Run:
        command = self.command(index, method, max_new_tokens)
        done = subprocess.run(command, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} failed ({done.returncode}): {done.stderr[-1500:]}")
        figures = parse_llama(done.stderr + "\n" + done.stdout)
        text = llama_text(done.stdout, self.texts[index])
        if method == BASELINE:
            if "eval_ms" not in figures:
                raise RuntimeError(f"no eval time in the output of {shlex.join(command)}")
            seconds = (figures.get("prompt_ms", 0.0) + figures["eval_ms"]) / 1000
            tokens = int(figures.get("eval_runs", 0)) + 1
            return Run(method, text, tokens, seconds, extra={"llama_cpp": figures})
        if "decoded_s" not in figures:
            raise RuntimeError(f"no 'decoded ... tokens in ... seconds' in the output of {shlex.join(command)}")
        seconds = figures.get("encoded_s", 0.0) + figures["decoded_s"]
        tokens = int(figures.get("n_predict") or figures.get("decoded_tokens") or 0)
        drafted, accepted = figures.get("n_drafted"), figures.get("n_accept")
        return Run(method, text, tokens, seconds, drafted=None if drafted is None else int(drafted),
                   accepted=None if accepted is None else int(accepted), extra={"llama_cpp": figures})

    def method_label(self, method: str) -> str:
        tool = self.tools.get(method)
        name = tool.name if tool is not None else method
        return name if method == BASELINE else f"{name} --draft-max {self.draft_max}"

    def versions(self) -> dict:
        return {"llama_cpp": self.version}


# -- tables and the docs section -------------------------------------------------------------------
def _fmt(value: float | None, pattern: str) -> str:
    return "–" if value is None else pattern.format(value)


def engine_summaries(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """``engine -> method -> hf_speculative.bench.report.summarize``'s row over every prompt."""
    from hf_speculative.bench.report import summarize

    by_engine: dict[str, list[dict]] = {}
    for row in rows:
        by_engine.setdefault(row["engine"], []).append(row)
    return {engine: {s["method"]: s for s in summarize(rs)} for engine, rs in by_engine.items()}


def _labels(rows: list[dict]) -> dict[tuple[str, str], str]:
    return {(r["engine"], r["method"]): r.get("engine_method") or r["method"] for r in rows}


def compact_table(rows: list[dict], engines: list[dict]) -> str:
    """One line per engine: plain and prompt-lookup tokens/s, prompt lookup's speedup over the engine's plain
    decoding, the other methods' speedups (τ), and how many outputs equalled the engine's plain ones."""
    summaries, labels = engine_summaries(rows), _labels(rows)
    lines = ["| engine | weights | plain tok/s | prompt lookup tok/s | vs plain | other methods: vs plain (τ) | "
             "identical |", "|---|---|---|---|---|---|---|"]
    for engine in engines:
        methods = summaries.get(engine["name"])
        if not methods:
            continue
        greedy, lookup = methods.get(BASELINE), methods.get("prompt-lookup")
        others = []
        for method, s in methods.items():
            if method in (BASELINE, "prompt-lookup"):
                continue
            tau = f" (τ {s['tau']:.2f})" if s["tau"] is not None else ""
            others.append(f"{labels[(engine['name'], method)]} {_fmt(s['speedup'], '{:.2f}×')}{tau}")
        spec = [s for m, s in methods.items() if m != BASELINE]
        identical = f"{sum(s['identical'] for s in spec)}/{sum(s['prompts'] for s in spec)}" if spec else "–"
        lookup_cell = _fmt(lookup["speedup"], "{:.2f}×") if lookup else "–"
        if lookup and lookup["tau"] is not None:
            lookup_cell += f" (τ {lookup['tau']:.2f})"
        lines.append("| " + " | ".join([
            engine["label"], engine["weights"], _fmt(greedy and greedy["tokens_per_s"], "{:.1f}"),
            _fmt(lookup and lookup["tokens_per_s"], "{:.1f}"), lookup_cell, "; ".join(others) or "–", identical,
        ]) + " |")
    return "\n".join(lines)


def full_table(rows: list[dict], engines: list[dict]) -> str:
    """Every engine and method: tokens/s, speedup over the engine's plain decoding (aggregate and median over
    prompts), τ, acceptance, identical outputs."""
    from hf_speculative.core.stats import format_acceptance

    summaries, labels = engine_summaries(rows), _labels(rows)
    lines = ["| engine | method | prompts | tokens/s | vs plain | median vs plain | τ | acceptance | identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for engine in engines:
        for method, s in summaries.get(engine["name"], {}).items():
            lines.append("| " + " | ".join([
                engine["name"], labels[(engine["name"], method)], str(s["prompts"]),
                _fmt(s["tokens_per_s"], "{:.2f}"), _fmt(s["speedup"], "{:.2f}×"),
                _fmt(s["median_speedup"], "{:.2f}×"), _fmt(s["tau"], "{:.2f}"),
                format_acceptance(s["acceptance_rate"], s.get("drafted")), f"{s['identical']}/{s['prompts']}",
            ]) + " |")
    return "\n".join(lines)


def versions_line(versions: dict) -> str:
    """The versions, in words: ours, then OpenVINO's venv, then llama.cpp (what was not run is left out)."""
    names = [("torch", "torch"), ("transformers", "transformers"), ("hf_speculative", "hf_speculative")]
    ours = ", ".join(f"{label} {versions[key]}" for key, label in names if versions.get(key))
    parts = [ours] if ours else []
    ov = versions.get("openvino_venv") or {}
    if ov:
        names = [("openvino", "OpenVINO"), ("openvino_genai", "OpenVINO GenAI"),
                 ("openvino_tokenizers", "openvino-tokenizers"), ("optimum_intel", "optimum-intel")]
        part = ", ".join(f"{label} {ov[key]}" for key, label in names if ov.get(key))
        if ov.get("transformers"):
            part += f" (its venv: transformers {ov['transformers']}, torch {ov.get('torch')})"
        parts.append(part)
    if versions.get("llama_cpp"):
        parts.append(f"llama.cpp {versions['llama_cpp']}")
    return "; ".join(parts)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def markdown(rows: list[dict], meta: dict) -> str:
    """The section: what ran, on what machine, with which versions and command, then the two tables and the notes."""
    engines = meta["engines"]
    prompts = meta["prompts"]
    load = meta["load"]
    parts = [
        f"Measured {meta['date']} with `{meta['command']}`.",
        f"**Machine:** {meta['cpu']}, {meta['cores']} cores; load average (1, 5, 15 min) "
        f"{' '.join(f'{x:.2f}' for x in load['start'])} at the start, "
        f"{' '.join(f'{x:.2f}' for x in load['end'])} at the end.",
        f"**Versions:** {versions_line(meta['versions'])}.",
        f"**Run:** {meta['model']}, {_count(len(prompts), 'Spec-Bench first turn')} (question ids "
        f"{', '.join(str(p) for p in prompts)}), each engine's input the same token ids (the model's chat template), "
        f"greedy, {meta['max_new_tokens']} new tokens, {_count(meta['threads'], 'thread')} everywhere; every "
        f"engine's plain decoding and methods interleaved prompt by prompt after a warm-up, "
        f"{_count(meta['repeats'], 'round')}, the median time kept; speedups and identical outputs against the same "
        "engine's plain decoding (speedup: total tokens/s over the plain decoding's; median: over prompts).",
        compact_table(rows, engines),
        full_table(rows, engines),
    ]
    notes = list(meta.get("skipped", []))
    for engine in engines:
        plain = [n.split(":", 1)[0] for n in engine.get("notes", []) if n.endswith(": no counterpart")]
        other = [n for n in engine.get("notes", []) if not n.endswith(": no counterpart")]
        notes += [f"{engine['name']} {note}" for note in other]
        if plain:
            notes.append(f"{engine['name']} has no counterpart of {', '.join(plain)}")
    if notes:
        parts.append("Not run: " + "; ".join(notes) + ".")
    return "\n\n".join(parts) + "\n"


def replace_section(text: str, body: str) -> str:
    """``text`` with what lies between :data:`BEGIN` and :data:`END` replaced by ``body``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN} ... {END} section")
    return text[: start + len(BEGIN)] + "\n" + body.strip("\n") + "\n" + text[end:]


def write_docs(path: Path, body: str) -> None:
    path.write_text(replace_section(path.read_text(encoding="utf-8"), body), encoding="utf-8")


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
    parser.add_argument("--openvino-venv", default=".venv-ov", help="The OpenVINO venv (make install-openvino).")
    parser.add_argument("--openvino-eagle3", default=None, help="An EAGLE-3 drafter's OpenVINO IR folder (eagle).")
    parser.add_argument("--num-assistant-tokens", type=int, default=5, help="OpenVINO's draft length.")
    parser.add_argument("--max-ngram-size", type=int, default=3, help="OpenVINO's prompt-lookup n-gram.")
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
                                     threads=args.threads, meta=meta))
        elif name == "openvino":
            python = openvino_python(args.openvino_venv)
            problem = openvino_problem(python)
            if problem:
                skipped.append(f"openvino: {problem}")
                continue
            engines.append(OpenVinoEngine(
                args.model, methods, [ids[0].tolist() for ids in encoded], python=python, draft_model=args.draft_model,
                eagle3=args.openvino_eagle3, threads=args.threads, num_assistant_tokens=args.num_assistant_tokens,
                max_ngram_size=args.max_ngram_size, log=out / f"{args.model}.openvino.log", meta=meta))
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
