"""hfs.Eagle on tiny targets: exactness with a drafter that is really accepted (trained here in a
few seconds on the target's own greedy text), hooks that never outlive a call, and clear errors."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.drafters.eagle.config import EagleConfig
from tests.conftest import PROMPT, build_model, fit_eagle, prompt_inputs, random_eagle, stock_generate

L = len(PROMPT)


def _hook_count(model) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


def train_on_own_text(target, version: int, steps: int = 250, new_tokens: int = 40):
    """An EAGLE drafter over-fitted to the target's greedy continuation of PROMPT (drafts accepted)."""
    text = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=new_tokens, eos_token_id=None)
    net, _, _ = fit_eagle(target, version, text, iterations=steps, unroll=3)
    return net.eval().requires_grad_(False), text


@pytest.fixture(scope="module", params=[1, 3])
def trained(request):
    target = build_model("llama", layers=3, init=0.3)
    target.requires_grad_(False)
    hfs.enable(target)
    net, text = train_on_own_text(target, request.param)
    return target, net, text


def test_trained_drafter_is_accepted_and_exact(trained):
    target, net, text = trained
    out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None,
                          candidate_generator=hfs.Eagle(net, num_tokens=6, confidence_threshold=0.0, adaptive=False))
    assert out.tolist() == text.tolist()
    stats = hfs.last_stats(target)
    assert stats.acceptance_rate > 0.6, stats.summary()
    assert stats.tau > 2.5, stats.summary()


@pytest.mark.parametrize("max_new_tokens", [3, 7, 11])
def test_max_new_tokens_inside_an_accepted_draft(trained, max_new_tokens):
    target, net, text = trained
    out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None,
                          candidate_generator=hfs.Eagle(net, num_tokens=8, confidence_threshold=0.0, adaptive=False))
    assert out.tolist() == text[:, : L + max_new_tokens].tolist()


def test_eos_inside_an_accepted_draft(trained):
    """A token of the greedy text made EOS: the output stops right after it, as plain greedy does."""
    target, net, text = trained
    eos = int(text[0, L + 5])
    kwargs = dict(do_sample=False, max_new_tokens=40, eos_token_id=eos, pad_token_id=0)
    ref = stock_generate(target, **prompt_inputs(), **kwargs)
    out = target.generate(**prompt_inputs(), **kwargs,
                          candidate_generator=hfs.Eagle(net, num_tokens=8, confidence_threshold=0.0, adaptive=False))
    assert out.tolist() == ref.tolist()
    assert out[0, -1] == eos and out.shape[1] <= L + 6


def test_adaptive_defaults_stay_exact(trained):
    target, net, text = trained
    out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None,
                          candidate_generator=hfs.Eagle(net))
    assert out.tolist() == text.tolist()


def test_hooks_are_removed_after_the_call_and_after_an_error():
    target = hfs.enable(build_model("llama"))
    before = _hook_count(target)
    strategy = hfs.Eagle(random_eagle(target), confidence_threshold=0.0, adaptive=False)
    target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=5, candidate_generator=strategy)
    assert _hook_count(target) == before

    class Boom(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=5, candidate_generator=strategy,
                        logits_processor=[lambda ids, scores: Boom()(scores)])
    assert _hook_count(target) == before


def test_error_drafter_for_another_model():
    target = hfs.enable(build_model("llama"))
    other = build_model("llama", hidden=64)
    strategy = hfs.Eagle(random_eagle(other))
    with pytest.raises(ValueError, match=r"hidden size: drafter 64, target 32"):
        target.generate(**prompt_inputs(), max_new_tokens=5, candidate_generator=strategy)


def test_error_fused_layer_beyond_the_target():
    target = hfs.enable(build_model("llama", layers=2))
    config = EagleConfig.for_target(build_model("llama", layers=8).config, version=3)
    from hf_speculative.drafters.eagle.model import EagleDraftModel

    with pytest.raises(ValueError, match="depth"):
        target.generate(**prompt_inputs(), max_new_tokens=5, candidate_generator=hfs.Eagle(EagleDraftModel(config)))


def test_error_arguments():
    with pytest.raises(TypeError, match="EagleDraftModel"):
        hfs.Eagle(torch.nn.Linear(2, 2))
    net = random_eagle(build_model("llama"))
    with pytest.raises(ValueError, match="num_tokens"):
        hfs.Eagle(net, num_tokens=0)
    with pytest.raises(ValueError, match="confidence_threshold"):
        hfs.Eagle(net, confidence_threshold=1.5)
    with pytest.raises(FileNotFoundError, match="train-eagle"):
        hfs.Eagle.from_pretrained("/nonexistent/drafter")
    with pytest.raises(ValueError, match="EAGLE-3 fuses exactly three"):
        EagleConfig(version=3, hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1,
                    vocab_size=10, target_layers=[1])
