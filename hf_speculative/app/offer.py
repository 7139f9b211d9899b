"""What this server can offer a visitor: the models on its disk, and the methods a model can run.

The app serves only models already on the server's disk (:func:`hf_speculative.registry.models.is_cached`): a
visitor who picks a registry model that is not there is told so at once, and nothing is downloaded,
unless the operator started the app with ``--allow-downloads`` (refused on a Space). A method whose
prerequisites a model lacks (a draft model sharing its tokenizer, a trained drafter shipped for it,
enough layers) is shown disabled with the reason, and refused before anything runs.

Everything here reads names, small JSON files of models already on disk (``config.json``,
``tokenizer.json``) and the lists of shipped drafters: no model is loaded, nothing is fetched.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from ..tooling import methods
from ..tooling.methods import get_method
from .request import Sources, selectable_methods

NOT_ON_DISK = "not on this server's disk (this app serves only models already downloaded)"
"""Why a registry model is not offered (the page's list of disabled models, and the message of a request)."""


def check_downloads(allow_downloads: bool) -> None:
    """Refuse ``allow_downloads`` on a Hugging Face Space (``SPACE_ID`` set): there any visitor could make the
    server download and convert a model. Raises `ValueError`."""
    if allow_downloads and os.environ.get("SPACE_ID"):
        raise ValueError("--allow-downloads is refused on a Hugging Face Space (SPACE_ID is set): its visitors must "
                         "not make the server download models. Fetch the models before the app starts instead "
                         "(`hf-speculative models fetch NAME`).")


def _registry() -> dict:
    from ..registry.models import REGISTRY

    return REGISTRY


def model_problem(name: str, sources: Sources) -> str | None:
    """Why model ``name`` cannot be served now (``None``: it can). A registry model must be on disk unless the
    operator allows downloads; folders and Hub ids are checked when they load (``--allow-local-paths``)."""
    if name in _registry() and not sources.allow_downloads:
        from ..registry.models import is_cached

        if not is_cached(name):
            return NOT_ON_DISK
    return None


def served_models(sources: Sources) -> tuple[list[str], dict[str, str]]:
    """``(models that can be picked, {model: why not} for the others)``, in the order offered."""
    problems = {name: problem for name in sources.models if (problem := model_problem(name, sources))}
    return [name for name in sources.models if name not in problems], problems


def model_folder(name: str) -> Path | None:
    """The folder on disk holding ``name`` (a cached registry model, or a local folder), else ``None``."""
    if name in _registry():
        from ..registry.models import is_cached, model_path

        return model_path(name) if is_cached(name) else None
    path = Path(name).expanduser()
    return path if path.is_dir() else None


def model_layers(name: str) -> int | None:
    """The number of decoder layers of ``name`` from its ``config.json`` on disk (``None``: unknown)."""
    folder = model_folder(name)
    if folder is None:
        return None
    config = _read_json(str(folder / "config.json"))
    if not isinstance(config, dict):
        return None
    layers = (config.get("text_config") or {}).get("num_hidden_layers", config.get("num_hidden_layers"))
    return layers if isinstance(layers, int) and layers > 0 else None


def _read_json(path: str) -> Any:
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return None
    return _read_json_at(path, stamp)


@functools.lru_cache(maxsize=32)
def _read_json_at(path: str, stamp: int) -> Any:
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


def _vocabulary(name: str) -> dict[str, int] | None:
    """Token -> id of ``name``'s ``tokenizer.json`` (its model's vocabulary and added tokens), else ``None``."""
    folder = model_folder(name)
    data = None if folder is None else _read_json(str(folder / "tokenizer.json"))
    if not isinstance(data, dict) or not isinstance((data.get("model") or {}).get("vocab"), dict):
        return None
    vocab = dict(data["model"]["vocab"])
    vocab.update({t["content"]: t["id"] for t in data.get("added_tokens") or [] if isinstance(t, dict) and "id" in t})
    return vocab


def shares_tokenizer(target: str, draft: str) -> bool:
    """Whether ``draft``'s tokenizer maps every token to the id ``target``'s does (what a draft model needs;
    ``DraftModel`` checks it again on the loaded models). ``False`` when either is unknown."""
    a, b = _vocabulary(target), _vocabulary(draft)
    return a is not None and b is not None and all(a.get(token) == i for token, i in b.items())


def draft_models(target: str, sources: Sources) -> list[str]:
    """The offered models that can draft for ``target``: on disk, not ``target`` itself, same tokenizer."""
    return [name for name in sources.models
            if name != target and model_problem(name, sources) is None and shares_tokenizer(target, name)]


def trained_sources(method: str) -> list[str]:
    """The options of ``method`` that name a trained drafter (its ``eagle`` / ``adapter`` / ``medusa``, offered in the
    form or not): each is the one shipped for the model unless the option names another."""
    return [source.option for source in methods.trained_sources(method)]


def method_problem(method: str, target: str, sources: Sources, layers: int | None = None,
                   options: dict | None = None) -> str | None:
    """Why ``method`` cannot run on model ``target`` on this server, in words for the page (``None``: it can):
    :func:`hf_speculative.tooling.methods.problem_on` by the model's name, with what this server offers (its draft
    models, whether a visitor may name a drafter).

    Args:
        layers (`int`, *optional*): the model's layer count if known (else read from its ``config.json``).
        options (`dict`, *optional*): the options a request set for the method (a draft model or drafter named
            there is used instead of the one the server would pick). ``None`` for the page before a request:
            with ``--allow-local-paths`` a visitor may still type one.
    """
    spec = get_method(method)
    typed = options is None and sources.allow_local_paths  # the page: a folder may still be typed in
    return methods.problem_on(
        spec, target, options=options or {}, layers=model_layers(target) if layers is None else layers,
        draft_models=draft_models(target, sources) if spec.needs_draft_model and not typed else None, may_name=typed,
        hint="; name one in the method's options" if sources.allow_local_paths else "")


def method_problems(target: str, sources: Sources) -> dict[str, str]:
    """``{method: why not}`` for the selectable methods that cannot run on ``target`` here."""
    layers = model_layers(target)
    problems = {}
    for name in selectable_methods():
        problem = method_problem(name, target, sources, layers)
        if problem:
            problems[name] = problem
    return problems
