"""The OpenVINO GenAI engine of the peers benchmark: the target's fp32 IR, exported once by optimum-intel into the
cache, run by ``openvino_worker.py serve`` in the OpenVINO venv (``make install-openvino``), a process of its own
that answers one JSON-lines request at a time."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Callable

from engines import BASELINE, Run, WorkerEngine

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "openvino_worker.py"
OPENVINO_MODES = {BASELINE: "plain", "prompt-lookup": "prompt_lookup", "draft-model": "draft_model",
                  "eagle": "eagle3"}
"""hf_speculative's method names -> the OpenVINO worker's modes."""


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


class OpenVinoEngine(WorkerEngine):
    """OpenVINO GenAI, in ``openvino_worker.py serve`` under the OpenVINO venv's Python."""

    name = "openvino"
    worker = "OpenVINO"
    weights = "fp32 IR (optimum-intel)"

    def __init__(self, model_name: str, methods: list[str], encoded: list[list[int]], *, python: Path,
                 draft_model: str | None, eagle3: str | None, threads: int, num_assistant_tokens: int,
                 max_ngram_size: int, log: Path, meta: dict, precision: str = "f32"):
        super().__init__()
        self.model_name, self.wanted, self.encoded, self.python = model_name, methods, encoded, python
        self.draft_model, self.eagle3, self.threads, self.log, self.meta = draft_model, eagle3, threads, log, meta
        self.num_assistant_tokens, self.max_ngram_size, self.precision = num_assistant_tokens, max_ngram_size, precision

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
        self.spawn(command, {**os.environ, "OMP_NUM_THREADS": str(self.threads)})
        self.base = {"run_id": self.meta["run_id"], "model": self.model_name, "engine": self.name,
                     "max_new_tokens": self.meta["max_new_tokens"], "repeats": self.meta["repeats"],
                     "threads": self.threads, "device": "cpu", "cpu": self.meta.get("cpu"),
                     "precision": self.precision, "ir": str(model_ir), **self.ready.get("versions", {})}

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



def run_of_reply(method: str, reply: dict) -> Run:
    """A :class:`Run` from the worker's reply: ids, time, and the counts OpenVINO GenAI reports (the main model's
    inferences, hence τ; accepted tokens where it counts them)."""
    ids = [int(t) for t in reply["output_ids"]]
    metrics = reply.get("metrics") or {}
    forwards = metrics.get("main_infer_calls") or metrics.get("infer_calls") or None
    accepted = metrics.get("accepted_tokens") if method != BASELINE else None
    return Run(method, ids, len(ids), float(reply["seconds"]), target_forwards=forwards, accepted=accepted,
               extra={"openvino": metrics} if metrics else None)
