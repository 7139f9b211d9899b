"""The long-context prompt list (``python -m tools.prompts context N --passages FILE``): passages read and filtered,
documents and RAG contexts built from them, deterministic, and self-distilled end to end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hf_speculative.cli.main import app
from tools.prompts.__main__ import build_rows, main
from tools.prompts.context import build_context_prompts, read_passages

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
PROSE = ("The old lighthouse stood on the cliff for two hundred years, guiding ships past the rocks. "
         "Every night its keeper climbed ninety steps to light the lamp, and every morning he wrote the weather "
         "in a book.")


def _passages_file(tmp_path, rows):
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _answers(n=12):
    return [{"id": f"a{i}", "category": "writing", "prompt": f"Write a story number {i} about a lighthouse.",
             "response": f"Story {i}. {PROSE} Chapter {i} ends with the keeper's {i}th log entry."} for i in range(n)]


def test_read_passages_keeps_prose_and_questions(tmp_path):
    rows = _answers(3) + [
        {"id": "m", "category": "math", "prompt": "What is 2+2?", "response": PROSE},  # not a document
        {"id": "loop", "category": "writing", "prompt": "Loop", "response": "the data base " * 60},  # degenerate
        {"id": "short", "category": "writing", "prompt": "Short", "response": "Too short."},
        {"text": "A plain document. " + PROSE},
    ]
    got = read_passages(_passages_file(tmp_path, rows))
    assert [p["question"] for p in got] == [r["prompt"] for r in rows[:3]] + [None]
    assert got[0]["text"] == rows[0]["response"]


def test_read_passages_decodes_token_rows_and_rejects_unknown_rows(tmp_path):
    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            assert skip_special_tokens
            return " ".join(PROSE.split()[i] for i in ids)

    path = _passages_file(tmp_path, [{"id": "t", "prompt": "Q?", "response_tokens": list(range(len(PROSE.split())))}])
    assert read_passages(path, tokenizer=Tok()) == [{"text": PROSE, "question": "Q?"}]
    with pytest.raises(ValueError, match="need the target's tokenizer"):
        read_passages(path)
    with pytest.raises(ValueError, match="expected 'text', 'response' or 'response_tokens'"):
        read_passages(_passages_file(tmp_path, [{"id": "x", "prompt": "?"}]))


def test_context_prompts_are_built_from_the_passages(tmp_path):
    passages = read_passages(_passages_file(tmp_path, _answers()))
    rows = build_context_prompts(200, passages, seed=3)
    assert rows == build_context_prompts(200, passages, seed=3)  # deterministic
    assert rows != build_context_prompts(200, passages, seed=4)
    assert [r["id"] for r in rows[:3]] == ["c00000", "c00001", "c00002"]
    assert len({r["prompt"] for r in rows}) == len(rows) == 200
    kinds = {r["category"] for r in rows}
    assert kinds == {"summarization", "rag", "extraction", "qa"}
    texts = {p["text"] for p in passages}
    summaries = [r["prompt"] for r in rows if r["category"] == "summarization"]
    with_passages = sum(any(t[:100] in s for t in texts) for s in summaries)
    assert 0.6 * len(summaries) < with_passages < len(summaries)  # passages 3 to 1 over Python's documentation
    for row in rows:
        if row["category"] == "rag":  # the answered question comes last, its passage somewhere in the context
            question = row["prompt"].rsplit("\n", 1)[1]
            source = next(p for p in passages if p["question"] == question)
            assert source["text"] in row["prompt"]
        elif row["category"] == "summarization":
            assert 1200 <= len(row["prompt"]) <= 3600 + 80
        elif row["category"] == "qa":
            assert len(row["prompt"]) < 80 and row["prompt"].endswith(("?", "."))


def test_context_prompt_ranges_and_errors(tmp_path, capsys):
    path = _passages_file(tmp_path, _answers())
    every = build_context_prompts(12, read_passages(path))
    assert build_rows("context", 0, 12, passages=[path]) == every
    assert build_rows("context", 5, 12, passages=[path]) == every[5:]
    assert build_rows("context", 0, 12, passages=[path], seed=1) != every
    for bad in ("7-7", "x", "9-2"):
        with pytest.raises(SystemExit):
            main(["context", bad, "--passages", str(path), "--out", str(tmp_path / "p.jsonl")])
        assert "use N (the first N prompts) or A-B" in capsys.readouterr().err
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"id": "x"}) + "\n")
    with pytest.raises(ValueError, match="--passages .*broken.jsonl: .*expected 'text'"):
        build_rows("context", 0, 3, passages=[broken])
    with pytest.raises(SystemExit):
        main(["context", "3", "--passages", str(broken), "--out", str(tmp_path / "p.jsonl")])
    assert "expected 'text', 'response' or 'response_tokens'" in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()


def test_self_distill_context_prompts_end_to_end(tmp_path, chat_checkpoint):
    """Answers carry their decoded text (``response``), so one self-distillation's output is the next
    one's passages (through the file ``python -m tools.prompts context`` writes); token rows of older files
    are decoded with the target's tokenizer (``--target``)."""
    first = tmp_path / "first.jsonl"
    prompts = _passages_file(tmp_path, [{"id": f"q{i}", "category": "writing", "prompt": f"the cat sat {i}"}
                                        for i in range(4)])
    args = ["self-distill", "--target", str(chat_checkpoint), "--max-new-tokens", "40", "--threads", "1"]
    result = CliRunner().invoke(app, [*args, "--prompts", str(prompts), "--out", str(first)], env=ENV)
    assert result.exit_code == 0, result.output
    answers = [json.loads(line) for line in first.read_text().splitlines()]
    assert all(r["response"] and r["response"] in r["text"] for r in answers)
    legacy = tmp_path / "legacy.jsonl"  # rows written before answers carried their text
    legacy.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "response"}) + "\n" for r in answers))
    from_tokens = build_rows("context", 0, 6, passages=[legacy], target=str(chat_checkpoint))
    assert from_tokens == build_rows("context", 0, 6, passages=[first])
    assert {r["category"] for r in from_tokens} - {"qa"}  # the answers were long enough to be passages
    with pytest.raises(ValueError, match="need the target's tokenizer to be decoded \\(give --target MODEL\\)"):
        build_rows("context", 0, 6, passages=[legacy])

    prompts, second = tmp_path / "ctx_prompts.jsonl", tmp_path / "second.jsonl"
    assert main(["context", "6", "--passages", str(legacy), "--target", str(chat_checkpoint), "--out",
                 str(prompts)]) == 0
    assert [json.loads(line) for line in prompts.read_text().splitlines()] == from_tokens
    result = CliRunner().invoke(app, [*args, "--prompts", str(prompts), "--out", str(second),
                                      "--max-prompt-tokens", "4000"], env=ENV)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in second.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [f"c{i:05d}" for i in range(6)]
    assert all(r["response_tokens"] for r in rows)
