"""A strategy <-> its spec in ``generation_config.json``: the model's default drafter, saved with the model.

    {"candidate_generator": {"method": "eagle",                    # a name of the method registry
                             "options": {"num_tokens": 8, ...},    # the strategy's settings
                             "path": "eagle",                      # relative to the model's folder,
                                                                   #   or the name of a shipped drafter
                             "sha256": {"model.safetensors": "…", "config.json": "…"}}}

- :func:`to_spec` describes a strategy without touching files. transformers calls it (through
  ``DraftStrategy.to_dict``) whenever it serializes a ``GenerationConfig`` that holds a strategy:
  ``repr``, ``hash``, equality, ``save_pretrained``.
- :func:`save_strategy` writes what the spec needs beside a saved model (a trained network goes to a
  subfolder, unless it is a shipped one, which is named) and returns the spec;
  ``model.save_pretrained(dir)`` on an enabled model calls it (see :func:`saving`).
- :func:`from_spec` builds the strategy back for a target; every problem names its field
  (``generation_config.candidate_generator.method`` ...).

Methods: ``prompt-lookup``, ``draft-model`` (saved by the draft model's registry name, folder or Hub
id, never its weights), ``eagle``, ``medusa``, ``early-exit``, ``early-exit-adapter``, ``layer-skip`` (the names
of ``hf_speculative.methods``), ``suffix``, ``lookahead``, and ``hybrid`` (``"members"``: a list of specs).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

from . import tree_shapes
from .options import MAX_HYBRID_MEMBERS

TREE_SHAPES = (tree_shapes.DynamicTree, tree_shapes.StaticTree)

FIELD = "candidate_generator"
WHERE = f"generation_config.{FIELD}"
_KEYS = {"method", "options", "path", "sha256", "members"}
JSON_VALUES = (dict, list, str, int, float)  # what a generation_config.json can hold: a spec, or a bad one
# the specs of the strategies being saved right now in this thread, by id (see `saving`)
_SAVING: contextvars.ContextVar[dict[int, dict]] = contextvars.ContextVar("hf_speculative_saving", default={})


class SpecError(ValueError):
    """A ``candidate_generator`` spec that cannot be read or written; the message names the field."""


@dataclasses.dataclass(frozen=True)
class _Method:
    cls: type
    live: tuple[str, ...] = ()  # fields that hold objects, not settings: never in "options"
    subfolder: str | None = None  # where a trained network is saved beside the model


@functools.cache
def _methods() -> dict[str, _Method]:
    # imported on first use: the drafters import base, which imports this module lazily
    from .drafters.draft_model import DraftModel
    from .drafters.eagle.drafter import Eagle
    from .drafters.hybrid import Hybrid
    from .drafters.lookahead import Lookahead
    from .drafters.medusa.drafter import Medusa
    from .drafters.prompt_lookup import PromptLookup
    from .drafters.self_speculative import EarlyExit, LayerSkip
    from .drafters.suffix import SuffixDecoding

    early_exit_live = ("adapter", "adapter_sha256")
    return {
        "prompt-lookup": _Method(PromptLookup),
        "draft-model": _Method(DraftModel, ("model", "tokenizer", "target_tokenizer")),
        "eagle": _Method(Eagle, ("drafter",), "eagle"),
        "medusa": _Method(Medusa, ("heads",), "medusa"),
        "early-exit": _Method(EarlyExit, early_exit_live),
        "early-exit-adapter": _Method(EarlyExit, early_exit_live, "exit-adapter"),
        "layer-skip": _Method(LayerSkip),
        "hybrid": _Method(Hybrid, ("strategies",)),
        "suffix": _Method(SuffixDecoding),
        "lookahead": _Method(Lookahead),
    }


def method_of(strategy: Any) -> str | None:
    """The spec's method name of ``strategy`` (``None`` for a class with no spec, e.g. a user's own)."""
    for name, method in _methods().items():
        if type(strategy) is method.cls:
            if name.startswith("early-exit"):
                return "early-exit-adapter" if strategy.adapter is not None else "early-exit"
            return name
    return None


# -- strategy -> spec ------------------------------------------------------------------------------
def to_spec(strategy: Any) -> dict:
    """The spec of ``strategy`` as far as it is known without writing files. Never raises: transformers
    calls it to print and hash configs. A strategy built by :func:`from_spec` gives back its spec."""
    saved = _SAVING.get().get(id(strategy))
    if saved is not None:
        return saved
    origin = strategy.__dict__.get("_hf_speculative_spec")
    if origin is not None:
        return origin
    method = method_of(strategy)
    if method is None:
        return {"class": f"{type(strategy).__module__}.{type(strategy).__qualname__}"}
    if method == "hybrid":
        return {"method": method, "members": [to_spec(member) for member in strategy.strategies]}
    spec = {"method": method, "options": options_of(strategy)}
    if method == "early-exit-adapter" and isinstance(strategy.adapter, (str, os.PathLike)):
        spec["path"] = str(strategy.adapter)
    if method == "draft-model" and getattr(strategy.model, "name_or_path", ""):
        spec["path"] = str(strategy.model.name_or_path)
    return spec


def options_of(strategy: Any) -> dict:
    """The strategy's settings as JSON values: its init fields except those holding live objects."""
    live = _methods()[method_of(strategy)].live
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

    A trained network (EAGLE drafter, Medusa heads, exit adapter) goes to ``directory/subfolder`` (default ``"eagle"`` /
    ``"medusa"`` /
    ``"exit-adapter"``) in hf_speculative's format, unless it is one that ships with the package, which
    the spec names instead. A draft model is named, not copied.

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
    if method == "hybrid":
        members = zip(strategy.strategies, strategy.labels())
        return {"method": method, "members": [save_strategy(m, directory, _subfolder(m, lab)) for m, lab in members]}
    spec = {"method": method, "options": options_of(strategy)}
    if method == "draft-model":
        spec["path"] = _draft_model_location(strategy.model, directory)
    elif _methods()[method].subfolder is not None:
        net = {"eagle": lambda: strategy.drafter, "medusa": lambda: strategy.heads}.get(method, lambda: strategy._adapter_net)()
        spec.update(_save_network(net, directory, _shipped_dir(method), subfolder or _methods()[method].subfolder,
                                  _checkpoints(method)))
    return spec


@contextlib.contextmanager
def saving(strategy: Any, spec: dict):
    """While transformers writes ``generation_config.json`` in this thread, ``strategy`` serializes as ``spec``
    (the one :func:`save_strategy` returned, with the paths of the files it wrote)."""
    token = _SAVING.set({**_SAVING.get(), id(strategy): spec})
    try:
        yield
    finally:
        _SAVING.reset(token)


def keep_field_on_load(directory: str | os.PathLike) -> None:
    """transformers drops the unknown keys of a ``generation_config.json`` marked ``_from_model_config``
    (a config derived from ``config.json``) when it loads it: clear the mark where the file holds a spec."""
    path = Path(directory) / "generation_config.json"
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    if FIELD in data and data.get("_from_model_config"):
        data["_from_model_config"] = False
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _subfolder(member: Any, label: str) -> str | None:
    base = _methods().get(method_of(member) or "", _Method(object)).subfolder
    return None if base is None else base + (f"-{label.split('#')[1]}" if "#" in label else "")


def _checkpoints(method: str) -> Any:
    """The checkpoint module of a trained network's method (Medusa heads, or EAGLE's for drafters and adapters)."""
    if method == "medusa":
        from .drafters.medusa import checkpoints

        return checkpoints
    from .drafters.eagle import checkpoints

    return checkpoints


def _shipped_dir(method: str) -> Path:
    if method == "medusa":
        from .drafters.medusa.drafter import PRETRAINED_DIR

        return PRETRAINED_DIR
    if method == "eagle":
        from .drafters.eagle.drafter import PRETRAINED_DIR

        return PRETRAINED_DIR
    from .drafters.exit_adapter import SHIPPED_DIR

    return SHIPPED_DIR


def _save_network(net: Any, directory: Path, shipped_dir: Path, subfolder: str, checkpoints: Any) -> dict:
    name = _shipped_match(net, shipped_dir, checkpoints)
    if name is not None:
        return {"path": name, "sha256": _digests(shipped_dir / name)}
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


def _draft_model_location(draft: Any, directory: Path) -> str:
    """How the spec names a draft model: its registry name, its folder (relative to ``directory`` when
    inside it) or its Hub id."""
    from . import models

    name = str(getattr(draft, "name_or_path", "") or "")
    local = Path(name).expanduser() if name else None
    if local is not None and local.is_dir():
        for registered in models.REGISTRY:
            if models.model_path(registered).resolve() == local.resolve():
                return registered
        with contextlib.suppress(ValueError):
            return local.resolve().relative_to(directory.resolve()).as_posix()
        return str(local.resolve())
    if name and not name.startswith(("/", ".", "~")) and name.count("/") <= 1:
        return name  # a Hub id
    raise SpecError(f"{WHERE}: DraftModel(model=...) holds a draft model that was not loaded from a folder, a registry "
                    f"name or the Hub (its name_or_path is {name!r}), and a spec names the draft model, it does not "
                    "copy it. Save it (draft.save_pretrained(folder)), load it back with from_pretrained(folder) and "
                    "use that one, or clear the default before saving: "
                    "del model.generation_config.candidate_generator.")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}


# -- spec -> strategy ------------------------------------------------------------------------------
def from_spec(spec: Any, target: Any, base_dir: str | os.PathLike | None, where: str = WHERE) -> Any:
    """The strategy that ``spec`` describes, ready for ``target``.

    Args:
        spec (`dict`): the value of ``generation_config.candidate_generator``.
        target (`PreTrainedModel`): the model it drafts for (device, dtype, checks).
        base_dir (`str`, *optional*): the model's folder, against which ``path`` is resolved.
        where (`str`): the field's name in error messages.

    Raises:
        SpecError: a bad method, option or digest. FileNotFoundError: a drafter's folder or file is missing.
    """
    if not isinstance(spec, dict):
        raise SpecError(f"{where} must be an object such as {{\"method\": \"prompt-lookup\", \"options\": {{}}}}, "
                        f"got {type(spec).__name__}.")
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {unknown}; a spec has {sorted(_KEYS)}. Was it written by a newer "
                        "hf_speculative?")
    name = spec.get("method")
    if name not in _methods():
        raise SpecError(f"{where}.method: unknown method {name!r}; known: {', '.join(_methods())}. Fix the name, or "
                        "upgrade hf_speculative if a newer version wrote this config.")
    if name == "hybrid":
        return _hybrid(spec, target, base_dir, where)
    options = _options(spec, name, where)
    strategy = _build(name, spec, options, target, base_dir, where)
    try:
        strategy.validate_target(target)
    except (ValueError, TypeError) as error:
        raise SpecError(f"{where} does not fit this model: {error}") from error
    strategy.__dict__["_hf_speculative_spec"] = spec  # it serializes as it was read (see to_spec)
    return strategy


def _hybrid(spec: dict, target: Any, base_dir: Any, where: str) -> Any:
    from .drafters.hybrid import Hybrid

    members = spec.get("members")
    if not isinstance(members, list) or len(members) < 2:
        raise SpecError(f"{where}.members: the hybrid method needs a list of two or more specs, got {members!r}.")
    if len(members) > MAX_HYBRID_MEMBERS:  # before any member is built (each may load a network)
        raise SpecError(f"{where}.members: at most {MAX_HYBRID_MEMBERS} specs, got {len(members)}.")
    hybrid = Hybrid(*[from_spec(m, target, base_dir, f"{where}.members[{i}]") for i, m in enumerate(members)])
    hybrid.__dict__["_hf_speculative_spec"] = spec
    return hybrid


def _options(spec: dict, method: str, where: str) -> dict:
    """The spec's options, checked against the strategy's fields and the types of their defaults."""
    options = spec.get("options", {})
    if not isinstance(options, dict):
        raise SpecError(f"{where}.options must be an object of option names and values, got {options!r}.")
    fields = {f.name: f for f in dataclasses.fields(_methods()[method].cls)
              if f.init and f.name not in _methods()[method].live}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise SpecError(f"{where}.options: unknown option(s) {unknown} for the {method} method; known: "
                        f"{', '.join(fields)}.")
    options = dict(options)
    if isinstance(options.get("tree"), dict):  # a draft tree's shape (see tree_shapes.shape_to_json)
        try:
            options["tree"] = tree_shapes.shape_from_json(options["tree"])
        except (TypeError, ValueError) as error:
            raise SpecError(f"{where}.options.tree: {error}") from error
    for key, value in options.items():
        default = fields[key].default
        expected = (bool,) if isinstance(default, bool) else (int,) if isinstance(default, int) else \
            (int, float) if isinstance(default, float) else None
        if expected and (not isinstance(value, expected) or (bool not in expected and isinstance(value, bool))):
            names = " or ".join(t.__name__ for t in expected)
            raise SpecError(f"{where}.options.{key}: expected {names}, got {value!r}.")
    return options


def _with_options(make: Any, options: dict, where: str) -> Any:
    try:
        return make(**options)
    except (ValueError, TypeError) as error:
        raise SpecError(f"{where}.options are invalid: {error}") from error


def _build(method: str, spec: dict, options: dict, target: Any, base_dir: Any, where: str) -> Any:
    cls = _methods()[method].cls
    if method == "draft-model":
        draft = _load_draft_model(spec, target, base_dir, where)
        return _with_options(functools.partial(cls, draft), options, where)
    if method not in ("eagle", "early-exit-adapter", "medusa"):
        if "path" in spec:
            raise SpecError(f"{where}.path: the {method} method loads no files; remove the path.")
        return _with_options(cls, options, where)
    folder = _network_folder(spec, method, base_dir, where)
    _check_digests(folder, spec.get("sha256"), where)
    if method in ("eagle", "medusa"):
        loaded = _loading(lambda: cls.from_pretrained(folder, target=target), where)
        return _with_options(functools.partial(dataclasses.replace, loaded), options, where)
    from .drafters.exit_adapter import load_adapter

    net = _loading(lambda: load_adapter(folder), where)
    return _with_options(functools.partial(cls, adapter=net), options, where)


def _loading(load: Any, where: str) -> Any:
    try:
        return load()
    except (ValueError, TypeError) as error:  # CheckpointError (a ValueError) and the checks against the target
        raise SpecError(f"{where}.path: cannot load the drafter there: {error}") from error


def _network_folder(spec: dict, method: str, base_dir: Any, where: str) -> Path:
    from .drafters.eagle.checkpoints import shipped_names

    path = spec.get("path")
    shipped = shipped_names(_shipped_dir(method))
    if not isinstance(path, str) or not path:
        raise SpecError(f"{where}.path: the {method} method needs the drafter's folder, relative to the model's "
                        f"folder, or a shipped name ({', '.join(shipped) or 'none'}); got {path!r}. Save the model "
                        "from an enabled model (hfs.enable(model); model.save_pretrained(dir)) to write the drafter "
                        "beside it.")
    relative = PurePosixPath(path)
    if relative.is_absolute() or ".." in relative.parts or Path(path).is_absolute():
        raise SpecError(f"{where}.path must be relative to the model's folder (or a shipped name), got {path!r}: "
                        "copy the drafter's folder into the model's folder and name it from there.")
    if base_dir is not None and (Path(base_dir) / path).is_dir():
        return Path(base_dir) / path
    if path in shipped:
        return _shipped_dir(method) / path
    raise FileNotFoundError(f"{where}.path: no drafter folder {path!r} in the model's folder {base_dir} and no shipped "
                            f"drafter of that name ({', '.join(shipped) or 'none'}). Copy the drafter's folder beside "
                            "generation_config.json, or fix the path.")


def _check_digests(folder: Path, digests: Any, where: str) -> None:
    if digests is None:
        return
    if not isinstance(digests, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in digests.items()):
        raise SpecError(f"{where}.sha256 must map file names to hex sha256 digests, got {digests!r}.")
    for name, want in digests.items():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"{where}.sha256 lists {name}, which is not in {folder}: copy the drafter's "
                                    "whole folder.")
        got = file_sha256(path)
        if got != want.lower():
            raise SpecError(f"{where}.sha256: {path} has sha256 {got}, the config expects {want}: the drafter's files "
                            "changed since the model was saved, or were copied incompletely. Copy them again, or save "
                            "the model again to record the new digests.")


def _load_draft_model(spec: dict, target: Any, base_dir: Any, where: str) -> Any:
    from transformers import AutoModelForCausalLM

    from . import compat
    from .models import resolve

    path = spec.get("path")
    if not isinstance(path, str) or not path:
        raise SpecError(f"{where}.path: the draft-model method needs the draft model's registry name, folder or Hub "
                        f"id, got {path!r}.")
    local = Path(base_dir) / path if base_dir is not None else None
    param = next(target.parameters())
    try:
        source = str(local) if local is not None and local.is_dir() else resolve(path)  # a registry name: its folder
        draft = AutoModelForCausalLM.from_pretrained(source, **compat.dtype_kwargs(param.dtype))
    except (OSError, RuntimeError, ValueError) as error:
        raise SpecError(f"{where}.path: cannot load the draft model {path!r} ({error}).") from error
    return draft.to(param.device).eval()
