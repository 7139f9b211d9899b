"""Medusa heads on disk: read the three layouts of ``formats.py``, write ours, export to vLLM's and Medusa's.

The helpers are EAGLE's (``drafters/eagle/checkpoints.py``): the same weight readers, sha256 manifest
(``sha256sums.json``), shipped-folder lookup and error class, so a damaged or mismatched file gives the same
messages for both drafters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..eagle.checkpoints import (
    MANIFEST,
    _checkpoint_dir,
    _read_config,
    _read_file,
    _read_weights,
    check_digests,
    check_manifest,
    checked_read,
    find_folder,
    shipped_names,
)
from .config import MedusaConfig
from .formats import MEDUSA_FILES, CheckpointError, detect, read, write
from .model import MedusaHeads

__all__ = ["CheckpointError", "save_pretrained", "load_checkpoint", "load_heads", "export", "check_manifest",
           "find_folder", "shipped_names", "MANIFEST"]


def save_pretrained(heads: MedusaHeads, directory: str | Path, *, metadata: dict | None = None) -> Path:
    """Write ``heads`` in our format: ``config.json``, ``model.safetensors`` (dtype kept) and, with
    ``metadata`` (training command, data, results), ``training.json``. Returns the directory."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    heads.config.save(directory)
    save_file({k: v.detach().contiguous().cpu() for k, v in heads.state_dict().items()},
              str(directory / "model.safetensors"), metadata={"format": "pt"})
    if metadata is not None:
        (directory / "training.json").write_text(json.dumps(metadata, indent=2, default=str) + "\n")
    return directory


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    for name in MEDUSA_FILES:  # FasterDecoding's file names first, then ours / vLLM's
        if (directory / name).exists():
            return _read_file(directory / name)
    try:
        return _read_weights(directory)
    except CheckpointError as error:
        raise CheckpointError(f"{error} (or, for FasterDecoding's Medusa, {' / '.join(MEDUSA_FILES)})") from None


def validate_state_dict(config: MedusaConfig, state: dict[str, torch.Tensor], source: str) -> None:
    """Raise :class:`CheckpointError` unless ``state`` has exactly the keys and shapes ``config`` describes."""
    with torch.device("meta"):
        expected = {k: v.shape for k, v in MedusaHeads(config).state_dict().items()}
    heads = (f"the heads its config describes ({config.num_heads} heads of {config.num_layers} blocks, hidden "
             f"{config.hidden_size}, vocabulary {config.vocab_size}, lm_head={config.lm_head!r}, "
             f"block_bias={config.block_bias})")
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    problems = [f"{what} keys {keys[:6]}{' ...' if len(keys) > 6 else ''}"
                for what, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)}, heads {tuple(shape)}"
              for k, shape in expected.items() if k in state and state[k].shape != shape]
    if shapes:
        problems.append("shape mismatches " + "; ".join(shapes[:4]))
    if problems:
        raise CheckpointError(f"{source} does not match {heads}: " + "; ".join(problems) + ". The config.json and the "
                              "weights come from different heads (check medusa_num_heads / medusa_num_layers, "
                              "num_heads / num_hidden_layers); use the config.json saved with these weights.")


def load_checkpoint(path: str | Path, *, dtype: torch.dtype | None = None, target_config: Any = None,
                    sha256: dict[str, str] | None = None) -> tuple[MedusaConfig, dict[str, torch.Tensor], str]:
    """Read Medusa heads saved in any supported layout (``formats.py``).

    Args:
        path: the checkpoint directory (or a file in it).
        dtype: cast the weights to this dtype.
        target_config: the target's transformers config: a hidden size or vocabulary different from the heads'
            is an error; fills ``target`` / ``target_num_layers`` when the checkpoint does not record them.
        sha256: ``{file name: hex digest}`` to verify before reading (a folder's ``sha256sums.json`` is
            always checked).

    Returns:
        ``(config, state_dict, format_name)``; the state dict loads into ``MedusaHeads(config)`` strictly.
    """
    directory = _checkpoint_dir(path)
    check_manifest(directory)
    check_digests(directory, sha256)
    cfg = _read_config(directory / "config.json")
    state = _weights(directory)
    fmt = detect(cfg, set(state))
    config_path = directory / "config.json"
    # MedusaConfig bounds every size (heads, blocks, widths) before validate_state_dict builds the heads on meta
    config, state = checked_read(lambda: read(fmt, cfg, state), config_path, fmt)
    if target_config is not None:  # first: cheap, and its message names both sides
        _check_target_config(config, target_config, directory)
    checked_read(lambda: validate_state_dict(config, state, f"The checkpoint {directory} ({fmt})"), config_path, fmt)
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    return config, state, fmt


def _check_target_config(config: MedusaConfig, target_config: Any, directory: Path) -> None:
    from ... import compat

    text = compat.text_config(target_config)
    sides = (("hidden size", config.hidden_size, int(text.hidden_size)),
             ("vocabulary", config.vocab_size, int(text.vocab_size)))
    problems = [f"{what}: heads {mine}, target {theirs}" for what, mine, theirs in sides if mine != theirs]
    if problems:
        raise CheckpointError(f"The Medusa heads at {directory} do not fit the target "
                              f"{getattr(target_config, '_name_or_path', '') or type(target_config).__name__}: "
                              + "; ".join(problems) + ". Use heads trained for this target "
                              "(`hf-speculative train-medusa --target ...`).")
    if config.target_num_layers is None:
        config.target_num_layers = int(text.num_hidden_layers)


def load_heads(path: str | Path, *, dtype: torch.dtype | None = None, target_config: Any = None,
               sha256: dict[str, str] | None = None) -> MedusaHeads:
    """:func:`load_checkpoint` into ready ``MedusaHeads`` (eval mode, no gradients)."""
    config, state, _ = load_checkpoint(path, dtype=dtype, target_config=target_config, sha256=sha256)
    heads = MedusaHeads(config)
    heads.load_state_dict(state, strict=True)
    return (heads.to(dtype) if dtype is not None else heads).eval().requires_grad_(False)


def export(heads_or_path: MedusaHeads | str | Path, out_dir: str | Path, format: str = "vllm", *,
           target: torch.nn.Module | None = None) -> Path:
    """Write heads in the layout a serving engine loads.

    ``format="vllm"``: vLLM's Medusa (``--speculative-config '{"method": "medusa", "model": DIR, ...}'``);
    ``format="medusa"``: FasterDecoding's (``medusa_lm_head.safetensors`` + ``config.json``; TGI and
    TensorRT-LLM's converter read it too). Heads on the target's own lm_head (``lm_head="target"``) need
    ``target``: both layouts store the vocabulary head with the heads (vLLM once, as ``original_lm_head``).
    """
    from safetensors.torch import save_file

    if isinstance(heads_or_path, MedusaHeads):
        config = heads_or_path.config
        state = {k: v.detach().cpu() for k, v in heads_or_path.state_dict().items()}
    else:
        config, state, _ = load_checkpoint(heads_or_path, target_config=None if target is None else target.config)
    head = None
    if target is not None:
        config.check_target(target)
        head = target.get_output_embeddings().weight.detach().cpu().to(next(iter(state.values())).dtype)
    name = None if target is None else (getattr(target, "name_or_path", None) or None)
    cfg, out, weights_name = write(format, config, state, target_head=head, target_name=name)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    # clone: one tensor under several names (a shared vocabulary head) is refused by safetensors
    save_file({k: v.contiguous().clone() for k, v in out.items()}, str(out_dir / weights_name),
              metadata={"format": "pt"})
    return out_dir
