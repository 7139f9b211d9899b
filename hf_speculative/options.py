"""Checking a strategy's options where they are born: types, ranges and the documented limits.

Every public strategy (``hfs.PromptLookup``, ``hfs.DraftModel``, ``hfs.Eagle``, ``hfs.EarlyExit``,
``hfs.LayerSkip``, ``hfs.Hybrid``) and tree shape (``hfs.DynamicTree``, ``hfs.StaticTree``) checks its
fields in ``__post_init__`` with the helpers below, before anything is built from them: the verify-cost
model and the n-gram indexes grow with these numbers, and they are shared per model, so one oversize
request would otherwise cost memory for the life of the process. The limits are named here so that the
docs, the app and the command line can show and reuse them.

Every message has one form, ``Owner(field=value): must be ...``, naming the class, the field and what is
allowed. Errors for a value of the wrong type are :class:`OptionTypeError` (both a ``TypeError`` and a
``ValueError``), out-of-range ones :class:`OptionError` (a ``ValueError``): ``except ValueError`` catches
both, as the spec loader and the app do.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import math
import numbers
import operator
import os
import reprlib
import stat
from collections.abc import Iterable, Mapping
from typing import Any

MAX_DRAFT_TOKENS = 64  # ``num_tokens``: the longest chain a drafter proposes per step
MAX_TREE_NODES = 256  # ``DynamicTree.nodes``, a ``StaticTree``'s paths: tokens one forward verifies
MAX_TREE_DEPTH = 64  # ``DynamicTree.depth``, a rank path's length: drafter forwards per step
MAX_TOP_K = 64  # ``DynamicTree.top_k``; a rank is below it (a ``StaticTree`` rank is at most 63)
MAX_NGRAM = 16  # ``PromptLookup.max_ngram``: each generated token indexes one n-gram per size
MAX_LAYERS = 1024  # ``EarlyExit.exit_layer``, ``LayerSkip.skip`` before the model is known (then: its depth)
MAX_CALIBRATION_TOKENS = 1024  # ``LayerSkip.calibration_tokens``: generated tokens calibration waits for
MAX_DRAFT_COST = 100.0  # ``draft_cost``: one drafter step, in target forwards
MAX_HYBRID_MEMBERS = 8  # ``Hybrid``'s strategies: each is asked in turn at every step
# the longest draft the verify-cost model is asked about: a chain or a tree, whichever is larger
MAX_VERIFY_TOKENS = max(MAX_DRAFT_TOKENS, MAX_TREE_NODES)
# elements looked at before an over-long list is refused (never consume an unbounded iterable)
_SCAN_LIMIT = 4 * MAX_TREE_NODES

_shower = reprlib.Repr()
_shower.maxstring, _shower.maxother, _shower.maxlist, _shower.maxtuple, _shower.maxlevel = 40, 40, 6, 6, 3


class OptionError(ValueError):
    """An option out of its range (or otherwise refused); the message names the class and the field."""


class OptionTypeError(OptionError, TypeError):
    """An option of the wrong type (a float or a string for an integer, ...): a ``TypeError`` that
    ``except ValueError`` catches too."""


class CheckedOnAssignment:
    """Base of the strategies (dataclasses): a field assigned after construction is checked as a constructor
    argument would be (``__post_init__`` runs again over every field), and a refused value leaves the strategy
    as it was, so a strategy is never in a state its constructor would refuse (``pl.max_ngram = 10**5`` raises
    the constructor's error). A strategy read from a spec forgets that spec once changed (it serializes anew)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        post = cls.__dict__.get("__post_init__")
        if post is None or getattr(post, "_checks_fields", False):
            return

        @functools.wraps(post)
        def checked_post_init(self, *args: Any, **kw: Any) -> Any:
            state = self.__dict__
            depth = state.get("_hfs_checking", 0)
            state["_hfs_checking"] = depth + 1
            try:
                return post(self, *args, **kw)
            finally:
                state["_hfs_checking"] = depth
                if depth == 0:
                    state["_hfs_ready"] = True

        checked_post_init._checks_fields = True
        cls.__post_init__ = checked_post_init

    def __setattr__(self, name: str, value: Any) -> None:
        state = self.__dict__
        fields = getattr(type(self), "__dataclass_fields__", {})
        if not state.get("_hfs_ready") or state.get("_hfs_checking") or name not in fields:
            object.__setattr__(self, name, value)
            return
        before = dict(state)
        object.__setattr__(self, name, value)
        try:
            self.__post_init__()
        except BaseException:
            state.clear()
            state.update(before)
            raise
        state.pop("_hf_speculative_spec", None)


def unknown_key(given: Iterable[str], known: list[str]) -> tuple[str, str] | None:
    """The first of ``given`` not in ``known`` and a hint for its message (``"did you mean 'x'? "``, or ``""`` when
    nothing is close), or ``None`` when every key is known."""
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            return key, f"did you mean {close[0]!r}? " if close else ""
    return None


def shown(value: Any) -> str:
    """A short ``repr`` of ``value`` for a message: bounded, whatever was passed (a huge list, string or
    integer would otherwise make the error message itself the big allocation)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<{value.bit_length()}-bit integer>"  # repr() of a huge int is slow, or refused beyond 4300 digits
    try:
        return _shower.repr(value)
    except Exception:  # a user object whose repr fails: its type says enough
        return f"<{type(value).__name__}>"


def escaped(text: Any, limit: int = 500) -> str:
    """``text`` (a path, or a name read from a file) for a message, without :func:`shown`'s quotes: every character a
    terminal could obey or hide (control characters, ESC, CR, NUL, bidi overrides: whatever ``str.isprintable``
    refuses) written as ``repr`` writes it (``\\x1b``, ``\\r``, ``\\x00``), at most ``limit`` characters kept."""
    if isinstance(text, os.PathLike):
        text = os.fsdecode(os.fspath(text))
    elif isinstance(text, BaseException):  # its message
        text = str(text)
    elif not isinstance(text, str):  # a value read from a file: bounded before it is made a string
        text = shown(text)
    if len(text) > limit:
        text = text[:limit] + "..."
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _is_bool(value: Any) -> bool:
    """``True``/``False``, numpy's included: bools have ``__index__`` but are never counts."""
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")


def as_int(value: Any) -> int | None:
    """``value`` as an ``int`` if it is an integer (Python's or numpy's, not a bool), else ``None``."""
    if _is_bool(value) or isinstance(value, (float, str, bytes)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_int(owner: str, name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an ``int`` in ``[low, high]``, or an error naming ``owner(name=value)`` and the range."""
    number = as_int(value)
    if number is None or not low <= number <= high:
        error = OptionTypeError if number is None else OptionError
        raise error(f"{owner}({name}={shown(value)}): must be an integer from {low} to {high}.")
    return number


def check_number(owner: str, name: str, value: Any, low: float, high: float, *, below_high: bool = False) -> float:
    """``value`` as a finite ``float`` in ``[low, high]`` (``[low, high)`` with ``below_high``)."""
    real = isinstance(value, numbers.Real) and not _is_bool(value)
    try:
        number = float(value) if real else math.nan
    except OverflowError:  # an integer beyond any float: out of range
        number = math.nan
    inside = low <= number < high if below_high else low <= number <= high  # False for NaN
    if not inside:
        error = OptionError if real else OptionTypeError
        raise error(f"{owner}({name}={shown(value)}): must be a number in [{low:g}, {high:g}{')' if below_high else ']'}.")
    return number


def check_bool(owner: str, name: str, value: Any) -> bool:
    """``value`` as a ``bool``: ``True`` or ``False`` only (not 0/1, not ``"false"``, which is truthy)."""
    if not _is_bool(value):
        raise OptionTypeError(f"{owner}({name}={shown(value)}): must be True or False.")
    return bool(value)


def check_optional_path(owner: str, name: str, value: Any) -> str | os.PathLike | None:
    """``value`` if it is a file path (``str`` or ``os.PathLike``) or ``None``; a path that exists must be a
    regular file (not a device such as ``/dev/zero``, a FIFO or a folder: they are never read)."""
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise OptionTypeError(f"{owner}({name}={shown(value)}): must be a file path (str or os.PathLike) or None.")
    if value is not None:
        try:
            mode = os.stat(value).st_mode
        except (OSError, ValueError):  # not there yet (it is written later), or a name the OS refuses
            return value
        if not stat.S_ISREG(mode):
            raise OptionError(f"{owner}({name}={shown(value)}): must be a regular file (or a path that does not exist "
                              "yet), not a device, FIFO, socket or folder.")
    return value


def check_int_list(owner: str, name: str, value: Any, low: int, high: int, max_len: int) -> list[int]:
    """``value`` as a sorted list of 1 to ``max_len`` distinct integers in ``[low, high]``. At most
    ``max_len + 1`` elements are read, so a huge or endless iterable is refused without being consumed."""
    items = bounded_items(value, max_len + 1)
    numbers_ = [as_int(item) for item in items] if items is not None else None
    if (numbers_ is None or not 1 <= len(numbers_) <= max_len or any(n is None or not low <= n <= high for n in numbers_)
            or len(set(numbers_)) != len(numbers_)):
        wrong_type = numbers_ is None or any(n is None for n in numbers_)
        raise (OptionTypeError if wrong_type else OptionError)(
            f"{owner}({name}={shown(value)}): must be a list of distinct integers from {low} to {high} (at least one, "
            f"at most {max_len}).")
    return sorted(numbers_)


def bounded_items(value: Any, limit: int) -> list | None:
    """Up to ``limit`` items of an iterable (``None`` for a non-iterable, a string or a mapping, whose
    items are not a list's)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        return None
    try:
        return list(itertools.islice(iter(value), limit))
    except TypeError:  # e.g. a 0-d numpy array
        return None


def check_verify_tokens(owner: str, value: Any) -> int:
    """The draft length the verify-cost model is asked to cover: ``0..MAX_VERIFY_TOKENS`` (it keeps
    lists of that length per model, for the life of the model)."""
    return check_int(owner, "max_tokens", value, 0, MAX_VERIFY_TOKENS)


def check_chain_options(strategy: Any) -> None:
    """The options every chain drafter shares (``num_tokens``, ``confidence_threshold``, ``adaptive``,
    ``draft_cost``), checked and normalised in place (a numpy integer becomes an ``int``)."""
    owner = type(strategy).__name__
    strategy.num_tokens = check_int(owner, "num_tokens", strategy.num_tokens, 1, MAX_DRAFT_TOKENS)
    strategy.confidence_threshold = check_number(owner, "confidence_threshold", strategy.confidence_threshold, 0.0, 1.0,
                                                 below_high=True)
    strategy.adaptive = check_bool(owner, "adaptive", strategy.adaptive)
    if strategy.draft_cost is not None:
        strategy.draft_cost = check_number(owner, "draft_cost", strategy.draft_cost, 0.0, MAX_DRAFT_COST)
