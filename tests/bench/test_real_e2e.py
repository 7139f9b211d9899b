"""gpu-check's ``real`` step on a saved tiny model and drafter: every arm runs, on every prompt, identical to
transformers' eager greedy in float32; the summary names τ and the per-step times. (The compiled arms run their
fixed-shape paths without torch.compile here; tests/core/test_static_cache.py compiles them.)"""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core.state import state_of
from hf_speculative.core import static_cache
from tools.gpu import real_e2e
from hf_speculative.core import regions
from hf_speculative.drafters.eagle.checkpoints import save_pretrained
from hf_speculative.drafters.suffix.history import ModelHistories
from tests.conftest import random_eagle

# gpu-check's real step, a part of the GPU check's CPU run (tests/bench/test_gpu_check.py): CI runs it on 5.x only
pytestmark = pytest.mark.single_version


def test_the_real_step_runs_every_arm_on_every_prompt(chat_checkpoint, chat_model, tmp_path, monkeypatch,
                                                      cheap_verification):
    load = hfs.load_model

    def loaded_with_cheap_verification(*args, **kwargs):  # adaptive drafters draft whatever the CPU's timings
        model, tokenizer = load(*args, **kwargs)
        cheap_verification(model)
        return model, tokenizer

    monkeypatch.setattr(hfs, "load_model", loaded_with_cheap_verification)
    monkeypatch.setattr(static_cache, "compiled_forward", lambda target, mode: target)
    monkeypatch.setattr(regions, "compile_region", lambda step, mode: step)
    drafter = save_pretrained(random_eagle(chat_model, version=1), tmp_path / "drafter")
    real = real_e2e.run_real(chat_checkpoint, "cpu", torch.float32, drafter=str(drafter), per_category=1,
                             new_tokens=12, repeats=1, fixed=True)
    arms = real["arms"]
    assert set(arms) == {"transformers greedy (eager)", "transformers greedy (static cache)", "prompt lookup, compiled",
                         "prompt lookup tree 32, compiled", "SuffixDecoding, compiled", "EAGLE chain (eager)",
                         "EAGLE chain, compiled", "EAGLE tree 32 (eager)", "EAGLE tree 32, compiled",
                         "prompt lookup tree 32, compiled, fixed", "EAGLE chain, compiled, fixed",
                         "EAGLE tree 32, compiled, fixed"}
    prompts = len(real["rows"]["transformers greedy (eager)"])
    assert prompts >= 6  # one per Spec-Bench category
    for label, arm in arms.items():
        assert "error" not in arm, (label, arm)
        assert arm["prompts"] == arm["identical"] == arm["identical_to_static"] == prompts, label
        assert "first_divergence" not in arm, label
        assert arm["vs transformers greedy (eager)"] > 0 and arm["tokens_per_s"] > 0
    assert arms["EAGLE tree 32 (eager)"]["draft_ms_per_step"] > 0  # (its cost model is the fixed one above)
    for label in ("EAGLE tree 32 (eager)", "EAGLE tree 32, compiled"):  # (the compiled one's measures padded steps)
        assert arms[label]["tau"] >= 1 and arms[label]["verify_ms_per_step"] > 0
    assert arms["EAGLE tree 32, compiled, fixed"]["draft_ms_per_step"] > 0  # it drafted at every step
    table = "\n".join(real_e2e.summary_lines(real))
    assert "| EAGLE tree 32, compiled |" in table and f"| {prompts}/{prompts} | {prompts}/{prompts} |" in table


def test_suffix_decodings_repeats_never_draft_their_own_answer_and_divergences_are_located(chat_checkpoint,
                                                                                           monkeypatch):
    """A prompt's repeats draft from the earlier prompts' outputs only: run_real holds each prompt's outputs back
    until its repeats are done (the history is the model's, so a repeat would otherwise copy the answer whole)."""
    from hf_speculative.drafters.suffix.history import outputs_held

    model, _ = hfs.load_model(str(chat_checkpoint))
    strategy, _ = real_e2e._arms(model, None)["SuffixDecoding, compiled"]
    ids = torch.tensor([[1, 2, 3]])
    base = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    with outputs_held(model):  # as run_real runs each prompt
        real_e2e._call(model, strategy, True, base)()
        real_e2e._call(model, strategy, True, base)()
    hfs.enable(model, compile=False)
    assert hfs.last_stats(model).accepted_tokens == 0  # nothing to copy: the first call's output was held back
    real_e2e._call(model, strategy, True, base)()  # the next prompt (here the same one) may copy it
    hfs.enable(model, compile=False)
    assert hfs.last_stats(model).accepted_tokens > 0  # the control: a released output is drafted from
    held, run_prompt = [], real_e2e._run_prompt

    def spy(model, *args):
        held.append(state_of(model).drafter_state(ModelHistories).held is not None)
        return run_prompt(model, *args)

    monkeypatch.setattr(real_e2e, "_run_prompt", spy)
    real_e2e.run_real(chat_checkpoint, "cpu", torch.float32, drafter=None, per_category=1, new_tokens=2, repeats=1,
                      only=["Suffix"])
    assert held and all(held)  # every prompt ran under the hold
    a = torch.tensor([[7, 7, 1, 2, 3, 4]])
    assert real_e2e._first_divergence(a, a.clone(), 2) is None
    assert real_e2e._first_divergence(a, torch.tensor([[7, 7, 1, 2, 9, 4]]), 2) == 2
    assert real_e2e._first_divergence(a, torch.tensor([[7, 7, 1, 2, 3]]), 2) == 3


def test_a_failing_arm_is_reported_and_the_others_still_run(chat_checkpoint, monkeypatch):
    calls = real_e2e._call

    def failing(model, strategy, compile, base, capacity=None):
        if strategy is not None:
            raise RuntimeError("the lookup broke")
        return calls(model, strategy, compile, base, capacity)

    monkeypatch.setattr(real_e2e, "_call", failing)
    real = real_e2e.run_real(chat_checkpoint, "cpu", torch.float32, drafter=None, per_category=1, new_tokens=4,
                             repeats=1)
    assert "the lookup broke" in real["arms"]["prompt lookup, compiled"]["error"]
    assert real["arms"]["transformers greedy (eager)"]["identical"] == real["arms"]["transformers greedy (eager)"]["prompts"]
    assert "error: RuntimeError: the lookup broke" in "\n".join(real_e2e.summary_lines(real))


def test_the_longest_prompt_runs_first_and_a_time_limit_keeps_what_was_measured(chat_checkpoint, monkeypatch):
    reports = []
    clock = iter(range(0, 10_000, 60))  # each reading a minute later than the last
    monkeypatch.setattr(real_e2e.time, "perf_counter", lambda: float(next(clock)))
    monkeypatch.setattr(real_e2e, "_arms", lambda *args: {
        "transformers greedy (eager)": (None, False), "transformers greedy (static cache)": (None, "static")})
    real = real_e2e.run_real(chat_checkpoint, "cpu", torch.float32, drafter=None, per_category=1, new_tokens=3,
                             repeats=1, max_minutes=2.5, on_prompt=lambda report: reports.append(
                                 [r["question_id"] for r in report["rows"]["transformers greedy (eager)"]]))
    done = real["stopped_after_prompts"]
    assert 1 <= done < 6 and len(reports) == done  # saved after every prompt, stopped before the others
    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.tooling.prompting import encode_prompt
    _, tokenizer = hfs.load_model(str(chat_checkpoint))
    lengths = {p.question_id: encode_prompt(tokenizer, p.text).shape[1] for p in load_prompts(per_category=1)}
    assert lengths[reports[0][0]] == max(lengths.values())
    assert real["arms"]["transformers greedy (static cache)"]["identical"] == done  # one cache size for all prompts


def test_only_the_named_arms_run_beside_both_greedy_arms(chat_checkpoint, chat_model, tmp_path):
    drafter = save_pretrained(random_eagle(chat_model, version=1), tmp_path / "drafter")
    model, _ = hfs.load_model(str(chat_checkpoint))
    arms = real_e2e._arms(model, str(drafter), fixed=True, only=["fixed", "SuffixDecoding"])
    assert list(arms) == ["transformers greedy (eager)", "transformers greedy (static cache)",
                          "SuffixDecoding, compiled", "prompt lookup tree 32, compiled, fixed",
                          "EAGLE chain, compiled, fixed", "EAGLE tree 32, compiled, fixed"]
    with pytest.raises(ValueError, match=r"\['Medusa'\] match nothing"):
        real_e2e._arms(model, None, only=["Medusa"])
