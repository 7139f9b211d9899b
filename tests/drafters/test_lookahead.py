"""``hfs.Lookahead``: the tree that carries both branches (positions and visibility), the Jacobi update and its
n-grams, the pool's bounds, the cost budget, the exactness battery on tiny models, threads, and a real model."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import GenerationConfig

from tests.conftest import draft_once
import hf_speculative as hfs
from hf_speculative.core.accept import accept_greedy
from hf_speculative.core.call import CallContext
from hf_speculative.drafters.lookahead.drafter import NgramPool
from hf_speculative.hf.checks import drafts_trees
from hf_speculative.core.tree import ROOT
from tests.conftest import ARCHS, build_model, prompt_inputs, stock_generate
from tests.drafters import tree_battery

V = 50


def fixed() -> hfs.Lookahead:
    return hfs.Lookahead(adaptive=False)


def open_generator(strategy, max_length: int = 100_000):
    ctx = CallContext(target=None, generation_config=GenerationConfig(do_sample=False, max_length=max_length),
                      logits_processor=None, stopping_criteria=None, stats=hfs.SpeculativeStats())
    return strategy.open(ctx)


def bigram(token: int) -> int:
    """The toy target: its next token depends on the last one only."""
    return (3 * token + 1) % V


def bigram_scores(sequence: torch.LongTensor, tree) -> torch.Tensor:
    """``[1, 1 + n, V]``: row 0 the root's (the sequence's last token), row 1 + i node i's."""
    last = [int(sequence[0, -1])] + tree.tokens.tolist()
    return torch.nn.functional.one_hot(torch.tensor([bigram(t) for t in last]), V).float()[None]


# -- options ---------------------------------------------------------------------------------------
def test_runs_in_our_loop_and_reports_its_bounds():
    strategy = hfs.Lookahead(window=4, ngram=3, guesses=2)
    assert drafts_trees(strategy) and strategy.max_nodes == 12 and strategy.tree.nodes == 12
    assert drafts_trees(hfs.Lookahead(window=0, guesses=3))


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(window=-1), r"Lookahead\(window=-1\): must be an integer from 0 to 64"),
    (dict(ngram=1), r"Lookahead\(ngram=1\): must be an integer from 2 to 16"),
    (dict(guesses=2.5), r"Lookahead\(guesses=2.5\): must be an integer"),
    (dict(pool_size=0), r"Lookahead\(pool_size=0\): must be an integer from 1"),
    (dict(text_ngrams="yes"), r"Lookahead\(text_ngrams='yes'\): must be True or False"),
    (dict(window=0, guesses=0), r"Lookahead\(window=0, guesses=0\): nothing would be drafted"),
    (dict(window=40, ngram=8, guesses=10), r"\(window \+ guesses\) \* \(ngram - 1\) = 350 tokens per forward"),
])
def test_bad_options_are_refused(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        hfs.Lookahead(**kwargs)


# -- the tree -------------------------------------------------------------------------------------
def test_one_tree_carries_the_verification_chains_and_the_jacobi_window():
    generator = open_generator(hfs.Lookahead(window=3, ngram=3, guesses=2, adaptive=False, text_ngrams=False))
    generator.pool.add(7, (8, 9))
    generator.pool.add(7, (8, 5))  # shares its first token with the other n-gram: merged
    generator.pool.add(6, (1, 1))  # another first token: not verified after 7
    sequence = torch.tensor([[1, 2, 3, 7]])
    draft_once(generator, sequence, 10)  # starts the window (level 0)
    generator.levels = [[20, 21, 22], [30, 31, 32]]  # two levels of three columns
    tree = draft_once(generator, sequence, 10)
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    assert tokens[:3] == [8, 5, 9] or tokens[:3] == [8, 9, 5]
    assert parents[:3] == [ROOT, 0, 0]  # the verification branch: a trie of the n-grams under the root
    assert generator._step == (3, 2, 3)
    node = {(level, column): 3 + level * 3 + column for level in range(2) for column in range(3)}
    depths, seen = tree.depths().tolist(), tree.ancestors()
    for (level, column), i in node.items():
        assert tokens[i] == generator.levels[level][column]
        assert depths[i] == level + column  # position: prefix + 1 + offset, offset = level + column + 1
        sees = {j for j in range(tree.size) if seen[i, j]}
        expected = {node[0, c] for c in range(column + 1)} | {node[l, column] for l in range(1, level + 1)}
        assert sees == expected  # level 0 up to its column, then its column's lower levels
        assert not sees & {0, 1, 2}  # never the verification branch


def test_max_depth_and_the_budget_cut_the_window():
    generator = open_generator(hfs.Lookahead(window=5, ngram=4, guesses=0, adaptive=False, text_ngrams=False))
    sequence = torch.tensor([[1, 2, 3, 4, 5, 6]])
    draft_once(generator, sequence, 10)
    generator.levels = [list(range(10, 15)), list(range(20, 25)), list(range(30, 35))]
    tree = draft_once(generator, sequence, 4)  # the top level's column c is c + 3 deep
    assert generator._step == (0, 3, 2) and int(tree.depths().max()) + 1 <= 4


def test_jacobi_iteration_on_a_bigram_target_pools_its_true_ngrams_and_gets_accepted():
    """The target's token at each top-level node is the next level; every completed n-gram the window puts in
    the pool is then a true 4-token trajectory of the target, which verification accepts."""
    generator = open_generator(hfs.Lookahead(window=6, ngram=4, guesses=4, adaptive=False, text_ngrams=False))
    sequence = torch.tensor([[11, 4, 9, 30, 2, 17]])
    accepted = 0
    for _ in range(25):
        tree = draft_once(generator, sequence, 16)
        scores = bigram_scores(sequence, tree)
        verdict = accept_greedy(tree, scores[0])
        accepted += verdict.num_accepted
        sequence = torch.cat([sequence, torch.tensor([tree.path_tokens(verdict.path) + [verdict.next_token]])], 1)
        generator.observe(sequence, tree, verdict, scores[0])
    grams = [(first, *rest) for first in range(V) for rest in generator.pool.get(first)]
    assert len(grams) > 10
    assert all(g[i + 1] == bigram(g[i]) for g in grams for i in range(3))
    assert accepted > 20  # the pool's n-grams of the target's own trajectory are accepted
    text = sequence[0].tolist()
    assert all(text[i + 1] == bigram(text[i]) for i in range(5, len(text) - 1))  # the loop's text is the target's


# -- the pool and memory bounds --------------------------------------------------------------------
def test_pool_keeps_the_most_recent_per_key_and_drops_the_least_recently_used_keys():
    pool = NgramPool(keys=2, per_key=2)
    pool.add(1, (2, 3))
    pool.add(1, (4, 5))
    pool.add(1, (2, 3))  # again: the most recent now
    pool.add(1, (6, 7))  # (4, 5) goes
    assert pool.get(1) == [(6, 7), (2, 3)]
    pool.add(2, (1, 1))
    pool.add(1, (8, 8))  # key 1 used: key 2 is the least recently used
    pool.add(3, (9, 9))
    assert pool.get(2) == [] and pool.get(1) == [(8, 8), (6, 7)] and len(pool) == 2


def test_the_pool_is_bounded_on_long_inputs():
    torch.manual_seed(0)
    strategy = hfs.Lookahead(window=4, ngram=3, guesses=3, pool_size=100, adaptive=False)
    generator = open_generator(strategy)
    text = torch.randint(0, 5000, (1, 6000))
    for end in range(2000, 6001, 500):
        sequence = text[:, :end]
        tree = draft_once(generator, sequence, 16)
        scores = torch.zeros(1 + tree.size, 8)
        generator.observe(sequence, tree, accept_greedy(tree, scores), scores)
        assert len(generator.pool) <= 100 and generator.pool.tokens <= 100 * 3 * 2
        assert len(generator.levels) <= 2 and all(len(level) == 4 for level in generator.levels)


def test_the_cost_model_turns_both_branches_off_and_on():
    generator = open_generator(hfs.Lookahead(window=4, ngram=3, guesses=2))
    generator.pool.add(5, (6, 7))
    sequence = torch.tensor([[1, 2, 3, 5]])
    generator.sizing.costs.fix([1.0, 3.0])  # every verified token costs two forwards: nothing pays
    assert draft_once(generator, sequence, 8).size == 0
    generator.sizing.costs.fix([1.0, 1.0])  # verification is free: the whole budget
    tree = draft_once(generator, sequence, 8)
    assert tree.size == 2 + 4 * 1 and generator._step == (2, 1, 4)  # one n-gram, the window's one level so far


# -- the battery ------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_equals_greedy_and_drafts(arch):
    tree_battery.check_greedy(fixed, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_jacobi_only_equals_greedy(arch):
    stats = tree_battery.check_greedy(lambda: hfs.Lookahead(adaptive=False, text_ngrams=False), arch)
    assert stats.drafted_tokens > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_adaptive_equals_greedy(arch):
    model = hfs.enable(build_model(arch))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=hfs.Lookahead())
    assert out.tolist() == expected.tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_max_new_tokens_inside_accepted_paths(arch):
    tree_battery.check_max_new_tokens(fixed, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_eos_inside_accepted_paths(arch):
    tree_battery.check_eos_inside_paths(fixed, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_stop_strings_inside_accepted_paths(arch):
    tree_battery.check_stop_strings(fixed, arch)


def test_static_cache_equals_greedy():
    tree_battery.check_static_cache(fixed)


def test_seeded_sampling_gives_the_seeded_text():
    tree_battery.check_seeded_sampling(fixed)


def test_threads_on_one_model():
    model = hfs.enable(build_model("llama"))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=24).tolist()
    strategy, barrier, errors, outputs = fixed(), threading.Barrier(3), [], []

    def work():
        try:
            barrier.wait(timeout=30)
            for _ in range(2):
                outputs.append(model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24,
                                              candidate_generator=strategy).tolist())
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and outputs == [expected] * 6


# -- a real model ----------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
def test_real_model_equals_greedy():
    torch.set_num_threads(1)
    model, tokenizer = hfs.load_model("smollm2-135m-instruct")
    model = hfs.enable(model)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Count from one to twenty in words."}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    expected = stock_generate(model, **ids, do_sample=False, max_new_tokens=48)
    out = model.generate(**ids, do_sample=False, max_new_tokens=48, candidate_generator=fixed())
    assert out.tolist() == expected.tolist()
    stats = hfs.last_stats(model)
    assert stats.accepted_tokens > 0 and stats.target_forwards < 48


def test_saved_in_a_generation_config(tmp_path):
    from hf_speculative.hf import spec

    model = hfs.enable(build_model("llama"))
    strategy = hfs.Lookahead(window=3, ngram=5, guesses=2, text_ngrams=False)
    written = strategy.save_pretrained(tmp_path)
    assert written == {"method": "lookahead", "options": spec.options_of(strategy)}
    restored = spec.from_spec(written, model, tmp_path)
    assert restored == strategy


# 300 calls in the fast suite (~18 s), 1,200 in the slow one: the chi-square and its negative control either way
@pytest.mark.parametrize("seeds", [300, pytest.param(1200, marks=pytest.mark.slow)])
def test_sampling_keeps_the_target_distribution(seeds):
    # ten new tokens: the window needs a few forwards before its n-grams, and the pool, draft the sampled text
    accepted = tree_battery.check_sampling_distribution(fixed, seeds=seeds, new=10)
    assert accepted > seeds // 6
