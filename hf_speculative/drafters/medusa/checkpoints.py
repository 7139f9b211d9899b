"""Medusa heads on disk: read the three layouts of ``formats.py``, write ours, export to vLLM's and Medusa's.

What every trained drafter's folder shares (weight readers, the sha256 manifest ``sha256sums.json``, digests,
shipped-folder lookup, the error class) is ``drafters/checkpoints.py``'s, so a damaged or mismatched file gives
the same messages for Medusa heads as for EAGLE drafters; the public names are those of every method's checkpoint
module (see ``drafters/eagle/checkpoints.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...options import escaped
from .. import checkpoints as files
from ..checkpoints import MANIFEST, CheckpointError, check_manifest, find_folder, folder_file, shipped_names
from .config import MedusaConfig
from .formats import MEDUSA_FILES, detect, read, write
from .model import MedusaHeads

__all__ = ["CheckpointError", "save_pretrained", "load_checkpoint", "load_heads", "export", "check_manifest",
           "find_folder", "folder_file", "shipped_names", "MANIFEST"]


def save_pretrained(heads: MedusaHeads, directory: str | Path, *, metadata: dict | None = None) -> Path:
    """Write ``heads`` in our format: ``config.json``, ``model.safetensors`` (dtype kept) and, with
    ``metadata`` (training command, data, results), ``training.json``. Returns the directory."""
    return files.save_network(heads, directory, metadata=metadata)


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    for name in MEDUSA_FILES:  # FasterDecoding's file names first, then ours / vLLM's
        if (directory / name).exists():
            return files.read_weights_file(directory, name)
    try:
        return files.read_weights(directory)
    except CheckpointError as error:
        raise CheckpointError(f"{error} (or, for FasterDecoding's Medusa, {' / '.join(MEDUSA_FILES)})") from None


def validate_state_dict(config: MedusaConfig, state: dict[str, torch.Tensor], source: str) -> None:
    """Raise :class:`CheckpointError` unless ``state`` has exactly the keys, shapes and kinds of dtype ``config``
    describes."""
    with torch.device("meta"):
        expected = MedusaHeads(config).state_dict()
    heads = (f"the heads its config describes ({config.num_heads} heads of {config.num_layers} blocks, hidden "
             f"{config.hidden_size}, vocabulary {config.vocab_size}, lm_head={config.lm_head!r}, "
             f"block_bias={config.block_bias})")
    problems = files.state_dict_problems(expected, state, "heads")
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
    directory, cfg, state = files.read_checkpoint(path, sha256, _weights)
    config_path = directory / "config.json"
    fmt = detect(cfg, set(state))
    # MedusaConfig bounds every size (heads, blocks, widths) before validate_state_dict builds the heads on meta
    config, state = files.checked_read(lambda: read(fmt, cfg, state), config_path, fmt)
    if target_config is not None:  # first: cheap, and its message names both sides
        _check_target_config(config, target_config, directory)
    files.checked_read(lambda: validate_state_dict(config, state, f"The checkpoint {escaped(directory)} ({fmt})"),
                       config_path, fmt)
    return config, files.cast(state, dtype), fmt


def _check_target_config(config: MedusaConfig, target_config: Any, directory: Path) -> None:
    from ... import compat

    problems = files.target_mismatches(config, target_config, "heads")
    if problems:
        raise CheckpointError(f"The Medusa heads at {escaped(directory)} do not fit the target "
                              f"{files.target_name(target_config)}: "
                              + "; ".join(problems) + ". Use heads trained for this target "
                              "(`hf-speculative train-medusa --target ...`).")
    if config.target_num_layers is None:
        config.target_num_layers = int(compat.text_config(target_config).num_hidden_layers)


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
    return files.write_folder(out_dir, cfg, out, weights_name)
