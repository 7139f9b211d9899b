"""EAGLE checkpoint formats: files written the way each project writes them, loaded, run, exported.

No downloads: every checkpoint is built here from a random drafter, with the key names, config
fields and file kinds of SafeAILab EAGLE-1/3, SpecForge and vLLM speculators (see checkpoints.py).
"""

from __future__ import annotations

import hashlib
import dataclasses
import json

import pytest
import torch
import transformers
from safetensors.torch import save_file

from hf_speculative.drafters.eagle import checkpoints
from hf_speculative.drafters.eagle.checkpoints import CheckpointError, export, load_checkpoint
from hf_speculative.drafters.eagle.config import EagleConfig
from hf_speculative.drafters.eagle.model import EagleDraftModel

H, V, L, DRAFT_V = 64, 100, 8, 60


def target_config(**overrides):
    fields = dict(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                  num_hidden_layers=L, vocab_size=V)
    fields.update(overrides)
    return transformers.LlamaConfig(**fields)


def random_drafter(version: int, seed: int = 0, **overrides) -> EagleDraftModel:
    draft = overrides.pop("draft_vocab_size", DRAFT_V if version == 3 else None)
    config = EagleConfig.for_target(target_config(), version=version, draft_vocab_size=draft,
                                    rms_norm_eps=1e-5, rope_theta=500000.0, **overrides)
    torch.manual_seed(seed)
    model = EagleDraftModel(config)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param) * 0.2 + (1.0 if param.ndim == 1 else 0.0))
        if version == 3:
            ids = torch.randperm(V)[: config.draft_vocab_size].sort().values
            model.d2t.copy_(ids - torch.arange(config.draft_vocab_size))
            model.t2d.zero_()
            model.t2d[ids] = True
    return model.eval()


def run(model: EagleDraftModel, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    embeds = torch.randn(2, 5, H, generator=g)
    hidden = torch.randn(2, 5, model.config.feature_size, generator=g)
    positions = torch.arange(5).expand(2, 5)
    with torch.no_grad():
        return model(embeds, hidden, positions)


def assert_same_drafter(original: EagleDraftModel, config: EagleConfig, state: dict) -> EagleDraftModel:
    loaded = EagleDraftModel(config)
    loaded.load_state_dict(state, strict=True)
    loaded.eval()
    assert torch.equal(run(loaded), run(original))
    if config.version == 3 and config.reduced_vocab:
        assert torch.equal(loaded.target_ids(), original.target_ids())
    assert (loaded.target_ids() is None) == (original.target_ids() is None)
    return loaded


def llama_json(config: EagleConfig, **extra) -> dict:
    """A drafter config.json as SafeAILab / SpecForge write it (Llama fields of the drafter)."""
    return {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
            "hidden_size": config.hidden_size, "initializer_range": 0.02, "intermediate_size": config.intermediate_size,
            "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads, "num_hidden_layers": 1, "pad_token_id": 0,
            "rms_norm_eps": config.rms_norm_eps, "tie_word_embeddings": False, "torch_dtype": "float16",
            "transformers_version": "4.28.1", "use_cache": True, "vocab_size": config.vocab_size,
            "rope_theta": config.rope_theta, **extra}


def renamed(model: EagleDraftModel, old: str, new: str) -> dict:
    return {k.replace(old, new, 1): v.clone() for k, v in model.state_dict().items()}


def write_safeailab1(tmp_path, model, *, bias_field=True, embed=True, kind="bin"):
    sd = renamed(model, "midlayer.", "layers.0.")
    if embed:  # SafeAILab's EAGLE-1 checkpoints carry a copy of the target's embedding
        sd["embed_tokens.weight"] = torch.randn(V, H)
    extra = {"bias": model.config.fc_bias} if bias_field else {}
    (tmp_path / "config.json").write_text(json.dumps(llama_json(model.config, **extra)))
    if kind == "bin":
        torch.save(sd, tmp_path / "pytorch_model.bin")
    else:
        save_file(sd, str(tmp_path / "model.safetensors"))
    return tmp_path


def write_safeailab3(tmp_path, model):
    cfg = llama_json(model.config, draft_vocab_size=model.config.draft_vocab_size)
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # eagle/traineagle3/config.json
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, tmp_path / "pytorch_model.bin")
    return tmp_path


def write_specforge(tmp_path, model, layers):
    cfg = llama_json(model.config, draft_vocab_size=model.config.draft_vocab_size,
                     architectures=["LlamaForCausalLMEagle3"],
                     eagle_config={"eagle_aux_hidden_state_layer_ids": layers})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    return tmp_path


def speculators_json(model, aux_ids, **extra):
    c = model.config
    return {
        "architectures": ["Eagle3DraftModel"], "auto_map": {"": "config.Eagle3SpeculatorConfig"},
        "draft_vocab_size": c.draft_vocab_size, "dtype": "float32", "eagle_aux_hidden_state_layer_ids": aux_ids,
        "embed_requires_grad": False, "fc_norm": False, "norm_before_fc": False, "norm_before_residual": False,
        "norm_output": False, "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": 3,
                                  "verifier_accept_k": 1}],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "org/tiny-target"}},
        "speculators_model_type": "eagle3", "speculators_version": "0.8.0.dev0", "target_hidden_size": None,
        "tie_word_embeddings": False,
        "transformer_layer_config": {
            "attention_bias": False, "head_dim": c.head_dim, "hidden_act": "silu", "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "max_position_embeddings": 2048, "mlp_bias": False,
            "model_type": "llama", "num_attention_heads": c.num_attention_heads, "num_hidden_layers": 1,
            "num_key_value_heads": c.num_key_value_heads, "rms_norm_eps": c.rms_norm_eps,
            "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"}, "vocab_size": c.vocab_size},
        **extra,
    }


def write_speculators(tmp_path, model, aux_ids=(2, 4, 5), sharded=False, **extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    sd = renamed(model, "midlayer.", "layers.0.")
    sd["embed_tokens.weight"] = torch.randn(V, H)
    (tmp_path / "config.json").write_text(json.dumps(speculators_json(model, list(aux_ids), **extra)))
    if sharded:
        keys = sorted(sd)
        shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
        for name, part in shards.items():
            save_file({k: sd[k].contiguous() for k in part}, str(tmp_path / name))
        index = {"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    return tmp_path


# -- reading each format --------------------------------------------------------------------------
@pytest.mark.parametrize("fc_bias,bias_field,kind", [(True, True, "bin"), (False, True, "bin"), (True, False, "st"),
                                                     (False, False, "st")])
def test_safeailab_eagle1(tmp_path, fc_bias, bias_field, kind):
    model = random_drafter(1, fc_bias=fc_bias)
    write_safeailab1(tmp_path, model, bias_field=bias_field, kind=kind)
    config, state, fmt = load_checkpoint(tmp_path, target_config=target_config())
    assert fmt == "safeailab-eagle1" and "embed_tokens.weight" not in state
    assert config.fc_bias == fc_bias and not config.input_layernorm and config.target_layers == []
    assert (config.rms_norm_eps, config.rope_theta, config.target_num_layers) == (1e-5, 500000.0, L)
    assert_same_drafter(model, config, state)


def test_safeailab_eagle1_bias_field_without_weight_is_missing_key(tmp_path):
    model = random_drafter(1, fc_bias=False)
    write_safeailab1(tmp_path, model)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "bias": True}))
    expected = r"drafter its config describes.*fc_bias=True.*missing keys \[.fc.bias.\]"
    with pytest.raises(CheckpointError, match=expected):
        load_checkpoint(tmp_path)


def test_safeailab_eagle3_needs_target_depth(tmp_path):
    model = random_drafter(3)
    write_safeailab3(tmp_path, model)
    with pytest.raises(CheckpointError, match="target_config"):
        load_checkpoint(tmp_path)
    config, state, fmt = load_checkpoint(tmp_path, target_config=target_config())
    # SafeAILab captures the input of layers 2, L//2, L-3 = the outputs of 1, L//2-1, L-4
    assert fmt == "safeailab-eagle3" and config.target_layers == [1, 3, 4] == model.config.target_layers
    assert config.draft_vocab_size == DRAFT_V and config.vocab_size == V
    assert_same_drafter(model, config, state)


def test_safeailab_eagle3_full_vocab_without_maps(tmp_path):
    model = random_drafter(3, draft_vocab_size=V)
    write_safeailab3(tmp_path, model)
    sd = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    torch.save({k: v for k, v in sd.items() if k not in ("d2t", "t2d")}, tmp_path / "pytorch_model.bin")
    config, state, _ = load_checkpoint(tmp_path, target_config=target_config())
    assert not config.reduced_vocab and torch.equal(state["d2t"], torch.zeros(V, dtype=torch.long))
    with torch.no_grad():
        model.d2t.zero_(), model.t2d.fill_(True)
    assert_same_drafter(model, config, state)


def test_specforge_eagle3_layer_ids_are_layer_outputs(tmp_path):
    model = random_drafter(3, target_layers=[0, 2, 6])
    write_specforge(tmp_path, model, [0, 2, 6])
    config, state, fmt = load_checkpoint(tmp_path)
    assert fmt == "specforge-eagle3" and config.target_layers == [0, 2, 6]
    assert_same_drafter(model, config, state)


@pytest.mark.parametrize("sharded", [False, True])
def test_vllm_speculators_eagle3(tmp_path, sharded):
    model = random_drafter(3)
    write_speculators(tmp_path, model, aux_ids=(2, 4, 5), sharded=sharded)
    config, state, fmt = load_checkpoint(tmp_path)
    # vLLM's ids name the layer whose input is captured: [2, 4, 5] -> outputs of [1, 3, 4]
    assert fmt == "vllm-speculators-eagle3" and config.target_layers == [1, 3, 4]
    assert config.target == "org/tiny-target" and config.rope_theta == 500000.0
    assert_same_drafter(model, config, state)


def test_vllm_speculators_default_layers_from_target(tmp_path):
    model = random_drafter(3)
    write_speculators(tmp_path, model, aux_ids=())
    with pytest.raises(CheckpointError, match="target_config"):
        load_checkpoint(tmp_path)
    assert load_checkpoint(tmp_path, target_config=target_config())[0].target_layers == [1, 3, 4]


def test_vllm_speculators_norm_before_residual(tmp_path):
    """The speculators variant whose residual starts from the normed feature loads, runs as written
    (differently from the plain layout), exports back to vllm, and refuses the SafeAILab layout."""
    model = random_drafter(3, norm_before_residual=True)
    write_speculators(tmp_path / "in", model, norm_before_residual=True)
    config, state, _ = load_checkpoint(tmp_path / "in", target_config=target_config())
    assert config.norm_before_residual
    assert_same_drafter(model, config, state)
    plain = EagleDraftModel(dataclasses.replace(config, norm_before_residual=False))
    plain.load_state_dict(state, strict=True)
    assert not torch.equal(run(plain.eval()), run(model))
    checkpoints.export(model, tmp_path / "vllm", format="vllm")
    assert json.loads((tmp_path / "vllm" / "config.json").read_text())["norm_before_residual"] is True
    with pytest.raises(CheckpointError, match="norm_before_residual=True"):
        checkpoints.export(model, tmp_path / "sai", format="safeailab")


def test_vllm_speculators_unsupported_variant(tmp_path):
    write_speculators(tmp_path, random_drafter(3), norm_before_fc=True)
    with pytest.raises(CheckpointError, match="norm_before_fc=True.*does not implement"):
        load_checkpoint(tmp_path)


def test_native_round_trip_keeps_dtype_and_metadata(tmp_path):
    model = random_drafter(3).to(torch.bfloat16)
    checkpoints.save_pretrained(model, tmp_path, metadata={"command": "hf-speculative train-eagle ..."})
    assert json.loads((tmp_path / "config.json").read_text())["format"] == "hf_speculative.eagle"
    assert json.loads((tmp_path / "training.json").read_text())["command"].startswith("hf-speculative")
    config, state, fmt = load_checkpoint(tmp_path)
    assert fmt == "native" and config == model.config and state["fc.weight"].dtype == torch.bfloat16
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value), key
    assert load_checkpoint(tmp_path, dtype=torch.float32)[1]["fc.weight"].dtype == torch.float32
    assert checkpoints.load_drafter(tmp_path).config == model.config


def test_network_kind_without_the_target(tmp_path):
    """``network_kind`` names EAGLE-1 / EAGLE-3 / exit adapter from config and weight names alone,
    for every format (SafeAILab EAGLE-3 could not be loaded without the target's depth)."""
    e1, e3 = random_drafter(1), random_drafter(3)
    adapter = random_drafter(3, target_layers=[2], exit_layer=3)
    checkpoints.save_pretrained(adapter, tmp_path / "adapter")
    checkpoints.save_pretrained(e3, tmp_path / "native3")
    cases = {
        write_safeailab1(_mkdir(tmp_path / "s1"), e1): (1, None),
        write_safeailab1(_mkdir(tmp_path / "s1st"), e1, kind="st"): (1, None),
        write_safeailab3(_mkdir(tmp_path / "s3"), e3): (3, None),
        write_specforge(_mkdir(tmp_path / "sf"), e3, [1, 3, 5]): (3, None),
        write_speculators(tmp_path / "vllm", e3, sharded=True): (3, None),
        tmp_path / "native3": (3, None),
        tmp_path / "adapter": (3, 3),
    }
    for folder, expected in cases.items():
        assert checkpoints.network_kind(folder) == expected, folder
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        checkpoints.network_kind(tmp_path / "broken")
    with pytest.raises(CheckpointError, match="No config.json"):
        checkpoints.network_kind(tmp_path / "nowhere")


def _mkdir(path):
    path.mkdir()
    return path


# -- export round trips ---------------------------------------------------------------------------
@pytest.mark.parametrize("version,fmt,layers,expected", [
    (3, "vllm", None, "vllm-speculators-eagle3"), (3, "safeailab", None, "safeailab-eagle3"),
    (3, "safeailab", [0, 5, 7], "specforge-eagle3"), (1, "safeailab", None, "safeailab-eagle1")])
def test_export_round_trip(tmp_path, version, fmt, layers, expected):
    extra = {"target_layers": layers} if layers else {}
    model = random_drafter(version, target="org/tiny-target", **extra)
    src = checkpoints.save_pretrained(model, tmp_path / "ours")
    out = export(src if version == 3 else model, tmp_path / "out", format=fmt, target_config=target_config())
    cfg = json.loads((out / "config.json").read_text())
    config, state, got = load_checkpoint(out, target_config=target_config(_name_or_path="org/tiny-target"))
    assert got == expected and config == model.config
    assert set(state) == set(model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value), key
    assert_same_drafter(model, config, state)
    if fmt == "vllm":
        assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-target"
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5] and cfg["norm_before_residual"] is False
        assert cfg["transformer_layer_config"]["vocab_size"] == V and cfg["draft_vocab_size"] == DRAFT_V


def test_export_eagle1_fc_bias_off(tmp_path):
    model = random_drafter(1, fc_bias=False)
    out = export(model, tmp_path, format="safeailab")
    assert json.loads((out / "config.json").read_text())["bias"] is False
    config, state, _ = load_checkpoint(out, target_config=target_config())
    assert "fc.bias" not in state and config == model.config
    assert_same_drafter(model, config, state)


def test_export_eagle1_to_vllm_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="only an 'eagle3' type.*format='safeailab'"):
        export(random_drafter(1), tmp_path, format="vllm")


# -- errors ---------------------------------------------------------------------------------------
def test_missing_and_unexpected_keys_name_both_sides(tmp_path):
    model = random_drafter(3)
    write_safeailab3(tmp_path, model)
    sd = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    del sd["midlayer.hidden_norm.weight"]
    sd["midlayer.extra.weight"] = torch.zeros(3)
    torch.save(sd, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, target_config=target_config())
    message = str(info.value)
    assert "missing keys ['midlayer.hidden_norm.weight']" in message
    assert "unexpected keys ['midlayer.extra.weight']" in message
    assert str(tmp_path) in message and "EAGLE-3, hidden 64" in message


def test_shape_mismatch_names_both_shapes(tmp_path):
    model = random_drafter(1)
    write_safeailab1(tmp_path, model)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 256}))
    expected = r"midlayer.mlp.gate_proj.weight: checkpoint \(128, 64\), drafter \(256, 64\)"
    with pytest.raises(CheckpointError, match=expected):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("kind", ["st", "bin"])
def test_truncated_weights_file(tmp_path, kind):
    write_safeailab1(tmp_path, random_drafter(1), kind=kind)
    path = tmp_path / ("model.safetensors" if kind == "st" else "pytorch_model.bin")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(tmp_path)


def test_not_an_eagle_checkpoint(tmp_path):
    target = transformers.LlamaForCausalLM(target_config(num_hidden_layers=2))
    target.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="Not an EAGLE drafter: config.json names LlamaForCausalLM"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="not a config object"):
        load_checkpoint(tmp_path)


def test_sha256(tmp_path):
    checkpoints.save_pretrained(random_drafter(1), tmp_path)
    good = hashlib.sha256((tmp_path / "model.safetensors").read_bytes()).hexdigest()
    load_checkpoint(tmp_path, sha256={"model.safetensors": good})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, sha256={"model.safetensors": "0" * 64})
    assert good in str(info.value) and "0" * 64 in str(info.value)


def test_target_config_mismatch(tmp_path):
    write_speculators(tmp_path, random_drafter(3))
    with pytest.raises(CheckpointError, match="hidden size: drafter 64, target 32"):
        load_checkpoint(tmp_path, target_config=target_config(hidden_size=32, num_attention_heads=4))
    with pytest.raises(CheckpointError, match=r"fused layers \[1, 3, 4\] outside the target's 0..3"):
        load_checkpoint(tmp_path, target_config=target_config(num_hidden_layers=4))


def test_check_target():
    config = random_drafter(3).config
    config.check_target(transformers.LlamaForCausalLM(target_config()))
    with pytest.raises(ValueError, match="hidden size: drafter 64, target 32.*vocabulary: drafter 100, target 50"):
        config.check_target(transformers.LlamaForCausalLM(target_config(hidden_size=32, vocab_size=50)))
    with pytest.raises(ValueError, match="depth: drafter trained on a 8-layer target, target has 6"):
        config.check_target(transformers.LlamaForCausalLM(target_config(num_hidden_layers=6)))
