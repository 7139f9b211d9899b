"""The Medusa heads shipped for smollm2-135m-instruct: they load by name with their manifest and calibrated tree,
draft exactly (greedy, chain and tree) on the real model, and their recorded validation is plausible."""

from __future__ import annotations

import json

import pytest

import hf_speculative as hfs
from hf_speculative.drafters.medusa.drafter import PRETRAINED_DIR, pretrained_names
from tests.conftest import drafts_exactly_on_real_model

NAME = "smollm2-135m-instruct"


def test_shipped_heads_are_small_with_a_manifest_and_a_tree():
    assert NAME in pretrained_names()
    folder = PRETRAINED_DIR / NAME
    manifest = json.loads((folder / "sha256sums.json").read_text())["sha256"]
    assert {"config.json", "model.safetensors", "tree.json", "training.json"} <= set(manifest)
    assert (folder / "model.safetensors").stat().st_size < 4_000_000  # the target's lm_head is not stored
    config = json.loads((folder / "config.json").read_text())
    assert config["lm_head"] == "target" and config["hidden_size"] == 576
    validation = json.loads((folder / "training.json").read_text())["last_validation"]
    assert len(validation["val_top1"]) == config["num_heads"] and validation["val_top1"][0] > 0.2


@pytest.mark.integration
# (its chain of heads, 13-20 s on the real model: slow; the calibrated tree, what the heads ship with, stays fast)
@pytest.mark.parametrize("tree", [pytest.param(None, marks=pytest.mark.slow), "calibrated"])
def test_shipped_heads_draft_exactly_on_the_real_model(integration, tree):
    model, tokenizer = integration
    hfs.enable(model)
    strategy = hfs.Medusa.from_pretrained(NAME, target=model, tree=tree, adaptive=False)
    stats = drafts_exactly_on_real_model(model, tokenizer, strategy)
    assert stats.accepted_tokens > 0 and stats.tau > 1.2
