"""The llama.cpp engine of the peers benchmark: a built llama.cpp tree's programs on a GGUF file, one process per
generation, their printed times and counts parsed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Iterable

from engines import BASELINE, Engine, Run

LLAMA_TOOLS = {BASELINE: ("llama-completion", "llama-cli"), "prompt-lookup": ("llama-lookup",),
               "draft-model": ("llama-speculative-simple",)}
"""hf_speculative's method names -> the llama.cpp programs that run them (the first one found)."""


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
