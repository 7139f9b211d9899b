"""A corpus's held-out prompts as a Spec-Bench question file, so that the benchmarks measure drafters on prompts of
the training mix they never saw (``benchmarks/tree_tau.py --dataset``, ``hf-speculative bench --dataset``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .files import SPLITS, prompts_path, read_rows


def questions(out: Path, split: str = "held_out", per_category: int | None = None) -> list[dict]:
    """The prompts of ``split`` as Spec-Bench rows (``question_id`` their order, ``category`` the source's,
    ``turns`` the prompt; ``corpus_id`` and ``source`` kept), the first ``per_category`` of each category."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: use one of {', '.join(SPLITS)}")
    path = prompts_path(out, split)
    if not path.is_file():
        raise ValueError(f"{path}: no prompt list (build the corpus first: python -m tools.corpus build ...)")
    taken: Counter[str] = Counter()
    rows = []
    for row in read_rows(path):
        category = row.get("category") or row["source"]
        if per_category is not None and taken[category] >= per_category:
            continue
        taken[category] += 1
        rows.append({"question_id": len(rows), "category": category, "turns": [row["prompt"]],
                     "corpus_id": row["id"], "source": row["source"]})
    return rows


def write_questions(out: Path, to: Path, split: str = "held_out", per_category: int | None = None) -> dict[str, int]:
    """:func:`questions` written to ``to`` (JSONL); returns the count per category, in first-seen order."""
    rows = questions(out, split, per_category)
    to.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return dict(Counter(row["category"] for row in rows))
