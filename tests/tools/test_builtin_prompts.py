"""The team's built-in prompt list (``python -m tools.prompts builtin N``): distinct, deterministic, every
kind of request, and the file it writes is what ``hf-speculative self-distill --prompts FILE`` reads."""

from __future__ import annotations

import json

import pytest

from hf_speculative.training.cli import _prompt_rows
from tools.prompts import builtin
from tools.prompts.__main__ import main

KINDS = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities", "translation",
         "summarization", "qa", "math_reasoning", "rag"}


@pytest.fixture
def no_man_pages(monkeypatch):
    """The list without the machine's German manual pages (they vary between machines, and are slow to read)."""
    monkeypatch.setattr(builtin, "_german_paragraphs", lambda limit=600: [])


def test_prompts_are_distinct_deterministic_and_cover_every_kind(no_man_pages):
    rows = builtin.build_prompts(400)
    assert [r["id"] for r in rows] == [f"p{i:05d}" for i in range(400)]
    assert len({r["prompt"] for r in rows}) == 400
    assert rows == builtin.build_prompts(400)
    assert rows != builtin.build_prompts(400, seed=1)
    assert builtin.build_prompts(50) == rows[:50]  # a longer list starts with the shorter one
    assert {r["category"] for r in rows} == KINDS
    for row in rows:
        if row["category"] == "translation":  # no manual pages: the team's German sentences
            assert any(sentence in row["prompt"] for sentence in builtin.GERMAN_FALLBACK)
        if row["category"] in ("summarization", "rag"):  # contexts are Python's own documentation
            assert len(row["prompt"]) > 400


def test_documentation_paragraphs_are_grouped_to_a_length():
    paragraphs = builtin.python_doc_paragraphs(min_chars=400, max_chars=2400)
    assert len(paragraphs) > 100
    assert all(400 <= len(p) <= 2400 for p in paragraphs)


@pytest.mark.skipif(not builtin.glob.glob("/usr/share/man/de/man[1-8]/*.gz"),
                    reason="no German manual pages on this machine")
def test_german_manual_pages_give_prose_paragraphs():
    paragraphs = builtin._german_paragraphs(limit=20)
    assert len(paragraphs) >= 20
    assert all(80 <= len(p) <= 600 and not p.startswith("-") for p in paragraphs)


def test_command_writes_what_self_distill_reads(tmp_path, no_man_pages, capsys):
    out = tmp_path / "builtin.jsonl"
    assert main(["builtin", "3-9", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == builtin.build_prompts(9)[3:] and rows[0]["id"] == "p00003"
    assert "6 prompts in" in capsys.readouterr().err
    assert _prompt_rows(str(out)) == rows  # ids kept: self-distill answers them as --prompts builtin:3-9 did
    with pytest.raises(SystemExit):
        main(["builtin", "3", "--passages", str(out), "--out", str(tmp_path / "x.jsonl")])
    assert "--passages only feeds the context list; builtin builds its own texts" in capsys.readouterr().err
