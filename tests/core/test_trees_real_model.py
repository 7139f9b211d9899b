"""Draft trees on the real default model (smollm2-135m-instruct from the offline registry): every tree drafter
identical to plain greedy, and the shipped EAGLE drafter's dynamic tree keeps more per forward than its chain."""

from __future__ import annotations

import copy

import pytest

import hf_speculative as hfs
from tests.conftest import stock_generate

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NEW = dict(do_sample=False, max_new_tokens=48)


def _inputs(tokenizer, text):
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(chat, return_tensors="pt")


def test_tree_drafters_equal_greedy_on_the_real_model(integration):
    model, tokenizer = integration
    hfs.enable(model)
    inputs = _inputs(tokenizer, "Rewrite in simpler words: the committee approved the new library budget, and the "
                                "new library budget will fund longer opening hours for the new library.")
    expected = stock_generate(model, **inputs, **NEW)
    tree = hfs.DynamicTree(nodes=16, depth=5, top_k=4)
    eagle = hfs.Eagle.from_pretrained("smollm2-135m-instruct", target=model, tree=tree, adaptive=False)
    draft = copy.deepcopy(model)
    hfs.disable(draft)
    strategies = {
        "lookup-tree": hfs.PromptLookup(tree=tree, adaptive=False),
        "eagle-tree": eagle,
        "hybrid-tree": hfs.Hybrid(hfs.PromptLookup(tree=tree, adaptive=False), eagle),
        "draft-model-tree": hfs.DraftModel(draft, tree=hfs.StaticTree([(0,), (1,), (0, 0), (0, 0, 0)]), adaptive=False,
                                           tokenizer=tokenizer, target_tokenizer=tokenizer),
    }
    for name, strategy in strategies.items():
        out = model.generate(**inputs, **NEW, candidate_generator=strategy)
        assert out.tolist() == expected.tolist(), (name, tokenizer.decode(out[0, inputs["input_ids"].shape[1]:]))
        stats = hfs.last_stats(model)
        assert stats.accepted_tokens > 0 and stats.target_forwards < stats.new_tokens, (name, stats)
    steps = hfs.last_stats(model).steps()  # the target drafting for itself: its rank-0 path is always kept
    assert {a for d, a in zip(steps["drafted"], steps["accepted"]) if d == 4} == {3}, steps


def test_the_shipped_eagle_keeps_more_per_forward_as_a_tree(integration):
    model, tokenizer = integration
    hfs.enable(model)
    inputs = _inputs(tokenizer, "Explain how a bicycle's gears work, in a short paragraph.")
    expected = stock_generate(model, **inputs, **NEW)
    chain = hfs.Eagle.from_pretrained("smollm2-135m-instruct", target=model, num_tokens=5, confidence_threshold=0.0,
                                      adaptive=False)
    tree = hfs.Eagle.from_pretrained("smollm2-135m-instruct", target=model, adaptive=False,
                                     tree=hfs.DynamicTree(nodes=32, depth=8, top_k=8))
    taus = {}
    for name, strategy in (("chain", chain), ("tree", tree)):
        assert model.generate(**inputs, **NEW, candidate_generator=strategy).tolist() == expected.tolist(), name
        taus[name] = hfs.last_stats(model).tau
    # (benchmarks/README.md, 60 Spec-Bench prompts: chain of 5 τ 1.47, 32 nodes 2.13)
    assert taus["tree"] > taus["chain"] + 0.2, taus
