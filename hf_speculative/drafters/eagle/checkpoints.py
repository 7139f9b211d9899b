"""EAGLE drafter checkpoints: our own format, the formats of other projects, and export to them.

Formats read by :func:`load_checkpoint` (detected from ``config.json`` and the weight names; the
weights may be ``model.safetensors``, ``pytorch_model.bin`` or either one sharded with an index):

- ``native`` (ours, :func:`save_pretrained`): ``config.json`` = ``EagleConfig.to_dict()`` (with
  ``"format": "hf_speculative.eagle"``), ``model.safetensors`` in our names, optional ``training.json``.
- ``safeailab-eagle1`` (EAGLE-1, whose weights EAGLE-2 also runs; SafeAILab/EAGLE
  ``eagle/model/cnets1.py``, ``eagle/model/ea_model.py``, ``eagle/train/*_config.json``): a
  Llama ``config.json`` describing the *drafter* (``num_hidden_layers`` is 1, not the target's depth),
  an optional ``"bias"`` for ``fc`` (absent = ``True`` in their loader); keys ``fc.weight`` [H, 2H],
  ``fc.bias``, ``layers.0.*`` without ``layers.0.input_layernorm`` (their layer 0 has none), and
  ``embed_tokens.weight`` (a copy of the target's embedding, ignored here). fc input is
  ``cat([embedding, feature])``, the feature being the target's final normed hidden state.
- ``safeailab-eagle3`` (SafeAILab/EAGLE ``eagle/model/cnets.py``, ``eagle/traineagle3/``) and
  ``specforge-eagle3`` (sgl-project/SpecForge ``specforge/modeling/draft/llama3_eagle.py``
  ``LlamaForCausalLMEagle3``, ``configs/*-eagle3.json``, ``specforge/export/to_sglang.py``): Llama
  config plus ``draft_vocab_size``; keys ``fc.weight`` [H, 3H], ``midlayer.*`` (our names),
  ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``. Fused layers: SafeAILab hardcodes them
  (``eagle/model/modeling_llama_kv.py`` records the hidden state *entering* layers 2, L//2 and L-3,
  i.e. the outputs of layers 1, L//2-1, L-4: our default, so they need ``target_config`` for L);
  SpecForge records ``eagle_config.eagle_aux_hidden_state_layer_ids`` as outputs of layers (SGLang's
  ``set_eagle3_layers_to_capture`` adds 1 to capture the next layer's input), our convention.
- ``vllm-speculators-eagle3`` (vllm-project/speculators ``src/speculators/models/eagle3/``,
  ``convert/eagle/eagle3_converter.py``; vLLM ``transformers_utils/configs/speculators/``,
  ``model_executor/models/llama_eagle3.py``): ``speculators_model_type: "eagle3"``,
  ``transformer_layer_config`` (Llama; its ``vocab_size`` is the target's), ``draft_vocab_size``,
  ``speculators_config.verifier.name_or_path``, ``eagle_aux_hidden_state_layer_ids`` in vLLM's
  convention (the hidden state *entering* that layer, default [2, L//2, L-3]: vLLM id = our index + 1);
  keys ``layers.0.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``/``t2d`` (only with a reduced vocabulary),
  ``embed_tokens.weight`` (ignored). vLLM defaults ``norm_before_residual`` to true when absent.

All four projects store ``d2t`` as an offset: target id = draft id + d2t[draft id] (ours too).
``rms_norm_eps`` / ``rope_theta`` come from the config (defaults 1e-6 / 10000 as SafeAILab's).

What every trained drafter's folder shares (weight files, manifest, digests, shipped folders, errors) is
``drafters/checkpoints.py``'s; this module names the EAGLE network's part. Its public names are those of every
method's checkpoint module (``save_pretrained``, ``load_checkpoint``, ``shipped_names``, ``find_folder``,
``check_manifest``, ``CheckpointError``, ``MANIFEST``), so callers treat EAGLE's and Medusa's alike.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from ...options import escaped
from .. import checkpoints as files
from ..checkpoints import MANIFEST, CheckpointError, check_manifest, find_folder, shipped_names
from .config import EagleConfig
from .formats import NATIVE, SAFEAILAB1, detect, read, write
from .model import EagleDraftModel

__all__ = ["CheckpointError", "save_pretrained", "load_checkpoint", "load_drafter", "export", "network_kind",
           "shipped_names", "find_folder", "check_manifest", "MANIFEST"]


def save_pretrained(model: EagleDraftModel, directory: str | Path, *, metadata: dict | None = None) -> Path:
    """Write ``model`` in our format: ``config.json``, ``model.safetensors`` (dtype kept) and, with
    ``metadata`` (training command, data, ...), ``training.json``. Returns the directory."""
    return files.save_network(model, directory, metadata=metadata)


def validate_state_dict(config: EagleConfig, state: dict[str, torch.Tensor], source: str) -> None:
    """Raise :class:`CheckpointError` unless ``state`` has exactly the keys, shapes and kinds of dtype ``config``
    describes."""
    with torch.device("meta"):
        expected = EagleDraftModel(config).state_dict()
    drafter = (f"the drafter its config describes (EAGLE-{config.version}, hidden {config.hidden_size}, vocabulary "
               f"{config.vocab_size}/{config.draft_vocab_size}, fc_bias={config.fc_bias}, "
               f"input_layernorm={config.input_layernorm})")
    problems = files.state_dict_problems(expected, state, "drafter")
    if problems:
        raise CheckpointError(f"{source} does not match {drafter}: " + "; ".join(problems) + ". The config.json and "
                              "the weights come from different drafters, or the file was written for another "
                              "architecture; use the config.json that was saved with these weights.")


def network_kind(path: str | Path) -> tuple[int, int | None]:
    """``(EAGLE version, exit layer or None)`` of the drafter saved in ``path``, from its
    ``config.json`` and weight names alone (no target needed; the weights are not checked)."""
    directory = files.checkpoint_dir(path)
    cfg = files.read_config(directory)
    if (directory / "model.safetensors").exists():
        from safetensors import safe_open

        single = files.check_weights_file(directory, "model.safetensors")
        try:
            with safe_open(str(single), framework="pt") as handle:  # the header only
                names = set(handle.keys())
        except Exception as error:  # damaged header
            files.damaged(single, error)
    else:
        names = set(files.read_weights(directory))
    fmt = detect(cfg, names)
    if fmt == NATIVE:
        return int(cfg.get("version", 1)), cfg.get("exit_layer")
    return (1, None) if fmt == SAFEAILAB1 else (3, None)


def load_checkpoint(path: str | Path, *, dtype: torch.dtype | None = None, target_config: Any = None,
                    sha256: dict[str, str] | None = None) -> tuple[EagleConfig, dict[str, torch.Tensor], str]:
    """Read an EAGLE drafter saved in any supported format (see the module docstring).

    Args:
        path: the checkpoint directory (or a file in it).
        dtype: cast the floating-point weights to this dtype (``d2t`` / ``t2d`` keep theirs).
        target_config: the target's transformers config, used to fill what a format does not record:
            the fused layers of SafeAILab EAGLE-3 (and speculators configs without
            ``eagle_aux_hidden_state_layer_ids``) follow from its depth; ``target_num_layers`` and
            ``target`` (its ``_name_or_path``) are filled from it; a hidden size or vocabulary
            different from the drafter's is an error.
        sha256: ``{file name: hex digest}`` to verify before reading.

    Returns:
        ``(config, state_dict, format_name)``; the state dict is in our names and loads into
        ``EagleDraftModel(config)`` with ``strict=True``.
    """
    directory, cfg, state = files.read_checkpoint(path, sha256)
    config_path = directory / "config.json"
    fmt = detect(cfg, set(state))
    config, state = files.checked_read(lambda: read(fmt, cfg, state, target_config), config_path, fmt)
    if target_config is not None:  # first: cheap, and its message names both sides
        _check_target_config(config, target_config, config_path)
    files.checked_read(lambda: validate_state_dict(config, state, f"The checkpoint {escaped(directory)} ({fmt})"),
                       config_path, fmt)
    weights = next((n for n in files.WEIGHT_FILES if (directory / n).exists()), files.WEIGHT_FILES[0])
    check_vocab_map(config, state, f"{escaped(directory / weights)} ({fmt})")
    return config, files.cast(state, dtype), fmt


def check_vocab_map(config: EagleConfig, state: dict[str, torch.Tensor], source: str) -> None:
    """Raise :class:`CheckpointError` unless ``state``'s ``d2t`` (an integer map of the shape ``config`` gives,
    checked before) sends every draft id to a distinct id of the vocabulary ``config.vocab_size``: else the first
    draft step indexes past the target's embedding (an ``IndexError`` inside ``generate()``), or two draft ids
    stand for one token."""
    d2t = state.get("d2t")
    if d2t is None:
        return
    ids = torch.arange(d2t.numel()) + d2t.reshape(-1).long()
    outside = ((ids < 0) | (ids >= config.vocab_size)).nonzero()
    if outside.numel():
        first = int(outside[0])
        raise CheckpointError(f"{source}: d2t maps {outside.numel()} draft ids outside the vocabulary of "
                              f"{config.vocab_size} (config.json's vocab_size), the first draft id {first} to target "
                              f"id {int(ids[first])}; target id = draft id + d2t[draft id] must be from 0 to "
                              f"{config.vocab_size - 1}. The d2t comes from another vocabulary or is damaged: use the "
                              "weights saved with this drafter's config.json (or retrain its draft vocabulary).")
    if ids.unique().numel() != ids.numel():
        raise CheckpointError(f"{source}: d2t maps {ids.numel() - ids.unique().numel()} draft ids to a "
                              "target id another draft id already has; each draft id must stand for its own token. "
                              "Use the weights saved with this drafter's config.json (or retrain its draft vocabulary).")


def _check_target_config(config: EagleConfig, target_config: Any, config_path: Path) -> None:
    from ... import compat

    depth = int(compat.text_config(target_config).num_hidden_layers)
    problems = files.target_mismatches(config, target_config, "drafter")
    if any(not 0 <= i < depth for i in config.target_layers):
        problems.append(f"fused layers {config.target_layers} outside the target's 0..{depth - 1} (target_layers, "
                        "or the format's layer ids, in config.json)")
    if config.exit_layer is not None and config.exit_layer >= depth:
        problems.append(f"exit after layer {config.exit_layer} (exit_layer in config.json), target has {depth} layers")
    if problems:
        raise CheckpointError(f"{escaped(config_path)}: This EAGLE drafter does not fit the target config "
                              f"{files.target_name(target_config)}: "
                              + "; ".join(problems) + ". Use a drafter trained for this target.")


def load_drafter(path: str | Path, *, dtype: torch.dtype | None = None, target_config: Any = None,
                 sha256: dict[str, str] | None = None) -> EagleDraftModel:
    """:func:`load_checkpoint` into a ready ``EagleDraftModel`` (eval mode)."""
    config, state, _ = load_checkpoint(path, dtype=dtype, target_config=target_config, sha256=sha256)
    model = EagleDraftModel(config)
    model.load_state_dict(state, strict=True)
    return (model.to(dtype) if dtype is not None else model).eval()


def export(model_or_path: EagleDraftModel | str | Path, out_dir: str | Path, format: str = "vllm", *,
           target_config: Any = None, speculative_tokens: int = 5) -> Path:
    """Write a drafter in the layout a serving engine loads.

    ``format="vllm"``: vLLM's speculators ``eagle3`` layout (``vllm serve DIR`` reads the target
    from ``speculators_config.verifier.name_or_path``, i.e. ``config.target``); EAGLE-3 only.
    ``format="safeailab"``: SafeAILab's layout for the drafter's version (EAGLE-1: also what vLLM's
    ``method: "eagle"`` and SGLang's EAGLE load; EAGLE-3: ``LlamaForCausalLMEagle3``, which SGLang and
    SpecForge load). Weights go to ``model.safetensors``; the target's embedding is not copied.
    """
    if isinstance(model_or_path, EagleDraftModel):
        config = model_or_path.config
        state = {k: v.detach().cpu() for k, v in model_or_path.state_dict().items()}
    else:
        config, state, _ = load_checkpoint(model_or_path, target_config=target_config)
    verifier = list(getattr(target_config, "architectures", None) or []) if target_config is not None else None
    if format == "vllm":
        from .. import vllm_support

        verifier = vllm_support.target_architectures(target_config, config.target)
    cfg, out = write(format, config, state, speculative_tokens=speculative_tokens, verifier_architectures=verifier)
    if format == "vllm":  # after write's own refusals (EAGLE-1, exit adapters), before anything is written
        vllm_support.check_reads_hidden_states("EAGLE-3", verifier)
        vllm_support.check_out_folder(out_dir)
    if format == "vllm" and not config.target:
        warnings.warn("The drafter records no target; vLLM needs speculators_config.verifier.name_or_path "
                      "(set EagleConfig.target before exporting, or edit config.json).", stacklevel=2)
    return files.write_folder(out_dir, cfg, out)
