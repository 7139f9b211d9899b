"""``tools/gpu/inflate.py``: a small model and its drafters embedded in a larger shape compute the same function, so
greedy text, speculative text and every drafted tree are the small model's, token for token (float32)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import hf_speculative as hfs
from tests.conftest import build_model, prompt_inputs
from tools.gpu import inflate
from tools.gpu.inflate import COST_MODEL, inflate_model, is_inflated
from tools.gpu.inflate_drafters import inflate_strategy, save_strategy
from tools.gpu.widening import Shape, Widening, head_slots, shipped_shape

TINY = Shape("tiny-wide", 48, 4, 96, 8, 2)  # conftest's tiny models: hidden 32, 2-3 layers, 4/2 heads of 8, MLP 64
NEW = 30


def _greedy(model, **inputs):
    return type(model).generate(model, **prompt_inputs(), max_new_tokens=NEW, do_sample=False, **inputs)


@pytest.fixture
def recorded(monkeypatch):
    """``record(strategy)`` -> the list every draft of the strategy's generators is appended to (the length drafted
    after, the tree's tokens and parents)."""

    def record(strategy):
        cls, drafts = type(strategy), []
        original = cls.open

        def opened(self, ctx):
            generator = original(self, ctx)
            if self is not strategy:  # another instance of the class (recorded on its own)
                return generator
            draft = generator.draft

            def recording(sequence, plan):
                tree = draft(sequence, plan)
                drafts.append((sequence.shape[1], tree.tokens.tolist(), tree.parents.tolist()))
                return tree

            generator.draft = recording
            return generator

        monkeypatch.setattr(cls, "open", opened)
        return drafts

    return record


def test_rms_norm_needs_eps_and_weights_scaled_by_the_real_share():
    """With d real channels of D, the mean of squares is d/D of the small one: eps' = eps d/D and w' = w sqrt(d/D) give
    the small norm's values for every input, tiny ones (where eps matters) included; eps D/d does not."""
    d, big, eps = 576, 640, 1e-5
    torch.manual_seed(0)
    small = LlamaRMSNorm(d, eps=eps)
    small.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(3, d, dtype=torch.float64) * torch.tensor([[1.0], [1e-3], [3e-4]], dtype=torch.float64)
    padded = torch.cat([x, torch.zeros(3, big - d, dtype=torch.float64)], dim=-1)
    widen = Widening(d, big, 64, list(range(9)), list(range(3)), 1536)
    expected = small.double()(x)
    for scaled_eps, same in ((widen.eps(eps), True), (eps * big / d, False)):
        wide = LlamaRMSNorm(big, eps=scaled_eps).double()
        wide.weight.data.zero_()
        widen.norm(wide, small)
        out = wide(padded)
        assert torch.equal(out[:, d:], torch.zeros_like(out[:, d:]))
        assert torch.allclose(out[:, :d], expected, rtol=1e-5, atol=0) is same, scaled_eps  # (the norm works in fp32)


def test_each_query_head_keeps_its_key_value_head():
    slots = head_slots(9, 3, 64, 16)  # SmolLM2 -> Llama-3.1-8B's widths in heads of 64
    assert slots == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    assert [s // 4 for s in slots] == [i // 3 for i in range(9)]
    assert shipped_shape("llama-3.1-8b", 64) == Shape("llama-3.1-8b", 4096, 32, 14336, 64, 16)
    with pytest.raises(ValueError, match="groups of at least 3"):
        head_slots(9, 3, 16, 8)
    with pytest.raises(ValueError, match="use one of .*llama-3.1-8b"):
        shipped_shape("llama-9", 64)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_tiny_model_inflated_gives_its_greedy_text(arch):
    small = build_model(arch)
    big = inflate_model(small, TINY, name="tiny")
    text = big.config
    sizes = (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.intermediate_size)
    assert sizes == (48, 4, 8, 96)
    assert is_inflated(big)["label"] == COST_MODEL and is_inflated(small) is None
    extra = big.model.layers[-1]
    assert all(not p.any() for p in extra.parameters())  # a pass-through layer
    with torch.no_grad():
        small_logits, big_logits = small(**prompt_inputs()).logits, big(**prompt_inputs()).logits
    assert torch.allclose(small_logits, big_logits, rtol=0, atol=1e-6)
    assert torch.equal(_greedy(small), _greedy(big))
    with pytest.raises(ValueError, match="inflated already"):
        inflate_model(big, TINY)


def test_shapes_too_small_or_unsupported_are_refused():
    small = build_model("llama")
    with pytest.raises(ValueError, match="does not fit in the shape tiny-wide: hidden_size 24 < 32; give a larger"):
        inflate_model(small, dataclasses.replace(TINY, hidden_size=24))
    with pytest.raises(ValueError, match="num_layers 1 < 2"):
        inflate_model(small, dataclasses.replace(TINY, num_layers=1))
    with pytest.raises(ValueError, match="not a multiple of its 7 heads"):
        inflate_model(small, dataclasses.replace(TINY, num_heads=7, num_kv_heads=7))
    if "gemma3" in __import__("tests.conftest", fromlist=["ARCHS"]).ARCHS:
        with pytest.raises(ValueError, match="is not supported"):
            inflate_model(build_model("gemma3"), TINY)


def _drafters(small):
    from hf_speculative.drafters.dflash.drafter import random_network
    from hf_speculative.drafters.eagle.drafter import random_drafter
    from hf_speculative.drafters.medusa.drafter import random_heads

    chain = dict(num_tokens=5, confidence_threshold=0.0, adaptive=False)
    paths = hfs.StaticTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    return {
        "eagle3 chain": hfs.Eagle(random_drafter(small), **chain),
        "eagle1 chain": hfs.Eagle(random_drafter(small, version=1), **chain),
        "eagle3 tree": hfs.Eagle(random_drafter(small), tree=hfs.DynamicTree(nodes=8, depth=4, top_k=3),
                                 adaptive=False),
        "dflash static tree": hfs.DFlash(random_network(small), tree=paths, **chain),
        "dflash dynamic tree": hfs.DFlash(random_network(small), tree=hfs.DynamicTree(nodes=8), **chain),
        "medusa tree": hfs.Medusa(heads=random_heads(small), tree=paths, **{**chain, "num_tokens": 4}),
    }


def _padded(x: torch.Tensor, width: int, big_width: int) -> torch.Tensor:
    """``x`` `[..., k * width]` as `[..., k * big_width]`: each part's channels first, zeros after."""
    parts = x.split(width, dim=-1)
    return torch.cat([torch.cat([p, p.new_zeros(*p.shape[:-1], big_width - width)], dim=-1) for p in parts], dim=-1)


def test_drafter_networks_compute_the_small_ones_where_eps_matters():
    """Each network on inputs small enough that its norms' eps weighs (EAGLE-3's and DFlash's hidden norms, DFlash's
    per-head q/k norms): the inflated network's output is the small one's in the real channels and zero elsewhere."""
    small = build_model("llama", layers=3)
    big = inflate_model(small, TINY, name="tiny")
    strategies = _drafters(small)
    torch.manual_seed(1)
    d, wide = small.config.hidden_size, TINY.hidden_size
    with torch.no_grad():  # DFlash's q and k small too, so that its per-head norms' eps weighs
        for layer in strategies["dflash static tree"].network.layers:
            layer.self_attn.q_proj.weight.mul_(1e-3)
            layer.self_attn.k_proj.weight.mul_(1e-3)
    for name in ("eagle3 chain", "eagle1 chain", "dflash static tree"):
        net = strategies[name].spec_network()
        big_net = inflate_strategy(strategies[name], big, TINY, "tiny").spec_network()
        features = 1e-3 * torch.randn(1, 5, net.fc.in_features - (d if name == "eagle1 chain" else 0))
        if name.startswith("eagle"):
            embeds, positions = 1e-3 * torch.randn(1, 5, d), torch.arange(5)[None]
            out = net(embeds, features, positions)
            big_out = big_net(_padded(embeds, d, wide), _padded(features, d, wide), positions)
        else:
            window, positions = 1e-3 * torch.randn(1, 6, d), torch.arange(11)[None]
            out = net(window, features, positions)
            big_out = big_net(_padded(window, d, wide), _padded(features, d, wide), positions)
        assert not big_out[..., d:].any(), name
        assert torch.allclose(big_out[..., :d], out, rtol=1e-4, atol=1e-5), (name, (big_out[..., :d] - out).abs().max())


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_inflated_drafters_propose_what_the_small_ones_propose(arch, recorded):
    """Through our API: the inflated target with each inflated drafter gives the small model's greedy text, and every
    tree drafted on the way is the small drafter's, step for step."""
    small = hfs.enable(build_model(arch, layers=3))
    big = hfs.enable(inflate_model(small, TINY, name="tiny"))
    reference = _greedy(small)
    for name, strategy in _drafters(small).items():
        inflated = inflate_strategy(strategy, big, TINY, "tiny")
        small_drafts = recorded(strategy)
        assert torch.equal(small.generate(**prompt_inputs(), max_new_tokens=NEW, do_sample=False,
                                          candidate_generator=strategy), reference), name
        big_drafts = recorded(inflated)
        assert torch.equal(big.generate(**prompt_inputs(), max_new_tokens=NEW, do_sample=False,
                                        candidate_generator=inflated), reference), name
        assert small_drafts and sum(len(d[1]) for d in small_drafts) > len(small_drafts), name
        assert big_drafts == small_drafts, name


def test_saved_inflated_folders_load_as_the_same_model_and_drafters(tmp_path, recorded):
    small = hfs.enable(build_model("llama", layers=3))
    big = inflate_model(small, TINY, name="tiny")
    big.save_pretrained(tmp_path / "model")
    assert json.loads((tmp_path / "model" / "config.json").read_text())[inflate.MARKER]["label"] == COST_MODEL
    loaded = hfs.enable(AutoModelForCausalLM.from_pretrained(tmp_path / "model"))
    reference = _greedy(small)
    assert torch.equal(_greedy(loaded), reference)
    strategies = _drafters(small)
    for name, cls in (("eagle3 tree", hfs.Eagle), ("dflash static tree", hfs.DFlash), ("medusa tree", hfs.Medusa)):
        folder = save_strategy(inflate_strategy(strategies[name], big, TINY, "tiny"), tmp_path / name, shape=TINY,
                               small_name="tiny")
        assert json.loads((folder / "inflated.json").read_text())["label"] == COST_MODEL
        network = cls.declaration.live_fields[0]  # the loaded network with the small strategy's options
        reloaded = dataclasses.replace(strategies[name], **{
            network: getattr(cls.from_pretrained(folder, target=loaded), network)})
        small_drafts, big_drafts = recorded(strategies[name]), recorded(reloaded)
        small.generate(**prompt_inputs(), max_new_tokens=NEW, do_sample=False, candidate_generator=strategies[name])
        out = loaded.generate(**prompt_inputs(), max_new_tokens=NEW, do_sample=False, candidate_generator=reloaded)
        assert torch.equal(out, reference) and big_drafts == small_drafts, name
    assert COST_MODEL in json.loads((tmp_path / "eagle3 tree" / "config.json").read_text())["target"]


@pytest.mark.slow
@pytest.mark.integration
def test_smollm2_and_its_shipped_drafters_inflated_keep_their_text_and_drafts(integration, recorded):
    """The registry's SmolLM2 inflated to 640 channels, 32 layers, 16/4 heads and 1664 MLP channels (every rule at
    work: norms rescaled, heads regrouped, layers added), with its shipped EAGLE-3 tree, DFlash tree and Medusa tree:
    greedy text and every drafted tree identical to the small model's, in float32."""
    from hf_speculative.tooling.prompting import encode_prompt
    from tools.gpu.inflate_drafters import load_shipped

    small, tokenizer = integration
    hfs.enable(small)
    shape = inflate.SMALL_SHAPES["smollm2-wide"]
    big = hfs.enable(inflate_model(small, shape, name="smollm2-135m-instruct"))
    ids = encode_prompt(tokenizer, "Summarize the plot of Romeo and Juliet in three sentences.")
    call = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    reference = type(small).generate(small, **call)
    assert torch.equal(type(big).generate(big, **call), reference)
    tree = hfs.DynamicTree(nodes=32)
    for method in ("eagle", "dflash", "medusa"):
        strategy = dataclasses.replace(load_shipped(method, "smollm2-135m-instruct", small), adaptive=False)
        if method != "medusa":
            strategy = dataclasses.replace(strategy, tree=tree)
        inflated = inflate_strategy(strategy, big, shape, "smollm2-135m-instruct")
        small_drafts = recorded(strategy)
        assert torch.equal(small.generate(**call, candidate_generator=strategy), reference), method
        tau = hfs.last_stats(small).tau
        big_drafts = recorded(inflated)
        assert torch.equal(big.generate(**call, candidate_generator=inflated), reference), method
        assert big_drafts == small_drafts and hfs.last_stats(big).tau == tau > 1.0, method
