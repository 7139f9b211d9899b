"""``hf-speculative train-medusa`` / ``export-medusa`` on a tiny saved chat model (self-distilled answers, feature
cache, validation, resume, export round trip), and Medusa-1's loss raising acceptance well above chance."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import hf_speculative as hfs
from hf_speculative.cli.main import app
from hf_speculative.drafters.medusa.config import MedusaConfig
from hf_speculative.drafters.medusa.model import MedusaHeads
from hf_speculative.core.features import tapped_features
from hf_speculative.training.medusa import MedusaTrainConfig, medusa_loss, new_heads
from tests.conftest import PROMPT, build_model, prompt_inputs, stock_generate
from tests.training.conftest import assert_drafts_exactly, write_prompts

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def run(*args):
    result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


@pytest.fixture
def prompts(tmp_path):
    return write_prompts(tmp_path / "prompts.jsonl")


@pytest.mark.parametrize("lm_head", ["target", "per_head"])
def test_train_medusa_end_to_end(tmp_path, chat_checkpoint, prompts, lm_head):
    out = tmp_path / "heads"
    common = ["train-medusa", "--target", chat_checkpoint, "--prompts", prompts, "--distill-tokens", 16, "--out", out,
              "--heads", 3, "--lm-head", lm_head, "--eval-every", 10, "--val-prompts", 2, "--threads", 1,
              "--tree-nodes", 6, "--lr", 3e-3]
    run(*common, "--epochs", 1)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log and len(log[-1]["val_top1"]) == 3 and all(0 <= a <= 1 for a in log[-1]["val_top1"])
    assert 1.0 <= log[-1]["val_tau_tree"] <= 4.0 and 1.0 <= log[-1]["val_tau_chain"] <= 4.0
    assert json.loads((out / "training_summary.json").read_text())["optimizer_steps"] == 22  # 24 rows, 2 held out
    result = run(*common, "--epochs", 2)  # resumes from the checkpoint
    assert "resumed from" in result.output
    assert json.loads((out / "training_summary.json").read_text())["optimizer_steps"] == 44

    model, tokenizer = hfs.load_model(str(chat_checkpoint))
    hfs.enable(model)
    for tree in (None, "calibrated"):
        strategy = hfs.Medusa.from_pretrained(out, target=model, tree=tree, adaptive=False, confidence_threshold=0.0)
        assert_drafts_exactly(model, tokenizer, strategy)
    exported = tmp_path / "vllm"
    run("export-medusa", out, "--out", exported, "--format", "vllm", "--target", chat_checkpoint)
    again = hfs.Medusa.from_pretrained(exported, target=model)
    hidden = torch.randn(5, model.config.hidden_size)
    head = model.get_output_embeddings()
    torch.testing.assert_close(again.heads.logits(hidden, head), strategy.heads.logits(hidden, head))


def test_train_medusa_refuses_bad_options(tmp_path, chat_checkpoint, prompts):
    result = CliRunner().invoke(app, ["train-medusa", "--target", str(chat_checkpoint), "--out", str(tmp_path / "o")],
                                env=ENV)
    assert result.exit_code != 0 and "give --data FILE" in result.output
    result = CliRunner().invoke(app, ["train-medusa", "--target", str(chat_checkpoint), "--data", str(prompts), "--out",
                                      str(tmp_path / "o"), "--lm-head", "tied"], env=ENV)
    assert result.exit_code != 0 and "lm_head='tied'" in result.output


@pytest.mark.parametrize("lm_head", ["target", "per_head"])
def test_medusa_loss_raises_acceptance_well_above_chance(lm_head):
    """Heads trained with Medusa-1's loss on the target's greedy text: head 0 goes from its start (the target's own
    next-token guess, almost never the token after it) to well above chance (1/96), and drafting with them keeps
    tokens (tau > 1.5) while the output stays greedy's."""
    target = build_model("llama", layers=3, init=0.3).requires_grad_(False)
    text = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=60, eos_token_id=None)
    final = tapped_features(target, [], text)  # [1, T, H]
    top = target.lm_head(final).argmax(-1)  # [1, T]
    mask = torch.zeros_like(text)
    mask[:, len(PROMPT) - 1:] = 1
    cfg = MedusaTrainConfig(target="tiny", data=["x"], out="x", heads=3, lm_head=lm_head)
    heads = new_heads(cfg, target)
    head_weight = target.lm_head.weight
    _, before, counts = medusa_loss(heads, final, top, mask, head_weight)
    optimizer = torch.optim.Adam(heads.parameters(), lr=1e-2)
    for _ in range(300):
        loss, correct, counts = medusa_loss(heads, final, top, mask, head_weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert before[0] / counts[0] < 0.3 and correct[0] / counts[0] > 0.8 and correct[1] / counts[1] > 0.5
    heads.eval().requires_grad_(False)
    hfs.enable(target)
    try:
        for tree in (None, hfs.StaticTree([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])):
            out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=60, eos_token_id=None,
                                  candidate_generator=hfs.Medusa(heads, tree=tree, adaptive=False,
                                                                 confidence_threshold=0.0))
            assert out.tolist() == text.tolist()
            assert hfs.last_stats(target).tau > 1.5
    finally:
        hfs.disable(target)


def test_train_config_checks():
    with pytest.raises(ValueError, match="decay=0"):
        MedusaTrainConfig(target="t", data=["d"], out="o", decay=0)
    with pytest.raises(ValueError, match="num_heads=0"):
        MedusaTrainConfig(target="t", data=["d"], out="o", heads=0)
    with pytest.raises(ValueError, match=r"data=\[\]"):
        MedusaTrainConfig(target="t", data=[], out="o")
    MedusaHeads(MedusaConfig(num_heads=2, hidden_size=4, vocab_size=8))
