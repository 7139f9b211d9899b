"""EAGLE drafting trees in our loop: EAGLE-2 dynamic trees and static rank-path trees, identical to greedy;
the tree's top-guess branch is the chain the drafter drafts; a branch's child is the drafter's guess after it."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.stopping_criteria import MaxLengthCriteria, StoppingCriteriaList

import hf_speculative as hfs
from hf_speculative.core.call import CallContext
from tests.core.loop_harness import run
from hf_speculative.core.stats import SpeculativeStats
from hf_speculative.core.tree_shapes import DynamicTree, StaticTree
from tests.conftest import ARCHS, PROMPT, build_model, draft_once, fit_eagle, prompt_inputs, random_eagle, stock_generate

NEW = 40


def loop_generate(target, strategy, new=NEW):
    max_length = len(PROMPT) + new
    stopping = StoppingCriteriaList([MaxLengthCriteria(max_length)])
    ctx = CallContext(target, GenerationConfig(max_length=max_length, do_sample=False), None, stopping,
                      SpeculativeStats(), prompt_length=len(PROMPT))
    drafter = strategy.open(ctx)
    try:
        return run(target, torch.tensor([PROMPT]), drafter, stopping_criteria=stopping, stats=ctx.stats,
                   max_length=max_length), drafter
    finally:
        drafter.close()


@pytest.fixture(scope="module", params=[1, 3])
def trained(request):
    target = build_model("llama", layers=3, init=0.3).requires_grad_(False)
    text = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    net, _, _ = fit_eagle(target, request.param, text, iterations=250, unroll=3)
    return target, net.eval().requires_grad_(False), text[0].tolist()


SHAPES = {
    "dynamic": DynamicTree(nodes=10, depth=4, top_k=3),
    "static": StaticTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("adaptive", [False, True])
def test_trained_drafter_trees_are_exact_and_kept(trained, shape, adaptive):
    target, net, text = trained
    result, _ = loop_generate(target, hfs.Eagle(net, tree=SHAPES[shape], adaptive=adaptive))
    assert result.sequences[0].tolist() == text
    if not adaptive:
        assert result.stats.tau > 2.0  # an over-fitted drafter's trees are kept several tokens deep


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_random_drafter_trees_are_exact(arch, version, shape):
    target = build_model(arch)
    expected = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    result, _ = loop_generate(target, hfs.Eagle(random_eagle(target, version=version), tree=SHAPES[shape],
                                                adaptive=False))
    assert result.sequences[0].tolist() == expected[0].tolist()
    assert result.stats.drafted_tokens >= 5 * (result.stats.target_forwards - 1)


def _opened(target, net, shape, verified):
    """A generator after the prefill forward over ``verified[:, :-1]`` (features recorded), ready to draft."""
    max_length = len(PROMPT) + NEW
    strategy = hfs.Eagle(net, num_tokens=3, confidence_threshold=0.0, adaptive=False, tree=shape)
    ctx = CallContext(target, GenerationConfig(max_length=max_length, do_sample=False), None,
                      StoppingCriteriaList([MaxLengthCriteria(max_length)]), SpeculativeStats())
    gen = strategy.open(ctx)
    with torch.no_grad():
        target(input_ids=verified[:, :-1])
    gen.features.follow(verified.shape[1], 0, 0)
    return gen


def test_top_branch_is_the_chain_and_children_follow_their_branch(trained):
    """The tree's rank path (0, 0, 0) holds the chain the drafter drafts, and the child (1, 0) of the
    runner-up is the drafter's top guess after the runner-up."""
    target, net, text = trained
    verified = torch.tensor([text[: len(PROMPT) + 6]])
    gen = _opened(target, net, None, verified)
    chain = draft_once(gen, verified, 3).tokens.tolist()
    gen.close()
    gen = _opened(target, net, StaticTree([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]), verified)
    tree = draft_once(gen, verified, 8)
    gen.close()
    assert tree.parents.tolist() == [-1, -1, 0, 1, 2]
    assert [int(tree.tokens[i]) for i in (0, 2, 4)] == chain
    gen = _opened(target, net, None, verified)  # by hand: one drafter step after the runner-up token
    with torch.no_grad():
        hidden, _ = gen._catch_up(verified)  # [H]
        step = net(gen.embed(tree.tokens[1:2][None]), hidden[None, None], torch.tensor([[verified.shape[1] - 1]]),
                   gen.cache, fused=False)
    assert int(tree.tokens[3]) == int(gen._widen(net.draft_logits(step[0, -1], gen.head)).argmax())
    gen.close()


def test_bad_tree_option_is_named():
    target = build_model("llama")
    with pytest.raises(ValueError, match=r"Eagle\(tree=8\): use hfs.DynamicTree"):
        hfs.Eagle(random_eagle(target), tree=8)


@pytest.mark.parametrize("version", [1, 3])
def test_expansions_equal_chain_steps_along_each_branch(version):
    """With a random drafter (every input matters): each expanded node's log-probabilities equal those of a
    chain drafted along its branch, so masks, positions and parent hidden states are the branch's."""
    from hf_speculative.drafters.eagle.tree_drafting import tree_expander

    target = build_model("llama")
    net = random_eagle(target, version=version)
    verified = torch.tensor([PROMPT + [20, 21, 22]])
    gen = _opened(target, net, None, verified)
    root_position = verified.shape[1] - 1
    with torch.no_grad():
        hidden = gen._catch_up(verified)[0][None, None]  # [1, 1, H]
        n_true = gen.n_true

        def logits_of(h):
            return gen._to_target_vocab(net.draft_logits(h, gen.head), gen._target_ids)

        raw = tree_expander(net, gen.embed, gen.cache, n_true, root_position, hidden[0, -1], logits_of)

        def expand(*args):  # the expander returns logits; the tree grower normalises them (after the processors)
            return torch.log_softmax(raw(*args), dim=-1)

        first = expand([0, 1], torch.tensor([30, 31]), [-1, -1])  # two children of the root
        second = expand([2, 3], torch.tensor([40, 41]), [0, 1])  # a child under each
        third = expand([4], torch.tensor([50]), [2])  # and one deeper under the first branch

        def chain(tokens):
            gen.cache.crop(n_true)
            h, out = hidden, []
            for depth, token in enumerate(tokens):
                h = net(gen.embed(torch.tensor([[token]])), h, torch.tensor([[root_position + depth]]), gen.cache,
                        fused=False)
                out.append(torch.log_softmax(logits_of(h[0, -1]).float(), -1))
            return out

        a, b = chain([30, 40, 50]), chain([31, 41])
    torch.testing.assert_close(first[0], a[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second[0], a[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(third[0], a[2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first[1], b[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second[1], b[1], atol=1e-5, rtol=1e-5)
    gen.close()


@pytest.mark.parametrize("device_like", ["cpu", "gpu"])
def test_the_cost_model_picks_chains_or_trees_by_the_devices_costs(trained, device_like):
    """Adaptive EAGLE trees: where each verified token costs 30% of a forward, the drafter's own chain is chosen
    (one-branch drafts, but for trying each tree size once); where it costs 1% and drafting is cheap, wide trees.
    Exact either way."""
    from hf_speculative.core.costs import forget_costs, verify_costs_for

    target, net, text = trained
    per_token = 0.3 if device_like == "cpu" else 0.01
    verify_costs_for(target, 64).fix([1.0 + per_token * k for k in range(65)])
    try:
        strategy = hfs.Eagle(net, tree=DynamicTree(nodes=16, depth=4, top_k=4), draft_cost=0.02)
        drafts = []
        generator_of = strategy.open

        def opened(ctx):
            generator = generator_of(ctx)
            grow = generator.draft
            generator.draft = lambda ids, plan: drafts.append(grow(ids, plan)) or drafts[-1]
            return generator

        object.__setattr__(strategy, "open", opened)
        result, _ = loop_generate(target, strategy)
    finally:
        forget_costs(target)
    assert result.sequences[0].tolist() == text
    drafted = [tree for tree in drafts if tree.size]
    assert drafted and result.stats.tau > 1.5
    if device_like == "cpu":  # (each tree size may be tried once: unmeasured sizes are valued optimistically)
        assert sum(not tree.is_chain() for tree in drafted) <= 5 < sum(tree.is_chain() for tree in drafted)
    else:
        assert sum(not tree.is_chain() for tree in drafted) > len(drafted) / 2
