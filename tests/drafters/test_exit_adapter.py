"""hfs.EarlyExit(adapter=...): the trained exit adapter (Kangaroo) drafts from exactly the inputs it is
trained on, learns, saves and loads, and refuses what does not fit with clear errors.

Greedy identity with every edge case, sampling and threads run through ``DRAFTERS``
("early-exit-adapter") in tests/conftest.py and tests/core/test_sampling.py."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.drafters.self_speculative import exit_adapter
from hf_speculative.drafters.eagle import checkpoints
from hf_speculative.drafters.eagle.config import EagleConfig
from hf_speculative.core.features import FeatureTap
from hf_speculative.training.losses import eagle_loss
from tests.conftest import ARCHS, build_model, prompt_inputs, random_eagle, random_exit_adapter, stock_generate

GREEDY = dict(do_sample=False, max_new_tokens=30)
EXACT = dict(confidence_threshold=0.0, adaptive=False)


def teacher_forced_logits(model, net, ids):
    """The adapter's logits `[T, V_draft]` over a whole sequence, computed the way training computes
    them (cached exit states of a full target forward, shifted and normed by ``adapter_features``):
    entry ``t`` predicts ``ids[t + 2]``."""
    tap = FeatureTap(model, net.config.target_layers)
    with torch.no_grad():
        type(model).forward(model, input_ids=ids)
        states = tap.take()
        tap.remove()
        inputs = exit_adapter.adapter_features(states, model.model.norm)
        emb = model.get_input_embeddings()(torch.cat([ids[:, 1:], ids[:, :1]], dim=1))  # x_{t+1}
        positions = torch.arange(ids.shape[1])[None]
        hidden = net(emb, inputs, positions)
        return net.draft_logits(hidden[0], None).float()


@pytest.mark.parametrize("arch", ARCHS)
def test_draft_logits_are_the_training_logits(arch, monkeypatch):
    """Every draft step that follows the final text sees what training sees at that position, so a
    trained adapter drafts with the accuracy it was trained to (the shift, the norm, the cache and the
    positions of drafting and of training agree)."""
    model = hfs.enable(build_model(arch, layers=3))
    net = random_exit_adapter(model, exit_layer=2)
    seen = []  # (input length, step, logits over the draft vocabulary, drafted tokens so far)
    original = exit_adapter.ExitAdapterCandidateGenerator._logits

    def record(self, hidden):
        full = original(self, hidden)
        seen.append(full[self._target_ids].clone())
        return full

    monkeypatch.setattr(exit_adapter.ExitAdapterCandidateGenerator, "_logits", record)
    lengths = []
    draft = exit_adapter.ExitAdapterCandidateGenerator.draft

    def track(self, input_ids, plan):
        start = len(seen)
        tree = draft(self, input_ids, plan)
        lengths.append((input_ids.shape[1], start, len(seen), tree.tokens.tolist()))
        return tree

    monkeypatch.setattr(exit_adapter.ExitAdapterCandidateGenerator, "draft", track)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.EarlyExit(adapter=net, num_tokens=3, **EXACT))
    assert out.tolist() == stock_generate(model, **prompt_inputs(), **GREEDY).tolist()
    reference = teacher_forced_logits(model, net, out)  # [T, V_draft]
    final = out[0].tolist()
    compared = 0
    for length, start, end, tokens in lengths:
        for j, logits in enumerate(seen[start:end]):
            if tokens[:j] != final[length : length + j] or length + j >= len(final):
                break  # a step after a wrong draft token sees a text training never saw
            torch.testing.assert_close(logits, reference[length + j - 2], atol=1e-4, rtol=1e-4)
            compared += 1
    assert compared >= 10, compared


def fit_adapter(model, ids, iterations):
    net = random_exit_adapter(model, exit_layer=1, draft_vocab_size=model.config.vocab_size).requires_grad_(True).train()
    tap, final_tap = FeatureTap(model, [0]), FeatureTap(model, [])
    with torch.no_grad():
        model(input_ids=ids)
        features = exit_adapter.adapter_features(tap.take(), model.model.norm)
    final = final_tap.take()
    tap.remove(), final_tap.remove()
    embed, head = model.get_input_embeddings(), model.get_output_embeddings().weight
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    mask = torch.ones_like(ids)
    _, before = eagle_loss(net, embed, head, ids, mask, features, final, 1)
    for _ in range(iterations):
        loss, last = eagle_loss(net, embed, head, ids, mask, features, final, 1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return net.eval().requires_grad_(False), before, last


def test_training_an_adapter_raises_its_acceptance():
    model = hfs.enable(build_model("llama", layers=3, init=0.3))
    ids = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40)
    net, before, after = fit_adapter(model, ids, 150)
    assert after.accuracy[0] > before.accuracy[0] + 0.3 and after.accuracy[0] > 0.8, (before, after)
    strategy = hfs.EarlyExit(adapter=net, num_tokens=4, **EXACT)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=40, candidate_generator=strategy)
    assert out.tolist() == ids.tolist()
    stats = hfs.last_stats(model)
    assert stats.acceptance_rate > 0.7 and stats.tau > 2.0, stats


def test_save_load_and_stats(tmp_path):
    model = hfs.enable(build_model("qwen2", layers=3))
    net = random_exit_adapter(model, exit_layer=2)
    checkpoints.save_pretrained(net, tmp_path / "adapter")
    strategy = hfs.EarlyExit(adapter=tmp_path / "adapter", num_tokens=3, **EXACT)
    assert strategy.exit_layer == 2
    for a, b in zip(net.state_dict().values(), strategy._adapter_net.state_dict().values()):
        assert torch.equal(a, b)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=strategy)
    assert out.tolist() == stock_generate(model, **prompt_inputs(), **GREEDY).tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0
    assert stats.extra["early-exit"]["adapter"] == str(tmp_path / "adapter")
    assert stats.extra["early-exit"]["layers"] == 2
    assert model.config.num_hidden_layers == 3  # nothing shared mutated


def test_wrong_sha256_is_refused(tmp_path):
    model = build_model("llama", layers=3)
    checkpoints.save_pretrained(random_exit_adapter(model, exit_layer=1), tmp_path / "a")
    with pytest.raises(ValueError, match="sha256"):
        hfs.EarlyExit(adapter=tmp_path / "a", adapter_sha256={"model.safetensors": "0" * 64})


def test_clear_errors(tmp_path):
    model = hfs.enable(build_model("llama", layers=3))
    adapter = random_exit_adapter(model, exit_layer=2)
    with pytest.raises(ValueError, match="exit adapter.*hfs.EarlyExit"):
        hfs.Eagle(adapter)
    with pytest.raises(ValueError, match="EAGLE drafter.*hfs.Eagle.from_pretrained"):
        hfs.EarlyExit(adapter=random_eagle(model, version=3))
    with pytest.raises(ValueError, match="trained for exit_layer=2"):
        hfs.EarlyExit(exit_layer=1, adapter=adapter)
    with pytest.raises(ValueError, match="exit_layer"):
        hfs.EarlyExit()
    with pytest.raises(FileNotFoundError, match="train-eagle --exit-layer"):
        hfs.EarlyExit(adapter=tmp_path / "missing")
    with pytest.raises(ValueError, match="no vLLM or SafeAILab form"):
        checkpoints.export(adapter, tmp_path / "out", format="vllm")
    wider = hfs.enable(build_model("llama", layers=3, hidden=64))
    with pytest.raises(ValueError, match="hidden size: drafter 32, target 64"):
        wider.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.EarlyExit(adapter=adapter))
    shallow = hfs.enable(build_model("llama", layers=2))
    deep_adapter = random_exit_adapter(build_model("llama", layers=4), exit_layer=3)
    with pytest.raises(ValueError, match="exit after layer 3, target has 2 layers"):
        shallow.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.EarlyExit(adapter=deep_adapter))


def test_config_checks():
    model = build_model("llama", layers=3)
    with pytest.raises(ValueError, match="target_layers=\\[exit_layer - 1\\]"):
        EagleConfig.for_target(model.config, version=3, target_layers=[0, 1, 2], exit_layer=2)
    with pytest.raises(ValueError, match="EAGLE-3 shaped"):
        EagleConfig.for_target(model.config, version=1, exit_layer=2)
    config = EagleConfig.for_target(model.config, version=3, target_layers=[1], exit_layer=2)
    assert config.feature_size == config.hidden_size and config.is_exit_adapter
    assert EagleConfig.from_dict(config.to_dict()) == config
