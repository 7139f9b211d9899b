"""A strategy -> its spec in ``generation_config.json`` (the reader is ``hf_speculative.hf.spec``).

    {"candidate_generator": {"method": "eagle",                    # a name of the drafter registry
                             "options": {"num_tokens": 8, ...},    # the strategy's settings
                             "path": "eagle",                      # relative to the model's folder,
                                                                   #   or the name of a shipped drafter
                             "sha256": {"model.safetensors": "…", "config.json": "…"}}}

- :func:`to_spec` describes a strategy without touching files. transformers calls it (through
  ``DraftStrategy.to_dict``) whenever it serializes a ``GenerationConfig`` that holds a strategy:
  ``repr``, ``hash``, equality, ``save_pretrained``.
- :func:`save_strategy` writes what the spec needs beside a saved model (a trained network goes to a
  subfolder, unless it is a shipped one, which is named) and returns the spec; ``model.save_pretrained(dir)`` on an
  enabled model calls it and writes that spec into the ``generation_config.json`` it saved
  (``hf.spec.keep_field_on_load``).

What goes into a spec is what the strategy's class declares (:class:`~hf_speculative.drafters.declaration.Declaration`):
its method (or a variant, ``spec_method()``), the fields that hold objects (``live_fields``: never options), what it
keeps in files (``files_for(method)``), or that it lists its members' specs (``holds_members``). Here in the drafters'
layer, so that a strategy writes its own spec without importing the transformers adapter above it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

from ..core import tree_shapes
from ..registry import integrity
from ..registry.spec_bounds import WHERE, SpecError
from . import registry
from .registry import NO_FILES, SpecFiles

TREE_SHAPES = (tree_shapes.DynamicTree, tree_shapes.StaticTree)


def _methods() -> dict[str, type]:
    """Every spec method: the drafter registry's names -> classes (the drafters are imported on first use)."""
    return registry.registered()


def files_of(method: str) -> SpecFiles:
    """What the spec of ``method`` keeps in files, as its class declares."""
    return _methods()[method].declaration.files_for(method)


def method_of(strategy: Any) -> str | None:
    """The spec's method name of ``strategy`` (``None`` for a class with no spec: a user's own, or a subclass of a
    registered one, which a spec would bring back as its base class)."""
    declaration = type(strategy).declaration if isinstance(strategy, registry.Drafter) else None
    if declaration is None:
        return None
    method = strategy.spec_method()
    return method if method is not None and _methods().get(method) is type(strategy) else None


# -- strategy -> spec ------------------------------------------------------------------------------
def to_spec(strategy: Any) -> dict:
    """The spec of ``strategy`` as far as it is known without writing files. Never raises: transformers
    calls it to print and hash configs. A strategy built by :func:`from_spec` gives back its spec."""
    origin = strategy.__dict__.get("_hf_speculative_spec")
    if origin is not None:
        return origin
    method = method_of(strategy)
    if method is None:
        return {"class": f"{type(strategy).__module__}.{type(strategy).__qualname__}"}
    members = strategy.spec_members()
    if members is not None:
        return {"method": method, "members": [to_spec(member) for member, _ in members]}
    spec = {"method": method, "options": options_of(strategy)}
    path = strategy.spec_path()
    if path:
        spec["path"] = path
    return spec


def options_of(strategy: Any) -> dict:
    """The strategy's settings as JSON values: its init fields except those holding live objects."""
    live = type(strategy).declaration.live_fields
    options = {}
    for field in dataclasses.fields(strategy):
        if field.init and field.name not in live:
            value = getattr(strategy, field.name)
            options[field.name] = os.fspath(value) if isinstance(value, os.PathLike) else \
                list(value) if isinstance(value, tuple) else \
                tree_shapes.shape_to_json(value) if isinstance(value, TREE_SHAPES) else value
    return options


def save_strategy(strategy: Any, directory: str | os.PathLike, subfolder: str | None = None) -> dict:
    """Write what the spec of ``strategy`` needs beside a model saved in ``directory``; return the spec.

    What its class declares (``declaration.files_for(method)``): a trained network goes to ``directory/subfolder`` (by default the class's
    subfolder: ``"eagle"``, ``"medusa"``, ``"exit-adapter"``) in hf_speculative's format, unless it is one that ships
    with the package, which the spec names instead; a draft model is named by its registry name or its folder inside
    ``directory`` (one from elsewhere is copied into ``directory/draft-model``); a history or calibration file is
    copied beside the model and named relatively.

    Raises:
        SpecError: the strategy cannot be described (a class with no spec, a draft model with no name).
    """
    method = method_of(strategy)
    if method is None:
        raise SpecError(f"{WHERE}: a {type(strategy).__name__} has no generation_config spec, so the model cannot be "
                        f"saved with it as its default drafter (only hf_speculative's strategies have one: "
                        f"{', '.join(_methods())}). Pass it per call with candidate_generator=, or clear the default "
                        "before saving: del model.generation_config.candidate_generator.")
    directory = Path(directory)
    members = strategy.spec_members()
    if members is not None:
        return {"method": method, "members": [save_strategy(m, directory, _subfolder(m, lab)) for m, lab in members]}
    spec = {"method": method, "options": options_of(strategy)}
    files = files_of(method)
    if files.file_option is not None:
        _save_file_option(spec, method, files, directory, subfolder)
    if files.network == "model":
        spec["path"] = _draft_model_location(strategy, directory, subfolder or files.subfolder)
        spec["options"].update(strategy.spec_save_beside(directory, spec["path"]))  # (DraftModel's tokenizers)
    elif files.network == "checkpoint":
        spec.update(_save_network(strategy.spec_network(), directory, files, subfolder or files.subfolder))
    return spec


def _subfolder(member: Any, label: str) -> str | None:
    """Where a hybrid's member keeps its files: its network's subfolder or its file's stem, with the label's number
    for a second member of the same method (``eagle-2``)."""
    method = method_of(member)
    files = NO_FILES if method is None else files_of(method)
    base = files.subfolder
    if base is None and files.saved_name is not None:
        base = files.saved_name.removesuffix(".json")
    return None if base is None else base + (f"-{label.split('#')[1]}" if "#" in label else "")


def _save_file_option(spec: dict, method: str, files: SpecFiles, directory: Path, stem: str | None) -> None:
    """A strategy's history / calibration file goes beside the model (copied, when it exists) under a relative
    name, the only kind of name a spec may hold (``hf.spec``'s reader reads no other)."""
    key = files.file_option
    value = spec["options"].get(key)
    if value is None:
        return
    name = f"{stem}.json" if stem else files.saved_name
    source = Path(value)
    if source.exists():
        data = integrity.read_capped(source, file_cap(files), f"{method} {key}")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    spec["options"][key] = name


def _save_network(net: Any, directory: Path, files: SpecFiles, subfolder: str) -> dict:
    """A trained network's spec fields: a shipped one's name, or the subfolder it is written to; their digests."""
    checkpoints = files.checkpoints()
    name = _shipped_match(net, files.shipped_dir, checkpoints)
    if name is not None:
        return {"path": name, "sha256": _digests(files.shipped_dir / name)}
    checkpoints.save_pretrained(net, directory / subfolder)
    return {"path": subfolder, "sha256": _digests(directory / subfolder)}


def _shipped_match(net: Any, shipped_dir: Path, checkpoints: Any) -> str | None:
    """The shipped network whose weights ``net`` holds (cast to its dtype), if any."""
    import torch

    mine = net.state_dict()
    for name in checkpoints.shipped_names(shipped_dir):
        try:
            _, state, _ = checkpoints.load_checkpoint(shipped_dir / name)
        except (checkpoints.CheckpointError, OSError):
            continue
        if state.keys() == mine.keys() and all(
                state[k].shape == v.shape and torch.equal(state[k].to(device=v.device, dtype=v.dtype), v)
                for k, v in mine.items()):
            return name
    return None


def _draft_model_location(strategy: Any, directory: Path, subfolder: str) -> str:
    """How the spec names ``strategy``'s draft model: its registry name, or its folder relative to ``directory``. A
    draft model loaded from anywhere else (another folder, the Hub) is saved into ``directory/subfolder`` first
    (``draft-model``): a spec loads a draft model from nowhere else (``hf.spec``'s reader)."""
    from ..registry import models

    draft = strategy.spec_network()
    name = str(getattr(draft, "name_or_path", "") or "")
    local = Path(name).expanduser() if name else None
    if name in models.REGISTRY:
        return name
    if local is not None and local.is_dir():
        for registered in models.REGISTRY:
            if models.model_path(registered).resolve() == local.resolve():
                return registered
        with contextlib.suppress(ValueError):
            return local.resolve().relative_to(directory.resolve()).as_posix()
    if name:
        draft.save_pretrained(directory / subfolder)
        return subfolder
    holder = f"{type(strategy).__name__}({type(strategy).declaration.live_fields[0]}=...)"  # DraftModel(model=...)
    raise SpecError(f"{WHERE}: {holder} holds a draft model that was not loaded from a folder, a registry name or the "
                    f"Hub (its name_or_path is {name!r}), and a spec names the draft model, it does not copy it. "
                    "Save it (draft.save_pretrained(folder)), load it back with from_pretrained(folder) and use that "
                    "one, or clear the default before saving: del model.generation_config.candidate_generator.")


def file_sha256(path: Path) -> str:
    """Hex sha256 of a regular file (a device or FIFO is refused, a file over ``integrity.MAX_HASHED_BYTES`` too)."""
    return integrity.sha256_file(Path(path))


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}


def file_cap(files: SpecFiles) -> int:
    """The most bytes read from a spec's file: the class's bound, else a JSON file's."""
    return integrity.MAX_JSON_BYTES if files.max_bytes is None else files.max_bytes
