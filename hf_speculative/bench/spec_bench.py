"""Spec-Bench's questions, shipped with the package, read as benchmark prompts.

``data/spec_bench/question.jsonl`` is Spec-Bench's question file (hemingkx/Spec-Bench, Apache-2.0: see
the LICENSE and NOTICE beside it): 480 questions, 80 in each of translation, summarization, qa,
math_reasoning and rag, and 10 in each of the 8 MT-bench categories. It lies inside the package so
that ``hf-speculative bench`` finds it from a clone and from an installed wheel alike. This module
imports neither torch nor transformers (the command line reads the categories for its ``--help``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterable

DATASET = Path(__file__).resolve().parent / "data" / "spec_bench" / "question.jsonl"
"""The shipped Spec-Bench ``question.jsonl``: the default of ``hf-speculative bench --dataset``."""

REPEATED = Path(__file__).resolve().parent / "data" / "repeated" / "question.jsonl"
"""A repeated-request workload in Spec-Bench's format (``--dataset``): ``doc-edit``, one notice edited five times
in a row (each request holds the current version, each answer rewrites it whole), and ``chat-quote``, a chat
whose later turns quote and repeat the earlier ones (each request holds the transcript so far). Written for
hf_speculative (issue 35) to measure drafters that reuse earlier requests and outputs (``suffix``)."""

MT_BENCH = "mt-bench"
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_CATEGORIES = (MT_BENCH, "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: the first turn of a Spec-Bench question."""

    question_id: Any
    category: str
    text: str


def default_dataset_path() -> Path:
    """The Spec-Bench ``question.jsonl`` shipped with the package (:data:`DATASET`)."""
    return DATASET


def load_prompts(
    path: str | os.PathLike = DATASET,
    categories: Iterable[str] | None = None,
    per_category: int | None = None,
) -> list[Prompt]:
    """Read a Spec-Bench ``question.jsonl`` (fields ``question_id``, ``category``, ``turns``).

    Args:
        path (defaults to :data:`DATASET`): the jsonl file.
        categories (*optional*): categories to keep, in this order; ``"mt-bench"`` stands for the 8
            MT-bench categories together, reported as one category. Default: every category of
            the file, in file order.
        per_category (`int`, *optional*): keep the first N prompts of each category. For
            ``"mt-bench"`` the N are taken round-robin over its 8 categories (first writing, first
            roleplay, ..., second writing, ...) so that a small N still covers them all.

    Returns:
        `list[Prompt]`, grouped by category.
    """
    by_category: dict[str, list[Prompt]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                prompt = Prompt(row["question_id"], row["category"], row["turns"][0])
                by_category.setdefault(prompt.category, []).append(prompt)
    if by_category and all(c in by_category for c in MT_BENCH_CATEGORIES):
        groups = [by_category[c] for c in MT_BENCH_CATEGORIES]
        mixed = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
        by_category[MT_BENCH] = [dataclasses.replace(p, category=MT_BENCH) for p in mixed]
    wanted = list(categories) if categories else [c for c in by_category if c != MT_BENCH]
    unknown = [c for c in wanted if c not in by_category]
    if unknown:
        raise ValueError(f"unknown categories {unknown}; known categories: {', '.join(by_category)}")
    prompts: list[Prompt] = []
    for category in wanted:
        group = by_category[category]
        prompts.extend(group[:per_category] if per_category else group)
    return prompts
