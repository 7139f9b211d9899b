"""A resume checked before it loads: ``OUT/checkpoint`` must hold the network this run trains.

accelerate's ``load_state`` copies the saved weights into the run's network with torch's ``load_state_dict``. A run
whose network has another shape (another ``--draft-vocab-size``, ``--eagle1`` / ``--eagle3``, ``--exit-layer`` or
target) stopped there, after the target's features were computed, on torch's "size mismatch for net.lm_head.weight".
:func:`check_resume` reads the checkpoint's tensor names and shapes from its safetensors header (never its data),
compares them with the network's and, where they differ, raises a ``ValueError`` that names the settings the earlier
run used (its ``train_config.json``) and the fix; as ``train-dflash`` refuses a resume reading other target layers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..options import escaped

WEIGHTS = "model.safetensors"  # what accelerate's save_state writes for the (first) prepared model
PREFIX = "net."  # TrainingStep's name of the drafter (checkpoints written before it hold the names without it)
# the settings that shape an EAGLE drafter or exit adapter, as train-eagle's flags
SHAPING = {"target": "--model", "eagle3": "--eagle3/--eagle1", "draft_vocab_size": "--draft-vocab-size",
           "exit_layer": "--exit-layer", "init_from": "--init-from", "refresh_vocab": "--refresh-vocab"}
SHOWN = 3  # differing tensors a message lists


def saved_shapes(state_dir: Path) -> dict[str, tuple[int, ...]] | None:
    """The drafter's tensor names (without :data:`PREFIX`) and shapes in ``state_dir``'s weights, read from the
    safetensors header; ``None`` where accelerate wrote none (another serialization: its loader then decides)."""
    from safetensors import safe_open

    path = state_dir / WEIGHTS
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        return {_name(key): tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}


def network_shapes(net: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """``net``'s state-dict names and shapes (what ``load_state_dict`` will match the checkpoint against)."""
    return {name: tuple(value.shape) for name, value in net.state_dict().items()}


def check_resume(state_dir: Path, net: torch.nn.Module, settings: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the fix unless the checkpoint in ``state_dir`` holds ``net``'s tensors, each of
    ``net``'s shape; ``settings`` are this run's (a :class:`~hf_speculative.training.config.TrainConfig` as a dict),
    compared with the earlier run's ``train_config.json`` beside ``state_dir`` to say which of them changed."""
    saved = saved_shapes(state_dir)
    if saved is None:
        return
    differences = shape_differences(saved, network_shapes(net))
    if not differences:
        return
    changed = changed_settings(state_dir.parent / "train_config.json", settings)
    listed = "; ".join(differences[:SHOWN]) + (f"; and {len(differences) - SHOWN} more" if len(differences) > SHOWN
                                               else "")
    raise ValueError(f"{escaped(str(state_dir))} holds a checkpoint of another network than this run trains "
                     f"({listed}){changed}. Resume with the settings it was trained with (the same --model, "
                     f"--eagle3/--eagle1, --draft-vocab-size and --exit-layer), or delete {escaped(str(state_dir))} "
                     "to start over, or train into another --out.")


def shape_differences(saved: dict[str, tuple[int, ...]], mine: dict[str, tuple[int, ...]]) -> list[str]:
    """Each tensor whose shape differs, or that only one side has, in words."""
    out = [f"{name} is {list(saved[name])} there, {list(shape)} in this run" for name, shape in mine.items()
           if name in saved and saved[name] != shape]
    out += [f"{name} only there" for name in saved if name not in mine]
    out += [f"{name} only in this run" for name in mine if name not in saved]
    return out


def changed_settings(path: Path, settings: dict[str, Any]) -> str:
    """``": it was trained with --draft-vocab-size 24 (this run: --draft-vocab-size 32)"`` for the shaping settings
    of the earlier run (its ``train_config.json`` at ``path``) that differ from ``settings``; empty when unknown."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(earlier, dict):
        return ""
    both_eagle3 = bool(earlier.get("eagle3")) and bool(settings.get("eagle3"))  # else the vocabulary size is unused
    changed = [f"{_flag(key, earlier.get(key))} (this run: {_flag(key, settings.get(key))})"
               for key in SHAPING if key in earlier and earlier.get(key) != settings.get(key)
               and (key != "draft_vocab_size" or both_eagle3)]
    return f": it was trained with {', '.join(changed)}" if changed else ""


def _flag(key: str, value: Any) -> str:
    """A setting as the flag that gives it (``--eagle1``, ``--draft-vocab-size 24``, ``no --exit-layer``)."""
    if key == "eagle3":
        return "--eagle3" if value else "--eagle1"
    if value is None or value is False:
        return f"no {SHAPING[key]}"
    if value is True:
        return SHAPING[key]
    return f"{SHAPING[key]} {escaped(str(value), limit=200)}"


def _name(key: str) -> str:
    return key.removeprefix(PREFIX)
