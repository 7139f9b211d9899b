"""What a visitor asks for: the form's values checked and turned into a :class:`CompareRequest`.

The methods and their knobs come from the method registry (:mod:`hf_speculative.methods`): every
registered method other than the baseline can be picked, and each option a method declares in
``MethodSpec.options`` becomes one input of the form (an :class:`OptionSlot`). Drafters registered
later appear without any change here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..methods import available_methods, get_method

MAX_PANES = 4  # the baseline plus up to three methods, side by side
MAX_PROMPT_CHARS = 20_000  # cheap first check, before tokenizing

# How to draw known option keys; a key a future method adds falls back on its default's type.
_INTEGER_KEYS = {"num_tokens", "max_ngram", "exit_layer"}
_MODEL_KEYS = {"draft_model"}
_OPTION_HELP = {
    "num_tokens": "tokens drafted per step (blank: the method's default)",
    "max_ngram": "longest n-gram matched (blank: default)",
    "exit_layer": "layer the early-exit drafter stops at",
    "draft_model": "registry name or local folder of a smaller model with the same tokenizer",
    "eagle": "folder of a trained EAGLE drafter (blank: the one shipped for this model)",
    "adapter": "folder of a trained exit adapter (blank: the one shipped for this model)",
}


class AppError(ValueError):
    """A problem with the visitor's request; its message is shown in the page as is."""


@dataclasses.dataclass(frozen=True)
class OptionSlot:
    """One method option as a form input.

    Attributes:
        method (`str`): registry name of the method.
        key (`str`): option name in ``MethodSpec.options``.
        default (`Any`): the registry's default (``None``: the strategy's own).
        widget (`str`): ``"integer"``, ``"number"``, ``"bool"``, ``"model"`` or ``"text"``.
        help (`str`): one line shown under the input.
    """

    method: str
    key: str
    default: Any
    widget: str
    help: str = ""


def selectable_methods() -> list[str]:
    """Registry names a visitor can compare with the baseline (every method but the baseline)."""
    return [name for name in available_methods() if get_method(name).kind != "baseline"]


def baseline_method() -> str:
    """The baseline every comparison runs first (plain greedy)."""
    names = [name for name in available_methods() if get_method(name).kind == "baseline"]
    if not names:
        raise RuntimeError("no baseline method is registered (expected 'greedy')")
    return names[0]


def option_slots() -> list[OptionSlot]:
    """One :class:`OptionSlot` per (method, option) of the selectable methods, in registry order."""
    slots = []
    for name in selectable_methods():
        for key, default in get_method(name).options.items():
            slots.append(OptionSlot(name, key, default, _widget(key, default), _OPTION_HELP.get(key, "")))
    return slots


def _widget(key: str, default: Any) -> str:
    if key in _MODEL_KEYS:
        return "model"
    if key in _INTEGER_KEYS:
        return "integer"
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "integer"
    if isinstance(default, float):
        return "number"
    return "text"


@dataclasses.dataclass
class CompareRequest:
    """A checked request: the prompt, the target, the methods in run order (baseline first) and knobs.

    Attributes:
        options (`dict[str, dict]`): per method, the options the visitor set (unset ones omitted).
        sampling (`dict`, *optional*): ``{"temperature", "seed"}`` when sampling, ``None`` for greedy.
        concurrent (`bool`): run the methods at the same time (only offered on a GPU).
    """

    prompt: str
    model: str
    methods: list[str]
    max_new_tokens: int
    options: dict[str, dict]
    sampling: dict | None = None
    concurrent: bool = False


def parse_request(
    prompt: str | None,
    model: str | None,
    methods: list[str] | None,
    max_new_tokens: Any,
    sampling: bool,
    temperature: Any,
    seed: Any,
    concurrent: bool,
    option_values: list[Any],
    *,
    slots: list[OptionSlot],
    default_model: str,
    max_new_tokens_limit: int,
) -> CompareRequest:
    """Check the form's values; raises :class:`AppError` with a message for the visitor."""
    prompt = prompt or ""
    if not prompt.strip():
        raise AppError("The prompt is empty: type a prompt or pick one of the examples.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise AppError(f"The prompt is too long ({len(prompt):,} characters; this demo accepts {MAX_PROMPT_CHARS:,}).")
    model = (model or "").strip() or default_model
    picked = _methods(methods)
    try:
        max_new = int(max_new_tokens)
    except (TypeError, ValueError):
        raise AppError(f"Max new tokens must be a whole number, got {max_new_tokens!r}.") from None
    if not 1 <= max_new <= max_new_tokens_limit:
        raise AppError(f"Max new tokens must be between 1 and {max_new_tokens_limit}, got {max_new}.")
    if len(option_values) != len(slots):
        raise AppError(f"Expected {len(slots)} method option values, got {len(option_values)}.")
    options: dict[str, dict] = {}
    for slot, value in zip(slots, option_values):
        if slot.method in picked and (parsed := _option_value(slot, value)) is not None:
            options.setdefault(slot.method, {})[slot.key] = parsed
    return CompareRequest(
        prompt=prompt,
        model=model,
        methods=[baseline_method(), *picked],
        max_new_tokens=max_new,
        options=options,
        sampling=_sampling(temperature, seed) if sampling else None,
        concurrent=bool(concurrent),
    )


def _methods(methods: list[str] | str | None) -> list[str]:
    names = [methods] if isinstance(methods, str) else list(methods or [])
    known = selectable_methods()
    unknown = [n for n in names if n not in known and n != baseline_method()]
    if unknown:
        raise AppError(f"Unknown method(s): {', '.join(unknown)}. Known: {', '.join(known)}.")
    picked = list(dict.fromkeys(n for n in names if n != baseline_method()))
    if not picked:
        raise AppError("Pick at least one method to compare with greedy.")
    if len(picked) > MAX_PANES - 1:
        raise AppError(f"Pick at most {MAX_PANES - 1} methods: the page shows greedy and three methods side by side.")
    return picked


def _sampling(temperature: Any, seed: Any) -> dict:
    try:
        temperature, seed = float(temperature), int(seed)
    except (TypeError, ValueError):
        raise AppError("Sampling needs a numeric temperature and an integer seed.") from None
    if not temperature > 0:
        raise AppError(f"The temperature must be positive, got {temperature}.")
    return {"temperature": temperature, "seed": seed}


def _option_value(slot: OptionSlot, value: Any) -> Any:
    """The form's value of ``slot`` as the method expects it (``None``: not set)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    label = f"{get_method(slot.method).label}: {slot.key}"
    if slot.widget == "integer":
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise AppError(f"{label} must be a whole number, got {value!r}.") from None
        if number != int(number) or number < 0:
            raise AppError(f"{label} must be a whole number >= 0, got {value!r}.")
        return int(number)
    if slot.widget == "number":
        try:
            return float(value)
        except (TypeError, ValueError):
            raise AppError(f"{label} must be a number, got {value!r}.") from None
    if slot.widget == "bool":
        return bool(value)
    return str(value).strip()
