"""The bounds of a ``candidate_generator`` spec, checked before anything reads or builds from it.

A spec (``generation_config.json``'s ``candidate_generator``: see ``hf_speculative.hf.spec``) comes from a model
folder anyone may have written: it is untrusted input (docs/hosting.md). Its size, depth, strings and integers are
bounded here, in the integrity layer, so that what reads a folder before transformers does (``hfs.load_model``), the
spec reader (``hf/spec.py``) and the drafters that keep files beside a saved model refuse a hostile one the same
way, with :class:`SpecError` naming the field.
"""

from __future__ import annotations

from typing import Any

from ..options import shown

FIELD = "candidate_generator"
WHERE = f"generation_config.{FIELD}"
# Bounds of a spec, checked before anything is built from it (a spec is untrusted input: docs/hosting.md)
MAX_SPEC_DEPTH = 8  # objects and lists nested in a spec (a hybrid's member's static tree's path is 7 deep)
MAX_SPEC_VALUES = 100_000  # values in a whole spec (a static tree of 256 paths 64 deep is 16_641)
MAX_SPEC_STRING = 4096  # characters of a string (a path, a digest, a method name) or an object key
MAX_SPEC_INT_BITS = 64  # an integer in a spec (larger ones are never a valid setting)
MAX_GENERATION_CONFIG_BYTES = 1 << 20  # a generation_config.json that hfs.load_model reads before transformers


class SpecError(ValueError):
    """A ``candidate_generator`` spec that cannot be read or written; the message names the field."""


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
