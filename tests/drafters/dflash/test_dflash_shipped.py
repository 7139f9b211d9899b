"""The DFlash drafter shipped for smollm2-135m-instruct: it loads by name with its manifest and its draft vocabulary
(8,192 ids), drafts only inside that vocabulary and exactly (chain and tree) on the real model, and drafts as much
with the vocabulary as without it on a prompt."""

from __future__ import annotations

import json

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.drafters.dflash.drafter import PRETRAINED_DIR, pretrained_names
from tests.conftest import drafts_exactly_on_real_model

NAME = "smollm2-135m-instruct"


def test_the_shipped_drafter_carries_a_checked_vocabulary():
    assert NAME in pretrained_names()
    manifest = json.loads((PRETRAINED_DIR / NAME / "sha256sums.json").read_text())["sha256"]
    assert {"config.json", "model.safetensors", "draft_vocab.safetensors", "training.json"} <= set(manifest)


@pytest.mark.integration
# (the tree, 27-38 s on the real model: slow; DFlash's trees are exact on tiny models in test_dflash_drafter.py)
@pytest.mark.parametrize("tree", [None, pytest.param(hfs.DynamicTree(nodes=16), marks=pytest.mark.slow)],
                         ids=["chain", "tree"])
def test_the_shipped_drafter_drafts_exactly_inside_its_vocabulary(integration, tree):
    model, tokenizer = integration
    hfs.enable(model)
    strategy = hfs.DFlash.from_pretrained(NAME, target=model, tree=tree, adaptive=False, confidence_threshold=0.0)
    vocab = strategy.network.draft_vocab
    assert vocab.numel() == 8192 and int(vocab.max()) < model.config.vocab_size
    with_vocab = drafts_exactly_on_real_model(model, tokenizer, strategy)
    assert with_vocab.accepted_tokens > 0
    strategy.network.set_draft_vocab(None)
    without = drafts_exactly_on_real_model(model, tokenizer, strategy)
    assert with_vocab.tau >= 0.9 * without.tau  # the vocabulary keeps what the drafter gets right
    strategy.network.set_draft_vocab(vocab)
    assert torch.equal(strategy.network.draft_vocab, vocab)
