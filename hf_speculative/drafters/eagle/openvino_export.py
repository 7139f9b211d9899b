"""An EAGLE-3 drafter for OpenVINO GenAI's speculative decoding (``hf-speculative export-eagle --format openvino``).

What OpenVINO GenAI runs, read in its sources (openvinotoolkit/openvino.genai at master da1db864, whose EAGLE-3
functions are those of releases/2026/3; checked at run time on the 2026.4.1 wheel) and in optimum-intel 2.2.0's:

- The draft folder is an OpenVINO IR (``openvino_model.xml``/``.bin``) of optimum-intel's ``LlamaEagle3ForCausalLM``
  (``optimum/exporters/openvino/model_patcher.py:8394-8670``), which ``optimum-cli export openvino`` builds for a
  config whose ``architectures[0]`` is SafeAILab's / SpecForge's ``LlamaForCausalLMEagle3`` (``__main__.py:219``)
  with ``draft_vocab_size``: ``fc`` (3H -> H, no bias), one ``midlayer`` with q/k/v over
  ``cat(input_layernorm(embedding), hidden_norm(hidden))`` and the *un-normed* hidden as residual, ``norm``,
  ``lm_head`` over the draft vocabulary, and ``d2t`` returned as a second output (``model_configs.py:866-908``).
  That is our EAGLE-3 drafter with ``norm_before_residual=False`` and no attention bias (its q/k/v have none), and
  ``formats.write("safeailab")`` gives its config and weight names. The export marks the IR ``eagle3_mode``
  (``convert.py:152,931``); GenAI's ``draft_model()`` reads that mark (``src/cpp/src/llm/pipeline.cpp:129``,
  ``apply_eagle3_rt_info`` in ``src/cpp/src/speculative_decoding/eagle3_model_transforms.cpp:78``).
- optimum-cli loads that class as remote code (``update_config_for_custom_draft_model``, ``__main__.py:226``): it
  needs ``--trust-remote-code``, and transformers' ``check_imports`` then wants every package ``model_patcher.py``
  names (diffusers, einops), whose newest releases do not resolve with optimum-intel 2.2's pins. Here the class is
  subclassed and filled in process (all weights, strictly) and written with ``export_from_model``, which takes a
  ``PreTrainedModel`` of another module for a transformers one (``optimum/intel/utils/modeling_utils.py:213``).
- The target is a plain ``optimum-cli export openvino --task text-generation-with-past`` IR, with its tokenizer
  (``openvino_tokenizer.xml``): nothing in it is EAGLE-specific. At load, GenAI rewires both models
  (``continuous_batching/eagle3_strategy.cpp:48-52``): the target gains an output, the concatenation of the
  hidden states of three decoder layers, found by name (``"layers.{i}/"``) as the residual ``Add`` whose second
  input is the MLP's down projection (``eagle3_model_transforms.cpp:235-300``): the **output** of layer ``i``,
  our ``target_layers`` convention. The draft's ``fc`` moves into the target (``move_fc_from_draft_to_main``, :173);
  the draft's embedding is replaced by the target's (``share_vocabulary``, :144); ``d2t`` becomes the id map
  (``extract_d2t_mapping_table``, :221; target id = draft id + d2t[draft id], as ours).
- Which layers: the ``hidden_layers_list`` entry of the draft IR's rt_info, else ``{2, L/2, L-3}`` from the
  target's ``num_hidden_layers`` (``eagle3_model_transforms.cpp:28-75``). That default names SafeAILab's layers
  but taps their outputs, one layer later than SafeAILab's code (the input of layers 2, L//2, L-3: our default
  ``[1, L//2-1, L-4]``), so the export always writes ``hidden_layers_list`` = ``target_layers``.
- The draft folder's ``generation_config.json`` is read too; a null ``eos_token_id`` there becomes -1 and fails
  ``'stop_token_ids' must be non-negative`` (``src/cpp/src/generation_config.cpp:303``): the export copies the
  target's generation config (and its bos/eos/pad ids) into the drafter's.
- Call: ``LLMPipeline(target_dir, "CPU", draft_model=openvino_genai.draft_model(draft_dir, "CPU"))``, then
  ``GenerationConfig(num_assistant_tokens=5)`` for a chain, or ``branching_factor`` and ``tree_depth > 0`` for a
  tree; ``result.extended_perf_metrics.get_num_accepted_tokens()`` counts accepted draft tokens
  (``site/docs/concepts/optimization-techniques/speculative-decoding.mdx``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..checkpoints import CheckpointError
from .config import EagleConfig
from .formats import write
from .model import EagleDraftModel

TASK = "text-generation-with-past"
WEIGHT_FORMATS = ("fp16", "fp32")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _openvino() -> dict[str, Any]:
    """The pieces of openvino and optimum-intel the export uses, or an ImportError naming the extra."""
    try:
        import openvino
        from optimum.exporters.openvino import export_from_model, main_export
        from optimum.exporters.openvino.model_patcher import LlamaEagle3ForCausalLM
        from optimum.intel import OVConfig
    except ImportError as err:
        raise ImportError(
            f"export-eagle --format openvino needs OpenVINO and optimum-intel ({err}): pip install "
            '"hf-speculative[openvino]", in a venv of its own (optimum-intel pins transformers; in a clone: '
            "make install-openvino).") from err
    return dict(openvino=openvino, export_from_model=export_from_model, main_export=main_export,
                eagle3=LlamaEagle3ForCausalLM, config=OVConfig)


def hidden_layers_list(config: EagleConfig) -> list[int]:
    """GenAI's ``hidden_layers_list`` for this drafter: the target layers whose outputs it fuses, as ours."""
    return [int(i) for i in config.target_layers]


def draft_folder(config: EagleConfig, state: dict[str, torch.Tensor],
                 target_config: Any = None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config.json, state dict)`` of the ``LlamaForCausalLMEagle3`` model optimum-intel exports: SafeAILab's
    config (``formats.write("safeailab")``) with the target's token ids, and the weights in the names of
    optimum-intel's ``LlamaEagle3ForCausalLM`` (``model.fc.weight``, ..., ``model.d2t``; not the embedding)."""
    if config.exit_layer is None and config.version != 3:
        raise CheckpointError(
            f"OpenVINO GenAI speculates with EAGLE-3 drafters only; this one is EAGLE-{config.version}. Use it with "
            "hf_speculative, or export it for vLLM / SGLang (--format safeailab).")
    if config.attention_bias:
        raise CheckpointError(
            "This EAGLE-3 drafter has attention biases (attention_bias=True); optimum-intel's LlamaEagle3 q/k/v "
            "projections have none, so an OpenVINO export would change its outputs. It has no OpenVINO form.")
    if config.norm_before_residual:
        raise CheckpointError(
            "This EAGLE-3 drafter starts its residual from the normed feature (norm_before_residual=True); "
            "optimum-intel's LlamaEagle3 layer starts it from the feature itself, so an OpenVINO export would change "
            "its outputs. It has no OpenVINO form.")
    cfg, out = write("safeailab", config, state)  # refuses exit adapters
    cfg.pop("torch_dtype", None)
    if target_config is not None:
        from ... import compat

        text = compat.text_config(target_config)
        cfg.update({key: getattr(text, key, None) for key in TOKEN_IDS})
    return cfg, {f"model.{key}": value for key, value in out.items()}


def _set_hidden_layers(openvino: Any, folder: Path, layers: list[int]) -> None:
    """Write ``hidden_layers_list`` into the draft IR's rt_info (saved beside it, then moved over it)."""
    xml = folder / "openvino_model.xml"
    model = openvino.Core().read_model(str(xml))
    model.set_rt_info(layers, "hidden_layers_list")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        openvino.save_model(model, str(Path(tmp) / xml.name), compress_to_fp16=False)
        del model
        for name in (xml.name, xml.with_suffix(".bin").name):
            os.replace(Path(tmp) / name, folder / name)


def export_target(target: str | os.PathLike, out_dir: str | os.PathLike, *, weight_format: str = "fp16") -> Path:
    """The target as OpenVINO GenAI loads it: ``optimum-cli export openvino --task text-generation-with-past
    --weight-format {weight_format}`` with its tokenizer and detokenizer. ``target`` is a model folder (or a Hub
    id). Returns the folder."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format={weight_format!r}: use one of {', '.join(WEIGHT_FORMATS)}.")
    ov = _openvino()
    local = Path(target).is_dir()
    ov["main_export"](str(target), str(out_dir), task=TASK, ov_config=ov["config"](dtype=weight_format),
                      convert_tokenizer=True, local_files_only=local)
    return Path(out_dir)


def export_openvino(model_or_path: EagleDraftModel | str | os.PathLike, out_dir: str | os.PathLike,
                    target: str | os.PathLike | None = None, *, weight_format: str = "fp16",
                    target_out: str | os.PathLike | None = None) -> Path:
    """Write an EAGLE-3 drafter as the draft model of OpenVINO GenAI's speculative decoding (see the module
    docstring): ``openvino_model.xml``/``.bin`` (optimum-intel's ``LlamaEagle3ForCausalLM``, marked ``eagle3_mode``,
    ``hidden_layers_list`` = the drafter's ``target_layers``, ``d2t`` as an output), ``config.json`` and the target's
    ``generation_config.json``.

    Args:
        model_or_path: a drafter folder (any format ``load_checkpoint`` reads) or a loaded ``EagleDraftModel``.
        out_dir: the draft folder to write (``openvino_genai.draft_model(out_dir, "CPU")``).
        target: the target, a model folder, a registry name or a Hub id; default the drafter's recorded target.
            Its config is checked against the drafter; its embedding, token ids and generation config are copied.
        weight_format: ``"fp16"`` (default) or ``"fp32"`` weights in the IR.
        target_out: also export the target there (:func:`export_target`, same ``weight_format``).

    Returns:
        ``out_dir`` as a ``Path``.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig

    from ...registry.models import resolve
    from . import checkpoints

    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format={weight_format!r}: use one of {', '.join(WEIGHT_FORMATS)}.")
    ov = _openvino()
    loaded = isinstance(model_or_path, EagleDraftModel)
    if loaded:
        config = model_or_path.config
    elif target is None:  # only for the target it records
        config = checkpoints.load_checkpoint(model_or_path)[0]
    if target is None and not config.target:
        raise CheckpointError("The drafter records no target; the OpenVINO export needs it (its depth, embedding and "
                              "token ids): pass target= (export-eagle --target).")
    target_path = resolve(str(target or config.target))
    target_model = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32)
    if loaded:
        checkpoints._check_target_config(config, target_model.config)
        state = {k: v.detach().cpu() for k, v in model_or_path.state_dict().items()}
    else:  # with the target: its checks, and what a format leaves to it (fused layers, depth)
        config, state, _ = checkpoints.load_checkpoint(model_or_path, target_config=target_model.config)
    cfg, weights = draft_folder(config, state, target_model.config)
    weights["model.embed_tokens.weight"] = target_model.get_input_embeddings().weight.detach()

    class Eagle3Draft(ov["eagle3"]):
        """optimum-intel's class under a module of ours, which its exporter takes for a transformers model."""

    draft = Eagle3Draft(LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    draft.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, strict=True)
    draft.generation_config = target_model.generation_config
    out = Path(out_dir)
    ov["export_from_model"](draft.eval(), str(out), task=TASK, ov_config=ov["config"](dtype=weight_format))
    _set_hidden_layers(ov["openvino"], out, hidden_layers_list(config))
    del target_model, draft
    if target_out is not None:
        export_target(target_path, target_out, weight_format=weight_format)
    return out
