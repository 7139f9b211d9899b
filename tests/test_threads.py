"""One enabled model, several threads generating at the same time with different strategies (or
none): every thread gets plain greedy's output and its own ``last_stats``."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import hf_speculative as hfs
from tests.conftest import ARCHS, build_model, prompt_inputs, random_eagle, random_exit_adapter, sibling_model, stock_generate

ROUNDS = 3
KWARGS = dict(do_sample=False, max_new_tokens=30)


def run_threads(model, strategies: dict, prompts: dict, rounds: int = ROUNDS):
    """Runs ``ROUNDS`` generate calls per thread, all threads released together. Returns per-thread
    results: outputs, the stats seen after each call, the (start, end) of each call, errors."""
    barrier = threading.Barrier(len(strategies))
    results = {name: {"outputs": [], "stats": [], "spans": [], "error": None} for name in strategies}

    def work(name):
        record = results[name]
        try:
            barrier.wait(timeout=30)
            for _ in range(rounds):
                start = time.perf_counter()
                out = model.generate(**prompt_inputs(prompts[name]), **KWARGS, candidate_generator=strategies[name])
                record["spans"].append((start, time.perf_counter()))
                record["outputs"].append(out.tolist())
                record["stats"].append(hfs.last_stats(model))
        except BaseException as error:  # reported by the main thread
            record["error"] = error

    threads = [threading.Thread(target=work, args=(name,)) for name in strategies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    for name, record in results.items():
        if record["error"] is not None:
            raise AssertionError(f"thread {name!r} failed") from record["error"]
    return results


def overlapping(results) -> bool:
    spans = [(name, span) for name, record in results.items() for span in record["spans"]]
    return any(a[1][0] < b[1][1] and b[1][0] < a[1][1] for a in spans for b in spans if a[0] != b[0])


def test_threads_with_different_strategies_on_one_model():
    torch.manual_seed(0)
    model = hfs.enable(build_model("llama"))
    draft = hfs.DraftModel(sibling_model(model), adaptive=False)
    strategies = {
        "lookup": hfs.PromptLookup(adaptive=False),
        "draft": draft,
        "draft-shared": draft,  # the same strategy object used by two threads at once
        "eagle": hfs.Eagle(random_eagle(model), num_tokens=4, confidence_threshold=0.0, adaptive=False),
        # two self-speculative drafts writing into their own calls' caches through views of one model
        "early-exit": hfs.EarlyExit(exit_layer=1, num_tokens=4, confidence_threshold=0.0, adaptive=False),
        "layer-skip": hfs.LayerSkip(skip=[0], num_tokens=4, confidence_threshold=0.0, adaptive=False),
        # its feature hooks on the shared layer must record only its own thread's forwards
        "exit-adapter": hfs.EarlyExit(adapter=random_exit_adapter(model, 1), num_tokens=4, confidence_threshold=0.0,
                                      adaptive=False),
        "plain": None,
    }
    # Different prompts, so that a thread reading another's state would show in its output.
    base = [3, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
    prompts = {"lookup": base, "draft": base[::-1], "draft-shared": base[3:] + base[:3], "eagle": base[2:] + base[:2],
               "early-exit": base[4:] + base[:4], "layer-skip": base[5:] + base[:5], "exit-adapter": base[6:] + base[:6],
               "plain": base[1:]}
    expected = {name: stock_generate(model, **prompt_inputs(prompt), **KWARGS).tolist()
                for name, prompt in prompts.items()}
    results = run_threads(model, strategies, prompts)
    assert overlapping(results), "the calls never ran at the same time: the test proved nothing"
    seen = set()
    for name, record in results.items():
        assert record["outputs"] == [expected[name]] * ROUNDS, name
        if strategies[name] is None:
            # a plain call publishes nothing, and nobody else's stats leak into this thread
            assert record["stats"] == [None] * ROUNDS
            continue
        for stats in record["stats"]:
            assert stats is not None and id(stats) not in seen
            seen.add(id(stats))
            assert stats.method == strategies[name].name
            assert stats.new_tokens == len(expected[name][0]) - len(prompts[name])
            assert stats.drafted_tokens > 0
            assert stats.new_tokens == stats.accepted_tokens + stats.target_forwards
    # the main thread ran no speculative call on this model
    assert hfs.last_stats(model) is None


@pytest.mark.skipif("gemma3" not in ARCHS, reason="Gemma3 needs transformers >= 4.50")
def test_threads_with_the_same_strategy_and_sliding_window_model():
    model = hfs.enable(build_model("gemma3"))
    strategy = hfs.PromptLookup()
    prompts = {"a": [3, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], "b": [3, 9, 8, 7, 9, 8, 7, 9, 8, 7, 9, 8]}
    expected = {name: stock_generate(model, **prompt_inputs(p), **KWARGS).tolist() for name, p in prompts.items()}
    results = run_threads(model, {"a": strategy, "b": strategy}, prompts, rounds=2)
    for name, record in results.items():
        assert record["outputs"] == [expected[name]] * 2, name
        assert all(s.new_tokens == len(expected[name][0]) - len(prompts[name]) for s in record["stats"])


def test_threads_with_tree_strategies_on_one_model():
    """Draft trees (our loop: each call its own verifier cache, drafter state and feature hooks) beside chains
    (transformers' loop) and a plain call, all at once on one model."""
    model = hfs.enable(build_model("llama"))
    tree = hfs.DynamicTree(nodes=8, depth=4, top_k=3)
    eagle = random_eagle(model)
    strategies = {
        "lookup-tree": hfs.PromptLookup(tree=tree, adaptive=False),
        "eagle-tree": hfs.Eagle(eagle, tree=tree, adaptive=False),
        "draft-tree": hfs.DraftModel(sibling_model(model), tree=tree, adaptive=False),
        "hybrid-tree": hfs.Hybrid(hfs.PromptLookup(min_ngram=3, max_ngram=3, tree=tree, adaptive=False),
                                  hfs.Eagle(eagle, tree=tree, adaptive=False)),
        "eagle-chain": hfs.Eagle(eagle, num_tokens=4, confidence_threshold=0.0, adaptive=False),
        "plain": None,
    }
    base = [3, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
    prompts = {name: base[i:] + base[:i] for i, name in enumerate(strategies)}
    expected = {name: stock_generate(model, **prompt_inputs(prompt), **KWARGS).tolist()
                for name, prompt in prompts.items()}
    results = run_threads(model, strategies, prompts)
    assert overlapping(results), "the calls never ran at the same time: the test proved nothing"
    for name, record in results.items():
        assert record["outputs"] == [expected[name]] * ROUNDS, name
        if strategies[name] is not None:
            assert all(s.drafted_tokens > 0 and s.method == strategies[name].name for s in record["stats"]), name
