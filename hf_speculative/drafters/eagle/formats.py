"""Other projects' EAGLE checkpoint layouts, translated to and from ours (see ``checkpoints.py``).

Each reader turns ``(config.json dict, state dict)`` into ``(EagleConfig, state dict in our names)``;
each writer does the reverse. Shapes the config leaves out (head_dim, fc bias, layer-0 input norm)
are read from the weights, so that a config that disagrees with its weights surfaces as a
missing / unexpected key or a shape mismatch in the validation of ``checkpoints.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import compat, options
from .. import checkpoints as bounds
from ..checkpoints import CheckpointError
from .config import EagleConfig, default_target_layers

NATIVE, SAFEAILAB1, SAFEAILAB3, SPECFORGE3, VLLM3 = (
    "native", "safeailab-eagle1", "safeailab-eagle3", "specforge-eagle3", "vllm-speculators-eagle3")
IGNORED_KEYS = ("embed_tokens.weight",)  # the target's embedding, saved by SafeAILab / speculators; never used


def detect(cfg: dict[str, Any], keys: set[str]) -> str:
    """Name the layout of a checkpoint from its ``config.json`` and weight names."""
    if cfg.get("format") == "hf_speculative.eagle":
        return NATIVE
    if "speculators_model_type" in cfg:
        if cfg["speculators_model_type"] != "eagle3":
            raise CheckpointError(
                f"speculators checkpoint of type {options.shown(cfg['speculators_model_type'])}: only 'eagle3' is an "
                "EAGLE drafter this library reads (speculators and vLLM dropped their 'eagle' (EAGLE-1) type).")
        return VLLM3
    if "fc.weight" in keys and any(k.startswith("midlayer.") for k in keys):
        return SPECFORGE3 if "eagle_config" in cfg else SAFEAILAB3
    if "fc.weight" in keys and any(k.startswith("layers.0.") for k in keys):
        return SAFEAILAB1
    raise CheckpointError(
        f"Not an EAGLE drafter: config.json names {bounds.config_names(cfg)} and the weights have none of the EAGLE "
        f"names (fc.weight with midlayer.* or layers.0.*; first keys: {sorted(keys)[:5]}). Pass the directory of an "
        "EAGLE drafter (SafeAILab EAGLE-1/2/3, SpecForge, vLLM speculators eagle3 or hf_speculative's own).")


_REQUIRED = object()


def _int(cfg: dict[str, Any], key: str, default: Any = _REQUIRED, high: int = bounds.MAX_VOCAB_SIZE) -> Any:
    """``cfg[key]`` as an ``int`` in ``[1, high]`` (``default`` when absent or null), or a CheckpointError naming the
    field: checked before anything is allocated from it."""
    value = cfg.get(key) if isinstance(cfg, dict) else None
    if value is None:
        if default is _REQUIRED:
            raise KeyError(key)
        return default
    number = options.as_int(value)
    if number is None or not 1 <= number <= high:
        raise CheckpointError(f"config.json's {key} is {options.shown(value)}: must be an integer from 1 to {high}. Use "
                              "the config.json that was saved with the drafter's weights.")
    return number


def _target_depth(target_config: Any) -> int | None:
    return None if target_config is None else int(compat.text_config(target_config).num_hidden_layers)


def _rope(cfg: dict[str, Any]) -> tuple[float, dict | None]:
    """rope_theta / rope_scaling from top-level fields (4.x) or ``rope_parameters`` (5.x)."""
    params = cfg.get("rope_parameters") or {}
    if not isinstance(params, dict) or not isinstance(cfg.get("rope_scaling") or {}, dict):
        raise CheckpointError("config.json's rope_parameters / rope_scaling must be an object of rope settings "
                              "(rope_type, factor, ...). Use the config.json that was saved with the drafter's weights.")
    theta = cfg.get("rope_theta") or params.get("rope_theta") or 10000.0
    scaling = cfg.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"} or None
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return theta, scaling


def _llama_fields(cfg: dict[str, Any], sd: dict[str, torch.Tensor], prefix: str) -> dict[str, Any]:
    """EagleConfig fields of a Llama-style config; head_dim from q_proj (SafeAILab ignores ``head_dim``)."""
    heads = _int(cfg, "num_attention_heads", high=bounds.MAX_ATTENTION_HEADS)
    q = sd.get(f"{prefix}self_attn.q_proj.weight")
    rope_theta, rope_scaling = _rope(cfg)
    return dict(
        hidden_size=_int(cfg, "hidden_size", high=bounds.MAX_HIDDEN_SIZE),
        intermediate_size=_int(cfg, "intermediate_size", high=bounds.MAX_INTERMEDIATE_SIZE),
        num_attention_heads=heads, num_key_value_heads=_int(cfg, "num_key_value_heads", heads, bounds.MAX_ATTENTION_HEADS),
        head_dim=q.shape[0] // heads if q is not None else cfg.get("head_dim"),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=rope_theta, rope_scaling=rope_scaling,
        max_position_embeddings=_int(cfg, "max_position_embeddings", 2048, bounds.MAX_POSITIONS),
        hidden_act=cfg.get("hidden_act", "silu"),
        attention_bias=bool(cfg.get("attention_bias", False) or cfg.get("qkv_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
    )


def _rename(sd: dict[str, torch.Tensor], old: str, new: str) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in sd.items():
        if key in IGNORED_KEYS or key.endswith("rotary_emb.inv_freq"):
            continue
        if key.startswith(old):
            if not key.startswith(old + "0."):
                raise CheckpointError(f"The checkpoint has a second decoder layer ({options.shown(key)}); this "
                                      "library's EAGLE drafter has exactly one. Use a one-layer drafter.")
            key = new + key[len(old) + 2:]
        out[key] = value
    return out


def _unsupported(cfg: dict[str, Any], flags: dict[str, Any], source: str) -> None:
    bad = [f"{name}={options.shown(cfg[name])}" for name, ok in flags.items()
           if name in cfg and cfg[name] not in (ok, None)]
    if bad:
        raise CheckpointError(f"{source} uses {', '.join(bad)}, a variant this library's EAGLE drafter does not "
                              f"implement (it needs {', '.join(f'{k}={v!r}' for k, v in flags.items())}).")


def _eagle3_vocab(sd: dict[str, torch.Tensor], vocab: int, draft: int) -> None:
    """Identity maps for full-vocabulary drafters that omit ``d2t`` / ``t2d`` (SafeAILab, speculators do)."""
    # checked before the casts below, which would turn a float map into truncated ids without a word
    for name, allowed in (("d2t", "an integer"), ("t2d", "a bool or integer")):
        found = sd.get(name)
        if found is not None and (found.is_floating_point() or found.is_complex()
                                  or (name == "d2t" and found.dtype == torch.bool)):
            raise CheckpointError(f"its weights' {name} is {str(found.dtype).removeprefix('torch.')}, not {allowed} "
                                  f"tensor (target id = draft id + d2t[draft id]); use the weights saved with this "
                                  "drafter's config.json.")
    if draft == vocab:
        sd.setdefault("d2t", torch.zeros(draft, dtype=torch.long))
        sd.setdefault("t2d", torch.ones(vocab, dtype=torch.bool))
    if "t2d" in sd:
        sd["t2d"] = sd["t2d"].to(torch.bool)
    if "d2t" in sd:
        sd["d2t"] = sd["d2t"].to(torch.long)


def _layers3(ids: list[int] | None, target_config: Any, source: str, shift: int) -> list[int]:
    """Our target_layers (outputs of layers) from a recorded list (``shift`` = its offset) or the target's depth."""
    if ids:
        if not isinstance(ids, list) or len(ids) != 3 or any(options.as_int(i) is None for i in ids):
            raise CheckpointError(f"{source}: eagle_aux_hidden_state_layer_ids is {options.shown(ids)}: must be a list "
                                  "of three layer indices.")
        return [int(i) - shift for i in ids]
    depth = _target_depth(target_config)
    if depth is None:
        raise CheckpointError(
            f"{source} does not record which target layers it fuses (its code derives them from the target's depth). "
            "Pass target_config= (the target's transformers config) to load_checkpoint.")
    return default_target_layers(depth)


def read(fmt: str, cfg: dict[str, Any], sd: dict[str, torch.Tensor], target_config: Any = None):
    """``(EagleConfig, state dict in our names)`` of a checkpoint in layout ``fmt``."""
    name = getattr(target_config, "_name_or_path", None) or None
    depth = _target_depth(target_config)
    if fmt == NATIVE:
        return EagleConfig.from_dict({k: v for k, v in cfg.items() if k != "format"}), dict(sd)
    if fmt == SAFEAILAB1:
        sd = _rename(sd, "layers.", "midlayer.")
        if _int(cfg, "num_hidden_layers", 1, bounds.MAX_TARGET_LAYERS) != 1:
            raise CheckpointError(f"SafeAILab EAGLE-1 config has num_hidden_layers={cfg['num_hidden_layers']}; "
                                  "this library's drafter has one decoder layer.")
        fields = _llama_fields(cfg, sd, "midlayer.")
        # SafeAILab's qkv_bias (Qwen2 drafters) has no o_proj bias: an equivalent zero one
        if "midlayer.self_attn.q_proj.bias" in sd and "midlayer.self_attn.o_proj.bias" not in sd:
            sd["midlayer.self_attn.o_proj.bias"] = torch.zeros(fields["hidden_size"], dtype=sd["fc.weight"].dtype)
        fields.update(version=1, vocab_size=_int(cfg, "vocab_size"), fc_bias=bool(cfg.get("bias", "fc.bias" in sd)),
                      input_layernorm="midlayer.input_layernorm.weight" in sd, target_num_layers=depth, target=name)
        return EagleConfig(**fields), sd
    if fmt in (SAFEAILAB3, SPECFORGE3):
        source = "SpecForge EAGLE-3 checkpoint" if fmt == SPECFORGE3 else "SafeAILab EAGLE-3 checkpoint"
        _unsupported(cfg, {"fc_norm": False, "norm_output": True}, source)
        if cfg.get("target_hidden_size") not in (None, cfg["hidden_size"]):
            raise CheckpointError(f"{source}: target_hidden_size {options.shown(cfg['target_hidden_size'])} differs "
                                  f"from the drafter's hidden_size {options.shown(cfg['hidden_size'])}; this library's "
                                  "drafter has the target's width.")
        sd = {k: v for k, v in sd.items() if k not in IGNORED_KEYS and not k.endswith("rotary_emb.inv_freq")}
        vocab = _int(cfg, "vocab_size")
        draft = _int(cfg, "draft_vocab_size", vocab)
        _eagle3_vocab(sd, vocab, draft)
        recorded = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        layers = _layers3(recorded, target_config, source, 0)
        fields = _llama_fields(cfg, sd, "midlayer.")
        fields.update(version=3, vocab_size=vocab, draft_vocab_size=draft, target_layers=layers, fc_bias=False,
                      target_num_layers=depth, target=name)
        return EagleConfig(**fields), sd
    if fmt == VLLM3:
        source = "vLLM speculators eagle3 checkpoint"
        layer_cfg = cfg.get("transformer_layer_config") or {}
        if not isinstance(layer_cfg, dict):
            raise CheckpointError(f"{source}: transformer_layer_config must be an object (a Llama config).")
        if layer_cfg.get("model_type", "llama") != "llama":
            raise CheckpointError(f"{source}: transformer_layer_config.model_type="
                                  f"{options.shown(layer_cfg['model_type'])}; this library's drafter is a Llama layer "
                                  "(model_type 'llama').")
        _unsupported(cfg, {"norm_before_fc": False, "fc_norm": False, "norm_output": False}, source)
        if cfg.get("target_hidden_size") not in (None, layer_cfg["hidden_size"]):
            raise CheckpointError(f"{source}: target_hidden_size {options.shown(cfg['target_hidden_size'])} differs "
                                  f"from hidden_size {options.shown(layer_cfg['hidden_size'])}; this library's drafter "
                                  "has the target's width.")
        sd = _rename(sd, "layers.", "midlayer.")
        vocab = _int(layer_cfg, "vocab_size")
        draft = _int(cfg, "draft_vocab_size", vocab)
        _eagle3_vocab(sd, vocab, draft)
        # vLLM's ids name the layer whose INPUT is captured (the output of the layer before): shift by one
        layers = _layers3(cfg.get("eagle_aux_hidden_state_layer_ids"), target_config, source, 1)
        verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
        fields = _llama_fields(layer_cfg, sd, "midlayer.")
        fields.update(version=3, vocab_size=vocab, draft_vocab_size=draft, target_layers=layers, fc_bias=False,
                      target_num_layers=depth, target=verifier or name,
                      norm_before_residual=bool(cfg.get("norm_before_residual") or False))
        return EagleConfig(**fields), sd
    raise CheckpointError(f"Unknown checkpoint format {fmt!r}.")


def _llama_config(config: EagleConfig, dtype: torch.dtype) -> dict[str, Any]:
    return {
        "model_type": "llama", "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim, "num_hidden_layers": 1, "vocab_size": config.vocab_size,
        "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta, "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings, "hidden_act": config.hidden_act,
        "attention_bias": config.attention_bias, "mlp_bias": config.mlp_bias, "tie_word_embeddings": False,
        "torch_dtype": str(dtype).replace("torch.", ""),
    }


def write(fmt: str, config: EagleConfig, sd: dict[str, torch.Tensor], *, speculative_tokens: int = 5,
          verifier_architectures: list[str] | None = None):
    """``(config.json dict, state dict)`` of our drafter in layout ``fmt`` ("vllm" or "safeailab")."""
    dtype = sd["fc.weight"].dtype
    if config.exit_layer is not None:
        raise CheckpointError(
            f"This is an exit adapter (hfs.EarlyExit(exit_layer={config.exit_layer}, adapter=...)), not an EAGLE drafter: "
            "it reads the exit state of each drafted token, which no serving engine computes. It has no vLLM or "
            "SafeAILab form; keep it in hf_speculative's format.")
    if fmt == "vllm":
        if config.version != 3:
            raise CheckpointError(
                "vLLM's speculators format has only an 'eagle3' type (speculators removed its EAGLE-1 'eagle' type, "
                "vLLM registers only 'eagle3'). vLLM serves EAGLE-1 drafters in SafeAILab's layout with "
                "--speculative-config '{\"method\": \"eagle\", ...}': export with format='safeailab'.")
        out = {k.replace("midlayer.", "layers.0.", 1): v for k, v in sd.items()}
        if not config.reduced_vocab:  # speculators writes the maps only for a reduced vocabulary
            out.pop("d2t", None), out.pop("t2d", None)
        cfg = {
            "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
            "draft_vocab_size": config.draft_vocab_size, "norm_before_residual": config.norm_before_residual, "norm_before_fc": False,
            "fc_norm": False, "norm_output": False, "target_hidden_size": None,
            "eagle_aux_hidden_state_layer_ids": [i + 1 for i in config.target_layers],
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "verifier": {"name_or_path": config.target, "architectures": verifier_architectures or []},
            },
            "transformer_layer_config": _llama_config(config, dtype),
            "torch_dtype": str(dtype).replace("torch.", ""), "tie_word_embeddings": False,
        }
        return cfg, out
    if fmt != "safeailab":
        raise CheckpointError(f"Unknown export format {fmt!r}: use 'vllm' or 'safeailab'.")
    cfg = {**_llama_config(config, dtype), "bos_token_id": None, "eos_token_id": None, "pad_token_id": 0}
    if config.norm_before_residual:
        raise CheckpointError("This EAGLE-3 drafter starts its residual from the normed feature "
                              "(norm_before_residual=True), which SafeAILab's and SpecForge's code do not implement; "
                              "export it with format='vllm'.")
    if config.version == 1:
        if config.input_layernorm:
            raise CheckpointError("This EAGLE-1 drafter normalises its layer input (input_layernorm=True); SafeAILab's "
                                  "layer 0 has no input norm and would silently drop it. It has no SafeAILab form.")
        if config.attention_bias:
            raise CheckpointError("SafeAILab EAGLE-1 has no o_proj bias (only qkv_bias); this drafter has "
                                  "attention_bias=True.")
        cfg.update(architectures=["LlamaForCausalLM"], bias=config.fc_bias)
        return cfg, {k.replace("midlayer.", "layers.0.", 1): v for k, v in sd.items()}
    cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=config.draft_vocab_size)
    if config.target_num_layers is None or config.target_layers != default_target_layers(config.target_num_layers):
        # SGLang / SpecForge read these (outputs of layers, our convention); SafeAILab's code hardcodes the default
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(config.target_layers)}
    return cfg, dict(sd)
