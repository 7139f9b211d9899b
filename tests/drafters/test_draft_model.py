"""``DraftModel``: the drafter's KV cache follows the verified text, and padded lm_heads work."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GenerationConfig

import hf_speculative as hfs
from hf_speculative import compat
from hf_speculative.core import kv_cache
from hf_speculative.core.call import CallContext
from tests.conftest import (
    draft_once,
    ARCHS,
    PROMPT,
    VOCAB,
    build_model,
    char_tokenizer,
    prompt_inputs,
    sibling_model,
    stock_generate,
)

L = len(PROMPT)


def open_generator(target, drafter, **options):
    options = dict(dict(num_tokens=5, confidence_threshold=0.0, adaptive=False), **options)
    ctx = CallContext(target=target, generation_config=GenerationConfig(do_sample=False, max_length=1000),
                      logits_processor=None, stopping_criteria=None, stats=hfs.SpeculativeStats())
    return hfs.DraftModel(drafter, **options).open(ctx)


def fresh_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float()


def greedy(model, ids: list[int], n: int) -> list[int]:
    out = stock_generate(model, **prompt_inputs(ids), do_sample=False, max_new_tokens=n, eos_token_id=None)
    return out[0, len(ids):].tolist()


def noisy_copy(model, noise: float = 0.02, seed: int = 5):
    """The model with noise on its weights: a drafter that is right part of the time."""
    clone = copy.deepcopy(model)
    hfs.disable(clone)
    torch.manual_seed(seed)
    with torch.no_grad():
        for param in clone.parameters():
            param.add_(noise * torch.randn_like(param))
    return clone


def check_synced(generator, drafter, verified: list[int]):
    """The cache holds exactly the fed tokens, which are a prefix of the verified text, and the
    drafter's next-token logits from it equal a fresh forward over the whole verified text."""
    cache = generator.cache
    assert kv_cache.cache_length(cache) == len(generator.fed)
    assert generator.fed == verified[: len(generator.fed)]
    probe = copy.deepcopy(cache)
    with torch.no_grad():
        out = drafter(input_ids=torch.tensor([verified[len(generator.fed):]]), **{compat.cache_kwarg(): probe}, use_cache=True)
    torch.testing.assert_close(out.logits[0, -1].float(), fresh_logits(drafter, verified), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_cache_rollback_after_rejections(arch):
    target = build_model(arch)
    drafter = sibling_model(target, seed=7)
    generator = open_generator(target, drafter)
    text = list(PROMPT)

    tokens = draft_once(generator, torch.tensor([text]), 5).tokens
    draft = tokens.tolist()
    assert draft == greedy(drafter, text, 5)
    assert kv_cache.cache_length(generator.cache) == len(generator.fed) == L + 4  # the last draft token is not fed

    # verification: 2 accepted, then the target's own (different) token
    wrong = (draft[2] + 1) % VOCAB
    text = text + draft[:2] + [wrong]
    common = generator._rollback(torch.tensor([text]))
    assert common == L + 2
    assert generator.fed == text[:common] and kv_cache.cache_length(generator.cache) == common
    check_synced(generator, drafter, text)

    # the next draft continues from the verified text exactly
    tokens = draft_once(generator, torch.tensor([text]), 5).tokens
    assert tokens.tolist() == greedy(drafter, text, 5)

    # first draft token rejected
    draft = tokens.tolist()
    text = text + [(draft[0] + 3) % VOCAB]
    assert generator._rollback(torch.tensor([text])) == len(text) - 1
    check_synced(generator, drafter, text)

    # all accepted plus the target's bonus token: nothing to crop, the bonus token is fed next
    tokens = draft_once(generator, torch.tensor([text]), 3).tokens
    draft = tokens.tolist()
    text = text + draft + [5]
    generator._rollback(torch.tensor([text]))
    assert generator.fed == text[: len(text) - 2]  # the last draft token was never fed
    check_synced(generator, drafter, text)
    tokens = draft_once(generator, torch.tensor([text]), 4).tokens
    assert tokens.tolist() == greedy(drafter, text, 4)


def test_cache_stays_synced_through_a_whole_generate(monkeypatch):
    """During a real generate with rejections, before every draft the drafter's cache is a prefix of
    the verified text and its length equals the fed tokens."""
    from hf_speculative.drafters.draft_model.drafter import DraftModelCandidateGenerator

    target = hfs.enable(build_model("llama"))
    drafter = noisy_copy(target)
    checks = []
    original = DraftModelCandidateGenerator.draft

    def spy(self, input_ids, plan):
        result = original(self, input_ids, plan)
        verified = input_ids[0].tolist()
        assert kv_cache.cache_length(self.cache) == len(self.fed)
        assert self.fed[: len(verified)] == verified[: len(self.fed)]  # fed = verified text + draft so far
        checks.append(len(self.fed))
        return result

    monkeypatch.setattr(DraftModelCandidateGenerator, "draft", spy)
    ref = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30,
                          candidate_generator=hfs.DraftModel(drafter, adaptive=False))
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(target)
    assert len(checks) == stats.target_forwards - 1  # the last forward has no room for a draft
    assert 0 < stats.accepted_tokens < stats.drafted_tokens  # partial acceptance: real rollbacks


def test_close_frees_the_cache():
    target = build_model("llama")
    generator = open_generator(target, sibling_model(target))
    draft_once(generator, torch.tensor([PROMPT]), 3)
    assert kv_cache.cache_length(generator.cache) > 0
    generator.close()
    assert kv_cache.cache_length(generator.cache) == 0 and generator.fed == []


@pytest.mark.parametrize("padded", ["drafter", "target"])
def test_padded_lm_head_with_identical_tokenizers(padded):
    """Qwen-style: one lm_head padded beyond the tokenizer. With both tokenizers given, the drafter is
    accepted and the output is plain greedy's; without them the size check refuses it."""
    tokenizer = char_tokenizer(VOCAB)
    target = hfs.enable(build_model("llama", vocab_size=VOCAB + 32 if padded == "target" else VOCAB))
    source = build_model("llama", seed=0, vocab_size=VOCAB + 32 if padded == "drafter" else VOCAB)
    assert source.config.vocab_size != target.config.vocab_size
    # a drafter that agrees with the target on the real vocabulary: the target's weights, padded or cut
    with torch.no_grad():
        for name, param in source.named_parameters():
            mine = dict(target.named_parameters())[name]
            rows = min(param.shape[0], mine.shape[0])
            param.copy_(torch.zeros_like(param) if param.shape != mine.shape else mine)
            if param.shape != mine.shape:
                param[:rows].copy_(mine[:rows])
    # The padded ids exist only in the lm_head: a trained model never produces them, this random one
    # might, so they are suppressed (the drafter's embedding has no rows for them).
    options = dict(suppress_tokens=list(range(VOCAB, VOCAB + 32))) if padded == "target" else {}
    ref = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=30, **options)
    with pytest.raises(ValueError, match="differ in size"):
        target.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=hfs.DraftModel(source))
    strategy = hfs.DraftModel(source, tokenizer=tokenizer, target_tokenizer=tokenizer, adaptive=False,
                              confidence_threshold=0.0)
    out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=strategy,
                          **options)
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(target)
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0
    # and under sampling the padded rows never get drafted nor break the rejection sampler
    torch.manual_seed(0)
    sampled = target.generate(**prompt_inputs(), do_sample=True, max_new_tokens=20, candidate_generator=strategy,
                              **options)
    assert sampled.shape[1] > L and int(sampled[0, L:].max()) < VOCAB


def test_a_drafter_that_could_never_pay_never_runs():
    """A drafter as large as the target (one drafter step costs a target forward) can never pay, whatever it accepts:
    once the target's verification costs are known (measured in an earlier call, or fixed as a profile does), the
    chain rule decides so before the drafter runs, so the call costs only that decision (no prefill of the drafter,
    no catch-up forwards) and the output is plain greedy's."""
    from hf_speculative.core.costs import verify_costs_for

    target = hfs.enable(build_model("llama"))
    drafter = noisy_copy(target)
    calls = []
    drafter.register_forward_hook(lambda module, args, output: calls.append(1))
    ref = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=24)
    verify_costs_for(target, 16).fix([1.0 + 0.1 * k for k in range(17)])  # cheap verification: the drafter's price
    out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24,
                          candidate_generator=hfs.DraftModel(drafter))
    assert out.tolist() == ref.tolist()
    assert calls == [] and hfs.last_stats(target).drafted_tokens == 0
    # the same drafter with adaptive=False drafts at every step (the check above could fail)
    target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24,
                    candidate_generator=hfs.DraftModel(drafter, adaptive=False))
    assert len(calls) > 0 and hfs.last_stats(target).drafted_tokens > 0


def first_paying_step(budget: int, prompt: int, forwards_per_token: float, saving: float) -> int | None:
    """The ski-rental rule worked by hand: the first step (tokens generated so far, the prefill's token counted) at
    which a catch-up of the prompt and those tokens, ``forwards_per_token`` target forwards each, costs less than
    ``saving`` forwards a token over the smaller of the budget left and the tokens generated so far."""
    for generated in range(1, budget):
        if min(budget - generated, generated) * saving > (prompt + generated) * forwards_per_token:
            return generated
    return None


@pytest.mark.parametrize("budget, forwards_per_token", [(24, 1.0), (24, 0.1), (24, 0.01), (400, 0.1), (400, 1.0)])
def test_a_prefill_runs_once_the_call_has_shown_it_can_win_it_back(budget, forwards_per_token, monkeypatch):
    """A draft model's prefill on a long prompt costs forwards that only the rest of the call can win back, and how
    long the call goes on is unknown: with the drafter's catch-up cost known (seconds per token, measured by earlier
    calls) and the target's verification measured, the prefill runs at the first step where the smaller of the
    budget left and the tokens generated so far, times the best draft's saving a token, exceeds its cost (the
    ski-rental rule); a prefill never worth it is not run and the call is plain greedy's. (24, 0.1): the budget
    alone would have paid for it (24 tokens saving about half a forward each against 11.4), an answer that stops at
    24 tokens never does."""
    from hf_speculative.core.costs import verify_costs_for
    from hf_speculative.core.policy import best_value
    from hf_speculative.core.state import state_of

    target = hfs.enable(build_model("llama", max_positions=512))
    drafter = noisy_copy(target)
    fed = []  # tokens per drafter forward
    drafter.register_forward_pre_hook(lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]),
                                      with_kwargs=True)
    inputs = prompt_inputs(list(range(3, 60)) * 2)  # 114 tokens: a catch-up long enough to be weighed
    prompt = inputs["input_ids"].shape[1]
    ref = stock_generate(target, **inputs, do_sample=False, max_new_tokens=budget)
    costs = verify_costs_for(target, 16)
    for k in range(17):  # measured as earlier calls would: a forward 10 ms, cheap verification (2% a token)
        for _ in range(2):
            costs.observe(k, 0.01 * (1.0 + 0.02 * k))
    monkeypatch.setattr(costs, "observe", lambda k, seconds: None)  # kept so: this machine's timings do not move it
    state_of(drafter).draft_step_s = 0.0001  # a drafter step: 1% of a target forward
    state_of(drafter).catch_up_token_s = forwards_per_token * 0.01
    saving = 1.0 - 1.0 / best_value(costs, 0.6, 16, 0.01)  # at the prior acceptance, the drafter step priced
    expected = first_paying_step(budget, prompt, forwards_per_token, saving)
    out = target.generate(**inputs, do_sample=False, max_new_tokens=budget,
                          candidate_generator=hfs.DraftModel(drafter))
    assert out.tolist() == ref.tolist()
    # the first drafter forward is the catch-up of the prompt and the tokens generated before it (a random drafter
    # is too unsure to draft past it under the cost rule: the prefill is what is weighed)
    assert fed[:1] == ([] if expected is None else [prompt + expected])
    assert (expected is None) == (budget == 24 and forwards_per_token > 0.01 or forwards_per_token == 1.0)
    if expected is None:  # the same call without the cost rule prefills at once and drafts (the check could fail)
        target.generate(**inputs, do_sample=False, max_new_tokens=budget,
                        candidate_generator=hfs.DraftModel(drafter, adaptive=False))
        assert fed[0] == prompt and hfs.last_stats(target).drafted_tokens > 0
