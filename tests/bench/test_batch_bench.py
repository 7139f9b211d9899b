"""``hf-speculative bench --batch-size`` (hf_speculative/bench/batch.py) on a tiny chat model."""

import json

import pytest
from typer.testing import CliRunner

from hf_speculative.bench.batch import format_summary, run_batch_bench, summarize
from hf_speculative.bench.spec_bench import load_prompts
from hf_speculative.cli.main import app
from spec_bench_rows import write_dataset

ROWS = [
    (1, "summarization", "the cat sat on the mat and the cat sat on the mat and the cat"),
    (2, "rag", "code def x return value x def y return value y def x"),
    (3, "qa", "the dog ran to the house"),
]


@pytest.fixture
def three_prompts(tmp_path):
    return write_dataset(tmp_path / "question.jsonl", ROWS)


def test_batch_bench_records_every_batch_size(tmp_path, three_prompts, chat_model, chat_tokenizer):
    from hf_speculative.core.costs import verify_costs_for

    # the row drafters' own length rule: cheap verification (else, on a loaded machine, it may draft nothing)
    verify_costs_for(chat_model, 32).fix([1.0 + 0.01 * k for k in range(33)])
    out = tmp_path / "res" / "batch.jsonl"
    records = run_batch_bench(chat_model, chat_tokenizer, ["prompt-lookup"], load_prompts(three_prompts),
                              batch_sizes=[1, 2], out=out, model_name="tiny", max_new_tokens=30, progress=False)
    assert [json.loads(line) for line in out.read_text().splitlines()] == records
    # B = 1: three prompts, greedy and the method; B = 2: two batches (2 rows, 1 row), also the method +always
    assert [(r["batch_size"], r["rows"], r["method"]) for r in records] == [
        (1, 1, "greedy"), (1, 1, "prompt-lookup")] * 3 + [
        (2, 2, "greedy"), (2, 2, "prompt-lookup"), (2, 2, "prompt-lookup+always"),
        (2, 1, "greedy"), (2, 1, "prompt-lookup"), (2, 1, "prompt-lookup+always")]
    assert all(r["identical_to_greedy"] for r in records)
    assert all(r["new_tokens"] > 0 and r["tokens_per_s"] > 0 for r in records)
    always = [r for r in records if r["method"] == "prompt-lookup+always"]
    assert any(r["drafted"] > 0 for r in always)
    rows = summarize(records)
    assert {(r["batch_size"], r["method"]) for r in rows} == {
        (1, "greedy"), (1, "prompt-lookup"), (2, "greedy"), (2, "prompt-lookup"), (2, "prompt-lookup+always")}
    assert all(r["speedup"] == 1.0 for r in rows if r["method"] == "greedy")
    assert "| 2 | prompt-lookup+always |" in format_summary(rows)


def test_batch_bench_refuses_bad_input(tmp_path, three_prompts, chat_model, chat_tokenizer):
    prompts = load_prompts(three_prompts)
    with pytest.raises(ValueError, match=r"batch sizes must be >= 1"):
        run_batch_bench(chat_model, chat_tokenizer, ["prompt-lookup"], prompts, batch_sizes=[0], out=tmp_path / "x")
    with pytest.raises(ValueError, match=r"hf_speculative's methods only.*drop hf-prompt-lookup"):
        run_batch_bench(chat_model, chat_tokenizer, ["hf-prompt-lookup"], prompts, batch_sizes=[2], out=tmp_path / "x")


def test_bench_batch_size_on_the_command_line(tmp_path, three_prompts, chat_checkpoint):
    out = tmp_path / "out" / "batch.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, [str(a) for a in (
        "bench", "--model", chat_checkpoint, "--methods", "prompt-lookup", "--dataset", three_prompts,
        "--categories", "summarization,rag,qa", "--batch-size", "2", "--max-new-tokens", "8", "--out", out,
        "--no-progress")],
        env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["batch_size"] for r in records} == {2} and all(r["identical_to_greedy"] for r in records)
    assert "| 2 | greedy |" in result.stdout and out.with_suffix(".md").is_file()
    bad = runner.invoke(app, ["bench", "--model", str(chat_checkpoint), "--dataset", str(three_prompts),
                              "--batch-size", "two", "--out", str(out)])
    assert bad.exit_code != 0 and "give whole numbers" in bad.output
