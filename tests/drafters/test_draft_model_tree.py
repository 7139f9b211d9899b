"""hfs.DraftModel(tree=...): a draft model's top guesses per depth as a tree, verified in our loop. The drafter
battery (greedy identity, EOS / max length / stop strings inside a draft, sampling) runs on ``"draft-model-tree"``
through ``tests/conftest.py``; these tests check the tree drafting itself."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_speculative as hfs
from hf_speculative import compat
from hf_speculative.core import kv_cache
from hf_speculative.drafters.draft_model.tree import model_tree_expander
from hf_speculative.core.verify import TreeAttentionError
from tests.conftest import ARCHS, PROMPT, build_model, prompt_inputs, sibling_model, stock_generate

DYNAMIC = hfs.DynamicTree(nodes=8, depth=4, top_k=3)
STATIC = hfs.StaticTree([(0,), (1,), (0, 0), (0, 0, 0), (1, 0)])


def _copy(model):
    clone = copy.deepcopy(model)
    hfs.disable(clone)
    return clone


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("shape", ["dynamic", "static"])
@pytest.mark.parametrize("drafter", ["sibling", "copy"])
def test_trees_equal_greedy(arch, shape, drafter, monkeypatch):
    from hf_speculative.core import loop

    runs = []
    monkeypatch.setattr("hf_speculative.core.entry.ladder", lambda *a, **k: runs.append(1) or loop.ladder(*a, **k))
    model = hfs.enable(build_model(arch))
    draft = sibling_model(model) if drafter == "sibling" else _copy(model)
    tree = DYNAMIC if shape == "dynamic" else STATIC
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30,
                         candidate_generator=hfs.DraftModel(draft, tree=tree, adaptive=False))
    assert out.tolist() == expected.tolist() and runs == [1]
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0
    if drafter == "copy" and shape == "static":
        # the target drafting for itself: its top guess is always right, so the rank-0 path (3 deep) is always kept
        steps = stats.steps()
        full = [a for d, a in zip(steps["drafted"], steps["accepted"]) if d == STATIC.size]
        assert len(full) >= 5 and set(full) == {3}, steps


@pytest.mark.parametrize("arch", ARCHS)
def test_expansions_equal_plain_forwards_along_each_branch(arch):
    """Each expanded node's log-probabilities equal a plain forward of the draft model over the prefix and the
    node's branch (masks, positions and the sliding window of the branch), and the cache is cropped back."""
    draft = build_model(arch, seed=5)
    verified = torch.tensor([PROMPT + [20, 21, 22]])  # longer than the tiny models' sliding window (8)
    cache = kv_cache.new_dynamic_cache()
    with torch.no_grad():
        draft(input_ids=verified, use_cache=True, **{compat.cache_kwarg(): cache})

        def logits_of(logits):
            return logits.float()

        raw, crop = model_tree_expander(draft, cache, logits_of)

        def expand(*args):  # the expander returns logits; the tree grower normalises them (after the processors)
            return torch.log_softmax(raw(*args), dim=-1)

        first = expand([0, 1], torch.tensor([30, 31]), [-1, -1])  # two children of the root
        second = expand([2, 3], torch.tensor([40, 41]), [0, 1])  # a child under each
        third = expand([4], torch.tensor([50]), [2])  # one deeper under the first branch
        crop()
        assert kv_cache.cache_length(cache) == verified.shape[1]

        def plain(branch):
            ids = torch.cat([verified, torch.tensor([branch])], dim=-1)
            return torch.log_softmax(draft(input_ids=ids).logits[0, -1].float(), dim=-1)

        expected = [plain([30]), plain([31]), plain([30, 40]), plain([31, 41]), plain([30, 40, 50])]
        got = [first[0], first[1], second[0], second[1], third[0]]
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_the_drafters_cache_holds_the_verified_text_between_steps():
    model = hfs.enable(build_model("llama"))
    seen = []
    strategy = hfs.DraftModel(_copy(model), tree=DYNAMIC, adaptive=False)
    open_ = strategy.open

    def opened(ctx):
        generator = open_(ctx)
        grow = generator.draft

        def spy(input_ids, plan):
            tree = grow(input_ids, plan)
            seen.append((kv_cache.cache_length(generator.cache), input_ids.shape[1]))
            return tree

        generator.draft = spy
        return generator

    object.__setattr__(strategy, "open", opened)
    model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=20, candidate_generator=strategy)
    assert seen and all(cached == length for cached, length in seen)


def test_adaptive_trees_follow_the_verification_cost():
    from hf_speculative.core.costs import verify_costs_for

    model = hfs.enable(build_model("llama"))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=24)
    draft = _copy(model)
    verify_costs_for(model, 32).fix([1.0 + 0.01 * k for k in range(33)])  # verification about free: trees pay
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24,
                         candidate_generator=hfs.DraftModel(draft, tree=DYNAMIC, draft_cost=0.01))
    assert out.tolist() == expected.tolist() and hfs.last_stats(model).drafted_tokens > 0
    # a drafter as dear as the target (its own price: the copy has the target's size) never pays
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24,
                         candidate_generator=hfs.DraftModel(draft, tree=DYNAMIC))
    assert out.tolist() == expected.tolist() and hfs.last_stats(model).drafted_tokens == 0
    verify_costs_for(model, 32).fix([1.0 + 2.0 * k for k in range(33)])  # every node costs two forwards: none pay
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24,
                         candidate_generator=hfs.DraftModel(draft, tree=DYNAMIC, draft_cost=0.01))
    assert out.tolist() == expected.tolist() and hfs.last_stats(model).drafted_tokens == 0


def test_bad_tree_and_attention_are_refused():
    model = hfs.enable(build_model("llama"))
    with pytest.raises(ValueError, match=r"DraftModel\(tree=.*hfs.DynamicTree"):
        hfs.DraftModel(sibling_model(model), tree=[(0,), (1,)])
    draft = sibling_model(model)
    draft.config._attn_implementation = "flash_attention_2"
    with pytest.raises(TreeAttentionError, match="flash_attention_2"):
        model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=5,
                       candidate_generator=hfs.DraftModel(draft, tree=DYNAMIC))
