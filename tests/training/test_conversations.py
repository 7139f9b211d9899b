"""Chat conversations (``messages`` / ShareGPT ``conversations``) as training data and as prompts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hf_speculative.cli.main import app
from hf_speculative.training.cli import _prompt_rows
from hf_speculative.training.conversations import chat_tokens, conversation, first_user_turn
from hf_speculative.training.data import read_examples
from tests.conftest import make_chat_tokenizer

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}

MESSAGES = [
    {"role": "system", "content": "the big cat"},
    {"role": "user", "content": "a dog sat"},
    {"role": "assistant", "content": "the dog sat on a mat"},
    {"role": "user", "content": "and the cat"},
    {"role": "assistant", "content": "the cat ran to the house"},
]
SHAREGPT = [{"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]), "value": m["content"]}
            for m in MESSAGES]


def learnt_text(tokenizer, ids, learnt):
    return tokenizer.decode([t for t, m in zip(ids, learnt) if m])


def test_both_layouts_read_as_the_same_turns():
    assert conversation({"messages": MESSAGES}) == conversation({"conversations": SHAREGPT}) == MESSAGES
    assert conversation({"text": "the cat"}) is None
    assert first_user_turn(MESSAGES) == "a dog sat"
    assert first_user_turn(MESSAGES[:1]) is None


def test_only_the_assistant_turns_are_learnt(chat_tokenizer):
    ids, learnt = chat_tokens(chat_tokenizer, MESSAGES)
    assert ids == chat_tokenizer(chat_tokenizer.apply_chat_template(MESSAGES, tokenize=False),
                                 add_special_tokens=False)["input_ids"]
    assert learnt_text(chat_tokenizer, ids, learnt) == "the dog sat on a mat the cat ran to the house"
    # a trailing user turn has no answer to learn, and a leading assistant turn no prompt: both are dropped
    assert chat_tokens(chat_tokenizer, MESSAGES + [{"role": "user", "content": "big dog"}]) == (ids, learnt)
    greeting = {"role": "assistant", "content": "a big dog"}
    assert chat_tokens(chat_tokenizer, [greeting] + MESSAGES[1:]) == chat_tokens(chat_tokenizer, MESSAGES[1:])
    # nothing left to learn (real templates refuse to render an empty conversation)
    assert chat_tokens(chat_tokenizer, [MESSAGES[1]]) == chat_tokens(chat_tokenizer, [greeting]) == ([], [])


def test_real_chatml_template_learns_the_end_of_turn(chat_tokenizer):
    """With a ChatML template (SmolLM2's, Qwen's) the learnt span is the answer and its ``<|im_end|>``."""
    tokenizer = make_chat_tokenizer(["the", "cat", "dog", "sat", "<|im_start|>", "<|im_end|>", "user", "assistant"])
    tokenizer.chat_template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    turns = [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "the dog sat"}]
    ids, learnt = chat_tokens(tokenizer, turns)
    assert tokenizer.convert_ids_to_tokens(ids) == ["<|im_start|>", "user", "the", "cat", "<|im_end|>", "<|im_start|>",
                                                   "assistant", "the", "dog", "sat", "<|im_end|>"]
    assert learnt == [0] * 7 + [1] * 4


def test_read_examples_learns_each_answer_token_after_its_context(tmp_path, chat_tokenizer):
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": MESSAGES}) + "\n" + json.dumps({"conversations": SHAREGPT}) + "\n")
    first, second = read_examples(path, chat_tokenizer)
    assert first == second
    ids, learnt = chat_tokens(chat_tokenizer, MESSAGES)
    # loss_mask[q] = 1 where ids[q + 1] is learnt
    assert first.ids == ids and first.loss_mask == learnt[1:] + [0]
    short = read_examples(path, chat_tokenizer, max_length=12)[0]
    assert short.ids == ids[:12] and short.loss_mask == (learnt[1:] + [0])[:12]
    with pytest.raises(ValueError, match="needs the target's tokenizer"):
        read_examples(path)
    # a row with a question and no answer is skipped, as too-short rows are, instead of failing the file
    path.write_text(json.dumps({"messages": MESSAGES[1:2]}) + "\n" + json.dumps({"messages": MESSAGES}) + "\n")
    assert read_examples(path, chat_tokenizer) == [first]


@pytest.mark.parametrize("row, message", [
    ({"messages": [{"role": "robot", "content": "the"}]}, "turn 0 has role='robot'"),
    ({"conversations": [{"from": "human"}]}, "turn 0 has from='human' and a NoneType 'value'"),
    ({"messages": "the cat"}, "a conversation is a list of turns"),
    ({"prompt": "the cat"}, "expected a 'text' field, a conversation"),
])
def test_malformed_rows_are_named(tmp_path, chat_tokenizer, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "the cat sat on the mat"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=f"bad.jsonl:2: .*{message}"):
        read_examples(path, chat_tokenizer)


def test_templates_it_cannot_lay_out_are_refused(chat_tokenizer):
    plain = make_chat_tokenizer()
    plain.chat_template = None
    with pytest.raises(ValueError, match="no chat template.*'text'"):
        chat_tokens(plain, MESSAGES)
    slow = type("SlowTokenizer", (), {"chat_template": chat_tokenizer.chat_template, "is_fast": False})()
    with pytest.raises(ValueError, match="need a fast tokenizer"):
        chat_tokens(slow, MESSAGES)
    # a template that renders the last turn differently from earlier ones (as some reasoning models' do)
    chat_tokenizer.chat_template = ("{% for m in messages %}{% if loop.last %}<|user|> {% endif %}{{ m['content'] }} "
                                    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    with pytest.raises(ValueError, match="lays out earlier turns differently.*self-distill"):
        chat_tokens(chat_tokenizer, MESSAGES)


def test_self_distill_prompts_from_conversations(tmp_path):
    path = tmp_path / "sharegpt.jsonl"
    rows = [{"id": "x", "conversations": SHAREGPT}, {"messages": MESSAGES, "source": "s"}, {"prompt": "the cat"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _prompt_rows(str(path)) == [{"id": "x", "prompt": "a dog sat"},
                                       {"source": "s", "prompt": "a dog sat", "id": "line000001"},
                                       {"prompt": "the cat", "id": "line000002"}]
    path.write_text(json.dumps({"messages": MESSAGES[:1]}) + "\n")
    result = CliRunner().invoke(app, ["self-distill", "--target", "none", "--prompts", str(path),
                                      "--out", str(tmp_path / "o.jsonl")], env=ENV)
    assert result.exit_code != 0 and "no conversation with a user turn" in result.output


def test_train_eagle_on_conversations(tmp_path, chat_checkpoint):
    """A ShareGPT file trains a drafter end to end (features over the chat layout, held-out validation)."""
    import hf_speculative as hfs
    from tests.conftest import CHAT_WORDS
    from tests.training.conftest import assert_drafts_exactly

    words = CHAT_WORDS
    rows = [{"conversations": [{"from": "human", "value": " ".join(words[(i + j) % len(words)] for j in range(4))},
                               {"from": "gpt", "value": " ".join(words[(i * 5 + j) % len(words)] for j in range(12))}]}
            for i in range(12)]
    data = tmp_path / "sharegpt.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "drafter"
    result = CliRunner().invoke(app, [str(a) for a in [
        "train-eagle", "--target", chat_checkpoint, "--data", data, "--out", out, "--eagle3", "--draft-vocab-size", 24,
        "--grad-accum", 1, "--epochs", 1, "--eval-every", 5, "--val-prompts", 1, "--threads", 1]],
        env=ENV)
    assert result.exit_code == 0, result.output + repr(result.exception)
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["optimizer_steps"] == 11  # 12 conversations, one held out
    model, tokenizer = hfs.load_model(str(chat_checkpoint))
    hfs.enable(model)
    strategy = hfs.Eagle.from_pretrained(out, target=model, num_tokens=4, confidence_threshold=0.0, adaptive=False)
    assert_drafts_exactly(model, tokenizer, strategy)
