"""Medusa checkpoint layouts, translated to and from ours (see ``checkpoints.py``).

- ``native`` (ours, ``save_pretrained``): ``config.json`` = ``MedusaConfig.to_dict()`` (``"format":
  "hf_speculative.medusa"``), ``model.safetensors`` in our names (vLLM's, below).
- ``fasterdecoding`` (FasterDecoding/Medusa ``medusa/model/medusa_model.py``, Medusa-1 and Medusa-2 heads;
  also what TGI and TensorRT-LLM's converter read): ``config.json`` with ``medusa_num_heads`` and
  ``medusa_num_layers``, weights in ``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt``; a Medusa-2 model
  saved whole (its config holds the medusa fields, its ``model.safetensors`` the fine-tuned model and the heads
  under ``medusa_head.``) gives its heads too (the model itself is the target). The heads' state dict is that
  of ``nn.ModuleList`` of
  ``nn.Sequential(*[ResBlock] * L, nn.Linear(H, V, bias=False))``: ``{i}.{j}.linear.weight`` `[H, H]`,
  ``{i}.{j}.linear.bias`` `[H]`, ``{i}.{L}.weight`` `[V, H]` (possibly under ``medusa_head.``). Their ``L``
  blocks are one module repeated, so with ``L > 1`` the ``j`` entries hold the same tensor.
- ``vllm`` (vLLM ``vllm/model_executor/models/medusa.py``, ``transformers_utils/configs/medusa.py``):
  ``config.json`` with ``model_type: "medusa"``, ``num_heads``, ``num_hidden_layers``, ``hidden_size``,
  ``vocab_size``, optional ``medusa_fc_bias`` (block bias, default false), ``original_lm_head`` (one
  shared vocabulary head, stored as ``lm_heads.0.weight``), ``truncated_vocab_size`` with ``token_map``;
  weights ``model.safetensors`` (or ``pytorch_model.bin``): ``blocks.{i}.layers.{j}.weight`` / ``.bias``,
  ``lm_heads.{i}.weight`` (possibly under ``medusa_heads.``).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ... import options
from ..checkpoints import CheckpointError, config_names
from .config import FORMAT_NAME, MedusaConfig

NATIVE, FASTERDECODING, VLLM = "native", "fasterdecoding", "vllm"
MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
_FD_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")

__all__ = ["CheckpointError", "detect", "read", "write", "NATIVE", "FASTERDECODING", "VLLM", "MEDUSA_FILES"]


def detect(cfg: dict[str, Any], keys: set[str]) -> str:
    """Name the layout of a checkpoint from its ``config.json`` and weight names."""
    if cfg.get("format") == FORMAT_NAME:
        return NATIVE
    if cfg.get("model_type") == "medusa" or any(_strip(k, "medusa_heads.").startswith("blocks.") for k in keys):
        return VLLM
    if "medusa_num_heads" in cfg:
        return FASTERDECODING
    raise CheckpointError(
        f"Not Medusa heads: config.json names {config_names(cfg)}, has no medusa_num_heads (FasterDecoding's Medusa) "
        f"nor model_type 'medusa' (vLLM), and the weights have no blocks.* names (first keys: {sorted(keys)[:5]}). "
        "Pass the folder of Medusa heads (FasterDecoding Medusa-1/2, vLLM's Medusa or hf_speculative's own).")


def _strip(key: str, prefix: str) -> str:
    return key[len(prefix):] if key.startswith(prefix) else key


def read(fmt: str, cfg: dict[str, Any], sd: dict[str, torch.Tensor]) -> tuple[MedusaConfig, dict[str, torch.Tensor]]:
    """``(MedusaConfig, state dict in our names)``. Shapes the config leaves out come from the weights, so a
    config that disagrees with its weights surfaces in the validation of ``checkpoints.py``."""
    if fmt == NATIVE:
        try:
            return MedusaConfig.from_dict(cfg), dict(sd)
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"config.json is not a valid hf_speculative Medusa config: {error}") from error
    if fmt == FASTERDECODING:
        return _read_fasterdecoding(cfg, sd)
    return _read_vllm(cfg, sd)


def _read_fasterdecoding(cfg, sd):
    # raw values: MedusaConfig checks their types and bounds (before any head is built) and names them
    heads, layers = cfg["medusa_num_heads"], cfg.get("medusa_num_layers", 1)
    if any(k.startswith("medusa_head.") for k in sd):  # Medusa-2: the fine-tuned model's weights with the heads
        sd = {k: v for k, v in sd.items() if k.startswith("medusa_head.")}
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        match = _FD_KEY.match(_strip(key, "medusa_head."))
        if match is None:
            out[key] = value  # reported as unexpected
            continue
        i, j, name = int(match[1]), int(match[2]), match[3]
        if name == "weight" and j == options.as_int(layers):
            out[f"lm_heads.{i}.weight"] = value
        elif name != "weight":
            out[f"blocks.{i}.layers.{j}.{name.split('.')[1]}"] = value
        else:
            out[key] = value  # a vocabulary head where a block should be: unexpected
    head, block = out.get("lm_heads.0.weight"), out.get("blocks.0.layers.0.weight")  # [V, H], [H, H]
    shaped = head if head is not None else block
    if shaped is None and not cfg.get("hidden_size"):
        raise CheckpointError(f"No Medusa head weights (keys like 0.0.linear.weight, 0.{options.escaped(layers, 20)}"
                              f".weight) in this FasterDecoding checkpoint; first keys: {sorted(sd)[:5]}.")
    hidden = cfg.get("hidden_size") or int(shaped.shape[-1])
    vocab = int(head.shape[0]) if head is not None else (cfg.get("vocab_size") or 1)
    return MedusaConfig(num_heads=heads, num_layers=layers, hidden_size=hidden, vocab_size=vocab,
                        block_bias=True, target=cfg.get("base_model_name_or_path")), out


def _read_vllm(cfg, sd):
    # vLLM's MedusaConfig.from_pretrained renames any "num...heads" / "num...layers" field, as here
    heads = next((cfg[k] for k in cfg if "num" in k and "heads" in k), None)
    layers = next((cfg[k] for k in cfg if "num" in k and "layers" in k), 1)
    if heads is None:
        raise CheckpointError("This vLLM Medusa config.json has no num_heads field, which that format always has.")
    vocab = cfg.get("vocab_size", 32001)
    truncated = cfg.get("truncated_vocab_size")
    if truncated is not None and truncated != vocab:
        raise CheckpointError(f"These vLLM Medusa heads use a truncated vocabulary (truncated_vocab_size "
                              f"{options.shown(truncated)}, vocab_size {options.shown(vocab)}, with a token_map), "
                              "which hf_speculative does not read; train full-vocabulary heads (`hf-speculative "
                              "train-medusa`) or use vLLM.")
    shared = bool(cfg.get("original_lm_head", False))
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        key = _strip(key, "medusa_heads.")
        if shared and key == "lm_heads.0.weight":
            key = "lm_head.weight"
        out[key] = value
    return MedusaConfig(num_heads=heads, num_layers=layers, hidden_size=cfg.get("hidden_size", 4096),
                        vocab_size=vocab, lm_head="shared" if shared else "per_head",
                        block_bias=bool(cfg.get("medusa_fc_bias", False))), out


def write(fmt: str, config: MedusaConfig, sd: dict[str, torch.Tensor], target_head: torch.Tensor | None = None,
          target_name: str | None = None) -> tuple[dict[str, Any], dict[str, torch.Tensor], str]:
    """``(config.json dict, state dict, weights file name)`` of heads in layout ``fmt`` ("vllm" or "medusa").
    ``target_head`` `[V, H]`: the target's lm_head weight, needed for heads with ``lm_head="target"``."""
    if config.lm_head == "target" and target_head is None:
        raise CheckpointError("These heads use the target's own lm_head (lm_head='target'), which vLLM and Medusa "
                              "store with the heads: export them with the target (--target NAME, or target=model).")
    blocks = {k: v for k, v in sd.items() if k.startswith("blocks.")}
    if fmt == "vllm":
        out = dict(blocks)
        if config.lm_head == "per_head":
            out.update({k: v for k, v in sd.items() if k.startswith("lm_heads.")})
        else:
            out["lm_heads.0.weight"] = sd["lm_head.weight"] if config.lm_head == "shared" else target_head
        cfg = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": config.hidden_size,
               "vocab_size": config.vocab_size, "num_heads": config.num_heads, "num_hidden_layers": config.num_layers,
               "truncated_vocab_size": config.vocab_size, "medusa_fc_bias": config.block_bias,
               "original_lm_head": config.lm_head != "per_head", "max_paths": 64, "topk": 10,
               "torch_dtype": str(next(iter(sd.values())).dtype).replace("torch.", "")}
        return cfg, out, "model.safetensors"
    if fmt != "medusa":
        raise CheckpointError(f"Unknown export format {fmt!r}: use 'vllm' or 'medusa'.")
    if config.num_layers > 1 and any(
            not torch.equal(sd[f"blocks.{i}.layers.{j}.weight"], sd[f"blocks.{i}.layers.0.weight"])
            for i in range(config.num_heads) for j in range(1, config.num_layers)):
        raise CheckpointError(f"FasterDecoding's Medusa repeats one residual block {config.num_layers} times per head "
                              "([ResBlock] * medusa_num_layers); these heads have distinct blocks, which it would "
                              "load into one. Export them with format='vllm'.")
    out = {}
    for i in range(config.num_heads):
        for j in range(config.num_layers):
            weight = sd[f"blocks.{i}.layers.{j}.weight"]
            out[f"{i}.{j}.linear.weight"] = weight
            # Medusa's blocks always have a bias: zero is the same block
            out[f"{i}.{j}.linear.bias"] = sd.get(f"blocks.{i}.layers.{j}.bias", torch.zeros_like(weight[:, 0]))
        out[f"{i}.{config.num_layers}.weight"] = {"per_head": lambda: sd[f"lm_heads.{i}.weight"],
                                                  "shared": lambda: sd["lm_head.weight"],
                                                  "target": lambda: target_head}[config.lm_head]()
    cfg = {"medusa_num_heads": config.num_heads, "medusa_num_layers": config.num_layers,
           "base_model_name_or_path": target_name or config.target, "hidden_size": config.hidden_size,
           "vocab_size": config.vocab_size}
    return cfg, out, "medusa_lm_head.safetensors"
