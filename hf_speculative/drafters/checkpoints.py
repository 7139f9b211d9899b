"""Trained drafters on disk (EAGLE drafters, exit adapters, Medusa heads): what their checkpoints share.

A trained drafter is a folder: a ``config.json`` (a self-validating dataclass, :class:`SavedConfig`, its sizes within
the bounds below, or another project's config that a method's ``formats.py`` translates), the weights
(``model.safetensors``, ``pytorch_model.bin``, or either sharded with an index), an optional ``training.json``,
and, for a shipped drafter, a ``sha256sums.json`` manifest written at release. Everything here is untrusted input
read defensively: every file is opened through :func:`folder_file` (``registry.integrity``'s one gate: a link out
of the folder, a device or a FIFO is refused before it is opened), files are regular files of bounded size, digests
are checked through ``registry.integrity`` (the one place that hashes), and every problem is a
:class:`CheckpointError` that says what to do, quoting names read from files escaped. Each method's
``checkpoints.py`` (``eagle/``, ``medusa/``) adds its network: its formats, the
shapes its config implies, its fit to a target, its export.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from collections.abc import Callable
from typing import Any, ClassVar, NoReturn

import torch

from .. import compat, options
from ..registry import integrity

__all__ = ["CheckpointError", "SavedConfig", "MANIFEST", "WEIGHT_FILES", "shipped_names", "find_folder",
           "folder_file", "check_manifest", "check_digests", "read_checkpoint", "read_weights", "read_weights_file",
           "read_json", "read_config", "checked_read", "state_dict_problems", "target_mismatches", "save_network",
           "write_folder"]

WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
MANIFEST = "sha256sums.json"  # {"sha256": {file name: hex digest}}, written at release (tools/drafter_manifests.py)

# Bounds of a trained drafter's config.json, checked before any module is built from it (docs/hosting.md)
MAX_HIDDEN_SIZE = 65_536  # hidden_size (the largest open models: 16_384)
MAX_INTERMEDIATE_SIZE = 262_144  # intermediate_size
MAX_VOCAB_SIZE = 1 << 20  # vocab_size, draft_vocab_size (the largest open vocabularies: 262_144)
MAX_ATTENTION_HEADS = 1024  # num_attention_heads, num_key_value_heads
MAX_HEAD_DIM = 4096  # head_dim
MAX_POSITIONS = 1 << 24  # max_position_embeddings
MAX_TARGET_LAYERS = options.MAX_LAYERS  # target_num_layers, exit_layer, a fused layer's index
MAX_MEDUSA_HEADS = options.MAX_DRAFT_TOKENS  # num_heads: one per drafted token
MAX_MEDUSA_LAYERS = 16  # num_layers: residual blocks per head (Medusa uses 1)


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as a drafter of its method (the message says why and how to fix it)."""


# -- config.json -----------------------------------------------------------------------------------
def check_size(owner: str, name: str, value: Any, high: int, low: int = 1) -> int:
    """``value`` as an ``int`` in ``[low, high]``, or a ``ValueError`` naming ``owner(name=value)`` and the bound."""
    return options.check_int(owner, name, value, low, high)


def config_names(cfg: dict[str, Any]) -> str:
    """What a config.json says it is (its architectures, else its model_type), escaped for a message."""
    found = cfg.get("architectures")
    names = [a for a in found if isinstance(a, str)] if isinstance(found, list) else []
    return options.escaped(", ".join(names) or cfg.get("model_type") or "no architecture", 200)


def check_choice(owner: str, name: str, value: Any, allowed: Any) -> Any:
    """``value`` if it is one of ``allowed`` (strings), else a ``ValueError`` naming the field and the choices."""
    if not isinstance(value, str) or value not in allowed:
        shown = sorted(allowed)
        listed = ", ".join(shown[:12]) + (", ..." if len(shown) > 12 else "")
        raise options.OptionError(f"{owner}({name}={options.shown(value)}): must be one of {listed}.")
    return value


class SavedConfig:
    """Mixin for a dataclass config: ``to_dict`` / ``from_dict`` / ``save`` with ``FORMAT`` in the file."""

    FORMAT: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}: config.json holds a {type(data).__name__}, not an object of fields.")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k)[:40] for k in set(data) - known - {"format"})
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {unknown[:8]}; was this file written by a newer "
                             "hf_speculative?")
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path


# -- folders ---------------------------------------------------------------------------------------
def shipped_names(shipped_dir: Path) -> list[str]:
    """Names of the networks shipped under ``shipped_dir`` (one folder with a ``config.json`` each)."""
    if not shipped_dir.is_dir():
        return []
    return sorted(p.name for p in shipped_dir.iterdir() if (p / "config.json").exists())


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # "owner/name", as the Hub names repositories


def find_folder(source: str | Path, shipped_dir: Path, missing: str, owner: str = "from_pretrained",
                argument: str = "path_or_name") -> Path:
    """``source`` if it is a folder, else the shipped network of that name under ``shipped_dir``. A shipped
    network (by name or by path) must carry its manifest: :func:`check_manifest` with ``required``.

    Raises:
        FileNotFoundError: ``missing``, the caller's message saying what to give instead.
        TypeError: ``source`` is not a path or a name (``owner(argument=...)`` in the message).
        CheckpointError: a shipped network without a readable manifest.
    """
    if not isinstance(source, (str, Path)) and not hasattr(source, "__fspath__"):
        names = shipped_names(shipped_dir)
        raise options.OptionTypeError(f"{owner}({argument}={options.shown(source)}): must be a folder (str or "
                                      f"os.PathLike) or the name of a shipped network ({', '.join(names) or 'none'}).")
    path = Path(source)
    if not path.is_dir():
        if str(source) not in shipped_names(shipped_dir):
            if _HUB_ID.fullmatch(str(source)) and not os.path.lexists(path):
                missing += (f" {options.escaped(source, 200)} looks like a Hugging Face Hub id: drafters are never "
                            "downloaded here (no network is touched). Download it yourself (`huggingface-cli download "
                            f"{options.escaped(source, 200)} --local-dir DIR`) and pass DIR.")
            raise FileNotFoundError(missing)
        path = shipped_dir / str(source)
    if path.resolve().parent == Path(shipped_dir).resolve():
        check_manifest(path, required=True)
    return path


def checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint directory of ``path`` (a directory or a file in it), which must hold a config.json."""
    directory = Path(path)
    if directory.is_file():
        directory = directory.parent
    if not (directory / "config.json").exists():
        raise CheckpointError(f"No config.json in {options.escaped(directory)}: not a drafter checkpoint directory.")
    return directory


def folder_file(directory: Path, name: str, what: str | None = None, *, hashed: bool = False) -> Path:
    """``directory / name``, checked before anything opens it: every file a drafter's loader reads from its folder
    comes through here (``integrity.folder_file``), so a link out of the folder, a device, a FIFO or a socket is
    refused, and with ``hashed`` (a file checked against a digest) a file of several hard links too.

    Raises:
        CheckpointError: naming ``what`` (by default ``name``), the file and the fix.
    """
    try:
        return integrity.folder_file(directory, name, what or name, hashed=hashed)
    except integrity.FileRefused as error:
        raise CheckpointError(str(error)) from None


# -- integrity: the manifest and the caller's digests (hashing is registry.integrity's) -------------------
def check_manifest(directory: str | Path, *, full: bool = False, required: bool = False) -> int:
    """Check the files of a drafter folder against its ``sha256sums.json`` (every shipped drafter has
    one, written at release; other folders are checked when they carry one). A file is hashed once and
    then trusted while its size, timestamps and inode are unchanged, the trust record kept in the
    package cache (``hf_speculative.registry.integrity``); ``full`` re-hashes every file; ``required`` (a shipped
    drafter, see :func:`find_folder`) refuses a folder without a manifest. Returns the number of files
    checked.

    Raises:
        CheckpointError: a file differs from the manifest, is missing, or a shipped drafter has no
            readable manifest.
    """
    directory = Path(directory)
    manifest = folder_file(directory, MANIFEST)
    if not manifest.exists():
        if required:
            raise CheckpointError(f"The shipped drafter {options.escaped(directory)} has no {MANIFEST}, so its files "
                                  "cannot be checked: the installation is incomplete. Reinstall hf-speculative.")
        return 0
    try:
        digests = integrity.read_json_capped(manifest, MANIFEST)["sha256"]
        problem = "its 'sha256' does not map file names to hex digests"
    except (OSError, ValueError, KeyError, TypeError) as error:  # FileRefused (a device, too big) is a ValueError
        digests, problem = None, f"{type(error).__name__}: {options.escaped(error, 1000)}"
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise CheckpointError(f"{options.escaped(manifest)} is not a readable sha256 manifest ({problem}). Reinstall "
                              "hf-speculative, or copy the drafter's folder again.")
    folder = directory.resolve()
    problems = integrity.check_files(folder, digests, integrity.drafter_trust_file(folder), full=full, own_files=True)
    if problems:
        raise CheckpointError(f"The drafter at {options.escaped(directory)} failed its integrity check: "
                              f"{integrity.first_problem(problems)}, unlike the {MANIFEST} written at its release (a damaged install or copy, or an edit). "
                              "Reinstall hf-speculative (pip install --force-reinstall hf-speculative), or copy the "
                              "folder again.")
    return len(digests)


def check_digests(directory: Path, sha256: Any) -> None:
    """Check the files of ``directory`` against ``sha256`` (``{relative name: hex digest}``): names inside the
    folder only, regular files only (see ``integrity``)."""
    if sha256 is None:
        return
    if not isinstance(sha256, dict):
        raise CheckpointError(f"sha256={options.shown(sha256)}: must map file names to hex sha256 digests.")
    for name, want in sha256.items():
        if not integrity.is_sha256_hex(want):
            raise CheckpointError(f"sha256[{options.shown(name)}]={options.shown(want)}: not a hex sha256 digest "
                                  "(64 hex digits).")
        path = folder_file(directory, name, "sha256", hashed=True)  # only a file of the folder's own is hashed
        try:
            got = integrity.sha256_file(path, what=f"sha256[{options.shown(name)}]")
        except integrity.FileRefused as error:
            raise CheckpointError(str(error)) from None
        if got != want.lower():
            raise CheckpointError(f"sha256 of {options.escaped(path)} is {got}, expected {want.lower()}: the file is "
                                  "damaged or not the published one. Download it again.")


# -- reading ---------------------------------------------------------------------------------------
def check_weights_file(directory: Path, name: str) -> Path:
    """The path of the weights file ``name`` of ``directory``: checked (:func:`folder_file`), a regular file under
    ``integrity.MAX_HASHED_BYTES`` (a FIFO or a device in a drafter folder would hang the reader or never end), else
    a CheckpointError."""
    what = f"the weights file {options.escaped(name, 200)}"
    path = folder_file(directory, name, what)
    try:
        fd, st = integrity.open_regular(path, what)
        os.close(fd)
        if st.st_size > integrity.MAX_HASHED_BYTES:
            raise integrity.FileRefused(f"the weights file {options.escaped(path)} has {st.st_size} bytes, over the "
                                        f"limit of {integrity.MAX_HASHED_BYTES}.")
    except integrity.FileRefused as error:
        raise CheckpointError(str(error)) from None
    return path


def read_weights_file(directory: Path, name: str) -> dict[str, torch.Tensor]:
    """The tensors of the weights file ``name`` of ``directory`` (safetensors, or a torch pickle read with
    ``weights_only``)."""
    path = check_weights_file(directory, name)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as error:  # safetensors / pickle / zip errors of a damaged file
        damaged(path, error)


def damaged(path: Path, error: Exception) -> NoReturn:
    raise CheckpointError(f"Cannot read the weights file {options.escaped(path)} ({type(error).__name__}: "
                          f"{options.escaped(error, 300)}); it is corrupt or truncated. Download or copy it again "
                          "(compare its sha256 with the source's).") from error


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint folder: the first of ``WEIGHT_FILES`` there, its shards read when it is an
    index (shards are files of the folder: nothing outside it is read)."""
    for name in WEIGHT_FILES:
        if not (directory / name).exists():
            continue
        if not name.endswith(".index.json"):
            return read_weights_file(directory, name)
        weight_map = read_json(directory, name).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{options.escaped(directory / name)}: its weight_map must map weight names to shard "
                                  "file names.")
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = folder_file(directory, shard, f"{options.escaped(directory / name)} weight_map")
            if not shard_path.exists():
                raise CheckpointError(f"{options.escaped(directory / name)} lists the shard {options.shown(shard)}, "
                                      f"which is not in {options.escaped(directory)}.")
            state.update(read_weights_file(directory, shard))
        return state
    raise CheckpointError(f"No weights in {options.escaped(directory)}: expected one of {', '.join(WEIGHT_FILES)}.")


def read_json(directory: Path, name: str) -> Any:
    """The JSON file ``name`` of a drafter folder: checked (:func:`folder_file`), a regular file of at most
    ``integrity.MAX_JSON_BYTES``."""
    path = folder_file(directory, name)
    try:
        return integrity.read_json_capped(path, options.escaped(name, 200))
    except integrity.FileRefused as error:
        raise CheckpointError(str(error)) from None


def read_config(directory: Path) -> dict[str, Any]:
    """The object in a drafter folder's ``config.json``, not yet interpreted."""
    cfg = read_json(directory, "config.json")
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{options.escaped(directory / 'config.json')} holds a {type(cfg).__name__}, not a "
                              "config object.")
    return cfg


def read_checkpoint(path: str | Path, sha256: dict[str, str] | None,
                    weights: Callable[[Path], dict[str, torch.Tensor]] = read_weights,
                    ) -> tuple[Path, dict[str, Any], dict[str, torch.Tensor]]:
    """What every load of a trained drafter starts with: ``(its folder, its config.json's object, its weights)``,
    the folder checked against its manifest and ``sha256`` before anything in it is read. ``weights`` reads the
    tensors (a method with its own file names wraps :func:`read_weights`)."""
    directory = checkpoint_dir(path)
    check_manifest(directory)
    check_digests(directory, sha256)
    cfg = read_config(directory)
    return directory, cfg, weights(directory)


def checked_read(read_config: Any, config_path: Path, fmt: str) -> Any:
    """``read_config()`` (a format reader, then the config's checks), its errors as CheckpointErrors naming the
    config file: a field of the wrong type or beyond its bound, an unknown activation or rope type."""
    # escaped here, whatever the reader quoted from the file (Python's own errors quote names raw)
    where = f"{options.escaped(config_path)} ({options.escaped(fmt, 40)})"
    try:
        return read_config()
    except CheckpointError as error:
        raise CheckpointError(f"{where}: {options.escaped(error, 2000)}") from None
    except KeyError as error:
        raise CheckpointError(f"{where} lacks the field {options.escaped(error, 200)}, which that format always has.") \
            from None
    except (ValueError, TypeError, AttributeError, OverflowError) as error:
        raise CheckpointError(f"{where}: {options.escaped(error, 2000)} Use the config.json that was saved with these "
                              "weights.") from None


def state_dict_problems(expected: dict[str, Any], state: dict[str, torch.Tensor], noun: str) -> list[str]:
    """How ``state`` differs from ``expected`` (the network ``config.json`` describes, built on the meta device: its
    tensors, or only their shapes): missing and unexpected keys, shape mismatches named
    ``"checkpoint (...), {noun} (...)"``, and, given tensors, dtypes the network cannot take; empty when it loads
    strictly."""
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    problems = [f"{what} keys {keys[:6]}{' ...' if len(keys) > 6 else ''}"
                for what, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
    shapes = {k: v.shape if isinstance(v, torch.Tensor) else v for k, v in expected.items()}
    mismatched = [f"{k}: checkpoint {tuple(state[k].shape)}, {noun} {tuple(shape)}"
                  for k, shape in shapes.items() if k in state and state[k].shape != shape]
    if mismatched:
        problems.append("shape mismatches " + "; ".join(mismatched[:4]))
    # load_state_dict copies across dtypes without a word: integer weights would run, a float id map would be
    # truncated into ids nobody wrote
    dtypes = [f"{k}: checkpoint {_dtype_name(state[k].dtype)}, {noun} {_dtype_kind(v.dtype)}"
              for k, v in expected.items()
              if isinstance(v, torch.Tensor) and k in state and not _dtype_fits(state[k].dtype, v.dtype)]
    if dtypes:
        problems.append("dtype mismatches " + "; ".join(dtypes[:4]))
    return problems


def _dtype_fits(found: torch.dtype, wanted: torch.dtype) -> bool:
    if wanted.is_floating_point:
        return found.is_floating_point
    if wanted == torch.bool:
        return found == torch.bool
    return not found.is_floating_point and not found.is_complex and found != torch.bool


def _dtype_kind(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return "floating point"
    return "bool" if dtype == torch.bool else "integer"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def target_mismatches(config: Any, target_config: Any, noun: str) -> list[str]:
    """How a network's config differs from its target's where both must agree (hidden size, vocabulary):
    ``"hidden size: {noun} 64, target 32"``."""
    text = compat.text_config(target_config)
    sides = (("hidden size", config.hidden_size, int(text.hidden_size)),
             ("vocabulary", config.vocab_size, int(text.vocab_size)))
    return [f"{what}: {noun} {mine}, target {theirs}" for what, mine, theirs in sides if mine != theirs]


def target_name(target_config: Any) -> str:
    return getattr(target_config, "_name_or_path", "") or type(target_config).__name__


def cast(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """``state`` with its floating-point tensors in ``dtype`` (others, e.g. EAGLE-3's ``d2t``, keep theirs)."""
    if dtype is None:
        return state
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


# -- writing ---------------------------------------------------------------------------------------
def save_network(net: torch.nn.Module, directory: str | Path, *, metadata: dict | None = None) -> Path:
    """Write ``net`` (its ``config`` a :class:`SavedConfig`) in our format: ``config.json``, ``model.safetensors``
    (dtype kept) and, with ``metadata`` (training command, data, results), ``training.json``. Returns the
    directory."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    net.config.save(directory)
    save_file({k: v.detach().contiguous().cpu() for k, v in net.state_dict().items()},
              str(directory / "model.safetensors"), metadata={"format": "pt"})
    if metadata is not None:
        (directory / "training.json").write_text(json.dumps(metadata, indent=2, default=str) + "\n")
    return directory


def write_folder(out_dir: str | Path, cfg: dict[str, Any], tensors: dict[str, torch.Tensor],
                 weights_name: str = "model.safetensors") -> Path:
    """Write an exported network: ``config.json`` (``cfg``) and ``weights_name`` (safetensors). Returns the folder."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    # clone: one tensor under several names (a shared vocabulary head) is refused by safetensors
    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, str(out_dir / weights_name),
              metadata={"format": "pt"})
    return out_dir
