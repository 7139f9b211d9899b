"""Spec-Bench's questions: the reader, and the copy shipped in the package (the default dataset)."""

import hashlib
import subprocess
import sys

import pytest

from hf_speculative.bench.spec_bench import (
    DATASET,
    MT_BENCH,
    MT_BENCH_CATEGORIES,
    SPEC_BENCH_CATEGORIES,
    default_dataset_path,
    load_prompts,
)
from spec_bench_rows import write_dataset

# Spec-Bench's data/spec_bench/question.jsonl (hemingkx/Spec-Bench), as copied into the package
SPEC_BENCH_SHA256 = "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"


def test_load_prompts_categories_and_per_category(tmp_path):
    rows = [(i, c, f"{c} {i}") for i, c in enumerate(MT_BENCH_CATEGORIES * 2)]
    rows += [(100 + i, "qa", f"qa {i}") for i in range(3)]
    path = write_dataset(tmp_path / "q.jsonl", rows)
    everything = load_prompts(path)
    expected = sorted(MT_BENCH_CATEGORIES * 2, key=MT_BENCH_CATEGORIES.index) + ["qa"] * 3
    assert [p.category for p in everything] == expected
    qa = load_prompts(path, ["qa"], per_category=2)
    assert [(p.question_id, p.text) for p in qa] == [(100, "qa 0"), (101, "qa 1")]
    # mt-bench: one category, taken round-robin over the 8 MT-bench categories.
    mt = load_prompts(path, [MT_BENCH, "qa"], per_category=3)
    assert [p.category for p in mt] == [MT_BENCH] * 3 + ["qa"] * 3
    assert [p.text for p in mt[:3]] == ["writing 0", "roleplay 1", "reasoning 2"]
    assert len(load_prompts(path, [MT_BENCH])) == 16


def test_load_prompts_unknown_category_lists_known(tmp_path):
    path = write_dataset(tmp_path / "q.jsonl", [(1, "summarization", "a"), (2, "rag", "b")])
    with pytest.raises(ValueError, match="unknown categories \\['poetry'\\]; known categories: summarization, rag"):
        load_prompts(path, ["poetry"])


def test_the_shipped_questions_are_spec_bench_unchanged_with_its_license():
    assert default_dataset_path() == DATASET and DATASET.is_file()
    assert hashlib.sha256(DATASET.read_bytes()).hexdigest() == SPEC_BENCH_SHA256
    license_text = (DATASET.parent / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0" in license_text
    notice = (DATASET.parent / "NOTICE").read_text(encoding="utf-8")
    assert "hemingkx/Spec-Bench" in notice and SPEC_BENCH_SHA256 in notice


def test_the_shipped_questions_are_the_default_and_hold_every_category():
    prompts = load_prompts(categories=SPEC_BENCH_CATEGORIES)
    counts = {c: sum(p.category == c for p in prompts) for c in dict.fromkeys(p.category for p in prompts)}
    assert counts == {MT_BENCH: 80, "translation": 80, "summarization": 80, "qa": 80, "math_reasoning": 80, "rag": 80}
    assert len({p.category for p in load_prompts(DATASET, [MT_BENCH], per_category=8)}) == 1
    assert all(isinstance(p.text, str) and p.text for p in prompts)


def test_reading_the_questions_imports_no_torch():
    """The CLI reads the categories for its --help from here: it must stay light."""
    # hf_speculative's own __init__ imports torch: load the module's file alone
    module_file = DATASET.parents[2] / "spec_bench.py"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('sb', {str(module_file)!r})\n"
        "module = sys.modules['sb'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "module.load_prompts()\n"
        "print(sorted(x for x in ('torch', 'transformers') if x in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
