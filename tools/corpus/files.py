"""The corpus folder's files: where each lives, and reading and writing them so that a run killed at any moment
leaves files the next run can resume from.

``DIR/`` holds::

    MANIFEST.json            the command, settings, target, counts (rewritten whole after every step)
    README.md                the mix in words (generated from the manifest)
    prompts/train.jsonl      {"id", "seat", "source", "category", "prompt"}, in the list's order ("seat")
    prompts/held_out.jsonl   the same, for the held-out prompts
    answers/train.jsonl      hf-speculative self-distill's rows (prompt_tokens, response_tokens, ...) for them
    answers/held_out.jsonl
    raw/magpie.jsonl         the target's own messages, as sampled (before the corpus's filters)
    .lock                    held by the build writing the folder (one at a time)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from hf_speculative.registry.integrity import write_text_atomic  # the corpus modules import it from here

SPLITS = ("train", "held_out")
LOCK = ".lock"
MANIFEST = "MANIFEST.json"
README = "README.md"


def prompts_path(out: Path, split: str) -> Path:
    return Path(out) / "prompts" / f"{split}.jsonl"


def answers_path(out: Path, split: str) -> Path:
    return Path(out) / "answers" / f"{split}.jsonl"


def magpie_path(out: Path) -> Path:
    return Path(out) / "raw" / "magpie.jsonl"


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSONL file (none when it does not exist), without a last line still being written (every
    writer here ends a row with its newline)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip() and line.endswith("\n")]


def repair_tail(path: Path) -> bool:
    """Cut a last line that a killed writer left unfinished (no newline at its end), so that the appending writers
    (self-distill, sample-prompts) resume after the last whole row. Returns whether anything was cut."""
    path = Path(path)
    if not path.exists():
        return False
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return False
        f.truncate(data.rfind(b"\n") + 1)
    return True


def write_rows_atomic(path: Path, rows: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def read_prompts(out: Path) -> list[dict]:
    """Every prompt of the corpus, both splits, in the list's order.

    Raises:
        ValueError: the files' seats are not 0, 1, 2, ... (files edited by hand, or from another corpus).
    """
    rows = sorted((row for split in SPLITS for row in read_rows(prompts_path(out, split))), key=lambda r: r["seat"])
    if [row["seat"] for row in rows] != list(range(len(rows))):
        raise ValueError(f"{Path(out) / 'prompts'}: the prompts' seats are not 0..{len(rows) - 1}; the files were "
                         "changed by hand or come from different corpora: build into a new --out")
    return rows


@contextlib.contextmanager
def sole_writer(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock for the block, or refuse at once when another build holds it (two writers would
    interleave their rows)."""
    import fcntl

    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / LOCK, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"another `python -m tools.corpus build` is writing {out}: let it finish or stop it (see "
                             f"its progress with python -m tools.corpus status --out {out})") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
