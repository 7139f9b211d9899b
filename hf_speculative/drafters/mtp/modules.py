"""The target's multi-token-prediction (MTP) layers: transformers' own ``MtpModel``, loaded from the target's folder,
built with random weights for a tiny target, and checked against the target.

Nothing here copies modelling code: the layers are ``transformers.modeling_layers.MtpModel`` (5.24+), built by its
constructor or its ``from_pretrained(main_model)``. Both read the target through a :class:`_TargetAs` view that
differs from the target in one or two attributes only (a config with ``num_mtp_layers``, or the key patterns of its
MTP layers), so that the user's model is never changed.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch

from ... import compat

# model types whose transformers 5.24 config reads num_mtp_layers (num_nextn_predict_layers in Hub configs)
MTP_MODEL_TYPES = ("deepseek_v3", "glm4_moe", "bailing_hybrid", "step3p7", "mellum", "inkling")
# model types whose MTP weights transformers 5.24 drops on load (no num_mtp_layers, no use_mtp path)
MTP_DROPPED = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "mimo_v2_flash", "glm4_moe_lite", "deepseek_v32")
MTP_VERSION = "5.24"  # transformers' first version with MtpModel used here (generate(use_mtp=True))


def mtp_model_class() -> type:
    """transformers' ``MtpModel`` (the target's own multi-token-prediction layers); an ``ImportError`` naming the
    version needed on a transformers without it (4.x)."""
    try:
        from transformers.modeling_layers import MtpModel
    except ImportError:
        raise ImportError(
            f"hfs.MTP drafts with transformers' MtpModel, which transformers {compat.TRANSFORMERS_VERSION} lacks: "
            f"pip install \"transformers>={MTP_VERSION}\".") from None
    return MtpModel


class _TargetAs:
    """``target`` as ``MtpModel`` reads it, with some attributes replaced (``config``,
    ``_keys_to_ignore_on_load_unexpected``); everything else is the target's own (its decoder, embeddings, head)."""

    def __init__(self, target: torch.nn.Module, **replaced: Any):
        object.__setattr__(self, "_target", target)
        for name, value in replaced.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def num_mtp_layers(target: torch.nn.Module) -> int:
    """The number of MTP layers ``target``'s config declares; a ``ValueError`` naming the model types that have them
    when it declares none."""
    text = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    layers = getattr(text, "num_mtp_layers", None)
    if not layers:
        kind = getattr(text, "model_type", type(target).__name__)
        raise ValueError(
            f"hfs.MTP drafts with the target's own MTP layers, but this {kind!r} model's config declares none "
            f"(num_mtp_layers / num_nextn_predict_layers is {layers!r}). In transformers "
            f"{compat.TRANSFORMERS_VERSION} the model types with MTP layers are {', '.join(MTP_MODEL_TYPES)} "
            f"(DeepSeek-V3, GLM-4.5 / 4.5-Air, ...); {', '.join(MTP_DROPPED)} drop their MTP weights on load. "
            "For another model use a separate drafter (hfs.Eagle, hfs.DraftModel), or hfs.MTP(modules=...) "
            "with an MtpModel you built.")
    return int(layers)


def expected_keys(target: torch.nn.Module, layers: int) -> list[str]:
    """The checkpoint key patterns of ``target``'s MTP layers (DeepSeek-V3 / GLM-4.5 layout: one more decoder layer
    each after the last, ``model.layers.{N + k}.*``)."""
    n = int(target.config.get_text_config().num_hidden_layers)
    return [rf"model\.layers\.{n + k}\..*" for k in range(layers)]


def load_modules(target: torch.nn.Module) -> Any:
    """``MtpModel.from_pretrained(target)`` on the target's device and dtype, in eval mode.

    transformers finds the MTP weights with the class's hard-coded key patterns (``model.layers.61`` for
    DeepSeek-V3, ``46|92`` for GLM-4.5): a model of another depth (a smaller or a tiny one) matches none, so the
    patterns derived from its config (:func:`expected_keys`) are added, through a view of the target (the model
    itself is not changed). Errors name the folder, the missing keys and the pattern expected.
    """
    mtp_model = mtp_model_class()
    layers = num_mtp_layers(target)
    folder = getattr(target.config, "name_or_path", "") or getattr(target, "name_or_path", "")
    patterns = expected_keys(target, layers)
    first = int(target.config.get_text_config().num_hidden_layers)
    if not folder:
        raise ValueError(
            "hfs.MTP() loads the MTP layers from the target's checkpoint folder, but this model has none "
            "(config.name_or_path is empty: it was built, not loaded with from_pretrained). Load the target "
            "with from_pretrained(folder), or pass hfs.MTP(modules=MtpModel(...)).")
    own = list(getattr(target, "_keys_to_ignore_on_load_unexpected", None) or [])
    view = _TargetAs(target, _keys_to_ignore_on_load_unexpected=own + [p for p in patterns if p not in own])
    device = next(target.get_decoder().layers[-1].parameters()).device
    try:
        modules = mtp_model.from_pretrained(view, device_map={"": device})
    except (RuntimeError, ValueError, OSError) as error:
        missing = re.findall(r"\[.*\]", str(error))
        raise ValueError(
            f"hfs.MTP could not load the MTP layers of {folder!r}: "
            f"{'missing weights ' + missing[-1] if missing else error}. The {layers} MTP layer(s) of this "
            f"{target.config.get_text_config().model_type!r} model are expected as checkpoint keys "
            f"{', '.join(f'model.layers.{n}.*' for n in range(first, first + layers))} (enorm, hnorm, eh_proj, shared_head.norm and a decoder layer's weights, "
            "the DeepSeek-V3 / GLM-4.5 layout). Use the full checkpoint (not a copy saved without its MTP "
            "layers: save_pretrained drops them).") from error
    return prepared(modules, target)


def random_modules(target: torch.nn.Module, layers: int = 1, seed: int = 7, scale: float | None = None) -> Any:
    """An ``MtpModel`` with random weights for any decoder-only ``target`` (Llama, Qwen2, Gemma3...): built by its
    constructor from a copy of the target's config that declares ``num_mtp_layers=layers`` (and full-attention
    ``mtp_layer_types`` where the config has ``layer_types``). The tests' and the identity matrix's examples;
    ``scale``: re-draw the MTP layers' matrices ~ N(0, scale), so that every input matters."""
    mtp_model = mtp_model_class()
    config = copy.deepcopy(target.config)
    text = config.get_text_config(decoder=True)
    text.num_mtp_layers = layers
    if getattr(text, "layer_types", None) is not None and getattr(text, "mtp_layer_types", None) is None:
        text.mtp_layer_types = ["full_attention"] * layers
    if getattr(text, "mlp_layer_types", None) is not None and getattr(text, "mtp_mlp_layer_types", None) is None:
        text.mtp_mlp_layer_types = [text.mlp_layer_types[-1]] * layers
    torch.manual_seed(seed)
    modules = mtp_model(_TargetAs(target, config=config), layers)
    if scale is not None:
        with torch.no_grad():
            for name, p in modules.layers.named_parameters():
                if p.dim() == 2:
                    p.normal_(0, scale)
    return prepared(modules, target)


def prepared(modules: Any, target: torch.nn.Module) -> Any:
    """``modules`` on the target's device and dtype, its own layers in eval mode without gradients (the shared
    embedding and head are the target's: left as they are)."""
    param = next(target.parameters())
    own = [modules.layers] + ([modules.shared_post_norm] if getattr(modules, "use_shared_post_norm", False) else [])
    for module in own:
        module.to(device=param.device, dtype=param.dtype).eval().requires_grad_(False)
    return modules


def check_modules(modules: Any, target: torch.nn.Module) -> None:
    """Raise ``ValueError`` naming both sides unless ``modules`` (an ``MtpModel``) drafts for ``target``: the same
    hidden size, and the target's own embedding and head (an ``MtpModel`` shares them with the model it was built
    for)."""
    text = target.config.get_text_config()
    problems = []
    if int(modules.config.hidden_size) != int(text.hidden_size):
        problems.append(f"hidden size: MTP layers {modules.config.hidden_size}, target {text.hidden_size}")
    if modules.embed_tokens is not target.get_input_embeddings() and not hasattr(target.get_input_embeddings(),
                                                                                 "embed_norm"):
        problems.append("the MTP layers use another model's input embeddings")
    if modules.shared_head is not target.get_output_embeddings():
        problems.append("the MTP layers use another model's lm_head")
    if problems:
        raise ValueError("These MTP layers were built for another model than the target "
                         f"{getattr(target, 'name_or_path', '') or type(target).__name__!r}: " + "; ".join(problems)
                         + ". Build them for this model: MtpModel.from_pretrained(model), or hfs.MTP() which does.")
