"""Writes small Spec-Bench-shaped question files for the bench tests."""

import json
from pathlib import Path


def write_dataset(path: Path, rows: list[tuple[int, str, str]]) -> Path:
    """A ``question.jsonl`` of ``(question_id, category, first turn)`` rows, each with a second turn."""
    lines = [json.dumps({"question_id": q, "category": c, "turns": [t, "second turn"]}) for q, c, t in rows]
    path.write_text("\n".join(lines) + "\n")
    return path
