"""``hfs.MTP()`` on a tiny GLM-4.5-style checkpoint (``glm4_moe`` with one MTP layer saved as ``model.layers.2.*``):
it loads the target's own MTP layer through transformers' ``MtpModel.from_pretrained``, drafts what transformers'
``generate(use_mtp=True)`` drafts, writes the same text in as many target forwards; and the errors name the fix."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from tests.conftest import PROMPT, build_model
from tests.drafters.mtp.conftest import load_glm, needs_mtp, save_glm_checkpoint


def _counting(model) -> list[int]:
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls


@needs_mtp
@pytest.mark.parametrize("prompt", [PROMPT, PROMPT[:3], [7, 9, 11, 13, 15, 17, 19]])
def test_same_text_same_drafts_same_forwards_as_transformers_use_mtp(glm_folder, prompt, monkeypatch):
    from transformers.generation.candidate_generator import MTPCandidateGenerator as Theirs

    from hf_speculative.drafters.mtp.drafter import MTPCandidateGenerator as Ours

    ids = torch.tensor([prompt])
    theirs, ours = {}, {}
    original = Theirs.get_candidates

    def record_theirs(self, input_ids, *args, **kwargs):
        candidates, logits = original(self, input_ids, *args, **kwargs)
        if candidates.shape[1] > input_ids.shape[1]:
            theirs[input_ids.shape[1]] = candidates[0, input_ids.shape[1]:].tolist()
        return candidates, logits

    monkeypatch.setattr(Theirs, "get_candidates", record_theirs)
    model = load_glm(glm_folder)
    plain = type(model).generate(model, input_ids=ids, do_sample=False, max_new_tokens=24)
    # transformers finds MTP weights by its class's key pattern (layers 46 or 92 for GLM-4.5): name this depth's
    model._keys_to_ignore_on_load_unexpected = [r"model\.layers\.2\..*"]
    calls = _counting(model)
    reference = type(model).generate(model, input_ids=ids, do_sample=False, max_new_tokens=24, use_mtp=True)
    their_forwards = len(calls)

    draft = Ours.draft

    def record_ours(self, sequence, plan):
        tree = draft(self, sequence, plan)
        if tree.size:
            ours[sequence.shape[1]] = tree.tokens.tolist()
        return tree

    monkeypatch.setattr(Ours, "draft", record_ours)
    mine = hfs.enable(load_glm(glm_folder))  # (hfs.MTP() finds the weights by the depth in the config)
    calls = _counting(mine)
    out = mine.generate(input_ids=ids, do_sample=False, max_new_tokens=24,
                        candidate_generator=hfs.MTP(adaptive=False, confidence_threshold=0.0))
    assert out.tolist() == reference.tolist() == plain.tolist()
    # a draft at every step after the prefill, the same one (transformers drafts at the last step too, one token
    # past max_length that it then drops; ours drafts only what fits)
    last = len(prompt) + 24 - 1
    assert ours == {at: tokens for at, tokens in theirs.items() if at < last} and len(ours) >= 20
    assert len(calls) == their_forwards == hfs.last_stats(mine).target_forwards


@needs_mtp
def test_loaded_once_per_model_and_trees_and_recursion_stay_exact(glm_folder):
    model = hfs.enable(load_glm(glm_folder))
    ids = torch.tensor([PROMPT])
    plain = type(model).generate(model, input_ids=ids, do_sample=False, max_new_tokens=20)
    strategy = hfs.MTP()
    first = hfs.MTP.from_pretrained(model)
    from hf_speculative.core.state import state_of
    from hf_speculative.drafters.mtp.drafter import TargetModules

    assert first.modules is state_of(model).drafter_state(TargetModules).modules and len(first.modules.layers) == 1
    for s in (strategy, hfs.MTP(num_tokens=3, adaptive=False, confidence_threshold=0.0),
              hfs.MTP(tree=hfs.StaticTree([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]), num_tokens=3, adaptive=False)):
        assert model.generate(input_ids=ids, do_sample=False, max_new_tokens=20,
                              candidate_generator=s).tolist() == plain.tolist()
    assert state_of(model).drafter_state(TargetModules).modules is first.modules  # loaded once for the model


@needs_mtp
def test_a_saved_spec_loads_again(glm_folder):
    """The spec holds the options only: the layers come from the target's folder again."""
    import json

    from hf_speculative.hf.spec import from_spec

    model = hfs.enable(load_glm(glm_folder))
    spec = json.loads(json.dumps(hfs.MTP(num_tokens=2, adaptive=False).to_dict()))
    assert spec == {"method": "mtp", "options": {"num_tokens": 2, "tree": None, "confidence_threshold": 0.05,
                                                  "adaptive": False, "draft_cost": None}}
    strategy = from_spec(spec, model, glm_folder)
    assert isinstance(strategy, hfs.MTP) and strategy.modules is None and strategy.num_tokens == 2
    ids = torch.tensor([PROMPT])
    out = model.generate(input_ids=ids, do_sample=False, max_new_tokens=10, candidate_generator=strategy)
    assert out.tolist() == type(model).generate(model, input_ids=ids, do_sample=False, max_new_tokens=10).tolist()


# -- errors ---------------------------------------------------------------------------------------------------
@needs_mtp
def test_a_target_without_mtp_layers_names_the_model_types_that_have_them():
    model = hfs.enable(build_model("llama"))
    with pytest.raises(ValueError, match=r"'llama' model's config declares none.*deepseek_v3, glm4_moe"):
        model.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=3, candidate_generator=hfs.MTP())


@needs_mtp
def test_missing_mtp_keys_are_named_with_the_pattern_expected(tmp_path):
    folder = save_glm_checkpoint(tmp_path, mtp_keys=False)
    with pytest.raises(ValueError, match=r"missing weights .*eh_proj.*keys model\.layers\.2\.\*"):
        hfs.MTP.from_pretrained(load_glm(folder))


@needs_mtp
def test_a_built_target_and_layers_of_another_model_are_refused(glm_folder):
    from transformers import Glm4MoeForCausalLM

    from hf_speculative.drafters.mtp.modules import random_modules
    from tests.drafters.mtp.conftest import glm_config

    with pytest.raises(ValueError, match="from_pretrained"):
        hfs.MTP.from_pretrained(Glm4MoeForCausalLM(glm_config()))
    model, other = hfs.enable(build_model("llama")), build_model("llama", seed=1)
    with pytest.raises(ValueError, match="another model's input embeddings"):
        model.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=3,
                       candidate_generator=hfs.MTP(random_modules(other)))
    with pytest.raises(TypeError, match="takes transformers' MtpModel"):
        hfs.MTP(modules=model)
    with pytest.raises(ValueError, match="StaticTree"):
        hfs.MTP(tree=[(0,)])
    with pytest.raises(ValueError, match="num_tokens"):
        hfs.MTP(num_tokens=0)


@pytest.mark.skipif(needs_mtp.args[0] is False, reason="transformers 4.x only")
def test_transformers_4_names_the_version_needed():
    from hf_speculative.drafters.registry import ExampleNotApplicable

    with pytest.raises(ImportError, match=r'pip install "transformers>=5.24"'):
        hfs.MTP()
    with pytest.raises(ExampleNotApplicable, match="MtpModel"):
        hfs.MTP.example(build_model("llama"))
