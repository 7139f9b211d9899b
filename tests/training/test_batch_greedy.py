"""Batched greedy decoding that drops each row at the step it ends (hf_speculative/training/batch_greedy.py): every
row's tokens are transformers' batched greedy generate()'s, rows ending at EOS or at the length limit, and the steps
after a row ended run without it; a generation config that changes greedy's scores is left to generate()."""

from __future__ import annotations

import json

import pytest
import torch

from hf_speculative.training import batch_greedy, selfdistill
from hf_speculative.training.batch_greedy import greedy_rows, plain_greedy
from tests.conftest import ARCHS, VOCAB, build_model

PAD = 0
LENGTHS = [5, 14, 3, 9, 11]  # left-padded to 14


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Five prompts of other lengths, left-padded: ``input_ids`` and ``attention_mask``, `[5, 14]`."""
    width = max(LENGTHS)
    ids = torch.full((len(LENGTHS), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        ids[row, width - n:] = torch.tensor([3 + (row * 7 + j * 5) % (VOCAB - 3) for j in range(n)])
        mask[row, width - n:] = 1
    return ids, mask


def generated(model, ids, mask, new: int, eos: set[int]) -> list[list[int]]:
    """transformers' batched greedy generate(), each row cut after its first EOS."""
    model.generation_config.eos_token_id = sorted(eos) or None
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=PAD)
    rows = []
    for seq in out[:, ids.shape[1]:].tolist():
        end = next((j for j, token in enumerate(seq) if token in eos), len(seq) - 1)
        rows.append(seq[: end + 1])
    return rows


def rows_per_forward(model) -> tuple[list[int], object]:
    """The batch size of every forward of ``model`` (a hook on its input embeddings), and the hook's handle."""
    sizes = []
    handle = model.get_input_embeddings().register_forward_hook(lambda module, args, out: sizes.append(args[0].shape[0]))
    return sizes, handle


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_are_generates_and_ended_rows_stop_running(arch):
    model = build_model(arch, eos=None)
    ids, mask = batch()
    new = 12
    free = generated(model, ids, mask, new, set())
    assert greedy_rows(model, ids, mask, max_new_tokens=new, eos_ids=set()) == free  # no EOS: every row runs 12
    # EOS tokens taken from the free-running text so that rows end at different steps, one at its very first token
    eos = {free[0][0], free[3][5]}
    expected = generated(model, ids, mask, new, eos)
    lengths = [len(row) for row in expected]
    assert 1 in lengths and len(set(lengths)) >= 3, lengths  # the rows end apart

    sizes, handle = rows_per_forward(model)
    try:
        assert greedy_rows(model, ids, mask, max_new_tokens=new, eos_ids=eos) == expected
    finally:
        handle.remove()
    assert sizes[0] == len(LENGTHS)  # the prefill: every row
    steps = sizes[1:]  # then one forward per new token after the first, of the rows still writing
    assert len(steps) == max(lengths) - 1
    assert steps == [sum(length > t for length in lengths) for t in range(1, max(lengths))]
    assert sum(steps) < len(LENGTHS) * len(steps)  # generate() would have run every row every step


def test_the_length_limit_and_one_token():
    model = build_model("llama", eos=None)
    ids, mask = batch()
    assert greedy_rows(model, ids, mask, max_new_tokens=1, eos_ids=set()) == generated(model, ids, mask, 1, set())
    with pytest.raises(ValueError, match=r"max_new_tokens=0\): a row writes at least one token"):
        greedy_rows(model, ids, mask, max_new_tokens=0, eos_ids=set())


def test_settings_that_change_greedy_scores_are_named():
    model = build_model("llama")
    assert plain_greedy(model.generation_config) == []
    model.generation_config.repetition_penalty = 1.3
    model.generation_config.no_repeat_ngram_size = 2
    assert plain_greedy(model.generation_config) == ["repetition_penalty", "no_repeat_ngram_size"]
    model.generation_config.repetition_penalty, model.generation_config.no_repeat_ngram_size = 1.0, 0
    assert plain_greedy(model.generation_config) == []


def test_self_distill_leaves_a_scored_config_to_generate(tmp_path, chat_model, chat_tokenizer, monkeypatch):
    """Under a repetition penalty the answers are generate()'s (the penalty applied), not the plain argmax's, which
    differ on these prompts; without one, greedy_rows writes them."""
    prompts = [{"id": f"q{i}", "prompt": text} for i, text in enumerate(["hello there world", "a b c d e f g",
                                                                       "the cat sat on the mat"])]
    calls = []
    monkeypatch.setattr(selfdistill, "greedy_rows", lambda *a, **k: calls.append(1) or batch_greedy.greedy_rows(*a, **k))
    plain = selfdistill.generate_responses(chat_model, chat_tokenizer, prompts, tmp_path / "plain.jsonl",
                                           max_new_tokens=12, batch_size=3, progress=False)
    assert calls  # the plain config: our loop
    calls.clear()
    before, chat_model.generation_config.repetition_penalty = chat_model.generation_config.repetition_penalty, 5.0
    try:
        scored = selfdistill.generate_responses(chat_model, chat_tokenizer, prompts, tmp_path / "scored.jsonl",
                                                max_new_tokens=12, batch_size=3, progress=False)
        assert not calls
        rows = [json.loads(line) for line in scored.read_text().splitlines()]
        for row in rows:
            ids = row["prompt_tokens"]
            alone = chat_model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12, pad_token_id=0)
            expected = alone[0, len(ids):].tolist()
            assert row["response_tokens"] == (expected[: expected.index(2) + 1] if 2 in expected else expected)
    finally:
        chat_model.generation_config.repetition_penalty = before
    assert plain.read_text() != scored.read_text()  # the penalty matters here: a plain argmax would have missed it


def test_a_large_batch_drops_its_ended_rows_in_groups():
    """40 rows: rows are dropped once a 16th of those in the batch have ended (2 of 32 to 47 rows; below 32, each at
    once); a single ended row of a large batch keeps being fed, its logits unread. Every row's tokens are still
    generate()'s."""
    model = build_model("llama", eos=None)
    width = 12
    ids = torch.full((40, width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row in range(40):
        n = 2 + row % 11
        ids[row, width - n:] = torch.tensor([3 + (row * 11 + j * 3) % (VOCAB - 3) for j in range(n)])
        mask[row, width - n:] = 1
    new = 10
    free = generated(model, ids, mask, new, set())
    eos = {free[0][1], free[7][4]}
    expected = generated(model, ids, mask, new, eos)
    lengths = [len(row) for row in expected]
    assert len(set(lengths)) >= 3, lengths
    sizes, handle = rows_per_forward(model)
    try:
        assert greedy_rows(model, ids, mask, max_new_tokens=new, eos_ids=eos) == expected
    finally:
        handle.remove()
    steps = sizes[1:]
    assert steps[-1] < 40 and steps == sorted(steps, reverse=True)
    drops = [(before, before - after) for before, after in zip([40, *steps], steps) if before != after]
    assert all(dropped >= max(1, before // 16) for before, dropped in drops), steps
    assert any(before >= 32 for before, _ in drops)  # a group drop happened (2 rows at least)
