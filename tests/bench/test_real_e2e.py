"""gpu-check's ``real`` step on a saved tiny model and drafter: every arm runs, on every prompt, identical to
transformers' eager greedy in float32; the summary names τ and the per-step times. (The compiled arms run their
fixed-shape paths without torch.compile here; tests/core/test_static_cache.py compiles them.)"""

from __future__ import annotations

import torch

import hf_speculative as hfs
from hf_speculative.core import static_cache
from tools.gpu import real_e2e
from hf_speculative.drafters.eagle import static_drafting
from hf_speculative.drafters.eagle.checkpoints import save_pretrained
from tests.conftest import random_eagle


def test_the_real_step_runs_every_arm_on_every_prompt(chat_checkpoint, chat_model, tmp_path, monkeypatch,
                                                      cheap_verification):
    load = hfs.load_model

    def loaded_with_cheap_verification(*args, **kwargs):  # adaptive drafters draft whatever the CPU's timings
        model, tokenizer = load(*args, **kwargs)
        cheap_verification(model)
        return model, tokenizer

    monkeypatch.setattr(hfs, "load_model", loaded_with_cheap_verification)
    monkeypatch.setattr(static_cache, "compiled_forward", lambda target, mode: target)
    monkeypatch.setattr(static_drafting, "compile_step", lambda step, mode: step)
    drafter = save_pretrained(random_eagle(chat_model, version=1), tmp_path / "drafter")
    real = real_e2e.run_real(chat_checkpoint, "cpu", torch.float32, drafter=str(drafter), per_category=1,
                             new_tokens=12, repeats=1)
    arms = real["arms"]
    assert set(arms) == {"transformers greedy (eager)", "transformers greedy (static cache)", "prompt lookup, compiled",
                         "EAGLE chain (eager)", "EAGLE chain, compiled", "EAGLE tree 32 (eager)",
                         "EAGLE tree 32, compiled"}
    prompts = len(real["rows"]["transformers greedy (eager)"])
    assert prompts >= 6  # one per Spec-Bench category
    for label, arm in arms.items():
        assert "error" not in arm, (label, arm)
        assert arm["prompts"] == arm["identical"] == prompts, label
        assert arm["vs transformers greedy (eager)"] > 0 and arm["tokens_per_s"] > 0
    assert arms["EAGLE tree 32 (eager)"]["draft_ms_per_step"] > 0  # (its cost model is the fixed one above)
    for label in ("EAGLE tree 32 (eager)", "EAGLE tree 32, compiled"):  # (the compiled one's measures padded steps)
        assert arms[label]["tau"] >= 1 and arms[label]["verify_ms_per_step"] > 0
    table = "\n".join(real_e2e.summary_lines(real))
    assert "| EAGLE tree 32, compiled |" in table and f"| {prompts}/{prompts} |" in table


def test_a_failing_arm_is_reported_and_the_others_still_run(chat_checkpoint, monkeypatch):
    calls = real_e2e._call

    def failing(model, strategy, compile, base):
        if strategy is not None:
            raise RuntimeError("the lookup broke")
        return calls(model, strategy, compile, base)

    monkeypatch.setattr(real_e2e, "_call", failing)
    real = real_e2e.run_real(chat_checkpoint, "cpu", torch.float32, drafter=None, per_category=1, new_tokens=4,
                             repeats=1)
    assert "the lookup broke" in real["arms"]["prompt lookup, compiled"]["error"]
    assert real["arms"]["transformers greedy (eager)"]["identical"] == real["arms"]["transformers greedy (eager)"]["prompts"]
    assert "error: RuntimeError: the lookup broke" in "\n".join(real_e2e.summary_lines(real))
