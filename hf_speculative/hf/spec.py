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

The methods are the drafter registry's (:func:`hf_speculative.drafters.registry.registered`), and each drafter class
declares what its spec holds: the fields that hold objects (``live_fields``), what it keeps in files
(``files_for``: a trained network saved to a subfolder or named when shipped, a draft model named by its registry
name or its folder inside the model's, a history or calibration file), how it is built back (``load_network``,
``from_spec_options``), or that it lists members' specs (``holds_members``: ``"members"``). This module does the
reading and writing, the same for every drafter: the bounds of a spec, paths confined to the model's folder, file
sizes capped, sha256 recorded and checked, every error naming its field.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..registry import integrity, model_config
from ..core import tree_shapes
from ..drafters import registry
from ..drafters.registry import SpecFiles
from ..options import MAX_HYBRID_MEMBERS, escaped, shown

TREE_SHAPES = (tree_shapes.DynamicTree, tree_shapes.StaticTree)

FIELD = "candidate_generator"
WHERE = f"generation_config.{FIELD}"
_KEYS = {"method", "options", "path", "sha256", "members"}
JSON_VALUES = (dict, list, str, int, float)  # what a generation_config.json can hold: a spec, or a bad one
# Bounds of a spec, checked before anything is built from it (a spec is untrusted input: docs/hosting.md)
MAX_SPEC_DEPTH = 8  # objects and lists nested in a spec (a hybrid's member's static tree's path is 7 deep)
MAX_SPEC_VALUES = 100_000  # values in a whole spec (a static tree of 256 paths 64 deep is 16_641)
MAX_SPEC_STRING = 4096  # characters of a string (a path, a digest, a method name) or an object key
MAX_SPEC_INT_BITS = 64  # an integer in a spec (larger ones are never a valid setting)
MAX_GENERATION_CONFIG_BYTES = 1 << 20  # a generation_config.json that hfs.load_model reads before transformers
MAX_SPEC_NETWORKS = 2  # members that load a network from files (a trained network or a draft model: SpecFiles)
# the specs of the strategies being saved right now in this thread, by id (see `saving`)
_SAVING: contextvars.ContextVar[dict[int, dict]] = contextvars.ContextVar("hf_speculative_saving", default={})


class SpecError(ValueError):
    """A ``candidate_generator`` spec that cannot be read or written; the message names the field."""


def _methods() -> dict[str, type]:
    """Every spec method: the drafter registry's names -> classes (the drafters are imported on first use)."""
    return registry.registered()


def _files(method: str) -> SpecFiles:
    """What the spec of ``method`` keeps in files, as its class declares."""
    return _methods()[method].files_for(method)


def method_of(strategy: Any) -> str | None:
    """The spec's method name of ``strategy`` (``None`` for a class with no spec: a user's own, or a subclass of a
    registered one, which a spec would bring back as its base class)."""
    from ..drafters.strategy import DraftStrategy  # (imports torch: whoever holds a strategy has it already)

    if not isinstance(strategy, DraftStrategy):
        return None
    method = strategy.spec_method()
    return method if method is not None and _methods().get(method) is type(strategy) else None


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
    live = type(strategy).live_fields
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

    What its class declares (``files_for``): a trained network goes to ``directory/subfolder`` (by default the class's
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
    files = _files(method)
    if files.file_option is not None:
        _save_file_option(spec, method, files, directory, subfolder)
    if files.network == "model":
        spec["path"] = _draft_model_location(strategy, directory, subfolder or files.subfolder)
        beside = getattr(strategy, "spec_save_beside", None)  # files kept with the draft model (DraftModel's tokenizers)
        if beside is not None:
            spec["options"].update(beside(directory, spec["path"]))
    elif files.network == "checkpoint":
        spec.update(_save_network(strategy.spec_network(), directory, files, subfolder or files.subfolder))
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
    (a config derived from ``config.json``) when it loads it: clear the mark where the file holds a spec or a
    sampling rule (``speculative_sampling``)."""
    path = Path(directory) / "generation_config.json"
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    if (FIELD in data or "speculative_sampling" in data) and data.get("_from_model_config"):
        data["_from_model_config"] = False
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _subfolder(member: Any, label: str) -> str | None:
    """Where a hybrid's member keeps its files: its network's subfolder or its file's stem, with the label's number
    for a second member of the same method (``eagle-2``)."""
    method = method_of(member)
    files = registry.NO_FILES if method is None else _files(method)
    base = files.subfolder
    if base is None and files.saved_name is not None:
        base = files.saved_name.removesuffix(".json")
    return None if base is None else base + (f"-{label.split('#')[1]}" if "#" in label else "")


def _save_file_option(spec: dict, method: str, files: SpecFiles, directory: Path, stem: str | None) -> None:
    """A strategy's history / calibration file goes beside the model (copied, when it exists) under a relative
    name, the only kind of name a spec may hold (see :func:`_local_files`)."""
    key = files.file_option
    value = spec["options"].get(key)
    if value is None:
        return
    name = f"{stem}.json" if stem else files.saved_name
    source = Path(value)
    if source.exists():
        data = integrity.read_capped(source, _file_cap(files), f"{method} {key}")
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
    (``draft-model``): a spec loads a draft model from nowhere else (see :func:`_load_draft_model`)."""
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
    holder = f"{type(strategy).__name__}({type(strategy).live_fields[0]}=...)"  # DraftModel(model=...)
    raise SpecError(f"{WHERE}: {holder} holds a draft model that was not loaded from a folder, a registry name or the "
                    f"Hub (its name_or_path is {name!r}), and a spec names the draft model, it does not copy it. "
                    "Save it (draft.save_pretrained(folder)), load it back with from_pretrained(folder) and use that "
                    "one, or clear the default before saving: del model.generation_config.candidate_generator.")


def file_sha256(path: Path) -> str:
    """Hex sha256 of a regular file (a device or FIFO is refused, a file over ``integrity.MAX_HASHED_BYTES`` too)."""
    return integrity.sha256_file(Path(path))


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}


# -- spec -> strategy ------------------------------------------------------------------------------
def check_bounds(value: Any, where: str = WHERE) -> None:
    """Refuse a spec beyond the documented bounds before anything is read or built from it: nesting deeper
    than ``MAX_SPEC_DEPTH``, more than ``MAX_SPEC_VALUES`` values, a string or key over ``MAX_SPEC_STRING``
    characters, an integer over ``MAX_SPEC_INT_BITS`` bits, a non-string key, a value JSON cannot hold.
    Iterative (no recursion) and it stops at the first excess, so a hostile spec costs nothing to refuse.

    Raises:
        SpecError: naming the field (``generation_config.candidate_generator.options.num_tokens``, ...).
    """
    def named(path: Any) -> str:  # the field's name, built only for a message
        keys = []
        while path is not None:
            path, key = path
            keys.append(f"[{key}]" if isinstance(key, int) else f".{key}")
        return where + "".join(reversed(keys))

    def check_leaf(item: Any, path: Any) -> bool:  # False: a container, to look into
        if item is None or isinstance(item, (bool, float)):
            return True
        if isinstance(item, int):
            if item.bit_length() > MAX_SPEC_INT_BITS:
                raise SpecError(f"{named(path)}: an integer of {item.bit_length()} bits, over the {MAX_SPEC_INT_BITS}-bit "
                                "bound of a spec (no setting is that large); use the documented range of the option.")
            return True
        if isinstance(item, str):
            if len(item) > MAX_SPEC_STRING:
                raise SpecError(f"{named(path)}: a string of {len(item)} characters, over the bound of "
                                f"{MAX_SPEC_STRING}; use a short name.")
            return True
        if isinstance(item, (dict, list, tuple)):
            return False
        raise SpecError(f"{named(path)}: a {type(item).__name__}, which a JSON spec cannot hold; use strings, numbers, "
                        "lists and objects.")

    if check_leaf(value, None):
        return
    too_many = f"{where}: more than {MAX_SPEC_VALUES} values in the spec; no spec is that large."
    count = 1 + len(value)  # a container's items are counted when it is first seen, before it is walked
    if count > MAX_SPEC_VALUES:
        raise SpecError(too_many)
    stack: list[tuple[Any, Any, int]] = [(value, None, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth >= MAX_SPEC_DEPTH:
            raise SpecError(f"{named(path)}: nested more than {MAX_SPEC_DEPTH} levels deep, which no spec is (a hybrid's "
                            "members hold plain specs); write the spec as save_pretrained does.")
        for key, child in (item.items() if isinstance(item, dict) else enumerate(item)):
            if isinstance(item, dict) and (not isinstance(key, str) or len(key) > MAX_SPEC_STRING):
                raise SpecError(f"{named(path)}: the key {shown(key)} is not a short string; a spec is JSON, whose "
                                "object keys are strings.")
            if not check_leaf(child, (path, key)):
                count += len(child)
                if count > MAX_SPEC_VALUES:
                    raise SpecError(too_many)
                stack.append((child, (path, key), depth + 1))


def from_spec(spec: Any, target: Any, base_dir: str | os.PathLike | None, where: str = WHERE) -> Any:
    """The strategy that ``spec`` describes, ready for ``target``.

    A spec is untrusted input (a model folder from anyone): it is checked whole against the bounds of
    :func:`check_bounds` and the shape of every member before anything is built; every path it names is a
    relative name inside ``base_dir`` (or a shipped drafter's or a cached registry model's name), a regular file
    under its size cap; nothing is downloaded and nothing is written outside the package's cache.

    Args:
        spec (`dict`): the value of ``generation_config.candidate_generator``.
        target (`PreTrainedModel`): the model it drafts for (device, dtype, checks).
        base_dir (`str`, *optional*): the model's folder, against which ``path`` is resolved.
        where (`str`): the field's name in error messages.

    Raises:
        SpecError: a bad method, option, path or digest. FileNotFoundError: a drafter's folder or file is missing.
    """
    check_bounds(spec, where)
    name = _parse(spec, where)
    if _methods()[name].holds_members:
        return _with_members(name, spec, target, base_dir, where)
    try:
        options = _local_files(name, _options(spec, name, where), target, base_dir, where)
        strategy = _build(name, spec, options, target, base_dir, where)
    except integrity.FileRefused as error:
        raise SpecError(str(error)) from None
    try:
        strategy.validate_target(target)
    except (ValueError, TypeError) as error:
        raise SpecError(f"{where} does not fit this model: {error}") from error
    strategy.__dict__["_hf_speculative_spec"] = spec  # it serializes as it was read (see to_spec)
    return strategy


def _parse(spec: Any, where: str) -> str:
    """The spec's method name, after the checks that need no file: an object with known fields and a known
    method (a hybrid's members each checked the same way, and their options, before any is built)."""
    if not isinstance(spec, dict):
        raise SpecError(f"{where} must be an object such as {{\"method\": \"prompt-lookup\", \"options\": {{}}}}, "
                        f"got {type(spec).__name__}.")
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {shown(unknown)}; a spec has {sorted(_KEYS)}. Was it written by a "
                        "newer hf_speculative?")
    name = spec.get("method")
    if not isinstance(name, str) or name not in _methods():
        raise SpecError(f"{where}.method: unknown method {shown(name)}; known: {', '.join(_methods())}. Fix the name "
                        "(a string), or upgrade hf_speculative if a newer version wrote this config.")
    if not _methods()[name].holds_members:
        _options(spec, name, where)
        return name
    members = spec.get("members")
    if not isinstance(members, list) or len(members) < 2:
        raise SpecError(f"{where}.members: the {name} method needs a list of two or more specs, got {shown(members)}.")
    if len(members) > MAX_HYBRID_MEMBERS:  # before any member is built (each may load a network)
        raise SpecError(f"{where}.members: at most {MAX_HYBRID_MEMBERS} specs, got {len(members)}.")
    methods = [_parse_member(member, name, f"{where}.members[{i}]") for i, member in enumerate(members)]
    networks = [m for m in methods if _files(m).network is not None]
    if len(networks) > MAX_SPEC_NETWORKS:
        raise SpecError(f"{where}.members: {len(networks)} members load a network ({', '.join(networks)}); a spec loads "
                        f"at most {MAX_SPEC_NETWORKS}. Keep the cheap drafters and one or two trained ones.")
    return name


def _parse_member(member: Any, outer: str, where: str) -> str:
    """A member's method, checked before anything is built; a member that lists members itself is refused (a spec
    nests one level: the bounds of :func:`check_bounds` count on it)."""
    inner = member.get("method") if isinstance(member, dict) else None
    if isinstance(inner, str) and inner in _methods() and _methods()[inner].holds_members:
        raise SpecError(f"{where}.method: a {outer}'s member cannot be a {inner}; list the inner {inner}'s members in "
                        f"the outer one.")
    return _parse(member, where)


def _with_members(method: str, spec: dict, target: Any, base_dir: Any, where: str) -> Any:
    """The strategy of a spec that lists members (``hfs.Hybrid``): each member built as a spec of its own."""
    members = [from_spec(m, target, base_dir, f"{where}.members[{i}]") for i, m in enumerate(spec["members"])]
    try:
        strategy = _methods()[method].from_spec_members(members)
    except (ValueError, TypeError) as error:
        raise SpecError(f"{where}.members: {error}") from error
    strategy.__dict__["_hf_speculative_spec"] = spec
    return strategy


def _options(spec: dict, method: str, where: str) -> dict:
    """The spec's options, checked against the strategy's fields and the types of their defaults."""
    options = spec.get("options", {})
    if not isinstance(options, dict):
        raise SpecError(f"{where}.options must be an object of option names and values, got {shown(options)}.")
    cls = _methods()[method]
    fields = {f.name: f.default for f in dataclasses.fields(cls) if f.init and f.name not in cls.live_fields}
    fields.update(getattr(cls, "spec_only_options", {}))  # options a spec records beyond the fields, with defaults
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise SpecError(f"{where}.options: unknown option(s) {shown(unknown)} for the {method} method; known: "
                        f"{', '.join(fields)}.")
    options = dict(options)
    if isinstance(options.get("tree"), dict):  # a draft tree's shape (see tree_shapes.shape_to_json)
        try:
            options["tree"] = tree_shapes.shape_from_json(options["tree"])
        except (TypeError, ValueError) as error:
            raise SpecError(f"{where}.options.tree: {error}") from error
    for key, value in options.items():
        default = fields[key]
        expected = (bool,) if isinstance(default, bool) else (int,) if isinstance(default, int) else \
            (int, float) if isinstance(default, float) else None
        if expected and (not isinstance(value, expected) or (bool not in expected and isinstance(value, bool))):
            names = " or ".join(t.__name__ for t in expected)
            raise SpecError(f"{where}.options.{key}: expected {names}, got {shown(value)}.")
    file_key = _files(method).file_option
    if file_key is not None and options.get(file_key) is not None:
        try:
            integrity.check_relative_name(options[file_key], f"{where}.options.{file_key}")
        except integrity.FileRefused as error:
            raise SpecError(f"{error} A spec names its files inside the model's folder; the file is then kept in "
                            "hf_speculative's cache (see docs/hosting.md).") from None
    return options


def _local_files(method: str, options: dict, target: Any, base_dir: Any, where: str) -> dict:
    """A spec's ``history_file`` / ``calibration_file`` is a relative name in the model's folder, read from there
    (once, a regular file under its cap) and then kept, read and written, in the package's cache under a name
    derived from the model's fingerprint: loading a spec never writes outside that cache."""
    files = _files(method)
    key = files.file_option
    name = None if key is None else options.get(key)
    if name is None:
        return options
    what = f"{where}.options.{key}"
    cap = _file_cap(files)
    from ..registry.models import cache_dir

    digest = hashlib.sha256(f"{method}\0{name}".encode()).hexdigest()[:16]
    kept = cache_dir() / "spec-files" / files.fingerprint(target) / f"{method}-{digest}.json"
    if not kept.exists() and base_dir is not None:
        source = integrity.folder_file(base_dir, name, what)
        if os.path.lexists(source):
            data = integrity.read_capped(source, cap, what)
            try:
                kept.parent.mkdir(parents=True, exist_ok=True)
                temporary = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
                temporary.write_bytes(data)
                os.replace(temporary, kept)
            except OSError as error:
                raise SpecError(f"{what}: cannot keep the file in hf_speculative's cache {kept.parent} ({error}); make "
                                "it writable or set HF_SPECULATIVE_CACHE to a writable folder.") from error
    return {**options, key: str(kept)}


def _file_cap(files: SpecFiles) -> int:
    """The most bytes read from a spec's file: the class's bound, else a JSON file's."""
    return integrity.MAX_JSON_BYTES if files.max_bytes is None else files.max_bytes


def _with_options(make: Any, options: dict, where: str) -> Any:
    try:
        return make(options)
    except (ValueError, TypeError) as error:
        raise SpecError(f"{where}.options are invalid: {error}") from error


def _build(method: str, spec: dict, options: dict, target: Any, base_dir: Any, where: str) -> Any:
    """The strategy of a checked spec: the network its files hold (checked: confined, digests matched), then the
    class's own constructor with the options."""
    cls, files = _methods()[method], _files(method)
    network = None
    if files.network == "model":
        network = _load_draft_model(spec, target, base_dir, where)
        beside = getattr(cls, "spec_load_beside", None)  # files kept with the draft model (DraftModel's tokenizers)
        if beside is not None:
            options = beside(options, spec["path"], base_dir, where)
    elif files.network == "checkpoint":
        folder = _network_folder(spec, method, files, base_dir, where)
        _check_digests(folder, spec.get("sha256"), where)
        network = _loading(lambda: cls.load_network(method, folder, target), where)
    elif "path" in spec or "sha256" in spec:
        raise SpecError(f"{where}.{'path' if 'path' in spec else 'sha256'}: the {method} method loads no files; "
                        "remove it.")
    return _with_options(functools.partial(cls.from_spec_options, method, network=network), options, where)


def _loading(load: Any, where: str) -> Any:
    try:
        return load()
    except (ValueError, TypeError) as error:  # CheckpointError (a ValueError) and the checks against the target
        raise SpecError(f"{where}.path: cannot load the drafter there: {error}") from error


def _network_folder(spec: dict, method: str, files: SpecFiles, base_dir: Any, where: str) -> Path:
    path = spec.get("path")
    shipped = files.checkpoints().shipped_names(files.shipped_dir)
    if not isinstance(path, str) or not path:
        raise SpecError(f"{where}.path: the {method} method needs the drafter's folder, relative to the model's "
                        f"folder, or a shipped name ({', '.join(shipped) or 'none'}); got {shown(path)}. Save the model "
                        "from an enabled model (hfs.enable(model); model.save_pretrained(dir)) to write the drafter "
                        "beside it.")
    try:
        integrity.check_relative_name(path, f"{where}.path")
    except integrity.FileRefused:
        raise SpecError(f"{where}.path must be relative to the model's folder (or a shipped name), got "
                        f"{shown(path)}: copy the drafter's folder into the model's folder and name it from there.") \
            from None
    if base_dir is not None:
        local = integrity.confined(base_dir, path, f"{where}.path")  # a symlink out of the folder is refused
        if local.is_dir():
            return local
    if path in shipped:
        return files.shipped_dir / path
    raise FileNotFoundError(f"{where}.path: no drafter folder {path!r} in the model's folder {base_dir} and no shipped "
                            f"drafter of that name ({', '.join(shipped) or 'none'}). Copy the drafter's folder beside "
                            "generation_config.json, or fix the path.")


def _check_digests(folder: Path, digests: Any, where: str) -> None:
    if digests is None:
        return
    if not isinstance(digests, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in digests.items()):
        raise SpecError(f"{where}.sha256 must map file names to hex sha256 digests, got {shown(digests)}.")
    for name, want in digests.items():
        if len(want) != 64 or any(c not in "0123456789abcdefABCDEF" for c in want):
            raise SpecError(f"{where}.sha256[{shown(name)}]: {shown(want)} is not a hex sha256 digest (64 hex digits); "
                            "save the model again to record the digests.")
        # only a file of the drafter's folder's own is hashed: its digest is never that of a file elsewhere
        path = integrity.folder_file(folder, name, f"{where}.sha256", hashed=True)
        if not path.is_file():
            raise FileNotFoundError(f"{where}.sha256 lists {escaped(name, 200)}, which is not in {escaped(folder)}: "
                                    "copy the drafter's whole folder.")
        got = integrity.sha256_file(path, what=f"{where}.sha256[{shown(name)}]")
        if got != want.lower():
            raise SpecError(f"{where}.sha256: {escaped(path)} has sha256 {got}, the config expects {want}: the "
                            "drafter's files changed since the model was saved, or were copied incompletely. Copy them "
                            "again, or save the model again to record the new digests.")


def _load_draft_model(spec: dict, target: Any, base_dir: Any, where: str) -> Any:
    """The draft model a spec names: a cached registry model, or a folder inside the model's folder. Nothing
    is downloaded (no Hub id, no fetch of a registry model)."""
    from transformers import AutoModelForCausalLM

    from .. import compat
    from ..registry import models

    path = spec.get("path")
    if not isinstance(path, str) or not path:
        raise SpecError(f"{where}.path: the {spec.get('method')} method needs the draft model's registry name or its "
                        f"folder inside the model's folder, got {shown(path)}.")
    if path in models.REGISTRY:
        try:
            source = models.resolve(path, fetch_missing=False)  # its cached folder, checked; never a download
        except models.RegistryError as error:
            raise SpecError(f"{where}.path: the draft model {path!r} is a registry model that is not cached here, and "
                            f"loading a spec downloads nothing. Fetch it first: `hf-speculative models fetch {path}` "
                            f"(or hfs.models.fetch({path!r})). ({error})") from None
    else:
        try:
            integrity.check_relative_name(path, f"{where}.path")
            local = integrity.confined(base_dir, path, f"{where}.path") if base_dir is not None else None
        except integrity.FileRefused as error:
            raise SpecError(f"{error} A spec loads a draft model only from inside the model's folder or by a cached "
                            "registry name.") from None
        if local is not None and local.is_dir():
            integrity.check_model_folder(local, f"{where}.path")  # before transformers opens any of its files
        if local is None or not (local / "config.json").is_file():
            raise SpecError(f"{where}.path: no draft model folder {path!r} (with a config.json) inside the model's "
                            f"folder {base_dir}, and it is not a registry name ({', '.join(models.REGISTRY)}). Loading "
                            "a spec downloads nothing (a Hub id is not fetched): download the draft model yourself, "
                            "save it inside the model's folder (draft.save_pretrained(folder / 'draft')) and name it "
                            "'draft', or use a registry name after `hf-speculative models fetch NAME`.")
        check_draft_config(local, f"{where}.path")
        source = str(local)
    param = next(target.parameters())
    try:
        draft = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, **compat.dtype_kwargs(param.dtype))
    except (OSError, RuntimeError, ValueError) as error:
        raise SpecError(f"{where}.path: cannot load the draft model {path!r} ({escaped(error, 1000)}).") from error
    return draft.to(param.device).eval()


MAX_DRAFT_PARAMS_PER_BYTE = model_config.MAX_PARAMS_PER_BYTE  # parameters a config may describe per byte of weights


def check_draft_config(folder: Path, what: str) -> None:
    """Bound what a draft model folder's ``config.json`` makes transformers allocate, before it is loaded
    (``registry.model_config``: its sizes sane, its parameters at most ``MAX_DRAFT_PARAMS_PER_BYTE`` per byte of the
    weights beside it)."""
    try:
        model_config.check_model_config(folder, what)
    except (model_config.ConfigRefused, integrity.FileRefused) as error:
        raise SpecError(str(error)) from None
