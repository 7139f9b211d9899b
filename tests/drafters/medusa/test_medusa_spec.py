"""Medusa heads as a model's default drafter (``generation_config.candidate_generator``): saved beside the model
(heads in ``medusa/``, the tree in the options), loaded back, drafting the same; shipped heads are named."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

import hf_speculative as hfs
from hf_speculative.hf import spec
from tests.conftest import build_model, prompt_inputs, stock_generate
from tests.drafters.medusa.conftest import random_heads

GREEDY = dict(do_sample=False, max_new_tokens=30)


def test_round_trip_with_a_tree(tmp_path):
    model = hfs.enable(build_model("llama"))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    heads = random_heads(model)
    strategy = hfs.Medusa(heads, tree=hfs.StaticTree([(0,), (1,), (0, 0)]), adaptive=False, confidence_threshold=0.0)
    model.generation_config.candidate_generator = strategy
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "generation_config.json").read_text())["candidate_generator"]
    assert written["method"] == "medusa" and written["path"] == "medusa"
    assert written["options"]["tree"] == {"static_tree": [[0], [1], [0, 0]]}
    assert set(written["sha256"]) == {"config.json", "model.safetensors"}
    reloaded = hfs.enable(AutoModelForCausalLM.from_pretrained(tmp_path).eval())
    restored = reloaded.generation_config.candidate_generator
    assert type(restored) is hfs.Medusa and restored.tree == strategy.tree and not restored.adaptive
    assert all(torch.equal(a, b) for a, b in zip(restored.heads.state_dict().values(), heads.state_dict().values()))
    assert reloaded.generate(**prompt_inputs(), **GREEDY).tolist() == ref.tolist()
    assert hfs.last_stats(reloaded).drafted_tokens > 0
    assert spec.options_of(restored) == spec.options_of(strategy)
