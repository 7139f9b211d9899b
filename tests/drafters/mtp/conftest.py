"""A tiny GLM-4.5-style target (``glm4_moe``, one MTP layer) saved with its MTP layer in the DeepSeek-V3 / GLM-4.5
checkpoint layout (``model.layers.{N}.*``), for ``hfs.MTP()``'s loader and the comparison with transformers' own
``generate(use_mtp=True)``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

try:
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
    from transformers.modeling_layers import MtpModel  # noqa: F401 - transformers 5.24+
except ImportError:  # transformers 4.x: no MtpModel
    Glm4MoeConfig = None

needs_mtp = pytest.mark.skipif(Glm4MoeConfig is None, reason="transformers' MtpModel arrived in 5.x (5.24 here)")
HIDDEN_LAYERS = 2  # the MTP layer is stored as layer 2


def glm_config(layers: int = HIDDEN_LAYERS, **overrides):
    fields = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "moe_intermediate_size": 16, "n_routed_experts": 4,
                  "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "num_mtp_layers": 1,
                  "max_position_embeddings": 256, "initializer_range": 0.3, "eos_token_id": 2, "pad_token_id": 0,
                  "bos_token_id": 3, "tie_word_embeddings": False}
    fields.update(overrides)
    return Glm4MoeConfig(**fields)


def save_glm_checkpoint(folder: Path, seed: int = 0, mtp_keys: bool = True) -> Path:
    """Save a random 2-layer ``glm4_moe`` target whose checkpoint also holds its MTP layer as ``model.layers.2.*``:
    a 3-layer model is saved (transformers writes its layer 2 in the layout it reads back), its config then says 2
    layers, and the MTP extras (``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm``) are added beside layer 2.
    ``mtp_keys=False`` leaves the extras out (a checkpoint whose MTP keys are missing)."""
    from safetensors.torch import load_file, save_file

    torch.manual_seed(seed)
    model = Glm4MoeForCausalLM(glm_config(HIDDEN_LAYERS + 1)).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 2, 0
    model.save_pretrained(folder)
    weights = load_file(folder / "model.safetensors")
    if mtp_keys:
        generator = torch.Generator().manual_seed(seed + 1)
        h = model.config.hidden_size
        prefix = f"model.layers.{HIDDEN_LAYERS}."
        weights[prefix + "enorm.weight"] = 1 + 0.1 * torch.randn(h, generator=generator)
        weights[prefix + "hnorm.weight"] = 1 + 0.1 * torch.randn(h, generator=generator)
        weights[prefix + "shared_head.norm.weight"] = 1 + 0.1 * torch.randn(h, generator=generator)
        weights[prefix + "eh_proj.weight"] = 0.3 * torch.randn(h, 2 * h, generator=generator)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config = glm_config()
    config.save_pretrained(folder)
    return folder


def load_glm(folder: Path):
    """The target loaded from ``folder`` (its ``name_or_path`` set, as ``MtpModel.from_pretrained`` needs)."""
    return Glm4MoeForCausalLM.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def glm_folder(tmp_path_factory) -> Path:
    return save_glm_checkpoint(tmp_path_factory.mktemp("glm_mtp"))
