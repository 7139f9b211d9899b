"""Chain drafters (and a user's raw transformers ``CandidateGenerator``) in our loop: a chain is a one-branch tree,
identical to plain greedy, with EOS and the length limit inside accepted chains."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import ARCHS, PROMPT, OracleCandidateGenerator, build_model, sibling_model, stock_generate
from transformers import GenerationConfig
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

import hf_speculative as hfs
from hf_speculative.core.call import CallContext
from hf_speculative.drafters.generator import ExternalCandidateGenerator
from hf_speculative.core.budget import DraftBudget
from tests.core.loop_harness import run
from hf_speculative.core.stats import SpeculativeStats


def loop_generate(model, strategy_or_raw, max_new_tokens: int, eos=None):
    max_length = len(PROMPT) + max_new_tokens
    config = GenerationConfig(max_length=max_length, do_sample=False, eos_token_id=eos)
    stopping = StoppingCriteriaList([MaxLengthCriteria(max_length)])
    if eos is not None:
        stopping.append(EosTokenCriteria(eos))
    ctx = CallContext(model, config, None, stopping, SpeculativeStats(), prompt_length=len(PROMPT))
    if isinstance(strategy_or_raw, hfs.DraftStrategy):
        drafter = strategy_or_raw.open(ctx)
    else:
        drafter = ExternalCandidateGenerator(ctx, strategy_or_raw)
    try:
        result = run(model, torch.tensor([PROMPT]), drafter, stopping_criteria=stopping, stats=ctx.stats,
                     max_length=max_length)
    finally:
        drafter.close()
    return result


def greedy(model, max_new_tokens, eos=None):
    ids = torch.tensor([PROMPT])
    return stock_generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=max_new_tokens, eos_token_id=eos)[0].tolist()


def strategies(model, reference):
    return {
        "prompt-lookup": hfs.PromptLookup(),
        "prompt-lookup-fixed": hfs.PromptLookup(num_tokens=4, adaptive=False),
        "draft-model": hfs.DraftModel(sibling_model(model), adaptive=False),
        "draft-model-copy": hfs.DraftModel(_copy(model), adaptive=False),
        "raw-oracle": OracleCandidateGenerator(reference, num_tokens=5),
    }


def _copy(model):
    clone = sibling_model(model)
    clone.load_state_dict(model.state_dict())
    return clone


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["prompt-lookup", "prompt-lookup-fixed", "draft-model", "draft-model-copy",
                                  "raw-oracle"])
@pytest.mark.parametrize("max_new_tokens", [1, 9, 30])
def test_chain_drafters_in_our_loop_equal_greedy(arch, name, max_new_tokens):
    model = build_model(arch)
    reference = greedy(model, 40)
    strategy = strategies(model, reference)[name]
    result = loop_generate(model, strategy, max_new_tokens)
    assert result.sequences[0].tolist() == reference[: len(PROMPT) + max_new_tokens]
    if name in ("draft-model-copy", "raw-oracle") and max_new_tokens == 30:
        assert result.stats.accepted_tokens == result.stats.drafted_tokens >= 15  # a perfect drafter: all kept
    if name == "raw-oracle" and max_new_tokens == 30:
        assert result.stats.target_forwards <= 6  # 5 drafted + 1 own token per forward


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "qwen2"])
def test_eos_inside_an_accepted_chain(arch):
    model = build_model(arch)
    free = greedy(model, 40)
    eos = free[len(PROMPT) + 3]
    expected = greedy(model, 40, eos=eos)
    result = loop_generate(model, OracleCandidateGenerator(free, num_tokens=8), 40, eos=eos)
    assert result.sequences[0].tolist() == expected


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("max_new_tokens", [3, 30])
def test_prompt_lookup_trees_equal_greedy(arch, adaptive, max_new_tokens):
    from hf_speculative.core.tree_shapes import DynamicTree

    model = build_model(arch)
    reference = greedy(model, 40)
    strategy = hfs.PromptLookup(tree=DynamicTree(nodes=12, depth=5, top_k=3), adaptive=adaptive)
    result = loop_generate(model, strategy, max_new_tokens)
    assert result.sequences[0].tolist() == reference[: len(PROMPT) + max_new_tokens]
    if not adaptive and max_new_tokens == 30:
        assert result.stats.drafted_tokens > 0


def test_prompt_lookup_tree_branches_on_disagreeing_matches():
    from hf_speculative.core.tree_shapes import DynamicTree

    model = build_model("llama")
    ctx = CallContext(model, GenerationConfig(max_length=64), None, None, SpeculativeStats())
    generator = hfs.PromptLookup(tree=DynamicTree(nodes=8, depth=3, top_k=4), adaptive=False).open(ctx)
    plan = DraftBudget(generator.sizing).plan(8)
    tree = generator.draft(torch.tensor([[11, 12, 17, 17, 13, 11, 12, 18, 16, 10, 11, 12]]), plan)
    assert sorted(tree.tokens[tree.parents == -1].tolist()) == [17, 18]  # two matches, two branches
    assert tree.size == 6 and not tree.is_chain()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("max_new_tokens", [7, 8])
def test_a_forward_the_loop_verified_without_asking_is_no_draft_of_the_drafter(arch, max_new_tokens):
    """With one token left before the length limit the loop verifies an empty tree without asking the drafter;
    the drafter observes that forward as an empty draft, not as its previous chain again (Medusa's feature queue
    raised IndexError on the stale count). Chains of one perfect guess: the prompt's forward gives one token,
    each step two, so an even ``max_new_tokens`` ends on such a forward."""
    from tests.drafters.medusa.conftest import OracleHeads

    model = build_model(arch)
    reference = torch.tensor([greedy(model, 40)])
    seen = []
    strategy = hfs.Medusa(OracleHeads(model, reference), num_tokens=1, adaptive=False, confidence_threshold=0.0)
    original = type(strategy).open

    def recording_open(self, ctx):
        generator = original(self, ctx)
        observe = generator.observe
        generator.observe = lambda ids, tree, verdict, scores: (seen.append(tree.size),
                                                                observe(ids, tree, verdict, scores))
        return generator

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(strategy), "open", recording_open)
        result = loop_generate(model, strategy, max_new_tokens)
    assert result.sequences[0].tolist() == reference[0, : len(PROMPT) + max_new_tokens].tolist()
    assert sum(seen) == result.stats.drafted_tokens == result.stats.accepted_tokens
    assert seen[-1] == (0 if max_new_tokens % 2 == 0 else 1)


def _wrong_copy(model):
    """The target itself with its output rows rolled by one: its guess after any verified text is the target's next
    token plus one (modulo the vocabulary), so every draft is rejected at its first token."""
    clone = _copy(model)
    with torch.no_grad():
        clone.get_output_embeddings().weight.copy_(torch.roll(model.get_output_embeddings().weight, 1, dims=0))
    return clone


def expected_lengths(steps: dict, k: int, max_new_tokens: int) -> list[int]:
    """What a fixed budget of ``k`` drafts at each recorded step: ``k``, or the room left before the length limit
    (the target's own token takes one place), from the lengths the accepted tokens give."""
    length, max_length, expected = len(PROMPT), len(PROMPT) + max_new_tokens, []
    for accepted in steps["accepted"]:
        expected.append(max(min(k, max_length - length - 1), 0))
        length += accepted + 1
    return expected


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("drafter", ["draft model, never accepted", "draft model, always accepted", "random EAGLE"])
def test_a_fixed_budget_drafts_its_whole_chain_at_every_step(arch, drafter):
    """``adaptive=False`` fixes a confidence chain's length: ``num_tokens`` at every step, whatever earlier drafts got,
    fewer only where the length limit leaves less room. (The chain rule used to shorten the longest draft by one after
    each rejected draft even so: drafts never accepted fell to one token a step after the first few.)"""
    from tests.conftest import random_eagle

    model, k, max_new_tokens = build_model(arch), 5, 30
    reference = greedy(model, max_new_tokens)
    if drafter == "random EAGLE":  # the case the chain rule hid on real prompts: EAGLE's chains, mostly rejected
        strategy = hfs.Eagle(random_eagle(model), num_tokens=k, adaptive=False)  # its default threshold, not applied
    else:
        draft = _wrong_copy(model) if drafter.endswith("never accepted") else _copy(model)
        strategy = hfs.DraftModel(draft, num_tokens=k, adaptive=False)
    result = loop_generate(model, strategy, max_new_tokens)
    assert result.sequences[0].tolist() == reference
    steps = result.stats.steps()
    expected = expected_lengths(steps, k, max_new_tokens)
    if drafter == "random EAGLE":
        expected[0] = 0  # the prompt's forward: no target features to draft from yet
    assert steps["drafted"] == expected
    if drafter.endswith("never accepted"):
        assert result.stats.accepted_tokens == 0 and len(steps["drafted"]) == max_new_tokens
    elif drafter.endswith("always accepted"):
        assert steps["accepted"] == steps["drafted"] and max(steps["drafted"]) == k
