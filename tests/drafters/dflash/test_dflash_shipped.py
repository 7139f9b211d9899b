"""The DFlash drafter shipped for smollm2-135m-instruct: it loads by name with its manifest and its draft vocabulary
(8,192 ids), drafts only inside that vocabulary and exactly (chain and tree) on the real model, and drafts as much
with the vocabulary as without it on a prompt."""

from __future__ import annotations

import json

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.drafters.dflash.drafter import PRETRAINED_DIR, pretrained_names

NAME = "smollm2-135m-instruct"


def test_the_shipped_drafter_carries_a_checked_vocabulary():
    assert NAME in pretrained_names()
    manifest = json.loads((PRETRAINED_DIR / NAME / "sha256sums.json").read_text())["sha256"]
    assert {"config.json", "model.safetensors", "draft_vocab.safetensors", "training.json"} <= set(manifest)


@pytest.mark.integration
@pytest.mark.parametrize("tree", [None, hfs.DynamicTree(nodes=16)], ids=["chain", "tree"])
def test_the_shipped_drafter_drafts_exactly_inside_its_vocabulary(integration, tree):
    model, tokenizer = integration
    hfs.enable(model)
    strategy = hfs.DFlash.from_pretrained(NAME, target=model, tree=tree, adaptive=False, confidence_threshold=0.0)
    vocab = strategy.network.draft_vocab
    assert vocab.numel() == 8192 and int(vocab.max()) < model.config.vocab_size
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is photosynthesis?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = {k: ids[k] for k in ("input_ids", "attention_mask")}
    ref = type(model).generate(model, **ids, max_new_tokens=40, do_sample=False)
    out = model.generate(**ids, max_new_tokens=40, do_sample=False, candidate_generator=strategy)
    assert out.tolist() == ref.tolist()
    with_vocab = hfs.last_stats(model)
    assert with_vocab.accepted_tokens > 0
    strategy.network.set_draft_vocab(None)
    out = model.generate(**ids, max_new_tokens=40, do_sample=False, candidate_generator=strategy)
    assert out.tolist() == ref.tolist()
    assert with_vocab.tau >= 0.9 * hfs.last_stats(model).tau  # the vocabulary keeps what the drafter gets right
    strategy.network.set_draft_vocab(vocab)
    assert torch.equal(strategy.network.draft_vocab, vocab)
