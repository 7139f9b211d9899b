"""A spec in ``generation_config.json`` -> its strategy: the model's default drafter, saved with the model.

    {"candidate_generator": {"method": "eagle",                    # a name of the drafter registry
                             "options": {"num_tokens": 8, ...},    # the strategy's settings
                             "path": "eagle",                      # relative to the model's folder,
                                                                   #   or the name of a shipped drafter
                             "sha256": {"model.safetensors": "…", "config.json": "…"}}}

- :func:`from_spec` builds the strategy back for a target; every problem names its field
  (``generation_config.candidate_generator.method`` ...).
- :func:`keep_field_on_load` writes the spec ``save_strategy`` returned into the ``generation_config.json``
  transformers saved (``model.save_pretrained(dir)`` on an enabled model), and keeps it through transformers' load.
- The writer, :func:`to_spec` and :func:`save_strategy`, is the drafters' own
  (``hf_speculative.drafters.spec_writer``: a strategy writes its spec without importing this module); the bounds
  of a spec, :func:`check_bounds` and :class:`SpecError`, are ``hf_speculative.registry.spec_bounds``'. Both are
  named here too.

The methods are the drafter registry's (:func:`hf_speculative.drafters.registry.registered`), and each drafter class
declares what its spec holds (:class:`~hf_speculative.drafters.declaration.Declaration`): the fields that hold
objects (``live_fields``), what it keeps in files (``files_for(method)``: a trained network saved to a subfolder or
named when shipped, a draft model named by its registry name or its folder inside the model's, a history or
calibration file), options recorded beyond its fields (``spec_only_options``), or that it lists members' specs
(``holds_members``: ``"members"``); how it is built back is its class's (``load_network``, ``from_spec_options``,
``spec_load_beside``). This module does the reading, the same for every drafter: the bounds of a spec, paths
confined to the model's folder, file sizes capped, sha256 checked, every error naming its field.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..registry import integrity, model_config
from ..registry.spec_bounds import (FIELD, MAX_GENERATION_CONFIG_BYTES, MAX_SPEC_DEPTH, MAX_SPEC_INT_BITS,
                                    MAX_SPEC_STRING, MAX_SPEC_VALUES, WHERE, SpecError, check_bounds)
from ..core import tree_shapes
from ..drafters import registry
from ..drafters.registry import SpecFiles
from ..drafters.spec_writer import TREE_SHAPES, file_cap, file_sha256, files_of, method_of, options_of, save_strategy, \
    to_spec
from ..options import MAX_HYBRID_MEMBERS, escaped, shown

__all__ = ["FIELD", "WHERE", "JSON_VALUES", "MAX_GENERATION_CONFIG_BYTES", "MAX_SPEC_DEPTH", "MAX_SPEC_INT_BITS",
           "MAX_SPEC_NETWORKS", "MAX_SPEC_STRING", "MAX_SPEC_VALUES", "TREE_SHAPES", "SpecError", "check_bounds",
           "check_draft_config", "file_sha256", "from_spec", "keep_field_on_load", "method_of", "options_of",
           "save_strategy", "to_spec"]

_KEYS = {"method", "options", "path", "sha256", "members"}
JSON_VALUES = (dict, list, str, int, float)  # what a generation_config.json can hold: a spec, or a bad one
MAX_SPEC_NETWORKS = 2  # members that load a network from files (a trained network or a draft model: SpecFiles)


def _methods() -> dict[str, type]:
    """Every spec method: the drafter registry's names -> classes (the drafters are imported on first use)."""
    return registry.registered()


def _declared(method: str) -> Any:
    """The declaration of the class registered for ``method``."""
    return _methods()[method].declaration


def keep_field_on_load(directory: str | os.PathLike, saved: dict | None = None) -> None:
    """After transformers wrote ``directory/generation_config.json``: with ``saved``, the spec
    :func:`save_strategy` returned for the model's default strategy (the paths and digests of the files it wrote)
    replaces the one transformers serialized (``to_spec``, which knows no files). And transformers drops the unknown
    keys of a ``generation_config.json`` marked ``_from_model_config`` (a config derived from ``config.json``) when it
    loads it: clear the mark where the file holds a spec or a sampling rule (``speculative_sampling``)."""
    path = Path(directory) / "generation_config.json"
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    changed = saved is not None and data.get(FIELD) != saved
    if changed:
        data[FIELD] = saved
    if (FIELD in data or "speculative_sampling" in data) and data.get("_from_model_config"):
        data["_from_model_config"], changed = False, True
    if changed:
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# -- spec -> strategy ------------------------------------------------------------------------------
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
    if _declared(name).holds_members:
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
    if not _declared(name).holds_members:
        _options(spec, name, where)
        return name
    members = spec.get("members")
    if not isinstance(members, list) or len(members) < 2:
        raise SpecError(f"{where}.members: the {name} method needs a list of two or more specs, got {shown(members)}.")
    if len(members) > MAX_HYBRID_MEMBERS:  # before any member is built (each may load a network)
        raise SpecError(f"{where}.members: at most {MAX_HYBRID_MEMBERS} specs, got {len(members)}.")
    methods = [_parse_member(member, name, f"{where}.members[{i}]") for i, member in enumerate(members)]
    networks = [m for m in methods if files_of(m).network is not None]
    if len(networks) > MAX_SPEC_NETWORKS:
        raise SpecError(f"{where}.members: {len(networks)} members load a network ({', '.join(networks)}); a spec loads "
                        f"at most {MAX_SPEC_NETWORKS}. Keep the cheap drafters and one or two trained ones.")
    return name


def _parse_member(member: Any, outer: str, where: str) -> str:
    """A member's method, checked before anything is built; a member that lists members itself is refused (a spec
    nests one level: the bounds of :func:`check_bounds` count on it)."""
    inner = member.get("method") if isinstance(member, dict) else None
    if isinstance(inner, str) and inner in _methods() and _declared(inner).holds_members:
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
    cls, declaration = _methods()[method], _declared(method)
    fields = {f.name: f.default for f in dataclasses.fields(cls) if f.init and f.name not in declaration.live_fields}
    fields.update(declaration.spec_only_options)  # options a spec records beyond the fields, with defaults
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
    file_key = files_of(method).file_option
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
    files = files_of(method)
    key = files.file_option
    name = None if key is None else options.get(key)
    if name is None:
        return options
    what = f"{where}.options.{key}"
    cap = file_cap(files)
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


def _with_options(make: Any, options: dict, where: str) -> Any:
    try:
        return make(options)
    except (ValueError, TypeError) as error:
        raise SpecError(f"{where}.options are invalid: {error}") from error


def _build(method: str, spec: dict, options: dict, target: Any, base_dir: Any, where: str) -> Any:
    """The strategy of a checked spec: the network its files hold (checked: confined, digests matched), then the
    class's own constructor with the options."""
    cls, files = _methods()[method], files_of(method)
    network = None
    if files.network == "model":
        network = _load_draft_model(spec, target, base_dir, where)
        options = cls.spec_load_beside(options, spec["path"], base_dir, where)  # (DraftModel's tokenizers)
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
