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
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, NoReturn

import torch

from ...registry import integrity
from ... import options
from .config import EagleConfig
from .formats import NATIVE, SAFEAILAB1, CheckpointError, detect, read, write
from .model import EagleDraftModel

__all__ = ["CheckpointError", "save_pretrained", "load_checkpoint", "load_drafter", "export"]

WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
MANIFEST = "sha256sums.json"  # {"sha256": {file name: hex digest}}, written at release (tools/drafter_manifests.py)


def shipped_names(shipped_dir: Path) -> list[str]:
    """Names of the networks shipped under ``shipped_dir`` (one folder with a ``config.json`` each)."""
    if not shipped_dir.is_dir():
        return []
    return sorted(p.name for p in shipped_dir.iterdir() if (p / "config.json").exists())


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
            raise FileNotFoundError(missing)
        path = shipped_dir / str(source)
    if path.resolve().parent == Path(shipped_dir).resolve():
        check_manifest(path, required=True)
    return path


def save_pretrained(model: EagleDraftModel, directory: str | Path, *, metadata: dict | None = None) -> Path:
    """Write ``model`` in our format: ``config.json``, ``model.safetensors`` (dtype kept) and, with
    ``metadata`` (training command, data, ...), ``training.json``. Returns the directory."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.save(directory)
    save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()},
              str(directory / "model.safetensors"), metadata={"format": "pt"})
    if metadata is not None:
        (directory / "training.json").write_text(json.dumps(metadata, indent=2, default=str) + "\n")
    return directory


def check_weights_file(path: Path) -> None:
    """A weights file is a regular file under ``integrity.MAX_HASHED_BYTES`` (a FIFO or a device in a drafter
    folder would hang the reader or never end), else a CheckpointError."""
    try:
        fd, st = integrity.open_regular(path, f"the weights file {path.name}")
        os.close(fd)
        if st.st_size > integrity.MAX_HASHED_BYTES:
            raise integrity.FileRefused(f"the weights file {path} has {st.st_size} bytes, over the limit of "
                                        f"{integrity.MAX_HASHED_BYTES}.")
    except integrity.FileRefused as error:
        raise CheckpointError(str(error)) from None


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    check_weights_file(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as error:  # safetensors / pickle / zip errors of a damaged file
        _damaged(path, error)


def _damaged(path: Path, error: Exception) -> NoReturn:
    raise CheckpointError(f"Cannot read the weights file {path} ({type(error).__name__}: {error}); it is corrupt or "
                          "truncated. Download or copy it again (compare its sha256 with the source's).") from error


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.exists():
            continue
        if not name.endswith(".index.json"):
            return _read_file(path)
        weight_map = _read_json(path).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{path}: its weight_map must map weight names to shard file names.")
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            try:  # a shard is a file of this folder: nothing outside it is read
                shard_path = integrity.confined(directory, shard, f"{path} weight_map")
            except integrity.FileRefused as error:
                raise CheckpointError(str(error)) from None
            if not shard_path.exists():
                raise CheckpointError(f"{path} lists the shard {shard}, which is not in {directory}.")
            state.update(_read_file(shard_path))
        return state
    raise CheckpointError(f"No weights in {directory}: expected one of {', '.join(WEIGHT_FILES)}.")


def _expected(config: EagleConfig) -> dict[str, tuple[torch.Size, torch.dtype]]:
    with torch.device("meta"):
        model = EagleDraftModel(config)
    return {k: (v.shape, v.dtype) for k, v in model.state_dict().items()}


def validate_state_dict(config: EagleConfig, state: dict[str, torch.Tensor], source: str) -> None:
    """Raise :class:`CheckpointError` unless ``state`` has exactly the keys and shapes ``config`` describes."""
    expected = _expected(config)
    drafter = (f"the drafter its config describes (EAGLE-{config.version}, hidden {config.hidden_size}, vocabulary "
               f"{config.vocab_size}/{config.draft_vocab_size}, fc_bias={config.fc_bias}, "
               f"input_layernorm={config.input_layernorm})")
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    problems = []
    if missing:
        problems.append(f"missing keys {missing[:6]}{' ...' if len(missing) > 6 else ''}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected[:6]}{' ...' if len(unexpected) > 6 else ''}")
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)}, drafter {tuple(shape)}"
              for k, (shape, _) in expected.items() if k in state and state[k].shape != shape]
    if shapes:
        problems.append("shape mismatches " + "; ".join(shapes[:4]))
    if problems:
        raise CheckpointError(f"{source} does not match {drafter}: " + "; ".join(problems) + ". The config.json and "
                              "the weights come from different drafters, or the file was written for another "
                              "architecture; use the config.json that was saved with these weights.")


def _checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint directory of ``path`` (a directory or a file in it), which must hold a config.json."""
    directory = Path(path)
    if directory.is_file():
        directory = directory.parent
    if not (directory / "config.json").exists():
        raise CheckpointError(f"No config.json in {directory}: not a drafter checkpoint directory.")
    return directory


def _read_json(path: Path) -> Any:
    """A JSON file of a drafter folder: a regular file of at most ``integrity.MAX_JSON_BYTES``."""
    try:
        return integrity.read_json_capped(path, path.name)
    except integrity.FileRefused as error:
        raise CheckpointError(str(error)) from None


def _read_config(config_path: Path) -> dict[str, Any]:
    cfg = _read_json(config_path)
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{config_path} holds a {type(cfg).__name__}, not a config object.")
    return cfg


def check_digests(directory: Path, sha256: Any) -> None:
    """Check the files of ``directory`` against ``sha256`` (``{relative name: hex digest}``): names inside the
    folder only, regular files only (see ``integrity``)."""
    if sha256 is None:
        return
    if not isinstance(sha256, dict):
        raise CheckpointError(f"sha256={options.shown(sha256)}: must map file names to hex sha256 digests.")
    for name, want in sha256.items():
        if not isinstance(want, str) or len(want) != 64 or any(c not in "0123456789abcdefABCDEF" for c in want):
            raise CheckpointError(f"sha256[{options.shown(name)}]={options.shown(want)}: not a hex sha256 digest "
                                  "(64 hex digits).")
        try:
            path = integrity.confined(directory, name, "sha256")
            got = integrity.sha256_file(path, what=f"sha256[{name!r}]")
        except integrity.FileRefused as error:
            raise CheckpointError(str(error)) from None
        if got != want.lower():
            raise CheckpointError(f"sha256 of {path} is {got}, expected {want.lower()}: the file is "
                                  "damaged or not the published one. Download it again.")


def checked_read(read_config: Any, config_path: Path, fmt: str) -> Any:
    """``read_config()`` (a format reader, then the config's checks), its errors as CheckpointErrors naming the
    config file: a field of the wrong type or beyond its bound, an unknown activation or rope type."""
    try:
        return read_config()
    except CheckpointError as error:
        raise CheckpointError(f"{config_path} ({fmt}): {error}") from None
    except KeyError as error:
        raise CheckpointError(f"{config_path} ({fmt}) lacks the field {error}, which that format always has.") from None
    except (ValueError, TypeError, AttributeError, OverflowError) as error:
        raise CheckpointError(f"{config_path} ({fmt}): {error} Use the config.json that was saved with these "
                              "weights.") from None


def network_kind(path: str | Path) -> tuple[int, int | None]:
    """``(EAGLE version, exit layer or None)`` of the drafter saved in ``path``, from its
    ``config.json`` and weight names alone (no target needed; the weights are not checked)."""
    directory = _checkpoint_dir(path)
    cfg = _read_config(directory / "config.json")
    single = directory / "model.safetensors"
    if single.exists():
        from safetensors import safe_open

        check_weights_file(single)
        try:
            with safe_open(str(single), framework="pt") as handle:  # the header only
                names = set(handle.keys())
        except Exception as error:  # damaged header
            _damaged(single, error)
    else:
        names = set(_read_weights(directory))
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
    directory = _checkpoint_dir(path)
    config_path = directory / "config.json"
    check_manifest(directory)
    check_digests(directory, sha256)
    cfg = _read_config(config_path)
    state = _read_weights(directory)
    fmt = detect(cfg, set(state))
    config, state = checked_read(lambda: read(fmt, cfg, state, target_config), config_path, fmt)
    if target_config is not None:  # first: cheap, and its message names both sides
        _check_target_config(config, target_config)
    checked_read(lambda: validate_state_dict(config, state, f"The checkpoint {directory} ({fmt})"), config_path, fmt)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    return config, state, fmt


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
    from ...registry.integrity import check_files, drafter_trust_file

    directory = Path(directory)
    manifest = directory / MANIFEST
    if not manifest.exists():
        if required:
            raise CheckpointError(f"The shipped drafter {directory} has no {MANIFEST}, so its files cannot be checked: "
                                  "the installation is incomplete. Reinstall hf-speculative.")
        return 0
    try:
        digests = integrity.read_json_capped(manifest, MANIFEST)["sha256"]
        problem = "its 'sha256' does not map file names to hex digests"
    except (OSError, ValueError, KeyError, TypeError) as error:  # FileRefused (a device, too big) is a ValueError
        digests, problem = None, f"{type(error).__name__}: {error}"
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise CheckpointError(f"{manifest} is not a readable sha256 manifest ({problem}). Reinstall hf-speculative, "
                              "or copy the drafter's folder again.")
    folder = directory.resolve()
    problems = check_files(folder, digests, drafter_trust_file(folder), full=full)
    if problems:
        (name, what), more = problems[0], problems[1:]
        others = f" (and {len(more)} more: {', '.join(n for n, _ in more)})" if more else ""
        raise CheckpointError(f"The drafter at {directory} failed its integrity check: {name} {what}{others}, unlike "
                              f"the {MANIFEST} written at its release (a damaged install or copy, or an edit). "
                              "Reinstall hf-speculative (pip install --force-reinstall hf-speculative), or copy the "
                              "folder again.")
    return len(digests)


def _check_target_config(config: EagleConfig, target_config: Any) -> None:
    from ... import compat

    text = compat.text_config(target_config)
    depth = int(text.num_hidden_layers)
    sides = (("hidden size", config.hidden_size, int(text.hidden_size)),
             ("vocabulary", config.vocab_size, int(text.vocab_size)))
    problems = [f"{what}: drafter {mine}, target {theirs}" for what, mine, theirs in sides if mine != theirs]
    if any(not 0 <= i < depth for i in config.target_layers):
        problems.append(f"fused layers {config.target_layers} outside the target's 0..{depth - 1}")
    if problems:
        raise CheckpointError("This EAGLE drafter does not fit the target config "
                              f"{getattr(target_config, '_name_or_path', '') or type(target_config).__name__}: "
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
    from safetensors.torch import save_file

    if isinstance(model_or_path, EagleDraftModel):
        config = model_or_path.config
        state = {k: v.detach().cpu() for k, v in model_or_path.state_dict().items()}
    else:
        config, state, _ = load_checkpoint(model_or_path, target_config=target_config)
    verifier = list(getattr(target_config, "architectures", None) or []) if target_config is not None else None
    cfg, out = write(format, config, state, speculative_tokens=speculative_tokens, verifier_architectures=verifier)
    if format == "vllm" and not config.target:
        warnings.warn("The drafter records no target; vLLM needs speculators_config.verifier.name_or_path "
                      "(set EagleConfig.target before exporting, or edit config.json).", stacklevel=2)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in out.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    return out_dir
