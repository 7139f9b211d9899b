"""Self-distillation: the target's own greedy answers, written in the list's order window by window
(a run stopped early holds a fair sample), batched without changing any answer, resumed by id."""

from __future__ import annotations

import json

import pytest
import torch

from hf_speculative.training.selfdistill import chat_text, generate_responses, merge_parts, part_path
from tests.conftest import CHAT_WORDS

# lengths 9, 1, 7, 3, 8, 2, 6, 4 words: every window of 4 holds long and short prompts
LENGTHS = [9, 1, 7, 3, 8, 2, 6, 4]
PROMPTS = [{"id": f"q{i}", "prompt": " ".join(CHAT_WORDS[(i + j) % len(CHAT_WORDS)] for j in range(n))}
           for i, n in enumerate(LENGTHS)]


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_answers_are_greedy_and_ordered_by_window(tmp_path, chat_model, chat_tokenizer):
    out = generate_responses(chat_model, chat_tokenizer, PROMPTS, tmp_path / "a.jsonl", max_new_tokens=6,
                             batch_size=3, sort_window=4, progress=False)
    rows = rows_of(out)
    # the first window (q0-q3) comes before the second, each sorted by length
    assert [r["id"] for r in rows] == ["q1", "q3", "q2", "q0", "q5", "q7", "q6", "q4"]
    for row in rows:  # batched, left-padded generation gives each prompt its own greedy answer
        ids = chat_tokenizer(chat_text(chat_tokenizer, row["prompt"]), add_special_tokens=False)["input_ids"]
        assert row["prompt_tokens"] == ids
        alone = chat_model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=6, pad_token_id=0)
        expected = alone[0, len(ids):].tolist()
        if 2 in expected:  # the answer ends at its EOS
            expected = expected[: expected.index(2) + 1]
        assert row["response_tokens"] == expected


def test_stopped_early_the_file_holds_a_window_of_the_list_and_resumes(tmp_path, chat_model, chat_tokenizer):
    path = tmp_path / "b.jsonl"
    generate_responses(chat_model, chat_tokenizer, PROMPTS[:4], path, max_new_tokens=4, batch_size=2, sort_window=4,
                       progress=False)
    assert sorted(r["id"] for r in rows_of(path)) == ["q0", "q1", "q2", "q3"]  # long and short prompts alike
    generate_responses(chat_model, chat_tokenizer, PROMPTS, path, max_new_tokens=4, batch_size=2, sort_window=4,
                       progress=False)
    rows = rows_of(path)
    assert sorted(r["id"] for r in rows) == [f"q{i}" for i in range(8)] and len(rows) == 8  # none twice


def test_window_zero_sorts_the_whole_list(tmp_path, chat_model, chat_tokenizer):
    out = generate_responses(chat_model, chat_tokenizer, PROMPTS, tmp_path / "w.jsonl", max_new_tokens=2,
                             batch_size=3, sort_window=0, progress=False)
    assert [r["id"] for r in rows_of(out)] == ["q1", "q5", "q3", "q7", "q6", "q2", "q4", "q0"]


def test_bad_sizes_are_refused(tmp_path, chat_model, chat_tokenizer):
    for bad in ({"sort_window": -1}, {"batch_size": 0}, {"shard": (2, 2)}, {"shard": (-1, 2)}):
        with pytest.raises(ValueError, match="the batch size must be >= 1, the window >= 0"):
            generate_responses(chat_model, chat_tokenizer, PROMPTS, tmp_path / "c.jsonl", progress=False, **bad)


def test_shards_merge_into_the_file_one_process_writes(tmp_path, chat_model, chat_tokenizer):
    """Processes deal the batches out (every count-th from their index); merged, their part files give
    the one-process file byte for byte, and the parts are gone. A part stopped early resumes by id,
    and a merge that ran already adds nothing."""
    kw = {"max_new_tokens": 5, "batch_size": 2, "sort_window": 4, "progress": False}
    one, three = tmp_path / "one.jsonl", tmp_path / "three.jsonl"
    for path in (one, three):  # a file started earlier
        generate_responses(chat_model, chat_tokenizer, PROMPTS[:3], path, **kw)
    generate_responses(chat_model, chat_tokenizer, PROMPTS, one, **kw)
    start = three.read_text()
    for index in range(3):
        generate_responses(chat_model, chat_tokenizer, PROMPTS, three, shard=(index, 3), **kw)
    # q3-q7 are left: windows (q3 q4 q5 q6) (q7) sorted by length, batches (q5 q3) (q6 q4) (q7), one per process
    assert [[r["id"] for r in rows_of(part_path(three, i, 3))] for i in range(3)] == [["q5", "q3"], ["q6", "q4"], ["q7"]]
    assert three.read_text() == start  # untouched until the merge
    assert merge_parts(three, 3) == 5
    assert three.read_text() == one.read_text()
    assert not list(tmp_path.glob("*.part*"))
    assert merge_parts(three, 3) == 0 and three.read_text() == one.read_text()

    whole, two = tmp_path / "whole.jsonl", tmp_path / "two.jsonl"
    generate_responses(chat_model, chat_tokenizer, PROMPTS, whole, **kw)
    for index in range(2):
        generate_responses(chat_model, chat_tokenizer, PROMPTS, two, shard=(index, 2), **kw)
    part = part_path(two, 1, 2)
    assert len(rows_of(part)) == 4  # batches 1 and 3 of (q1 q3) (q2 q0) (q5 q7) (q6 q4)
    part.write_text("".join(part.read_text().splitlines(keepends=True)[:2]))  # stopped after its first batch
    generate_responses(chat_model, chat_tokenizer, PROMPTS, two, shard=(1, 2), **kw)
    assert [r["id"] for r in rows_of(part)] == ["q2", "q0", "q6", "q4"]
    merge_parts(two, 2)
    assert two.read_text() == whole.read_text()
