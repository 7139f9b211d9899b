"""The Spec-Bench runner on a tiny random model and a temporary dataset."""

import json
from pathlib import Path

import pytest

from hf_speculative.bench.report import write_report
from hf_speculative.bench.runner import (
    MT_BENCH,
    MT_BENCH_CATEGORIES,
    default_dataset_path,
    encode_prompt,
    load_prompts,
    run_bench,
)

SPEC_BENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"
def write_dataset(path: Path, rows: list[tuple[int, str, str]]) -> Path:
    lines = [json.dumps({"question_id": q, "category": c, "turns": [t, "second turn"]}) for q, c, t in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def two_prompts(tmp_path):
    return write_dataset(
        tmp_path / "question.jsonl",
        [
            (1, "summarization", "the cat sat on the mat and the cat sat on the mat and the cat"),
            (2, "rag", "code def x return value x def y return value y def x"),
        ],
    )


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


def test_load_prompts_unknown_category_lists_known(two_prompts):
    with pytest.raises(ValueError, match="unknown categories \\['poetry'\\]; known categories: summarization, rag"):
        load_prompts(two_prompts, ["poetry"])


@pytest.mark.skipif(not SPEC_BENCH.is_file(), reason="Spec-Bench data not available")
def test_real_spec_bench_file():
    assert default_dataset_path(SPEC_BENCH.parents[3] / "main") == SPEC_BENCH
    prompts = load_prompts(SPEC_BENCH, [MT_BENCH, "translation", "summarization", "qa", "math_reasoning", "rag"])
    counts = {c: sum(p.category == c for p in prompts) for c in dict.fromkeys(p.category for p in prompts)}
    assert counts == {MT_BENCH: 80, "translation": 80, "summarization": 80, "qa": 80, "math_reasoning": 80, "rag": 80}
    assert len({p.category for p in load_prompts(SPEC_BENCH, [MT_BENCH], per_category=8)}) == 1


def test_encode_prompt_with_and_without_chat_template(chat_tokenizer):
    tokenizer = chat_tokenizer
    ids = encode_prompt(tokenizer, "the cat")
    assert tokenizer.convert_ids_to_tokens(ids[0].tolist()) == ["<|user|>", "the", "cat", "<|assistant|>"]
    assert encode_prompt(tokenizer, "the cat", chat_template=False)[0].tolist() == tokenizer("the cat").input_ids
    tokenizer.chat_template = None
    assert encode_prompt(tokenizer, "the cat").shape == (1, len(tokenizer("the cat").input_ids))


def test_run_bench_writes_records_and_report(tmp_path, two_prompts, chat_model, chat_tokenizer):
    out = tmp_path / "res" / "results.jsonl"
    records = run_bench(
        chat_model,
        chat_tokenizer,
        ["hf-prompt-lookup"],
        load_prompts(two_prompts),
        out=out,
        model_name="tiny",
        max_new_tokens=12,
        progress=False,
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == records
    assert [(r["question_id"], r["method"]) for r in records] == [
        (1, "greedy"),
        (1, "hf-prompt-lookup"),
        (2, "greedy"),
        (2, "hf-prompt-lookup"),
    ]
    for r in records:
        assert r["model"] == "tiny" and r["threads"] == 1 and r["max_new_tokens"] == 12
        assert r["identical_to_greedy"] is True
        assert r["new_tokens"] == 12 and r["tokens_per_s"] == pytest.approx(12 / r["seconds"])
        assert r["target_forwards"] >= 1 and r["tau"] == pytest.approx(12 / r["target_forwards"])
        assert r["acceptance_rate"] is None and r["drafted"] is None
        for key in ("torch", "transformers", "device", "cpu", "run_id", "category", "accepted", "input_tokens"):
            assert key in r
    assert {r["category"] for r in records} == {"summarization", "rag"}
    assert records[0]["tau"] == 1.0  # greedy: one forward per token

    text, md_path = write_report(out, reference="greedy")
    assert md_path == out.with_suffix(".md") and md_path.read_text() == text
    header = "| method | prompts | tokens/s | speedup | median speedup | tau | acceptance | identical | vs greedy |"
    assert header in text
    for heading in ("### summarization", "### rag", "### overall"):
        assert heading in text
    assert "| hf-prompt-lookup | 2 |" in text and "| 2/2 |" in text


def test_run_bench_repeats_keep_the_median(tmp_path, two_prompts, chat_model, chat_tokenizer):
    out = tmp_path / "r.jsonl"
    records = run_bench(
        chat_model, chat_tokenizer, ["greedy"], load_prompts(two_prompts, ["rag"]), out=out, max_new_tokens=4,
        repeats=3, progress=False,
    )
    assert len(records) == 1 and len(records[0]["seconds_all"]) == 3
    assert records[0]["seconds"] == sorted(records[0]["seconds_all"])[1]
    with pytest.raises(ValueError, match="repeats"):
        run_bench(chat_model, chat_tokenizer, [], load_prompts(two_prompts), out=out, repeats=0)


def test_run_bench_with_hfs_prompt_lookup(tmp_path, two_prompts, chat_model, chat_tokenizer):
    records = run_bench(
        chat_model, chat_tokenizer, ["prompt-lookup", "hf-prompt-lookup"], load_prompts(two_prompts),
        out=tmp_path / "r.jsonl", max_new_tokens=16, progress=False,
    )
    hfs_records = [r for r in records if r["method"] == "prompt-lookup"]
    assert len(hfs_records) == 2 and all(r["identical_to_greedy"] for r in records)
    assert all(r["drafted"] is not None and r["tau"] >= 1.0 for r in hfs_records)
