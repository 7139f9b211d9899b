"""Self-distillation: the target's own greedy answers, written in the list's order window by window
(a run stopped early holds a fair sample), batched without changing any answer, resumed by id."""

from __future__ import annotations

import json

import pytest
import torch

from hf_speculative.training.selfdistill import chat_text, generate_responses
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
    for bad in ({"sort_window": -1}, {"batch_size": 0}):
        with pytest.raises(ValueError, match="the batch size must be >= 1 and the window >= 0"):
            generate_responses(chat_model, chat_tokenizer, PROMPTS, tmp_path / "c.jsonl", progress=False, **bad)
