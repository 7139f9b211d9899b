"""The ``hf-speculative`` command line through typer's CliRunner, on a tiny saved checkpoint."""

import json

import pytest
from typer.testing import CliRunner

from hf_speculative import models as registry
from hf_speculative.cli import app

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args], env=ENV)


@pytest.fixture
def dataset(tmp_path):
    rows = [(1, "summarization", "the cat sat on the mat and the cat sat on the mat"), (2, "rag", "def x return x")]
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps({"question_id": q, "category": c, "turns": [t]}) + "\n" for q, c, t in rows))
    return path


def test_help_lists_commands(cli):
    result = cli("--help")
    assert result.exit_code == 0
    for command in ("models", "compare", "bench", "bench-report"):
        assert command in result.output


def test_models_list(cli, monkeypatch):
    rows = [
        {"name": "model-a", "description": "first", "params": "135M", "license": "Apache-2.0", "cached": True},
        {"name": "model-b", "description": "second", "params": 1_780_000_000, "license": "Other", "cached": False},
    ]
    monkeypatch.setattr(registry, "list_models", lambda: rows)
    result = cli("models", "list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    a = next(line for line in lines if "model-a" in line)
    b = next(line for line in lines if "model-b" in line)
    assert all(word in a for word in ("135M", "Apache-2.0", "yes", "first"))
    assert all(word in b for word in ("1780M", "Other", "no", "second"))
    assert json.loads(cli("models", "list", "--json").stdout) == rows


def test_models_list_real_registry(cli):
    result = cli("models", "list")
    assert result.exit_code == 0, result.output
    for name in registry.REGISTRY:
        assert name in result.output


def test_models_fetch_unknown_name(cli):
    result = cli("models", "fetch", "no-such-model")
    assert result.exit_code == 2
    assert "Unknown model 'no-such-model'" in result.output and "smollm2-135m-instruct" in result.output


def test_bench_report(cli, tmp_path):
    path = tmp_path / "r.jsonl"
    records = [
        {"run_id": "x", "model": "m", "method": "greedy", "category": "qa", "question_id": 1, "new_tokens": 10,
         "seconds": 2.0, "tokens_per_s": 5.0, "target_forwards": 10, "identical_to_greedy": True},
        {"run_id": "x", "model": "m", "method": "hf-prompt-lookup", "category": "qa", "question_id": 1,
         "new_tokens": 10, "seconds": 1.0, "tokens_per_s": 10.0, "target_forwards": 4, "identical_to_greedy": True},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = cli("bench-report", path, "--reference", "greedy")
    assert result.exit_code == 0, result.output
    assert "| hf-prompt-lookup | 1 | 10.00 | 2.00× | 2.00× | 2.50 | – | 1/1 | 2.00× |" in result.output
    assert (tmp_path / "r.md").read_text().strip() == result.output.strip()


def test_bench_report_errors(cli, tmp_path):
    result = cli("bench-report", tmp_path / "missing.jsonl")
    assert result.exit_code == 2 and "no such file" in result.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    result = cli("bench-report", bad)
    assert result.exit_code == 2 and "not a benchmark jsonl" in result.output


def test_unknown_method_lists_known_ones(cli):
    for args in (("compare", "--method", "nope"), ("bench", "--methods", "prompt-lookup,nope")):
        result = cli(*args)
        assert result.exit_code == 2
        assert "unknown method 'nope'; known methods: greedy, prompt-lookup, draft-model" in result.output


def test_missing_draft_model_and_bad_reference(cli, dataset):
    result = cli("compare", "--method", "draft-model")
    assert result.exit_code == 2 and "draft-model need --draft-model" in result.output
    result = cli("bench", "--methods", "prompt-lookup", "--reference", "hf-assisted", "--dataset", dataset)
    assert result.exit_code == 2 and "--reference hf-assisted must be greedy or one of" in result.output


def test_bench_bad_inputs(cli, dataset, tmp_path):
    result = cli("bench", "--dataset", dataset, "--categories", "poetry")
    assert result.exit_code == 2 and "known categories: summarization, rag" in result.output
    result = cli("bench", "--dataset", tmp_path / "none.jsonl")
    assert result.exit_code == 2 and "dataset not found" in result.output


def test_unknown_model_lists_registry(cli, dataset):
    result = cli("compare", "--model", "./no/such/folder", "--method", "hf-prompt-lookup")
    assert result.exit_code == 2
    assert "cannot load model './no/such/folder'" in result.output and "smollm2-135m-instruct" in result.output


def test_compare_json(cli, chat_checkpoint):
    result = cli(
        "compare", "--model", chat_checkpoint, "--method", "prompt-lookup", "--method", "hf-prompt-lookup",
        "--prompt", "the cat sat on the mat and the cat sat on the mat", "--max-new-tokens", "10", "--json",
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert [r["method"] for r in payload["results"]] == ["greedy", "prompt-lookup", "hf-prompt-lookup"]
    for res in payload["results"]:
        assert res["identical_to_greedy"] is True and res["new_tokens"] == 10 and res["tau"] >= 1.0
        assert isinstance(res["text"], str) and res["speedup"] > 0
    assert payload["environment"]["threads"] == 1


def test_compare_and_bench_with_cpu_layout(cli, chat_checkpoint, dataset, tmp_path):
    for layout in ("all+packed", "all+kernel"):
        result = cli("compare", "--model", chat_checkpoint, "--method", "prompt-lookup", "--max-new-tokens", "8",
                     "--cpu-layout", layout, "--json")
        assert result.exit_code == 0, result.output
        payload = json.loads(result.stdout)
        assert payload["environment"]["cpu_layout"] == layout
        assert all(r["identical_to_greedy"] for r in payload["results"])
    out = tmp_path / "bench.jsonl"
    result = cli("bench", "--model", chat_checkpoint, "--methods", "prompt-lookup", "--dataset", dataset,
                 "--categories", "rag", "--per-category", "1", "--max-new-tokens", "6", "--out", out,
                 "--cpu-layout", "output", "--no-progress")
    assert result.exit_code == 0, result.output
    assert {json.loads(line)["cpu_layout"] for line in out.read_text().splitlines()} == {"output"}
    assert "weights column-major (output" in result.stdout
    for bad in ("mlp", "all+fast"):
        result = cli("compare", "--model", chat_checkpoint, "--cpu-layout", bad)
        assert result.exit_code == 2
        assert (f"--cpu-layout {bad}: use none, output, all, output+packed, all+packed, output+kernel or all+kernel"
                in result.output)


def test_compare_table(cli, chat_checkpoint):
    result = cli("compare", "--model", chat_checkpoint, "--method", "hf-prompt-lookup", "--max-new-tokens", "6")
    assert result.exit_code == 0, result.output
    assert "greedy" in result.output and "hf-prompt-lookup" in result.output and "yes" in result.output


def test_bench_end_to_end(cli, chat_checkpoint, dataset, tmp_path):
    out = tmp_path / "out" / "bench.jsonl"
    result = cli(
        "bench", "--model", chat_checkpoint, "--methods", "prompt-lookup,hf-prompt-lookup", "--dataset", dataset,
        "--categories", "summarization,rag", "--per-category", "1", "--max-new-tokens", "8", "--out", out,
        "--reference", "hf-prompt-lookup", "--no-progress",
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 6 and all(r["identical_to_greedy"] for r in records)
    assert "| vs hf-prompt-lookup |" in result.stdout and "| 2/2 |" in result.stdout
    assert out.with_suffix(".md").is_file()
