"""``hf-speculative train-dflash`` on tiny random targets: the training forward is drafting's window by window, the
block loss raises acceptance and the result drafts exactly, the command self-distils, caches, validates, resumes and
writes a folder ``hfs.DFlash.from_pretrained`` loads, and bad arguments get clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

import hf_speculative as hfs
from hf_speculative.cli.main import app
from hf_speculative.core.features import tapped_features
from hf_speculative.drafters.dflash.drafter import DFlash, random_network
from hf_speculative.training.dflash import (
    DFlashTrainConfig,
    block_inputs,
    build_target_layer_ids,
    dflash_loss,
    new_network,
    sample_anchors,
    window_embedder,
)
from tests.conftest import PROMPT, build_model, prompt_inputs, stock_generate
from tests.training.conftest import CLI_ENV as ENV
from tests.training.conftest import assert_drafts_exactly
from tests.training.conftest import run_cli as run


def refused(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    assert result.exit_code != 0
    return " ".join(result.output.split())  # typer wraps long messages in a box


@pytest.fixture
def deep_chat_checkpoint(tmp_path, chat_tokenizer):
    """The chat tokenizer with a seeded 6-layer tiny Llama (deep enough to spread target layers over)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                                         num_attention_heads=4, num_key_value_heads=2, bos_token_id=1,
                                         eos_token_id=2, pad_token_id=0)).eval()
    model.save_pretrained(tmp_path / "tiny-llama-6")
    chat_tokenizer.save_pretrained(tmp_path / "tiny-llama-6")
    return tmp_path / "tiny-llama-6"


def test_build_target_layer_ids_is_zlabs_rule():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # z-lab/Qwen3-8B-DFlash-b16's
    assert build_target_layer_ids(30, 5) == [1, 8, 14, 20, 27]  # SmolLM2-135M's default
    assert build_target_layer_ids(30, 1) == [15]
    with pytest.raises(ValueError, match="do not spread over a target of 4 layers"):
        build_target_layer_ids(4, 3)


def test_sample_anchors_draws_learnt_positions_once_sorted():
    mask = torch.zeros(2, 12, dtype=torch.long)
    mask[0, 3:10] = 1
    mask[1, 5:7] = 1
    anchors, keep = sample_anchors(mask, 4, torch.Generator().manual_seed(1))
    assert anchors.shape == (2, 4) and keep.tolist() == [[True] * 4, [True, True, False, False]]
    for row in range(2):
        kept = anchors[row][keep[row]].tolist()
        assert kept == sorted(set(kept)) and all(mask[row, a] == 1 for a in kept)
    assert sorted(anchors[1][keep[1]].tolist()) == [5, 6]
    everything, _ = sample_anchors(mask, 100)
    assert everything[0].tolist() == list(range(3, 10))


@pytest.mark.parametrize("width", [None, 4], ids=["dense", "blocks"])
@pytest.mark.parametrize("shape", ["bidirectional", "causal-sliding"])
def test_training_forward_is_drafting_window_by_window(shape, width):
    """Every window of one training forward equals the drafting forward after its own context alone (features before
    the anchor, the anchor token, mask tokens), and the labels are the target's next argmax tokens; with dense
    attention and with the windows' blocks (``width``: no score of one window against another computed)."""
    target = build_model("llama", layers=4)
    fields = {} if shape == "bidirectional" else dict(causal=True, layer_types=["sliding_attention"],
                                                      sliding_window=3)
    net = random_network(target, block_size=4, num_hidden_layers=1, **fields).float()
    ids = torch.tensor([PROMPT + [5, 9, 8, 7, 6, 5]])  # [1, T]
    t = ids.shape[1]
    features = tapped_features(target, net.config.target_layer_ids, ids)  # [1, T, F]
    top = target(ids).logits.argmax(-1)  # [1, T]
    anchors = torch.tensor([[0, 4, 9, t - 2]])
    keep = torch.ones_like(anchors, dtype=torch.bool)
    mask = torch.ones_like(ids)
    inputs = block_inputs(ids, mask, top, anchors, keep, 4, net.config.mask_token_id)
    embed = window_embedder(target)
    hidden = net.forward_blocks(embed(inputs["window_ids"]), features, inputs["positions"], inputs["allowed"],
                                width=width)
    for j, a in enumerate(anchors[0].tolist()):
        window = torch.tensor([[ids[0, a].item()] + [net.config.mask_token_id] * 3])
        positions = torch.arange(a + 4)[None]
        alone = net(embed(window), features[:, :a], positions)  # [1, 4, H]
        torch.testing.assert_close(hidden[:, 4 * j: 4 * j + 4], alone, rtol=1e-4, atol=1e-5)
        for k in range(1, 4):
            if a + k < t:
                assert inputs["labels"][0, j, k] == top[0, a + k - 1] and inputs["valid"][0, j, k]
            else:
                assert not inputs["valid"][0, j, k]
        assert not inputs["valid"][0, j, 0]


def test_window_blocks_give_dense_attentions_outputs_and_gradients_on_a_padded_batch():
    """Two rows, one with filler anchors (fewer learnt positions): the blocks' forward and gradients are the dense
    mask's; a mask that lets a window see another window is refused rather than split."""
    from hf_speculative.drafters.dflash.blocks import WindowBlocks

    target = build_model("llama", layers=4)
    net = random_network(target, block_size=4, num_hidden_layers=2).float().requires_grad_(True)
    torch.manual_seed(2)
    ids = torch.randint(3, target.config.vocab_size, (2, 19))
    mask = torch.zeros_like(ids)
    mask[0, 3:18], mask[1, 12:15] = 1, 1
    features = tapped_features(target, net.config.target_layer_ids, ids)
    top = target(ids).logits.argmax(-1)
    anchors, keep = sample_anchors(mask, 8, torch.Generator().manual_seed(0))
    assert not keep[1].all()  # row 1 has three learnt positions: filler anchors
    inputs = block_inputs(ids, mask, top, anchors, keep, 4, net.config.mask_token_id)
    embed = window_embedder(target)

    def run(width):
        net.zero_grad()
        hidden = net.forward_blocks(embed(inputs["window_ids"]), features, inputs["positions"], inputs["allowed"],
                                    width=width)
        (hidden * torch.linspace(-1, 1, hidden.shape[-1])).sum().backward()
        return hidden.detach(), {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}

    (dense, dense_grads), (blocks, block_grads) = run(None), run(4)
    torch.testing.assert_close(blocks, dense, rtol=1e-4, atol=1e-5)
    assert block_grads.keys() == dense_grads.keys() and any("self_attn.q_proj" in name for name in block_grads)
    for name, want in dense_grads.items():
        torch.testing.assert_close(block_grads[name], want, rtol=1e-3, atol=1e-5)
    leaky = inputs["allowed"][:, None].clone()
    s = ids.shape[1]
    leaky[0, 0, 4, s] = True  # window 1's first query sees window 0's anchor
    with pytest.raises(ValueError, match="another window's positions"):
        WindowBlocks.from_mask(leaky, s, 4)


def _greedy_text_setup(new_tokens: int):
    """A tiny target's greedy text after the prompt, a fresh 1-layer drafter with blocks of 4, the target's features,
    argmax and the answer's loss mask, the window embedder and the lm_head weight."""
    target = build_model("llama", layers=4, init=0.3).requires_grad_(False)
    text = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=new_tokens, eos_token_id=None)
    cfg = DFlashTrainConfig(target="tiny", data=["x"], out="x", block_size=4, layers=1, target_layer_ids=[0, 2])
    net = new_network(cfg, target)
    features = tapped_features(target, net.config.target_layer_ids, text)
    top = target(text).logits.argmax(-1)
    mask = torch.zeros_like(text)
    mask[:, len(PROMPT) - 1: -1] = 1
    embed, head = window_embedder(target), target.lm_head.weight
    return target, text, cfg, net, features, top, mask, embed, head


def test_block_loss_raises_acceptance_and_drafts_exactly():
    """A fresh drafter trained with the block loss on the target's greedy text: the loss falls, the top-1 of every
    drafted position rises well above chance, and drafting with it keeps blocks (tau > 1.5) while the output stays
    greedy's, as chains and as a tree."""
    target, text, cfg, net, features, top, mask, embed, head = _greedy_text_setup(48)
    torch.manual_seed(0)
    first, before = dflash_loss(net, embed, head, text, mask, features, top, 64, cfg.gamma)
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    for _ in range(150):
        loss, m = dflash_loss(net, embed, head, text, mask, features, top, 64, cfg.gamma)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert m.loss < 0.5 * first.item()
    assert before.correct[0] / before.counts[0] < 0.3 and m.correct[0] / m.counts[0] > 0.8
    assert m.correct[2] / m.counts[2] > 0.5
    net.eval().requires_grad_(False)
    hfs.enable(target)
    try:
        for tree in (None, hfs.StaticTree([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])):
            out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=48, eos_token_id=None,
                                  candidate_generator=DFlash(net, tree=tree, num_tokens=3, adaptive=False,
                                                             confidence_threshold=0.0))
            assert out.tolist() == text.tolist()
            assert hfs.last_stats(target).tau > 1.5
    finally:
        hfs.disable(target)


def test_the_draft_vocabulary_loss_reads_its_rows_and_misses_what_it_cannot_propose():
    """``loss_vocab='draft'``: the cross-entropy over the draft vocabulary's rows of the lm_head for the labels inside
    it; labels outside it are not learnt and count as misses. With every id in the vocabulary it is the whole
    vocabulary's loss."""
    _, text, cfg, net, features, top, mask, embed, head = _greedy_text_setup(24)
    vocab_size = head.shape[0]

    def loss_of(vocab):
        return dflash_loss(net, embed, head, text, mask, features, top, 64, cfg.gamma,
                           generator=torch.Generator().manual_seed(0), vocab=vocab)

    whole, whole_m = loss_of(None)
    every, every_m = loss_of(torch.arange(vocab_size))
    torch.testing.assert_close(every, whole)
    assert every_m.correct == whole_m.correct and every_m.counts == whole_m.counts
    labels = sorted(set(top[0, len(PROMPT) - 1:].tolist()))
    vocab = torch.tensor(sorted(set(range(0, vocab_size, 3)) | set(labels[: len(labels) // 2])))
    outside = set(labels) - set(vocab.tolist())
    assert outside  # some labels the vocabulary cannot propose
    loss, metrics = loss_of(vocab)
    assert metrics.counts == whole_m.counts  # every learnt label is counted, inside the vocabulary or not
    # the expected loss from the windows themselves
    picked, keep = sample_anchors(mask, 64, torch.Generator().manual_seed(0))
    inputs = block_inputs(text, mask, top, picked, keep, 4, net.config.mask_token_id)
    hidden = net.forward_blocks(embed(inputs["window_ids"]), features.float(), inputs["positions"],
                                inputs["allowed"]).view(1, picked.shape[1], 4, -1)
    valid, targets = inputs["valid"], inputs["labels"][inputs["valid"]]
    weights = torch.exp(-(torch.arange(4) - 1).clamp(min=0).float() / cfg.gamma).expand(1, picked.shape[1], 4)[valid]
    inside = torch.isin(targets, vocab)
    logits = hidden[valid] @ head[vocab].T
    draft_ids = torch.searchsorted(vocab, targets[inside])
    per_label = torch.nn.functional.cross_entropy(logits[inside], draft_ids, reduction="none")
    torch.testing.assert_close(loss, (per_label * weights[inside]).sum() / weights[inside].sum())
    assert not torch.allclose(loss, whole)
    hits = (vocab[logits.argmax(-1)] == targets) & inside
    for k in range(1, 4):
        at = torch.nonzero(valid)[:, 2] == k
        assert metrics.correct[k - 1] == float(hits[at].sum())


def test_train_dflash_end_to_end_and_resume(tmp_path, deep_chat_checkpoint, prompts):
    out = tmp_path / "dflash"
    common = ["train-dflash", "--target", deep_chat_checkpoint, "--prompts", prompts, "--distill-tokens", 16,
              "--out", out, "--block-size", 4, "--layers", 1, "--target-layers", 3, "--anchors", 8,
              "--eval-every", 10, "--val-prompts", 2, "--threads", 1, "--lr", 3e-3]
    run(*common, "--epochs", 1)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [10, 20, 22]  # 24 rows, 2 held out
    assert len(log[-1]["val_acc"]) == 3 and all(0 <= a <= 1 for a in log[-1]["val_acc"])
    assert 1.0 <= log[-1]["val_tau_teacher_forced"] <= 4.0 and 1.0 <= log[-1]["val_tau"] <= 4.0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["dflash_config"]["target_layer_ids"] == [1, 2, 3] and cfg["block_size"] == 4
    assert cfg["num_target_layers"] == 6 and cfg["num_hidden_layers"] == 1
    assert json.loads((out / "training_summary.json").read_text())["optimizer_steps"] == 22

    assert not (out / "draft_vocab.safetensors").exists()
    # continues from the checkpoint, ships a vocabulary and trains on it from here
    result = run(*common, "--epochs", 2, "--draft-vocab", 10, "--loss-vocab", "draft")
    assert "resumed from" in result.output and "draft vocabulary: 10 ids" in result.output
    assert json.loads((out / "training_summary.json").read_text())["optimizer_steps"] == 44
    last = json.loads((out / "train_log.jsonl").read_text().splitlines()[-1])
    assert last["draft_vocab"] == 10 and 0 < last["val_vocab_coverage"] <= 1 and 1.0 <= last["val_tau"]

    model, tokenizer = hfs.load_model(str(deep_chat_checkpoint))
    hfs.enable(model)
    strategy = hfs.DFlash.from_pretrained(out, target=model, adaptive=False, confidence_threshold=0.0)
    assert strategy.network.config.target_layer_ids == [1, 2, 3] and strategy.network.draft_vocab.numel() == 10
    assert_drafts_exactly(model, tokenizer, strategy)
    assert_drafts_exactly(model, tokenizer, hfs.DFlash.from_pretrained(
        out, target=model, adaptive=False, confidence_threshold=0.0, tree=hfs.StaticTree([(0,), (1,), (0, 0)])))

    message = refused(*common, "--epochs", 2, "--target-layers", 2)
    assert "reading target layers [1, 2, 3]" in message and "[1, 3]" in message


def test_train_dflash_refuses_bad_arguments(tmp_path, deep_chat_checkpoint, prompts):
    base = ["train-dflash", "--target", deep_chat_checkpoint, "--out", tmp_path / "o"]
    assert "give --data FILE" in refused(*base)
    data = ["--data", prompts, "--target-layers", 3]
    assert "block_size=1" in refused(*base, *data, "--block-size", 1)
    assert "do not spread over a target of 6 layers" in refused(*base, *data, "--target-layers", 6)
    message = refused(*base, *data, "--target-layer-ids", "1,5")
    assert "last layer 5" in message and "use layers before it" in message
    message = refused(*base, *data, "--target-layer-ids", "1,9")
    assert "[9] outside the target's 6 layers" in message
    assert "comma-separated layer indices" in refused(*base, *data, "--target-layer-ids", "one,two")
    assert "mask_token_id=500 is outside its vocabulary of 128" in refused(*base, *data, "--mask-token-id", 500)
    assert "save_dtype='int8'" in refused(*base, *data, "--save-dtype", "int8")
    assert "gamma=-1.0" in refused(*base, *data, "--gamma", -1)
    assert "anchors=0" in refused(*base, *data, "--anchors", 0)
    assert "--draft-vocab" in refused(*base, *data, "--draft-vocab", 0)
    assert "give its size too (--draft-vocab 8192)" in refused(*base, *data, "--loss-vocab", "draft")
    assert "loss_vocab='all'" in refused(*base, *data, "--loss-vocab", "all", "--draft-vocab", 10)
    with pytest.raises(ValueError, match="draft_vocab=2097152"):
        DFlashTrainConfig(target="t", data=["x"], out="o", draft_vocab=2 ** 21)
    assert not (tmp_path / "o").exists()  # refused before anything ran
