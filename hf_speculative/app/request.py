"""What a visitor asks for: the form's values checked and turned into a :class:`CompareRequest`.

The methods and their knobs come from the method registry (:mod:`hf_speculative.tooling.methods`): every
registered method other than the baseline can be picked, and each option a method declares in
``MethodSpec.options`` becomes one input of the form (an :class:`OptionSlot`). Drafters registered
later appear without any change here.

Every value is checked here, on the server: the page's sliders and dropdowns bound what a browser
sends, but the ``/compare`` API takes whatever a client posts. Numbers must be finite and within
the ranges below, flags booleans, and models, draft models, EAGLE drafters and exit adapters names
from the lists the app offers (:class:`Sources`): a remote caller never names a file on the server.
Anything else is an :class:`AppError` naming the field and what it accepts.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from ..tooling.methods import available_methods, canonical_name, get_method
from ..options import MAX_DRAFT_TOKENS, MAX_LAYERS, MAX_NGRAM

MAX_PANES = 4  # the baseline plus up to three methods, side by side
MAX_PROMPT_CHARS = 20_000  # cheap first check, before tokenizing
MAX_NAMES = 16  # method names looked at in one request (the form offers about ten)
MAX_NAME_CHARS = 200  # a model or drafter name (registry names are short; folders with the flag)
TEMPERATURE_RANGE = (0.05, 2.0)  # the temperature slider's range
MAX_SEED = 2**63 - 1  # torch.manual_seed takes a 64-bit integer
# Bounds of the method options: the strategies' own (hf_speculative.options), checked here before anything
# is built; exit_layer and skip indices again once the model is loaded, against its layer count.
MAX_SKIP_CHARS = 400
INTEGER_RANGES = {"num_tokens": (1, MAX_DRAFT_TOKENS), "max_ngram": (1, MAX_NGRAM), "exit_layer": (1, MAX_LAYERS),
                  "tree_nodes": (1, 64)}
DEFAULT_INTEGER_RANGE = (0, 1024)  # an integer option a future method adds
NUMBER_RANGE = (-1e6, 1e6)  # a float option a future method adds

# How to draw known option keys; a key a future method adds falls back on its default's type.
_INTEGER_KEYS = {"num_tokens", "max_ngram", "exit_layer", "tree_nodes"}
_MODEL_KEYS = {"draft_model"}
_DRAFTER_KEYS = {"eagle", "adapter"}  # trained drafters: shipped names (folders with --allow-local-paths)
_LAYER_KEYS = {"skip"}  # 'auto' or comma-separated layer indices
# Options a remote caller never sets: they name files on the server (LayerSkip's calibration is kept in
# the package's cache under the model's fingerprint instead, see ModelCache.calibration_file), or choose how the
# server's CPU kernel stores a drafter (kernel_weights: the operator's memory, not the visitor's choice).
SERVER_ONLY_OPTIONS = {"calibration_file", "kernel_weights"}
_OPTION_HELP = {
    "num_tokens": f"tokens drafted per step, 1 to {MAX_DRAFT_TOKENS} (blank: the method's default)",
    "max_ngram": f"longest n-gram matched, 1 to {MAX_NGRAM} (blank: default)",
    "exit_layer": "layer the early-exit drafter stops at (below the model's layer count)",
    "draft_model": "a smaller model with the same tokenizer, from the list",
    "eagle": "a trained EAGLE drafter, from the list (blank: the one shipped for this model)",
    "adapter": "a trained exit adapter, from the list (blank: the one shipped for this model)",
    "skip": "'auto' (calibrated once per model) or comma-separated layer indices",
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


@dataclasses.dataclass(frozen=True)
class Sources:
    """What a caller may name: target and draft models, EAGLE drafters, exit adapters.

    Attributes:
        models (`tuple[str, ...]`): the offered models: the operator's default model (a registry name
            or the folder the operator started the app with), then the registry's.
        eagle (`tuple[str, ...]`): shipped EAGLE drafters (``pretrained_names()``).
        adapters (`tuple[str, ...]`): shipped exit adapters (``shipped_adapters()``).
        allow_local_paths (`bool`): also accept any folder or Hub id (the operator's
            ``--allow-local-paths``; refused on a Space and beyond localhost, see ``ui.build_app``).
        allow_downloads (`bool`): registry models not on the server's disk may be picked, and are then
            downloaded (the operator's ``--allow-downloads``; refused on a Space). Without it a request
            for one is refused at once (:mod:`.offer`).

    Names are compared as strings and nothing else: whether some file exists never changes an answer.
    """

    models: tuple[str, ...]
    eagle: tuple[str, ...] = ()
    adapters: tuple[str, ...] = ()
    allow_local_paths: bool = False
    allow_downloads: bool = False

    @classmethod
    def offered(cls, default_model: str, *, allow_local_paths: bool = False,
                allow_downloads: bool = False) -> "Sources":
        from ..drafters.eagle.drafter import pretrained_names
        from ..drafters.self_speculative.exit_adapter import shipped_adapters
        from ..registry.models import REGISTRY

        return cls(tuple(dict.fromkeys([default_model, *REGISTRY])), tuple(pretrained_names()),
                   tuple(shipped_adapters()), allow_local_paths, allow_downloads)

    def for_key(self, key: str) -> tuple[str, ...]:
        """The names offered for option ``key`` (``draft_model``, ``eagle``, ``adapter``)."""
        return {"eagle": self.eagle, "adapter": self.adapters}.get(key, self.models)


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_exposure(allow_local_paths: bool, host: str | None = None, share: bool = False) -> None:
    """Refuse ``allow_local_paths`` where remote visitors could use it: on a Hugging Face Space
    (``SPACE_ID`` set), when the server listens beyond localhost (``host``, else ``GRADIO_SERVER_NAME``,
    else gradio's default 127.0.0.1), or behind a public share link. Raises `ValueError`."""
    import os

    if not allow_local_paths:
        return
    if os.environ.get("SPACE_ID"):
        raise ValueError("--allow-local-paths is refused on a Hugging Face Space (SPACE_ID is set): its visitors "
                         "must not name files on the server or Hub models. Offer models by registry name instead.")
    host = host or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    if not (host in LOCAL_HOSTS or host.startswith("127.")):
        raise ValueError(f"--allow-local-paths is refused when the app listens beyond localhost (host {host!r}): "
                         "listen on 127.0.0.1, or leave the flag out.")
    if share:
        raise ValueError("--allow-local-paths is refused with a public share link (share=True): leave one of them out.")


def selectable_methods() -> list[str]:
    """Registry names a visitor can compare with the baseline (every method but the baseline)."""
    return [name for name in available_methods() if get_method(name).kind != "baseline" and get_method(name).app]


def baseline_method() -> str:
    """The baseline every comparison runs first (plain greedy)."""
    names = [name for name in available_methods() if get_method(name).kind == "baseline"]
    if not names:
        raise RuntimeError("no baseline method is registered (expected 'greedy')")
    return names[0]


def option_slots() -> list[OptionSlot]:
    """One :class:`OptionSlot` per (method, option) of the selectable methods, in registry order (the
    :data:`SERVER_ONLY_OPTIONS`, the server's own, left out)."""
    slots = []
    for name in selectable_methods():
        for key, default in get_method(name).options.items():
            if key not in SERVER_ONLY_OPTIONS:
                slots.append(OptionSlot(name, key, default, _widget(key, default), _OPTION_HELP.get(key, "")))
    return slots


def api_parameter(method: str, key: str) -> str:
    """The ``/compare`` API's parameter for option ``key`` of ``method``: ``prompt-lookup``, ``num_tokens`` ->
    ``prompt_lookup__num_tokens``."""
    return identifier(f"{method}__{key}")


def identifier(name: str) -> str:
    """``name`` as a Python parameter name (registered method names may hold any character)."""
    out = re.sub(r"\W", "_", name.replace("+", "_plus_"))
    return out if out.isidentifier() else f"_{out}"


def _widget(key: str, default: Any) -> str:
    if key in _MODEL_KEYS:
        return "model"
    if key in _DRAFTER_KEYS:
        return "drafter"
    if key in _LAYER_KEYS:
        return "layers"
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
    prompt: Any,
    model: Any,
    methods: Any,
    max_new_tokens: Any,
    sampling: Any,
    temperature: Any,
    seed: Any,
    concurrent: Any,
    option_values: list[Any],
    *,
    slots: list[OptionSlot],
    default_model: str,
    max_new_tokens_limit: int,
    sources: Sources | None = None,
) -> CompareRequest:
    """Check the form's values; raises :class:`AppError` with a message for the visitor.

    ``sources`` says which models and drafters may be named (default: the offered lists only, no
    paths). Every option value is checked, also those of methods not picked; only the picked
    methods' options are kept.
    """
    sources = sources or Sources.offered(default_model)
    prompt = "" if prompt is None else prompt
    if not isinstance(prompt, str):
        raise AppError(f"The prompt must be text, got {_kind(prompt)}.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise AppError(f"The prompt is too long ({len(prompt):,} characters; this demo accepts {MAX_PROMPT_CHARS:,}).")
    if not prompt.strip():
        raise AppError("The prompt is empty: type a prompt or pick one of the examples.")
    model = _name(model, "Model", sources.models, sources) or default_model
    _on_disk(model, "Model", sources)
    picked = _methods(methods)
    max_new = _whole(max_new_tokens, "Max new tokens", 1, max_new_tokens_limit)
    sample = _flag(sampling, "Sample")
    run_together = _flag(concurrent, "Run methods at the same time")
    # checked when sent, also when not sampling: the page always sends both
    if sample or temperature is not None:
        temperature = _real(temperature, "Temperature", *TEMPERATURE_RANGE)
    if sample or seed is not None:
        seed = _whole(seed, "Seed", 0, MAX_SEED, shown_max="2**63 - 1")
    if not isinstance(option_values, (list, tuple)) or len(option_values) != len(slots):
        count = len(option_values) if isinstance(option_values, (list, tuple)) else _kind(option_values)
        raise AppError(f"Expected {len(slots)} method option values, got {count}.")
    options: dict[str, dict] = {}
    for slot, value in zip(slots, option_values):
        parsed = _option_value(slot, value, sources)
        if slot.method in picked and parsed is not None:
            options.setdefault(slot.method, {})[slot.key] = parsed
    return CompareRequest(
        prompt=prompt,
        model=model,
        methods=[baseline_method(), *picked],
        max_new_tokens=max_new,
        options=options,
        sampling={"temperature": temperature, "seed": seed} if sample else None,
        concurrent=run_together,
    )


def _methods(methods: Any) -> list[str]:
    names = [methods] if isinstance(methods, str) else methods
    names = [] if names is None else names
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise AppError(f"Methods must be a list of method names, got {_short(methods)}.")
    known = selectable_methods()
    if len(names) > MAX_NAMES:
        raise AppError(f"Too many method names ({len(names)}); pick at most {MAX_PANES - 1} of: {', '.join(known)}.")
    names = [canonical_name(n) for n in names]  # an earlier name of a method (eagle+lookup) is the method (hybrid)
    unknown = [n for n in names if n not in known and n != baseline_method()]
    if unknown:
        shown = ", ".join(_short(n, 40) for n in unknown[:5]) + (" …" if len(unknown) > 5 else "")
        raise AppError(f"Unknown method(s): {shown}. Known: {', '.join(known)}.")
    picked = list(dict.fromkeys(n for n in names if n != baseline_method()))
    if not picked:
        raise AppError("Pick at least one method to compare with greedy.")
    if len(picked) > MAX_PANES - 1:
        raise AppError(f"Pick at most {MAX_PANES - 1} methods: the page shows greedy and three methods side by side.")
    return picked


def _option_value(slot: OptionSlot, value: Any, sources: Sources) -> Any:
    """The form's value of ``slot`` as the method expects it (``None``: not set)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    label = f"{get_method(slot.method).label}: {slot.key}"
    if slot.widget == "integer":
        return _whole(value, label, *INTEGER_RANGES.get(slot.key, DEFAULT_INTEGER_RANGE))
    if slot.widget == "number":
        return _real(value, label, *NUMBER_RANGE)
    if slot.widget == "bool":
        return _flag(value, label)
    if slot.widget in ("model", "drafter"):
        name = _name(value, label, sources.for_key(slot.key), sources)
        if slot.widget == "model" and name is not None:
            _on_disk(name, label, sources)
        return name
    if slot.widget == "layers":
        return _layers(value, label)
    # an option of a kind this module does not know (a future method's): text, passed on only where
    # the operator allows paths, since it could name one
    if not isinstance(value, str) or len(value) > MAX_NAME_CHARS:
        raise AppError(f"{label} must be text of at most {MAX_NAME_CHARS} characters, got {_short(value)}.")
    if value.strip() != str(slot.default) and not sources.allow_local_paths:
        raise AppError(f"{label} can only be set when the app is started with --allow-local-paths.")
    return value.strip()


# -- checks of single values -------------------------------------------------------------------------
def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a hostile value is not echoed back in full)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _kind(value: Any) -> str:
    name = type(value).__name__
    return "nothing" if value is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _number(value: Any) -> int | float | None:
    """``value`` as an int or float (numeric strings too); ``None`` when it is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str) and len(value) <= 40:
        text = value.strip()
        for parse in (int, float):
            try:
                return parse(text)
            except ValueError:
                pass
    return None


def _whole(value: Any, field: str, low: int, high: int, *, shown_max: str | None = None) -> int:
    number = _number(value)
    ok = number is not None and (isinstance(number, int) or (math.isfinite(number) and number == int(number)))
    if not ok or not low <= number <= high:
        raise AppError(f"{field} must be a whole number from {low} to {shown_max or high}, got {_short(value)}.")
    return int(number)


def _real(value: Any, field: str, low: float, high: float) -> float:
    number = _number(value)
    if number is None or not math.isfinite(number) or not low <= number <= high:
        raise AppError(f"{field} must be a number from {low} to {high}, got {_short(value)}.")
    return float(number)


def _flag(value: Any, field: str) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    raise AppError(f"{field} must be true or false, got {_short(value)}.")


def _name(value: Any, field: str, offered: tuple[str, ...], sources: Sources) -> str | None:
    """A model or drafter name: one of ``offered``, or (with ``allow_local_paths``) any short string.
    Only string comparisons: the answer never depends on what exists on the server's disk."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise AppError(f"{field} must be a name from the list, got {_kind(value)}.")
    name = value.strip()
    if not name or name in offered:
        return name or None
    if sources.allow_local_paths and len(name) <= MAX_NAME_CHARS and "\x00" not in name:
        return name
    raise AppError(f"{field} {_short(name)} is not offered here; pick one of: {', '.join(offered) or 'none'}.")


def _on_disk(name: str, field: str, sources: Sources) -> None:
    """Refuse a registry model that is not on the server's disk (unless the operator allows downloads):
    answered at once, nothing downloaded."""
    from .offer import model_problem, served_models

    problem = model_problem(name, sources)
    if problem:
        served = served_models(sources)[0]
        raise AppError(f"{field} {_short(name)} is {problem}; pick one of: {', '.join(served) or 'none'}.")


def _layers(value: Any, field: str) -> str:
    """LayerSkip's ``skip``: ``'auto'`` or distinct layer indices, canonical ``"1,4,6"``."""
    if isinstance(value, str) and value.strip() == "auto":
        return "auto"
    indices = None
    if isinstance(value, str) and len(value) <= MAX_SKIP_CHARS:
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if parts and all(p.isdigit() and len(p) <= 4 for p in parts):
            indices = [int(p) for p in parts]
    if not indices or len(set(indices)) != len(indices) or max(indices) >= MAX_LAYERS:
        raise AppError(f"{field} must be 'auto' or distinct layer indices from 0 to {MAX_LAYERS - 1} separated by "
                       f"commas, got {_short(value)}.")
    return ",".join(str(i) for i in sorted(indices))
