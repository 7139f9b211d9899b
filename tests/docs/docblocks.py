"""The fenced code blocks of the docs site (docs/*.md) and of README.md, and the rules that decide
which of them the tests execute.

Every block is one of:

- a ``python`` block: executed; the python blocks of a page run in order in one namespace, so a
  block may use what an earlier block of the same page defined;
- a shell block (``bash``/``sh``/``shell``/``console``) whose every command is ``hf-speculative ...``
  or ``python -m hf_speculative ...`` (also spelt ``.venv/bin/hf-speculative`` / ``.venv/bin/python -m
  hf_speculative``, as after ``make demo``): each command is run (typer's CliRunner), in page order;
- anything else (``pip install``, ``accelerate launch`` on many GPUs, a file's contents, ...): it
  must say why it is not run, with an HTML comment on the line before its fence::

      <!-- not-run: needs 8 GPUs -->

A block that is run only where something is available says so the same way; it is skipped
(with the reason) elsewhere::

      <!-- needs: qwen2.5-coder-1.5b-instruct, transformers>=4.57 -->

Requirements: a registry model name (cached locally: the tests never download one; models other
than the default one only with ``HF_SPECULATIVE_DOCS_ALL_MODELS=1``),
``transformers>=X.Y``, ``eagle-drafter:NAME`` (a drafter shipped for NAME), ``spec-bench`` (the
Spec-Bench questions the package carries), ``gpu``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SPEC_BENCH = ROOT / "hf_speculative" / "bench" / "data" / "spec_bench" / "question.jsonl"

# Examples on registry models other than the default (GBs of weights, minutes on a CPU) run only when
# this is 1 and the model is cached; `make test` fetches only the default model.
ALL_MODELS = "HF_SPECULATIVE_DOCS_ALL_MODELS"

PYTHON = {"python", "py"}
# the command line as the docs spell it: installed, or in the .venv that `make demo` / `make test` build
CONSOLE_SCRIPTS = {"hf-speculative", ".venv/bin/hf-speculative"}
PYTHONS = {"python", ".venv/bin/python"}
SHELL = {"bash", "sh", "shell", "console", "zsh"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not-run|needs)\s*:(?P<value>.*?)-->\s*$")


@dataclasses.dataclass
class Block:
    page: str  # path relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None = None  # "not-run" / "needs" / None
    value: str = ""  # the reason (not-run) or the requirements (needs)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def requirements(self) -> list[str]:
        return [r.strip() for r in self.value.split(",") if r.strip()] if self.marker == "needs" else []

    @property
    def commands(self) -> list[list[str]]:
        """Shell blocks: each command as argv (continuation lines joined, comments dropped)."""
        joined = re.sub(r"\\\n", " ", self.code)
        out = []
        for line in joined.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            if line and not line.startswith("#"):
                out.append(shlex.split(line, comments=True))
        return [argv for argv in out if argv]

    @property
    def cli_args(self) -> list[list[str]] | None:
        """The hf-speculative arguments of every command, or None if some command is something else."""
        out = []
        for argv in self.commands:
            if argv[0] in CONSOLE_SCRIPTS:
                out.append(argv[1:])
            elif argv[0] in PYTHONS and argv[1:3] == ["-m", "hf_speculative"]:
                out.append(argv[3:])
            else:
                return None
        return out

    @property
    def executable(self) -> bool:
        """Whether the rules let the tests run this block (a not-run marker aside)."""
        if self.lang in PYTHON:
            return True
        return self.lang in SHELL and bool(self.commands) and self.cli_args is not None


def pages() -> list[Path]:
    """The markdown files whose blocks are checked: every page of the site, and the README."""
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


def parse(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    rel = str(path.relative_to(ROOT))
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, indent = match["fence"], match["indent"]
        lang = (match["info"].split() or [""])[0].strip("{}.").lower()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        block = Block(rel, i + 1, lang, "\n".join(body) + "\n")
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = _MARKER.match(lines[k]) if k >= 0 else None
        if marker:
            block.marker, block.value = marker["kind"], marker["value"].strip()
        blocks.append(block)
        i = j + 1
    return blocks


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in parse(page)]


def unmet(requirement: str) -> str | None:
    """Why ``requirement`` is not met here, or None when it is."""
    if requirement.startswith("transformers>="):
        import transformers
        from packaging.version import Version

        need = requirement.split(">=", 1)[1]
        if Version(transformers.__version__) < Version(need):
            return f"needs transformers >= {need} (installed {transformers.__version__})"
        return None
    if requirement.startswith("eagle-drafter:"):
        name = requirement.split(":", 1)[1]
        try:
            from hf_speculative.drafters.eagle import checkpoints  # noqa: F401
            from hf_speculative.drafters.eagle.drafter import pretrained_names
        except ImportError as err:
            return f"the EAGLE drafter cannot load checkpoints yet ({err})"
        if name not in pretrained_names():
            return f"no EAGLE drafter ships for {name} yet (shipped: {pretrained_names()})"
        return None
    if requirement == "spec-bench":
        return None if SPEC_BENCH.is_file() else f"no Spec-Bench questions at {SPEC_BENCH}"
    if requirement == "gpu":
        import torch

        return None if torch.cuda.is_available() else "needs a CUDA GPU"
    from hf_speculative.registry import models

    if requirement in models.REGISTRY:
        if not models.is_cached(requirement):
            return f"{requirement} is not in the local cache (`hf-speculative models fetch {requirement}`)"
        if requirement != models.DEFAULT_MODEL and os.environ.get(ALL_MODELS) != "1":
            return f"examples on models other than the default run with {ALL_MODELS}=1"
        return None
    raise ValueError(f"unknown requirement {requirement!r} in a <!-- needs: --> marker")
