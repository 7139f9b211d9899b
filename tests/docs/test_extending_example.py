"""The example drafter of docs/api/extending.md ("Writing a drafter"), run from the page's own code block on the
tiny random models of the test suite: its output is plain decoding's (greedy, seeded sampling, a left-padded batch,
a static cache, transformers' loop), and its declaration registers it and saves it with a model.

test_code_blocks.py runs the page on the real model; this runs its definitions on every architecture, in seconds,
with the drafter registry restored afterwards (the page declares a method of its own).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_speculative as hfs
from docblocks import DOCS, ROOT, parse
from hf_speculative.drafters import registry
from tests.conftest import ARCHS, build_model, prompt_inputs, stock_generate

PAGE = DOCS / "api" / "extending.md"


@pytest.fixture
def example(monkeypatch):
    """The page's first python block (the drafter's definition) executed in a module of its own; the registry's
    classes are a copy for the test, so the declared method does not outlive it."""
    registry.registered()  # the package's drafters first, then a copy that the example may add to
    monkeypatch.setattr(registry, "_CLASSES", dict(registry._CLASSES))
    block = next(b for b in parse(PAGE) if b.lang == "python" and "class RepeatLast(" in b.code)
    module = types.ModuleType("docs_extending_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile("\n" * block.line + block.code, str(ROOT / block.page), "exec"), module.__dict__)  # noqa: S102
    return module


@pytest.mark.parametrize("arch", ARCHS)
def test_the_example_drafter_gives_plain_greedy_and_seeded_sampling(example, arch):
    model = hfs.enable(build_model(arch))
    inputs = prompt_inputs()
    plain = stock_generate(model, **inputs, do_sample=False, max_new_tokens=24)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=24, candidate_generator=example.RepeatLast())
    assert out.tolist() == plain.tolist()
    stats = hfs.last_stats(model)
    assert stats.method == "repeat-last" and stats.drafted_tokens > 0, stats
    theirs = model.generate(**inputs, do_sample=False, max_new_tokens=24, candidate_generator=example.RepeatLast(),
                            speculative_loop="transformers")
    assert theirs.tolist() == plain.tolist()
    sampled = dict(do_sample=True, temperature=1.5, sampling_seed=11, max_new_tokens=24)
    assert (model.generate(**inputs, **sampled, candidate_generator=example.RepeatLast()).tolist()
            == model.generate(**inputs, **sampled, candidate_generator=None).tolist())


def test_the_example_drafter_is_accepted_where_the_text_repeats(example):
    model = hfs.enable(build_model("gemma3"))  # its greedy text repeats one token (tests/conftest.py, SEEDS)
    inputs = prompt_inputs()
    out = model.generate(**inputs, do_sample=False, max_new_tokens=24, candidate_generator=example.RepeatLast())
    assert out.tolist() == stock_generate(model, **inputs, do_sample=False, max_new_tokens=24).tolist()
    stats = hfs.last_stats(model)
    assert stats.accepted_tokens > 0 and stats.target_forwards < 24, stats


def test_the_example_drafter_runs_a_batch_and_a_static_cache(example):
    model = hfs.enable(build_model("llama"))
    ids = torch.tensor([[0, 0, 3, 5, 6, 7, 8, 9, 5], [3, 5, 6, 7, 8, 9, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 9])
    batch = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0)
    out = model.generate(**batch, candidate_generator=example.RepeatLast())
    assert out.tolist() == stock_generate(model, **batch).tolist()
    inputs = prompt_inputs()
    out = model.generate(**inputs, do_sample=False, max_new_tokens=12, cache_implementation="static",
                         candidate_generator=example.RepeatLast())
    assert out.tolist() == stock_generate(model, **inputs, do_sample=False, max_new_tokens=12).tolist()


def test_the_declaration_registers_the_example_and_saves_it_with_a_model(example, tmp_path):
    RepeatLast = example.RepeatLast
    assert registry.registered()["repeat-last"] is RepeatLast and RepeatLast.name == "repeat-last"
    declared = registry.capabilities_of(RepeatLast())
    assert declared.batch and not declared.trees and declared.static_cache
    assert RepeatLast(num_tokens=2).to_dict() == {"method": "repeat-last", "options": {"num_tokens": 2}}
    with pytest.raises(ValueError, match="must be an integer from 1 to 64"):
        RepeatLast(num_tokens=0)

    model = hfs.enable(build_model("llama"))
    model.generation_config.candidate_generator = RepeatLast(num_tokens=2)
    model.save_pretrained(tmp_path)
    again = hfs.enable(AutoModelForCausalLM.from_pretrained(tmp_path))
    assert again.generation_config.candidate_generator == RepeatLast(num_tokens=2)
    inputs = prompt_inputs()
    out = again.generate(**inputs, do_sample=False, max_new_tokens=12)
    assert out.tolist() == stock_generate(model, **inputs, do_sample=False, max_new_tokens=12).tolist()
    assert hfs.last_stats(again).method == "repeat-last"
