"""``hfs.SuffixDecoding``: options, the exactness battery on tiny models, the per-model history (across calls,
threads and a file), memory bounds on long inputs, and a real-model run."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import GenerationConfig

import hf_speculative as hfs
from hf_speculative.core.call import CallContext
from hf_speculative.drafters.suffix.history import history_for, outputs_held
from hf_speculative.hf.checks import drafts_trees
from hf_speculative.core.tree import Verdict
from tests.conftest import ARCHS, PROMPT, build_model, draft_once, prompt_inputs, stock_generate
from tests.drafters import tree_battery


def fixed() -> hfs.SuffixDecoding:
    return hfs.SuffixDecoding(adaptive=False)


# -- options ---------------------------------------------------------------------------------------
def test_runs_in_our_loop_and_reports_its_bounds():
    strategy = hfs.SuffixDecoding(max_nodes=12, max_depth=16)
    assert drafts_trees(strategy) and strategy.tree.nodes == 12 and strategy.tree.depth == 16
    assert [strategy.node_budget(m) for m in (0, 1, 5, 30)] == [0, 1, 5, 12]
    assert hfs.SuffixDecoding(spec_factor=2.0, spec_offset=1.0).node_budget(3) == 7


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(max_depth=0), r"SuffixDecoding\(max_depth=0\): must be an integer from 1 to 64"),
    (dict(max_nodes=257), r"SuffixDecoding\(max_nodes=257\): must be an integer from 1 to 256"),
    (dict(spec_factor=-1), r"SuffixDecoding\(spec_factor=-1\): must be a number in \[0, 64\]"),
    (dict(min_token_prob=1.5), r"SuffixDecoding\(min_token_prob=1.5\): must be a number in \[0, 1\]"),
    (dict(history_tokens=-1), r"SuffixDecoding\(history_tokens=-1\): must be an integer"),
    (dict(history_file=3), r"SuffixDecoding\(history_file=3\): must be a file path"),
    (dict(context_tokens=4, max_depth=8), r"SuffixDecoding\(context_tokens=4\): must be an integer from 8"),
    (dict(adaptive=1), r"SuffixDecoding\(adaptive=1\): must be True or False"),
    (dict(history_file="h.json", history_tokens=0), r"a history file needs a history"),
])
def test_bad_options_are_refused(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        hfs.SuffixDecoding(**kwargs)


# -- the battery ------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_equals_greedy_and_drafts(arch):
    stats = tree_battery.check_greedy(fixed, arch)
    assert stats.accepted_tokens > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_adaptive_equals_greedy(arch):
    tree_battery.check_greedy(hfs.SuffixDecoding, arch)


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


def test_wrong_history_drafts_are_rejected_and_the_text_stays_greedy():
    """Drafts never accepted: a history that continues the prompt's tail with tokens greedy never writes."""
    model = hfs.enable(build_model("llama"))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=20)
    greedy = set(expected[0, len(PROMPT):].tolist())
    wrong = [t for t in range(4, 90) if t not in greedy][:12]
    strategy = hfs.SuffixDecoding(adaptive=False, spec_factor=8.0)
    history = strategy.history(model)
    for token in set(expected[0].tolist()):  # after any token of the text, a wrong continuation, often
        for _ in range(5):
            history.add([token] + wrong)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=20, candidate_generator=strategy)
    assert out.tolist() == expected.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > stats.accepted_tokens


def test_history_makes_a_repeated_request_fully_drafted():
    """Drafts always accepted: the second identical request drafts its whole output from the first one's."""
    model = hfs.enable(build_model("qwen2"))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    strategy = hfs.SuffixDecoding(adaptive=False, max_nodes=32, max_depth=40, spec_factor=4.0)
    forwards = []
    for _ in range(2):
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=strategy)
        assert out.tolist() == expected.tolist()
        forwards.append(hfs.last_stats(model).target_forwards)
    assert forwards[1] <= 4 < forwards[0]
    alone = hfs.SuffixDecoding(adaptive=False, max_nodes=32, max_depth=40, spec_factor=4.0, history_tokens=0)
    model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=alone)
    assert hfs.last_stats(model).target_forwards > forwards[1]  # without a history, no such shortcut


def test_held_outputs_keep_a_measurement_repeatable_and_join_at_the_end():
    """The benchmark's hold: the repeats of one request inside ``outputs_held`` draft from the same history (none
    copies the previous repeat's answer, which the test above shows it would), and the outputs join afterwards."""
    model = hfs.enable(build_model("qwen2"))
    strategy = hfs.SuffixDecoding(adaptive=False, max_nodes=32, max_depth=40, spec_factor=4.0)
    call = dict(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=strategy)
    history = strategy.history(model)
    forwards = []
    with outputs_held(model):
        with outputs_held(model):  # nested: the outer block holds
            for _ in range(3):
                model.generate(**call)
                forwards.append(hfs.last_stats(model).target_forwards)
        assert len(history.outputs) == 0
    assert forwards[0] == forwards[1] == forwards[2] > 4
    assert len(history.outputs) == 1  # the three identical outputs joined once
    model.generate(**call)
    assert hfs.last_stats(model).target_forwards <= 4  # now the history has it


def test_held_outputs_can_be_dropped_and_a_failing_block_still_releases():
    model = hfs.enable(build_model("qwen2"))
    strategy = hfs.SuffixDecoding(adaptive=False)
    with outputs_held(model, keep=False):
        model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=8, candidate_generator=strategy)
    assert len(strategy.history(model).outputs) == 0  # a warm-up leaves no trace
    with pytest.raises(KeyError), outputs_held(model):
        raise KeyError("a failing measurement")
    model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=8, candidate_generator=strategy)
    assert len(strategy.history(model).outputs) == 1  # no hold left behind


def test_history_file_carries_over_to_a_new_process(tmp_path):
    path = tmp_path / "suffix.json"
    model = hfs.enable(build_model("llama"))
    strategy = hfs.SuffixDecoding(adaptive=False, history_file=path, spec_factor=4.0, max_depth=40)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24, candidate_generator=strategy)
    assert path.exists()
    hfs.forget(model)  # as if the process restarted: the history is read back from the file
    again = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24, candidate_generator=strategy)
    assert again.tolist() == out.tolist()
    assert hfs.last_stats(model).target_forwards <= 4
    assert strategy.history(model).outputs[0] == out[0, len(PROMPT):].tolist()


def test_threads_keep_separate_histories_per_model():
    models = {name: hfs.enable(build_model("llama", seed=seed)) for name, seed in (("a", 0), ("b", 5))}
    expected = {name: stock_generate(m, **prompt_inputs(), do_sample=False, max_new_tokens=20).tolist()
                for name, m in models.items()}
    strategy = hfs.SuffixDecoding(adaptive=False)  # one strategy, shared by every thread
    barrier, errors, outputs = threading.Barrier(4), [], {}

    def work(key, name):
        try:
            barrier.wait(timeout=30)
            outputs[key] = [models[name].generate(**prompt_inputs(), do_sample=False, max_new_tokens=20,
                                                  candidate_generator=strategy).tolist() for _ in range(3)]
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=((name, i), name)) for name in models for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and len(outputs) == 4
    for (name, _), outs in outputs.items():
        assert all(out == expected[name] for out in outs)
    for name, model in models.items():
        history = strategy.history(model)
        generated = expected[name][0][len(PROMPT):]
        assert list(history.outputs) == [generated] * 6  # its own model's outputs only, every call's


def test_adaptive_size_weighs_expected_tokens_against_the_measured_cost():
    """The loop's rule for a best-first list of nodes with probabilities (the suffix drafter's sizing)."""
    from hf_speculative.core.policy import ScoredPrefix

    generator = open_generator(hfs.SuffixDecoding())
    assert generator.sizing.rule == "scored"
    costs, probs = generator.sizing.costs, [0.9, 0.8, 0.7, 0.1, 0.05]
    rule = ScoredPrefix(costs)
    costs.fix([1.0, 1.1, 1.2, 1.3, 1.4, 1.5])  # cheap rows: the likely nodes pay, the unlikely do not
    assert rule.size(probs) == 3
    costs.fix([1.0, 3.0])  # every row costs two forwards: nothing pays
    assert rule.size(probs) == 0
    costs.fix([1.0, 1.0])  # free rows: all but the last node, whose 0.05 is within the 2% margin
    assert rule.size(probs) == 4
    assert ScoredPrefix(costs, adaptive=False).size(probs) == 5
    costs.fix([1.0, 1.15, 1.3, 1.45, 1.6, 1.75])
    assert rule.size(probs) == 3
    rule.predicted = 2.4
    for _ in range(40):  # drafts predicted to keep 2.4 tokens keep none: the calibration falls, and so does n
        rule.verified(0)
    assert rule.calibration == pytest.approx(0.2) and rule.size(probs) == 1


# -- memory bounds on long inputs ------------------------------------------------------------------
def open_generator(strategy, target=None):
    ctx = CallContext(target=target, generation_config=GenerationConfig(do_sample=False, max_length=100_000),
                      logits_processor=None, stopping_criteria=None, stats=hfs.SpeculativeStats())
    return strategy.open(ctx)


def test_the_calls_trie_is_bounded_on_long_inputs():
    torch.manual_seed(0)
    strategy = hfs.SuffixDecoding(adaptive=False, max_depth=8, context_tokens=500, history_tokens=0)
    generator = open_generator(strategy)
    text = torch.randint(0, 40, (1, 3000))
    for end in range(1000, 3001, 250):  # grown in blocks, as verified text grows
        tree = draft_once(generator, text[:, :end], 8)
        generator.observe(text[:, :end], tree, Verdict((), 0), torch.zeros(1 + tree.size, 40))
        assert generator.local.nodes <= 8 * 500
    fresh = open_generator(hfs.SuffixDecoding(adaptive=False, max_depth=8, context_tokens=500, history_tokens=0))
    fresh.local.extend(text[0, -500:].tolist())
    assert generator.local.nodes == fresh.local.nodes  # what is left is exactly the last 500 tokens' trie


def test_the_history_is_bounded_per_model_on_long_outputs():
    model = build_model("llama")
    history = history_for(model, 8, 2000, None)
    for i in range(20):
        history.add(torch.randint(0, 90, (700,)).tolist())
        assert history.tokens <= 2000 and history.trie.nodes <= 8 * 2000
    assert history_for(model, 8, 2000, None) is history  # one per model (and settings)
    assert history_for(build_model("llama"), 8, 2000, None) is not history


# -- a real model ----------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
def test_real_model_equals_greedy_and_learns_from_its_history():
    torch.set_num_threads(1)
    model, tokenizer = hfs.load_model("smollm2-135m-instruct")
    model = hfs.enable(model)
    text = "Rewrite this list with one more item: apples, pears, plums, cherries, grapes, melons."
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    expected = stock_generate(model, **ids, do_sample=False, max_new_tokens=48)
    strategy = hfs.SuffixDecoding()
    forwards = []
    for _ in range(2):
        out = model.generate(**ids, do_sample=False, max_new_tokens=48, candidate_generator=strategy)
        assert out.tolist() == expected.tolist()
        forwards.append(hfs.last_stats(model).target_forwards)
    assert forwards[1] < forwards[0]


def test_saved_in_a_generation_config(tmp_path, monkeypatch):
    """The history file is copied beside the saved model and named relatively; loading the spec reads it from
    there and keeps it, read and written, in hf_speculative's cache (never where an absolute path would point)."""
    import json

    from hf_speculative.hf import spec

    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path / "cache"))
    model = hfs.enable(build_model("llama"))
    strategy = hfs.SuffixDecoding(max_nodes=12, spec_factor=2.0, history_file=tmp_path / "history.json")
    strategy.history(model).add([5, 6, 7, 5, 6, 7])  # written to tmp_path/history.json
    model.generation_config.candidate_generator = strategy
    model.save_pretrained(tmp_path / "model")
    written = json.loads((tmp_path / "model" / "generation_config.json").read_text())["candidate_generator"]
    assert written == {"method": "suffix", "options": {**spec.options_of(strategy), "history_file": "suffix-history.json"}}
    assert (tmp_path / "model" / "suffix-history.json").read_bytes() == (tmp_path / "history.json").read_bytes()
    restored = spec.from_spec(written, model, tmp_path / "model")
    assert type(restored) is hfs.SuffixDecoding
    kept = restored.history_file
    assert kept.startswith(str(tmp_path / "cache" / "spec-files")) and kept.endswith(".json")
    assert {k: v for k, v in spec.options_of(restored).items() if k != "history_file"} == \
        {k: v for k, v in spec.options_of(strategy).items() if k != "history_file"}
    assert list(restored.history(build_model("llama")).outputs) == [[5, 6, 7, 5, 6, 7]]


# 500 calls in the fast suite (~8 s), 2,000 in the slow one: the chi-square and its negative control either way
@pytest.mark.parametrize("seeds", [500, pytest.param(2000, marks=pytest.mark.slow)])
def test_sampling_keeps_the_target_distribution(seeds):
    accepted = tree_battery.check_sampling_distribution(lambda: hfs.SuffixDecoding(adaptive=False), seeds=seeds)
    assert accepted > seeds // 10
