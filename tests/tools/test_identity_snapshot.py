"""tools/refactor/identity_snapshot.py --resume: a stopped snapshot keeps its finished questions and runs the rest;
a question cut short is dropped and run again."""

from __future__ import annotations

import json

import pytest

from tools.refactor.identity_snapshot import finished_questions

pytestmark = pytest.mark.single_version


def rows(q: int, methods: list[str], seeds: list[int], last: bool = True) -> list[dict]:
    out = [{"q": q, "method": "greedy", "seed": None, "ids": [1]}]
    out += [{"q": q, "method": m, "seed": s, "ids": [1]} for m in methods for s in (None, *seeds)]
    if last:
        out += [{"q": q, "method": "greedy", "seed": s, "ids": [2]} for s in seeds]
    return out


def test_resume_keeps_finished_questions_and_cuts_the_unfinished_one(tmp_path):
    path = tmp_path / "snap.jsonl"
    finished = rows(81, ["prompt-lookup", "eagle"], [1]) + rows(82, ["prompt-lookup", "eagle"], [1])
    unfinished = rows(83, ["prompt-lookup", "eagle"], [1], last=False)
    text = "".join(json.dumps(r) + "\n" for r in finished + unfinished) + '{"q": 83, "meth'  # a line cut mid-write
    path.write_text(text)
    assert finished_questions(str(path), [1]) == {81, 82}
    assert [json.loads(line) for line in path.read_text().splitlines()] == finished
    assert finished_questions(str(path), [1]) == {81, 82}  # idempotent
    assert finished_questions(str(tmp_path / "none.jsonl"), [1]) == set()


def test_with_several_seeds_a_question_is_finished_after_its_last_seed(tmp_path):
    path = tmp_path / "snap.jsonl"
    almost = rows(90, ["eagle"], [1, 2])[:-1]  # the plain run of seed 2 missing
    path.write_text("".join(json.dumps(r) + "\n" for r in almost))
    assert finished_questions(str(path), [1, 2]) == set()
    assert path.read_text() == ""
