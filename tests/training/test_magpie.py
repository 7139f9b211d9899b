"""Prompts the target writes itself (Magpie): the pre-query text, reproducible sampling, resume equal to
an uninterrupted run, the filters (cut-off, short, repeated, excluded), and the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hf_speculative.cli.main import app
from hf_speculative.training.magpie import (
    pad_id_of,
    pre_query_text,
    query_inputs,
    sample_batch,
    sample_prompts,
    shingles,
)
from tests.conftest import make_chat_tokenizer

# the tiny random model ends about one message in four within 40 tokens
KW = {"batch_size": 16, "max_new_tokens": 40, "min_words": 2, "progress": False}


@pytest.fixture
def chat_tokenizer():
    """The test chat tokenizer with its role markers registered as special tokens, as real chat tokenizers have
    them (same ids)."""
    tokenizer = make_chat_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})
    return tokenizer


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_pre_query_text_is_the_template_up_to_the_users_message(chat_tokenizer):
    assert pre_query_text(chat_tokenizer) == "<|user|> "
    bare = make_chat_tokenizer()
    bare.chat_template = None
    with pytest.raises(ValueError, match="need a chat model: this tokenizer has no chat template"):
        pre_query_text(bare)


def test_sampling_is_reproducible_and_resumes_like_one_run(tmp_path, chat_model, chat_tokenizer):
    whole = rows_of(sample_prompts(chat_model, chat_tokenizer, tmp_path / "a.jsonl", 12, **KW))
    assert len(whole) == 12 and len({r["prompt"] for r in whole}) == 12
    assert all(r["category"] == "self-written" and len(r["prompt"].split()) >= 2 for r in whole)
    again = rows_of(sample_prompts(chat_model, chat_tokenizer, tmp_path / "b.jsonl", 12, **KW))
    assert again == whole
    # stopped at 5 (inside a batch), resumed to 12: the same file as one run
    sample_prompts(chat_model, chat_tokenizer, tmp_path / "c.jsonl", 5, **KW)
    resumed = rows_of(sample_prompts(chat_model, chat_tokenizer, tmp_path / "c.jsonl", 12, **KW))
    assert resumed == whole
    other = rows_of(sample_prompts(chat_model, chat_tokenizer, tmp_path / "d.jsonl", 12, seed=1, **KW))
    assert {r["prompt"] for r in other} != {r["prompt"] for r in whole}
    with pytest.raises(ValueError, match="holds rows that are not this run's .*resume with the seed that wrote it"):
        sample_prompts(chat_model, chat_tokenizer, tmp_path / "d.jsonl", 20, seed=0, **KW)


def test_batches_sampled_elsewhere_make_the_same_file(tmp_path, chat_model, chat_tokenizer):
    """A batch's messages depend on the seed and its index alone: sampled beforehand in reverse order by another copy
    of the model (as other processes do, ``sampled=``), the file is the same as one run's, resumed or not."""
    whole = rows_of(sample_prompts(chat_model, chat_tokenizer, tmp_path / "a.jsonl", 12, **KW))
    copy = type(chat_model)(chat_model.config).eval()
    copy.load_state_dict(chat_model.state_dict())
    inputs, pad = query_inputs(chat_tokenizer, KW["batch_size"]), pad_id_of(copy, chat_tokenizer)
    last = max(r["batch"] for r in whole)
    made = {b: sample_batch(copy, inputs, 0, b, temperature=1.0, top_p=0.95, max_new_tokens=KW["max_new_tokens"],
                            pad_id=pad) for b in reversed(range(last + 1))}
    asked = []

    def sampled(batch):
        asked.append(batch)
        return made[batch]

    assert rows_of(sample_prompts(chat_model, chat_tokenizer, tmp_path / "b.jsonl", 12, sampled=sampled,
                                  **KW)) == whole
    assert asked == list(range(last + 1))  # in order, each once
    sample_prompts(chat_model, chat_tokenizer, tmp_path / "c.jsonl", 5, sampled=made.__getitem__, **KW)
    assert rows_of(sample_prompts(chat_model, chat_tokenizer, tmp_path / "c.jsonl", 12, sampled=made.__getitem__,
                                  **KW)) == whole
    # a source of other batches gives another file: the rows come from it
    shifted = rows_of(sample_prompts(chat_model, chat_tokenizer, tmp_path / "d.jsonl", 4,
                                     sampled=lambda b: made[(b + 1) % (last + 1)], **KW))
    assert [r["prompt"] for r in shifted] != [r["prompt"] for r in whole[:4]]


def test_messages_are_whole_decoded_turns(tmp_path, chat_model, chat_tokenizer):
    rows = rows_of(sample_prompts(chat_model, chat_tokenizer, tmp_path / "a.jsonl", 8, **KW))
    for row in rows:  # special tokens left out of the text; no cut-off: each is a turn the model ended
        assert "<" not in row["prompt"] and row["prompt"] == row["prompt"].strip()
    # with room for one token, every message is cut off or empty: nothing is kept, and the run says why
    with pytest.raises(RuntimeError, match="only 0 of 3 prompts after 2 batches of 16: .*cut off, short or repeated"):
        sample_prompts(chat_model, chat_tokenizer, tmp_path / "e.jsonl", 3, **{**KW, "max_new_tokens": 1},
                       max_batches=2)


def test_excluded_texts_never_come_back(tmp_path, chat_model, chat_tokenizer):
    rows = rows_of(sample_prompts(chat_model, chat_tokenizer, tmp_path / "a.jsonl", 12, **KW))
    banned = [rows[3]["prompt"], "zzz " + rows[7]["prompt"] + " zzz"]  # the second one inside a longer text
    kept = rows_of(sample_prompts(chat_model, chat_tokenizer, tmp_path / "b.jsonl", 12, exclude=banned, shingle=2,
                                  **KW))
    runs = shingles(banned, 2)
    assert len(kept) == 12 and not any(shingles([r["prompt"]], 2) & runs for r in kept)
    assert rows[3]["prompt"] not in {r["prompt"] for r in kept}


def test_bad_sizes_are_refused(tmp_path, chat_model, chat_tokenizer):
    for count, bad in ((0, {}), (3, {"batch_size": 0}), (3, {"min_words": -1}), (3, {"shingle": 0})):
        with pytest.raises(ValueError, match="count, batch size and shingle must be >= 1, min_words >= 0"):
            sample_prompts(chat_model, chat_tokenizer, tmp_path / "a.jsonl", count, progress=False, **bad)
    assert not (tmp_path / "a.jsonl").exists()


def test_cli_writes_prompts_that_self_distill_answers(tmp_path, chat_checkpoint):
    questions = tmp_path / "question.jsonl"
    env = {"COLUMNS": "200", "NO_COLOR": "1"}
    args = ["sample-prompts", "--target", str(chat_checkpoint), "--count", "6", "--batch-size", "16",
            "--max-new-tokens", "40", "--min-words", "2", "--out", str(tmp_path / "p.jsonl")]
    first = CliRunner().invoke(app, args, env=env)
    assert first.exit_code == 0, first.output
    rows = rows_of(tmp_path / "p.jsonl")
    assert len(rows) == 6 and "hf-speculative self-distill" in first.output
    # a Spec-Bench-style file of questions excludes them
    questions.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": [rows[0]["prompt"]]}) + "\n"
                         + json.dumps({"turns": rows[1]["prompt"]}) + "\n")  # a lone string counts whole
    second = CliRunner().invoke(app, [*args[:-1], str(tmp_path / "q.jsonl"), "--exclude", str(questions)], env=env)
    assert second.exit_code == 0, second.output
    again = {r["prompt"] for r in rows_of(tmp_path / "q.jsonl")}
    assert len(again) == 6 and rows[0]["prompt"] not in again and rows[1]["prompt"] not in again
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no known field"}\n')
    third = CliRunner().invoke(app, [*args, "--exclude", str(bad)], env=env)
    assert third.exit_code == 2 and "has none of 'turns', 'prompt', 'text'" in third.output
    hot = CliRunner().invoke(app, [*args, "--temperature", "0"], env=env)
    assert hot.exit_code == 2 and "the temperature must be > 0" in hot.output
    answered = CliRunner().invoke(app, ["self-distill", "--target", str(chat_checkpoint), "--prompts",
                                        str(tmp_path / "p.jsonl"), "--max-new-tokens", "4", "--out",
                                        str(tmp_path / "a.jsonl")], env=env)
    assert answered.exit_code == 0, answered.output
    assert [r["id"] for r in rows_of(tmp_path / "a.jsonl")] != [] and len(rows_of(tmp_path / "a.jsonl")) == 6
