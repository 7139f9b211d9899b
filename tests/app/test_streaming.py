"""The streamer-based observation of a run: blocks, figures, agreement with hf_speculative's own stats."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.app.streaming import GenerationCancelled, MethodTrace, TokenStreamer, generate_into
from hf_speculative.tooling.methods import get_method, run_method
from tests.conftest import PROMPT, build_model, prompt_inputs, stock_generate

MAX_NEW = 24


@pytest.fixture
def target():
    return build_model("llama")


def _run(name: str, model, options: dict | None = None, cancel: threading.Event | None = None) -> MethodTrace:
    spec = get_method(name)
    if spec.kind == "hfs":
        hfs.enable(model)
    trace = MethodTrace(spec, MAX_NEW)
    ids = prompt_inputs()["input_ids"]
    generate_into(trace, model, ids, spec.build(model, None, dict(options or {})), cancel=cancel or threading.Event(),
                  pad_token_id=0)
    return trace


@pytest.mark.parametrize("name", ["greedy", "prompt-lookup", "hf-prompt-lookup", "hf-early-exit"])
def test_trace_is_greedy_output_with_one_block_per_target_forward(name, target, cheap_verification):
    cheap_verification(target)  # the adaptive prompt lookup drafts whatever the machine's load
    reference = stock_generate(target, **prompt_inputs(), max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
    options = {"exit_layer": 1} if name == "hf-early-exit" else {}
    trace = _run(name, target, options)
    assert trace.status == "done", trace.error
    assert trace.ids == reference[0, len(PROMPT):].tolist()
    # the same forwards as methods.run_method counts with its forward hook (or hf_speculative's stats)
    measured = run_method(name, target, None, prompt_inputs()["input_ids"], options=options, max_new_tokens=MAX_NEW)
    assert trace.target_forwards == measured.target_forwards
    assert trace.block_ends[-1] == trace.new_tokens == MAX_NEW
    assert trace.tau == pytest.approx(trace.new_tokens / trace.target_forwards)
    if name == "greedy":
        assert set(trace.accepted_lengths) == {0} and trace.drafted_tokens == 0
    if name == "prompt-lookup":
        stats = trace.final_stats
        assert stats.accepted_tokens > 0, "the looping tiny model's text must give accepted drafts"
        # block size - 1 per forward is exactly hf_speculative's own accepted-length histogram
        assert Counter(trace.accepted_lengths) == stats.accepted_lengths
        assert trace.drafted_tokens == stats.drafted_tokens
        assert trace.acceptance_rate == pytest.approx(stats.acceptance_rate)
        assert trace.live_stats is stats  # the ObservedStrategy saw the very stats object of the call
    if name == "hf-prompt-lookup":
        assert trace.accepted_tokens > 0 and trace.drafted_tokens is None and trace.acceptance_rate is None


def test_blocks_since_splits_drafted_and_target_tokens(target, cheap_verification):
    cheap_verification(target)
    trace = _run("prompt-lookup", target)
    blocks = trace.blocks_since(0)
    assert [t for ids, _ in blocks for t in ids] == trace.ids
    assert [a for _, a in blocks] == trace.accepted_lengths[: len(blocks)]
    assert all(len(ids) == a + 1 for ids, a in blocks[:-1])  # n accepted drafts + the target's token
    assert trace.blocks_since(len(blocks)) == []


def test_cancel_stops_generate_at_the_next_block(target):
    cancel = threading.Event()
    cancel.set()
    trace = _run("greedy", target, cancel=cancel)
    assert trace.status == "cancelled" and trace.ids == []
    streamer = TokenStreamer(MethodTrace(get_method("greedy"), 4), cancel)
    with pytest.raises(GenerationCancelled):
        streamer.put(torch.tensor([1]))


def test_budget_cuts_an_overshooting_block():
    trace = MethodTrace(get_method("greedy"), max_new_tokens=3)
    trace.started = 0.0
    trace.add_block([5, 6], 0.1)
    trace.add_block([7, 8, 9], 0.2)  # transformers < 5.14 may accept past the budget
    assert trace.ids == [5, 6, 7] and trace.accepted_lengths == [1, 2] and trace.block_ends == [2, 3]
    assert trace.token_times == [(0.1, 2), (0.2, 3)]


def test_a_drafter_error_is_recorded_not_raised(target):
    trace = MethodTrace(get_method("prompt-lookup"), 4)
    hfs.enable(target)
    generate_into(trace, target, prompt_inputs()["input_ids"], {"candidate_generator": object()},
                  cancel=threading.Event(), pad_token_id=0)
    assert trace.status == "error" and "candidate_generator" in trace.error and "Traceback" not in trace.error
