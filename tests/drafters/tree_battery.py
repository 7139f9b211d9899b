"""The exactness battery shared by the model-free tree drafters (SuffixDecoding, Lookahead): each check builds a
fresh strategy with ``make()`` and compares ``generate()`` with transformers' own greedy or seeded call."""

from __future__ import annotations

import torch

import hf_speculative as hfs
from hf_speculative.core.costs import forget_costs
from hf_speculative.core.sampling import call_seed
from tests.conftest import (
    EOS,
    build_model,
    char_tokenizer,
    fix_cheap_costs,
    prompt_inputs,
    recurring_token,
    stock_generate,
)

SAMPLING = dict(do_sample=True, temperature=0.8, top_k=40, top_p=0.95, max_new_tokens=16)


def check_greedy(make, arch: str, new: int = 40) -> hfs.SpeculativeStats:
    """Identical to plain greedy, in our loop, with drafts made; returns the last call's stats."""
    model = hfs.enable(build_model(arch))
    fix_cheap_costs(model)  # drafts must be made to check, whatever the machine's load
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=new)
    strategy = make()
    for _ in range(2):  # the second call may draft from what the first one learned
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=new, candidate_generator=strategy)
        assert out.tolist() == expected.tolist()
        stats = hfs.last_stats(model)
        assert stats.new_tokens == new and stats.drafted_tokens > 0 and stats.target_forwards < new
    return stats


def check_max_new_tokens(make, arch: str) -> None:
    """Every length limit, even one that ends inside an accepted path."""
    model = hfs.enable(build_model(arch))
    for new in (1, 2, 3, 7, 13):
        expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=new)
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=new, candidate_generator=make())
        assert out.tolist() == expected.tolist(), new


def check_eos_inside_paths(make, arch: str) -> None:
    """An EOS that the drafts propose mid-tree ends the text exactly where greedy ends it."""
    if EOS[arch] is None:
        return
    model = hfs.enable(build_model(arch))
    prompt, token, step, _ = recurring_token(model)
    kwargs = dict(**prompt_inputs(prompt), do_sample=False, max_new_tokens=30, eos_token_id=token)
    expected = stock_generate(model, **kwargs)
    assert expected.shape[1] == len(prompt) + step + 1  # the stop is new token number `step`
    out = model.generate(**kwargs, candidate_generator=make())
    assert out.tolist() == expected.tolist()


def check_stop_strings(make, arch: str) -> None:
    model, tokenizer = hfs.enable(build_model(arch)), char_tokenizer()
    free = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None)
    start = prompt_inputs()["input_ids"].shape[1]
    for at in (4, 9):
        stop = tokenizer.decode(free[0, start + at: start + at + 2])
        kwargs = dict(**prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None, stop_strings=[stop],
                      tokenizer=tokenizer)
        expected = stock_generate(model, **kwargs)
        assert model.generate(**kwargs, candidate_generator=make()).tolist() == expected.tolist()


def check_seeded_sampling(make, arch: str = "llama", target=None, inputs=None) -> None:
    """One seed, one text: the same as the plain seeded call, whatever was drafted or measured before. ``target``:
    the model (default: a tiny ``arch`` model); ``inputs``: ``generate``'s inputs (default: ``prompt_inputs()``)."""
    model = hfs.enable(build_model(arch) if target is None else target)
    inputs = prompt_inputs() if inputs is None else inputs
    torch.manual_seed(5)
    expected = model.generate(**inputs, **SAMPLING, sampling_seed=call_seed())
    strategy, drafted = make(), 0
    for run in range(3):
        forget_costs(model)
        torch.manual_seed(5)
        out = model.generate(**inputs, **SAMPLING, candidate_generator=strategy)
        assert out.tolist() == expected.tolist(), run
        drafted += hfs.last_stats(model).drafted_tokens
    assert drafted > 0
    other = model.generate(**inputs, **SAMPLING, sampling_seed=4, candidate_generator=strategy)
    assert other.tolist() == model.generate(**inputs, **SAMPLING, sampling_seed=4).tolist()


def check_sampling_distribution(make, seeds: int = 2000, alpha: float = 1e-3, new: int = 3, rule: str = "seeded",
                                target=None) -> int:
    """Chi-square of the first two sampled tokens against the target's own distributions, over ``seeds`` calls with
    one strategy (its state carried from call to call, as in use): the first token against the target's softmax
    after the prompt, the second against its exact marginal ``sum_x1 p(x1) p(. | x1)`` (for a drafter that reads the
    target's hidden states the first token comes from the prefill alone: the second is the first one a draft can
    decide). ``rule``: ``"seeded"`` (``sampling_seed=seed``) or ``"rejection"`` (``speculative_sampling=
    "rejection"`` after ``torch.manual_seed(seed)``). ``target``: the model (default: a peaked tiny Llama,
    ``init=0.3``, so that drafts land often). Returns the accepted draft tokens (the test needs some, to reach the
    rule's accept branch); a negative control (the same counts against a distribution one token off) must fail."""
    from scipy.stats import chisquare

    from tests.conftest import PROMPT

    model = hfs.enable(build_model("llama", init=0.3) if target is None else target)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        p1 = torch.softmax(model(ids).logits[0, -1].double(), -1)  # [V]
        vocab = p1.numel()
        both = torch.cat([ids.expand(vocab, -1), torch.arange(vocab)[:, None]], 1)  # [V, T + 1]: every first token
        p2 = p1 @ torch.softmax(model(both).logits[:, -1].double(), -1)  # [V]: the second token's marginal
    strategy, firsts, seconds, accepted = make(), [], [], 0
    if rule not in ("seeded", "rejection"):
        raise ValueError(rule)
    for seed in range(seeds):
        if rule == "seeded":
            extra = {"sampling_seed": seed}
        else:
            torch.manual_seed(seed)
            extra = {"speculative_sampling": "rejection"}
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                             top_k=0, top_p=1.0, max_new_tokens=new, candidate_generator=strategy, eos_token_id=None,
                             **extra)
        firsts.append(int(out[0, len(PROMPT)]))
        seconds.append(int(out[0, len(PROMPT) + 1]))
        accepted += hfs.last_stats(model).accepted_tokens
    for samples, probs in ((firsts, p1), (seconds, p2)):
        keep = probs * seeds >= 5  # chi-square needs expected counts of 5 or more: the rest in one bin
        counts = torch.bincount(torch.tensor(samples), minlength=vocab).double()
        observed = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
        expected = torch.cat([probs[keep], probs[~keep].sum(0, keepdim=True)]) * seeds
        assert chisquare(observed.numpy(), expected.numpy()).pvalue > alpha
        shifted = torch.roll(probs, 1)
        expected_off = torch.cat([shifted[keep], shifted[~keep].sum(0, keepdim=True)]) * seeds
        assert chisquare(observed.numpy(), expected_off.numpy()).pvalue < alpha
    return accepted


def check_static_cache(make, arch: str = "llama") -> None:
    """On a static cache (``cache_implementation="static"``) too: the same text as greedy."""
    model = hfs.enable(build_model(arch))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=make(),
                         cache_implementation="static")
    assert out.tolist() == expected.tolist() and hfs.last_stats(model).target_forwards < 30
