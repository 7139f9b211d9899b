"""Where a call's drafter comes from: the ``candidate_generator=`` keyword, else the ``GenerationConfig`` passed in,
else the model's own ``generation_config.candidate_generator``.

A model's default is data transformers copies and serializes in every call, so it must be one of hf_speculative's
strategies (a dataclass); a spec read from ``generation_config.json`` is built into its strategy once
(:func:`model_default`, by :mod:`hf_speculative.hf.spec`). An error about a drafter the call did not name says which
config it came from and how to turn it off (:func:`explain`), since the user may never have written it.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import warnings
from pathlib import Path
from typing import Any, NoReturn

import torch

from .. import compat
from . import spec
from ..drafters.strategy import DraftStrategy

UNSET = object()  # `candidate_generator=` not given (None is given: speculation off for the call)
_DEFAULT_LOCK = threading.Lock()  # building a model's default strategy from its spec, once
_FROM_CONFIG = "the GenerationConfig passed to generate()"
_FROM_MODEL = "model.generation_config"


def resolve_strategy(model: torch.nn.Module, keyword: Any, passed_config: Any) -> tuple[Any, str | None]:
    """``(strategy or None, where it came from)``: the call's keyword (``None``: off for this call), else the
    ``candidate_generator`` of the GenerationConfig passed in, else the model's own. ``where`` is ``None`` for
    the keyword, else the config it came from (for error messages)."""
    if keyword is not UNSET and passed_config is None:
        return keyword, None
    default = model_default(model)
    given = None if passed_config is None else getattr(passed_config, spec.FIELD, None)
    # a copy of the model's own config (a 4.x pipeline passes one) carries the default: not the user's choice
    users = given is not None and not is_default(given, default)
    if keyword is not UNSET:
        if users and given is not keyword:
            warnings.warn("candidate_generator= and the GenerationConfig passed to generate() both choose a drafter; "
                          "the keyword's is used for this call.", UserWarning, stacklevel=3)
        return keyword, None
    if users:
        if isinstance(given, dict):
            given = spec.from_spec(given, model, model_dir(model))
        return given, _FROM_CONFIG
    return default, _FROM_MODEL


def is_default(value: Any, default: Any) -> bool:
    """Whether ``value`` is the model's default strategy, or the spec it was built from."""
    if default is None:
        return False
    return value is default or (isinstance(value, dict) and value == spec.to_spec(default))


def model_default(model: torch.nn.Module) -> Any:
    """The strategy in ``model.generation_config.candidate_generator`` (``None`` when unset). A spec (a dict
    read from ``generation_config.json``) is built into its strategy once and put in its place."""
    config = getattr(model, "generation_config", None)
    value = getattr(config, spec.FIELD, None)
    if isinstance(value, spec.JSON_VALUES):
        with _DEFAULT_LOCK:
            value = getattr(config, spec.FIELD, None)
            if isinstance(value, spec.JSON_VALUES):
                value = spec.from_spec(value, model, model_dir(model))
                setattr(config, spec.FIELD, value)
    if value is None or (isinstance(value, DraftStrategy) and dataclasses.is_dataclass(value)):
        return value
    if isinstance(value, type):
        check_candidate_generator(model, value)  # "pass an instance"
    raise TypeError(
        f"model.generation_config.candidate_generator holds a {type(value).__name__}; a model's default drafter must "
        "be one of hf_speculative's strategies (hfs.PromptLookup(), hfs.Eagle.from_pretrained(...), ...: a dataclass), "
        "because transformers copies and serializes the generation config in every call. Pass other drafters per "
        "call with candidate_generator=."
    )


def model_dir(model: torch.nn.Module) -> str | None:
    """The folder the model was loaded from (``path`` of a spec is relative to it), if it is a local one."""
    name = str(getattr(model, "name_or_path", "") or "")
    return name if name and Path(name).is_dir() else None


def without_strategy(config: Any) -> Any:
    """A deep copy of a GenerationConfig without its ``candidate_generator`` (never copied: it may hold a
    raw CandidateGenerator, which transformers could neither copy cheaply nor serialize)."""
    shallow = copy.copy(config)
    vars(shallow).pop(spec.FIELD, None)
    return copy.deepcopy(shallow)


def explain(error: Exception, origin: str) -> NoReturn:
    """An error about a strategy the call did not name says where it came from and how to turn it off."""
    raise type(error)(f"{error} (The drafter comes from {origin}.candidate_generator: pass "
                      "candidate_generator=None to generate() to decode without it.)") from error


def check_candidate_generator(model: torch.nn.Module, candidate_generator: Any) -> Any:
    """The call's drafter, checked: one of our strategies (checked against ``model``) or a transformers
    ``CandidateGenerator`` instance; anything else is a ``TypeError`` naming what to pass."""
    if isinstance(candidate_generator, DraftStrategy):
        candidate_generator.validate_target(model)
        return candidate_generator
    if isinstance(candidate_generator, compat.CandidateGenerator):
        return candidate_generator
    if isinstance(candidate_generator, type) and issubclass(candidate_generator, DraftStrategy):
        raise TypeError(
            f"candidate_generator= got the class {candidate_generator.__name__}; pass an instance, "
            f"e.g. candidate_generator={candidate_generator.__name__}()."
        )
    raise TypeError(
        f"candidate_generator= must be a hf_speculative strategy (hfs.PromptLookup(), hfs.DraftModel(model), ...) "
        f"or a transformers CandidateGenerator instance, got {type(candidate_generator).__name__}."
    )
