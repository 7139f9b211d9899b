"""Prompt lookup drafting whole copies: the alignment it follows, how far a copy reaches, the per-token sizing rule,
and generations that copy long spans, compared with plain greedy token for token (EOS, ``max_new_tokens`` and stop
strings inside a long accepted copy, in both loops) with the target's forwards counted."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

import hf_speculative as hfs
from hf_speculative.core.budget import DraftBudget, Sizing, best_survival_length
from hf_speculative.core.costs import VerifyCostModel, forget_costs, verify_costs_for
from hf_speculative.core.policy import best_length
from hf_speculative.core.call import CallContext
from hf_speculative.drafters.prompt_lookup.copying import (
    MAX_MATCH,
    CopyTracker,
    best_alignment,
    copied,
    copy_key,
    copy_keys,
    copy_prior,
    copy_reach,
    match_length,
)
from tests.conftest import PROMPT, VOCAB, build_model, char_tokenizer, prompt_inputs, stock_generate

CPU_RATIOS = [1.0] + [1.1 + 0.12 * k for k in range(1, 65)]  # the cost model's CPU prior: a verified token ~12%


def costs(ratios=CPU_RATIOS) -> VerifyCostModel:
    model = VerifyCostModel(64)
    model.fix(list(ratios))
    return model


# -- the alignment ---------------------------------------------------------------------------------
def test_match_length_counts_the_tokens_before_start_that_end_the_text():
    text = [9, 1, 2, 3, 4, 7, 2, 3, 4]
    assert match_length(text, 5) == 3  # (2, 3, 4) before position 5 ends the text; 1 != 7 stops it
    assert match_length(text, 1) == 0  # 9 != 4
    assert match_length([5] * 100, 99) == MAX_MATCH  # counted up to the cap
    assert match_length([1, 2, 1, 2], 2, limit=1) == 1


def test_copy_keys_buckets_priors_and_reach():
    assert [copy_key(m) for m in (1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 64)] == [1, 2, 3, 4, 4, 8, 8, 16, 16, 32, 32]
    assert copy_keys(6, 4) == [4, 4, 8, 8]  # token j continues a copy of 6 + j matched tokens
    assert copy_prior(1) == 0.6 and copy_prior(2) == 2 / 3 and copy_prior(4) == 0.8 and copy_prior(32) == 32 / 33
    assert [copy_reach(m, 10, 64) for m in (1, 10, 21, 43, 64)] == [10, 10, 21, 43, 64]  # doubling when accepted
    assert copy_reach(50, 10, 10) == 10  # copy_tokens=num_tokens: no growth


def test_a_copy_running_into_the_end_of_the_text_goes_on_with_its_period():
    assert copied([1, 2, 3, 1, 2], 3, 6) == [1, 2, 1, 2, 1, 2]  # period 2
    assert copied([5, 7, 7], 2, 4) == [7, 7, 7, 7]
    assert copied([1, 2, 3, 4, 5], 1, 3) == [2, 3, 4]  # within the text: the text


def test_the_carried_copy_wins_over_a_more_recent_shorter_match():
    source = [10, 11, 12, 13, 14, 15, 16, 17]
    text = source + [50, 13, 99, 51] + source[:4]  # the copy of `source` is under way; (13,) also recurs at 9
    tracker = CopyTracker()
    tracker.drafted_from(4, len(text))  # the step before drafted source[4:] after source[:4]
    text = text + [14, 15]  # two tokens verified since, both following the source
    carried = tracker.candidate(text)
    assert carried == (6, 6)  # source[6] next, after 6 matching tokens
    assert best_alignment(text, (1, 9), carried) == (6, 6)  # the index's 1-gram match is shorter
    diverged = text + [77]
    assert tracker.candidate(diverged) is None  # the last token left the source: no longer a candidate


def test_the_longer_match_wins_and_a_tie_keeps_the_carried_copy():
    text = [1, 2, 3, 4, 8, 3, 4, 9, 1, 2, 3, 4]
    assert best_alignment(text, (2, 7), None) == (7, 2)
    assert best_alignment(text, (2, 7), (4, 4)) == (4, 4)  # further back: the copy of (1, 2, 3, 4)
    assert best_alignment(text, (2, 7), (7, 2)) == (7, 2)  # a tie: the carried one (the same here)
    assert best_alignment(text, None, None) is None


# -- the sizing rule -------------------------------------------------------------------------------
def test_constant_rates_size_as_best_length():
    for rate in (0.3, 0.6, 0.8, 0.95):
        assert best_survival_length(costs(), [rate] * 40) == best_length(costs(), rate, 40)


def test_a_copy_that_matched_further_drafts_longer():
    budget = DraftBudget(Sizing(costs(), tokens=64, rule="keyed"))
    short = budget.plan(64).copy_length(copy_keys(2, 64), copy_prior)
    long = budget.plan(64).copy_length(copy_keys(32, 64), copy_prior)
    assert 0 < short < long, (short, long)


def test_each_key_learns_from_its_own_tokens():
    budget = DraftBudget(Sizing(costs(), tokens=64, rule="keyed"))
    plan = budget.plan(64)
    k = plan.copy_length(copy_keys(3, 8), copy_prior)  # keys 3, 4, 4, 4, 4, 8, 8, 8
    assert plan.keys == tuple(copy_keys(3, 8))[:k] and k >= 6
    before = {key: (e.accepted, e.rejected) for key, e in budget.estimates.items()}
    tree = hfs_chain(k)
    budget.verified(plan, tree, verdict(accepted=5), None)  # the 6th token (key 8) was rejected
    after = budget.estimates
    assert after[3].accepted == before[3][0] * 0.9 + 1 and after[3].rejected == before[3][1] * 0.9
    assert after[4].accepted == before[4][0] * 0.9 + 4 and after[4].rejected == before[4][1] * 0.9
    assert after[8].accepted == before[8][0] * 0.9 and after[8].rejected == before[8][1] * 0.9 + 1


def test_a_fixed_budget_drafts_every_key_given():
    budget = DraftBudget(Sizing(costs([1.0] + [5.0] * 64), tokens=10, rule="keyed", adaptive=False))
    assert budget.plan(64).copy_length(copy_keys(1, 64)) == 10  # tokens caps it, not the (huge) costs
    assert budget.plan(4).copy_length(copy_keys(1, 64)) == 4  # nor the room


def hfs_chain(k: int):
    from hf_speculative.core.tree import DraftTree

    return DraftTree.chain(torch.arange(k))


def verdict(accepted: int):
    from hf_speculative.core.tree import Verdict

    return Verdict(tuple(range(accepted)), 0)


# -- driving the generator -------------------------------------------------------------------------
def open_generator(strategy: hfs.PromptLookup, ratios=CPU_RATIOS):
    ctx = CallContext(target=None, generation_config=GenerationConfig(do_sample=False, max_length=100_000),
                      logits_processor=None, stopping_criteria=None, stats=hfs.SpeculativeStats())
    generator = strategy.open(ctx)
    generator.sizing.costs.fix(list(ratios))
    return generator


def copy_steps(strategy: hfs.PromptLookup, source: list[int], lead: int = 4) -> list[int]:
    """The draft lengths of the steps that copy ``source`` whole after its first ``lead`` tokens (the target
    follows the source exactly; each step keeps the accepted tokens and the target's own)."""
    generator = open_generator(strategy)
    text = source + [0] + source[:lead]
    goal = source + [0] + source + [1]
    lengths = []
    while len(text) < len(goal):
        draft = generator.get_candidates(torch.tensor([text]))[0][0, len(text):].tolist()
        accepted = 0
        while accepted < min(len(draft), len(goal) - len(text)) and draft[accepted] == goal[len(text) + accepted]:
            accepted += 1
        text = goal[: len(text) + accepted + 1]
        generator.update_candidate_strategy(torch.tensor([text]), torch.empty(0), accepted)
        lengths.append(len(draft))
    return lengths


def test_a_whole_copy_takes_doubling_drafts_and_fewer_steps():
    source = list(range(10, 150))  # 140 distinct tokens, copied whole
    grown = copy_steps(hfs.PromptLookup(copy_tokens=64), source)
    capped = copy_steps(hfs.PromptLookup(copy_tokens=10), source)
    assert max(capped) <= 10 and max(grown) > 32, (grown, capped)
    assert all(b >= a for a, b in zip(grown[1:-2], grown[2:-1])), grown  # a copy that is accepted keeps growing
    assert len(grown) < len(capped) - 3, (grown, capped)  # counted in steps (target forwards)


def test_copy_tokens_is_checked():
    with pytest.raises(ValueError, match=r"PromptLookup\(num_tokens=12, copy_tokens=8\): need copy_tokens >= "):
        hfs.PromptLookup(num_tokens=12, copy_tokens=8)
    with pytest.raises(ValueError, match="copy_tokens"):
        hfs.PromptLookup(copy_tokens=65)
    assert hfs.PromptLookup(num_tokens=7).draft_budget() == 15  # the default: 16 rows verify it (the CPU kernel's)
    assert hfs.PromptLookup(num_tokens=20).draft_budget() == 20  # never below num_tokens
    assert hfs.PromptLookup(num_tokens=7, copy_tokens=64).draft_budget() == 64
    assert hfs.PromptLookup(num_tokens=7, adaptive=False).draft_budget() == 7


# -- generations that copy long spans --------------------------------------------------------------
# The tiny random Qwen2's greedy text (no EOS) falls into a loop of 8 tokens for about 70 tokens from its 15th new
# token on: a prompt that holds a few periods of it has an answer that copies the prompt for tens of tokens.
LOOP_PROMPT_TOKENS = len(PROMPT) + 50


@pytest.fixture(scope="module")
def looping():
    model = build_model("qwen2")
    free = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=120, eos_token_id=None)[0].tolist()
    prompt = free[:LOOP_PROMPT_TOKENS]
    period = free[LOOP_PROMPT_TOKENS - 8: LOOP_PROMPT_TOKENS]
    assert free[LOOP_PROMPT_TOKENS: LOOP_PROMPT_TOKENS + 24] == period * 3, "the model's greedy text no longer loops"
    hfs.enable(model)
    yield model, prompt, free
    forget_costs(model)


def fixed_costs(model, ratios) -> None:
    forget_costs(model)
    verify_costs_for(model, 64).fix(list(ratios))


def identical(model, prompt, strategy, loop, **kwargs):
    """The call's statistics after checking that it wrote plain greedy's text."""
    ref = stock_generate(model, **prompt_inputs(prompt), do_sample=False, **kwargs)
    out = model.generate(**prompt_inputs(prompt), do_sample=False, candidate_generator=strategy,
                         speculative_loop=loop, **kwargs)
    assert out.tolist() == ref.tolist()
    return ref[0, len(prompt):].tolist(), hfs.last_stats(model)


LOOPS = ["hf_speculative", "transformers"]
CHEAP = [1.0 + 0.01 * k for k in range(65)]  # a GPU-like profile: long copies pay from the first step


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("ratios", [CPU_RATIOS, CHEAP], ids=["cpu", "cheap"])
def test_long_copies_are_exact(looping, loop, ratios):
    model, prompt, _ = looping
    fixed_costs(model, ratios)
    new, stats = identical(model, prompt, hfs.PromptLookup(), loop, max_new_tokens=60, eos_token_id=None)
    assert len(new) == 60 and max(stats.steps()["drafted"]) > 10, stats.steps()  # past num_tokens: a copy's reach


@pytest.mark.parametrize("loop", LOOPS)
def test_eos_inside_a_long_accepted_copy(looping, loop):
    model, prompt, free = looping
    fixed_costs(model, CHEAP)
    eos = free[LOOP_PROMPT_TOKENS + 5]  # the 6th token of the copied loop
    new, stats = identical(model, prompt, hfs.PromptLookup(), loop, max_new_tokens=60, eos_token_id=eos)
    assert new == free[LOOP_PROMPT_TOKENS: LOOP_PROMPT_TOKENS + 6]  # stopped at it
    steps = stats.steps()
    if loop == "hf_speculative":  # the whole draft was verified and the text ends inside it
        assert steps["drafted"][0] > 10 and steps["accepted"][0] >= 5, steps
    else:  # transformers' loop checks stops only after a block: the draft was cut before the stopping token
        assert steps["drafted"][0] == 5, steps


@pytest.mark.parametrize("loop", LOOPS)
def test_max_new_tokens_inside_a_long_accepted_copy(looping, loop):
    model, prompt, free = looping
    fixed_costs(model, CHEAP)
    new, stats = identical(model, prompt, hfs.PromptLookup(), loop, max_new_tokens=13, eos_token_id=None)
    assert new == free[LOOP_PROMPT_TOKENS: LOOP_PROMPT_TOKENS + 13]
    assert stats.target_forwards <= 2 and max(stats.steps()["drafted"]) >= 12, stats.steps()


@pytest.mark.parametrize("loop", LOOPS)
def test_stop_string_inside_a_long_accepted_copy(looping, loop):
    model, prompt, free = looping
    fixed_costs(model, CHEAP)
    tokenizer = char_tokenizer()
    stop = tokenizer.decode(free[LOOP_PROMPT_TOKENS + 6: LOOP_PROMPT_TOKENS + 8])  # two tokens of the copied loop
    new, stats = identical(model, prompt, hfs.PromptLookup(), loop, max_new_tokens=60, eos_token_id=None,
                           stop_strings=[stop], tokenizer=tokenizer)
    assert new == free[LOOP_PROMPT_TOKENS: LOOP_PROMPT_TOKENS + 8]
    if loop == "hf_speculative":
        assert stats.steps()["drafted"][0] > 10, stats.steps()


class ForwardCounter:
    """Counts the target's forwards (a pre-hook), whichever loop runs them."""

    def __init__(self, model):
        self.count = 0
        self.handle = model.register_forward_pre_hook(self.hook)

    def hook(self, module, args):
        self.count += 1


def forwards(model, prompt, settings=None, **kwargs) -> int:
    """The target's forwards in one call that copies (``settings``: the call's; default 60 new tokens, no EOS),
    after checking its text against plain greedy's."""
    settings = settings or dict(max_new_tokens=60, eos_token_id=None)
    counter = ForwardCounter(model)
    try:
        ref = stock_generate(model, **prompt_inputs(prompt), do_sample=False, **settings)
        counter.count = 0
        out = model.generate(**prompt_inputs(prompt), do_sample=False, **settings, **kwargs)
    finally:
        counter.handle.remove()
    assert out.tolist() == ref.tolist()
    return counter.count


def test_a_copy_takes_fewer_target_forwards_than_capped_drafts_and_transformers_lookup(looping):
    """Counted, not timed, at the CPU prior's costs (fixed, so the rule decides the same on every run)."""
    model, prompt, free = looping
    fixed_costs(model, CPU_RATIOS)
    # an EOS the text never reaches (transformers 4.x's own lookup needs one)
    settings = dict(max_new_tokens=60, eos_token_id=min(set(range(VOCAB)) - set(free)))
    grown = forwards(model, prompt, settings, candidate_generator=hfs.PromptLookup(copy_tokens=64))
    capped = forwards(model, prompt, settings, candidate_generator=hfs.PromptLookup(copy_tokens=10))
    theirs = forwards(model, prompt, settings, prompt_lookup_num_tokens=10)
    assert grown < capped and grown < theirs, (grown, capped, theirs)


@pytest.mark.slow
def test_the_apps_context_answer_takes_no_more_forwards_than_transformers_lookup(integration):
    """The demo app's "answer from a context" example on the real model: its answer copies a sentence of the context.
    Counted at the CPU prior's fixed costs, so that the count does not depend on the machine's load."""
    from hf_speculative.app.examples import EXAMPLES
    from hf_speculative.tooling.prompting import encode_prompt

    model, tokenizer = integration
    hfs.enable(model)
    try:
        fixed_costs(model, CPU_RATIOS)
        prompt = encode_prompt(tokenizer, EXAMPLES["answer from a context"])[0].tolist()
        app = {"max_new_tokens": 128, "pad_token_id": tokenizer.pad_token_id}  # the app's default length, its EOS
        grown = forwards(model, prompt, app, candidate_generator=hfs.PromptLookup(copy_tokens=64))
        capped = forwards(model, prompt, app, candidate_generator=hfs.PromptLookup(copy_tokens=10))
        theirs = forwards(model, prompt, app, prompt_lookup_num_tokens=10)
    finally:
        forget_costs(model)
    assert grown <= theirs and grown <= capped, (grown, capped, theirs)
