"""``hfs.DFlash`` against transformers' own DFlash (5.24: ``generate(assistant_model=MuseGlimmerAssistantModel(...),
speculation_type="dflash")``) on the same weights: the network's outputs, the generated text, the drafts of every
round where both draft, the accepted tokens and the target forwards."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.drafters.dflash.checkpoints import to_transformers
from hf_speculative.drafters.dflash.drafter import DFlashCandidateGenerator, random_network
from tests.conftest import build_model, prompt_inputs, stock_generate

muse = pytest.importorskip("transformers.models.muse_glimmer_assistant",
                           reason="transformers' DFlash (MuseGlimmerAssistantModel) arrived in 5.24")
candidate_generator = pytest.importorskip("transformers.generation.candidate_generator")
NEW = 24


def transformers_assistant(net):
    """transformers' ``MuseGlimmerAssistantModel`` holding ``net``'s weights."""
    fields, state = to_transformers(net)
    config = muse.MuseGlimmerAssistantConfig(**fields, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    assistant = muse.MuseGlimmerAssistantModel(config).eval()
    assistant.load_state_dict(state, strict=True)
    return assistant


@pytest.mark.parametrize("types,window", [(None, None), (["sliding_attention", "full_attention"], 3)])
def test_network_equals_transformers_on_the_same_weights(types, window):
    """Three rounds of context and window through both networks, each with its cache: same hidden states (fp32)."""
    target = build_model("llama", layers=4)
    net = random_network(target, num_hidden_layers=2, block_size=4, layer_types=types, sliding_window=window)
    theirs = transformers_assistant(net)
    cache_t, cache_o = muse.modeling_muse_glimmer_assistant.DFlashCache(config=theirs.config), net.new_cache()
    cache_t.activate_past_recording()
    start = 0
    for round_, new in enumerate([6, 2, 3]):
        features = torch.randn(1, new, 2 * 32)
        window_embeds = torch.randn(1, 4, 32)
        positions = torch.arange(start, start + new + 4)[None]
        cache_t.set_previous_accepted_tokens(new)
        if round_:
            cache_t.crop(-4)  # transformers keeps the last window until the next round
        with torch.no_grad():
            expected = theirs(noise_embeds=window_embeds, context_hidden_states=features, position_ids=positions,
                              attention_mask=torch.ones(1, start + new + 4, dtype=torch.long),
                              cache=cache_t).last_hidden_state
            got = net(window_embeds, features, positions, cache_o)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        start += new


class Recorder:
    """Counts the target's forwards and records ``(length, draft)`` of each round of a generator's ``get_candidates``."""

    def __init__(self, target, monkeypatch, cls, method):
        self.forwards, self.rounds = 0, []
        target.register_forward_pre_hook(self._count)
        original = getattr(cls, method)
        recorder = self

        def spy(self, input_ids, *args, **kwargs):
            out = original(self, input_ids, *args, **kwargs)
            tokens = out[0][0, input_ids.shape[1]:] if cls is not DFlashCandidateGenerator else out.tokens
            if tokens.numel():
                recorder.rounds.append((input_ids.shape[1], tokens.tolist()))
            return out

        monkeypatch.setattr(cls, method, spy)

    def _count(self, module, args):
        self.forwards += 1


@pytest.mark.parametrize("arch,kept", [("llama", False), ("gemma3", False), ("llama", True)])
def test_generate_equals_transformers_dflash(arch, kept, monkeypatch):
    """Same text as transformers' DFlash and plain greedy; the same drafts at every length where both draft (ours a
    prefix of theirs: both draft B - 1 with adaptive=False, ours fewer where the length limit leaves less room), the
    same accepted tokens there; as many target forwards. ``kept``: both final norms zeroed, so that the target always
    writes token 0 and the drafter always drafts it: every draft is kept, in both loops alike."""
    target = build_model(arch, layers=4)
    net = random_network(target, num_hidden_layers=2, block_size=6)
    if kept:
        with torch.no_grad():
            target.model.norm.weight.zero_()
            net.norm.weight.zero_()
    expected = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW)

    with monkeypatch.context() as patch:
        theirs = Recorder(target, patch, candidate_generator.DFlashTokenCandidateGenerator, "get_candidates")
        out = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW,
                             assistant_model=transformers_assistant(net), speculation_type="dflash")
    assert out.tolist() == expected.tolist()
    target._forward_pre_hooks.clear()

    model = hfs.enable(target)
    with monkeypatch.context() as patch:
        ours = Recorder(target, patch, DFlashCandidateGenerator, "draft")
        strategy = hfs.DFlash(net, num_tokens=5, confidence_threshold=0.0, adaptive=False)
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=NEW, candidate_generator=strategy)
    assert out.tolist() == expected.tolist()
    text = expected[0].tolist()

    def accepted(length, draft):
        return next((i for i, t in enumerate(draft) if t != text[length + i]), len(draft))

    theirs_at = dict(theirs.rounds)
    assert len(theirs_at) == len(theirs.rounds) and ours.rounds[0] == theirs.rounds[0]
    common = [(length, draft) for length, draft in ours.rounds if length in theirs_at]
    assert len(common) >= 2
    for length, draft in common:
        assert draft == theirs_at[length][: len(draft)], length
        assert accepted(length, draft) == min(accepted(length, theirs_at[length]), len(draft))
    assert ours.forwards == hfs.last_stats(model).target_forwards == theirs.forwards
    if kept:
        assert all(accepted(*r) == 5 for r in ours.rounds[:-1]) and ours.forwards <= 2 + NEW // 6
