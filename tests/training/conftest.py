"""Fixtures and checks shared by the training tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hf_speculative as hfs
from tests.conftest import CHAT_WORDS

CLI_ENV = {"COLUMNS": "200", "NO_COLOR": "1"}  # rich's output wide and plain, so that tests can read it


def run_cli(*args, **env):
    """``hf-speculative ARGS`` in this process (typer's ``CliRunner``), asserted to exit 0; ``env`` adds to its
    environment. Returns the ``Result``."""
    from typer.testing import CliRunner

    from hf_speculative.cli.main import app

    result = CliRunner().invoke(app, [str(a) for a in args], env={**CLI_ENV, **env})
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


def write_prompts(path: Path) -> Path:
    """24 six-word prompts of the chat words (``{"id", "prompt"}`` rows) written to ``path`` as JSON lines."""
    rows = [{"id": f"q{i}", "prompt": " ".join(CHAT_WORDS[(i * 3 + j) % len(CHAT_WORDS)] for j in range(6))}
            for i in range(24)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def prompts(tmp_path):
    """``prompts.jsonl`` in the test's folder (:func:`write_prompts`)."""
    return write_prompts(tmp_path / "prompts.jsonl")


@pytest.fixture
def chat_answers(tmp_path, chat_checkpoint):
    """The tiny chat model's greedy answers (12 tokens) to 21 five-word prompts, as ``self-distill`` writes them."""
    from hf_speculative.training.selfdistill import generate_responses

    model, tokenizer = hfs.load_model(str(chat_checkpoint))
    rows = [{"id": f"q{i}", "prompt": " ".join(CHAT_WORDS[(i * 5 + j) % len(CHAT_WORDS)] for j in range(5))}
            for i in range(21)]
    generate_responses(model, tokenizer, rows, tmp_path / "a.jsonl", max_new_tokens=12, batch_size=8, progress=False)
    return tmp_path / "a.jsonl"


def assert_drafts_exactly(model, tokenizer, strategy) -> None:
    """On a chat prompt, greedy generation drafting with ``strategy`` gives plain greedy's 20 tokens, and it drafted."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "the cat sat"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    ids = {k: ids[k] for k in ("input_ids", "attention_mask")}  # transformers 4.x adds token_type_ids
    ref = type(model).generate(model, **ids, max_new_tokens=20, do_sample=False)
    assert model.generate(**ids, max_new_tokens=20, do_sample=False, candidate_generator=strategy).tolist() == ref.tolist()
    assert hfs.last_stats(model).drafted_tokens > 0
