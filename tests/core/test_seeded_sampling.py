"""One seed, one text: seeded sampling gives the same output whatever the drafter, the adaptive drafting's
decisions, the timings they read, the thread, or earlier calls drafted (hf_speculative.core.sampling).

That the text is a sample of the target's distribution is tested by the chi-square batteries
(tests/core/test_sampling.py, tests/core/test_tree_sampling.py); here only the reproducibility promise.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch
from tests.conftest import build_model, make_drafter, prompt_inputs

import hf_speculative as hfs
from hf_speculative.core.costs import forget_costs
from hf_speculative.core.sampling import call_seed

NEW = 16
SAMPLING = dict(do_sample=True, temperature=0.8, top_k=40, top_p=0.95, max_new_tokens=NEW)
CHAINS = ("prompt-lookup", "draft-model", "eagle3", "early-exit", "layer-skip", "hybrid")


@pytest.fixture(scope="module")
def target():
    return hfs.enable(build_model("llama", layers=2))


def strategies(target) -> dict:
    chains = {name: make_drafter(name, target, None) for name in CHAINS}
    chains["adaptive-lookup"] = hfs.PromptLookup()  # its costs measured under the jittered clock
    chains["lookup-tree"] = hfs.PromptLookup(tree=hfs.DynamicTree(nodes=8, top_k=2))
    chains["eagle-tree"] = hfs.Eagle(make_drafter("eagle3", target, None).drafter, tree=hfs.DynamicTree(nodes=8))
    chains["hybrid-tree"] = make_drafter("hybrid-tree", target, None)
    return chains


@pytest.fixture
def jittered_clock(monkeypatch):
    """``time.perf_counter`` with random jumps of up to 50 ms: the adaptive drafters' cost models and
    draft-length policies then decide differently on every run, as under varying machine load."""
    real = time.perf_counter
    rng = random.Random()
    offset = [0.0]

    def clock():
        offset[0] += rng.random() * 0.05
        return real() + offset[0]

    def reseed(seed):
        rng.seed(seed)

    monkeypatch.setattr(time, "perf_counter", clock)
    return reseed


def test_every_drafter_gives_the_seeded_text_whatever_the_timings(target, jittered_clock):
    inputs = prompt_inputs()
    torch.manual_seed(5)
    seed = call_seed()  # what a speculative call takes as its seed after this manual_seed
    expected = target.generate(**inputs, **SAMPLING, sampling_seed=seed)  # plain decoding, seeded draws
    drafted = {}
    for name, strategy in strategies(target).items():
        for run in range(3):
            jittered_clock(run)
            forget_costs(target)  # the cost model measures afresh under this run's clock
            torch.manual_seed(5)
            out = target.generate(**inputs, **SAMPLING, candidate_generator=strategy)
            assert out.tolist() == expected.tolist(), (name, run)
            stats = hfs.last_stats(target)
            drafted.setdefault(name, []).append((stats.drafted_tokens, stats.target_forwards, stats.verify_time_s))
    assert all(sum(d for d, _, _ in runs) > 0 for runs in drafted.values()), drafted  # every drafter drafted
    # the adaptive drafters read different timings on every run (their drafts may or may not change with them:
    # on this tiny model the tree drafters' choice of their own chain mostly does not)
    assert all(len({t for _, _, t in runs}) == len(runs) for runs in drafted.values()), drafted


def test_the_plain_call_is_seeded_when_given_a_seed(target):
    """An enabled model's call without a drafter samples with the seed's draws when ``sampling_seed=`` is
    given (so a baseline and its speculative runs write the same sample); without one it is transformers'
    own call, draws included."""
    inputs = prompt_inputs()
    seeded = [target.generate(**inputs, **SAMPLING, sampling_seed=3) for _ in range(2)]
    speculative = target.generate(**inputs, **SAMPLING, sampling_seed=3, candidate_generator=hfs.PromptLookup())
    assert seeded[0].tolist() == seeded[1].tolist() == speculative.tolist()
    other = target.generate(**inputs, **SAMPLING, sampling_seed=4)
    assert other.tolist() != seeded[0].tolist()
    plain = build_model("llama", layers=2)  # not enabled
    torch.manual_seed(8)
    expected = plain.generate(**inputs, **SAMPLING)
    torch.manual_seed(8)
    assert target.generate(**inputs, **SAMPLING).tolist() == expected.tolist()


def test_consecutive_calls_after_one_manual_seed_agree_across_drafters(target):
    """A call advances torch's generator by the one draw of its seed, whatever it drafted, so a sequence of
    calls after one ``torch.manual_seed`` is reproducible too."""
    inputs = prompt_inputs()

    def three(strategy):
        torch.manual_seed(11)
        return [target.generate(**inputs, **SAMPLING, candidate_generator=strategy).tolist() for _ in range(3)]

    plain = three(hfs.PromptLookup(num_tokens=1, adaptive=False))
    assert len({str(t) for t in plain}) == 3  # the calls drew different seeds
    assert three(hfs.PromptLookup()) == plain
    assert three(make_drafter("eagle3", target, None)) == plain
    assert three(hfs.PromptLookup(tree=hfs.DynamicTree(nodes=8, top_k=2))) == plain


def test_an_explicit_seed_leaves_torch_s_generator_alone(target):
    torch.manual_seed(0)
    before = torch.get_rng_state()
    target.generate(**prompt_inputs(), **SAMPLING, sampling_seed=9, candidate_generator=hfs.PromptLookup())
    assert torch.equal(torch.get_rng_state(), before)


def test_threads_with_their_own_seeds_get_their_own_texts(target):
    """Concurrent calls on one model: each call's text is its seed's, as when run alone."""
    inputs = prompt_inputs()
    seeds = list(range(6))
    alone = {s: target.generate(**inputs, **SAMPLING, sampling_seed=s).tolist() for s in seeds}
    results, errors = {}, []

    def work(seed):
        try:
            strategy = hfs.PromptLookup(adaptive=False) if seed % 2 else hfs.PromptLookup()
            results[seed] = target.generate(**inputs, **SAMPLING, sampling_seed=seed,
                                            candidate_generator=strategy).tolist()
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == alone


def test_greedy_ignores_the_seed(target):
    inputs = prompt_inputs()
    greedy = target.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    with pytest.warns(UserWarning, match="sampling_seed=1 fixes the draws of sampling, and this call decodes greedily"
                      ) as caught:
        seeded = target.generate(**inputs, max_new_tokens=NEW, do_sample=False, sampling_seed=1,
                                 candidate_generator=hfs.PromptLookup())
    assert seeded.tolist() == greedy.tolist()
    assert [w.filename for w in caught if "sampling_seed=1" in str(w.message)] == [__file__]  # the user's line


@pytest.mark.skipif(not hfs.compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE, reason="custom_generate callables: 4.57+")
def test_custom_generate_route_takes_the_seed():
    model = build_model("llama", layers=2)  # not enabled
    inputs = prompt_inputs()
    expected = hfs.enable(build_model("llama", layers=2)).generate(**inputs, **SAMPLING, sampling_seed=2)
    out = model.generate(**inputs, **SAMPLING, custom_generate=hfs.speculative_generate, sampling_seed=2,
                         candidate_generator=hfs.PromptLookup(adaptive=False))
    assert out.tolist() == expected.tolist()


@pytest.mark.parametrize("seed, error, fragment", [
    (-1, ValueError, "from 0 to 2**64 - 1"), (2**64, ValueError, "from 0 to 2**64 - 1"),
    (10**30, ValueError, "from 0 to 2**64 - 1"), (1.5, TypeError, "must be an integer"),
    ("3", TypeError, "must be an integer"), (True, TypeError, "not a bool"),
])
def test_bad_seeds_are_refused_with_the_range(target, seed, error, fragment):
    with pytest.raises(error, match="sampling_seed=") as info:
        target.generate(**prompt_inputs(), **SAMPLING, sampling_seed=seed, candidate_generator=hfs.PromptLookup())
    assert fragment in str(info.value)


def test_a_seed_with_beam_sampling_is_refused(target):
    with pytest.raises(ValueError, match="num_beams"):
        target.generate(**prompt_inputs(), do_sample=True, num_beams=2, max_new_tokens=4, sampling_seed=1)
