"""What a drafter is, declared once: one :class:`Declaration`, given by the keywords of its class statement.

    @dataclasses.dataclass
    class PromptLookup(CheckedOnAssignment, DraftStrategy, method="prompt-lookup",
                       capabilities=Capabilities(trees=True, batch=True),
                       examples=("prompt-lookup", "prompt-lookup-fixed", "prompt-lookup-tree")):

``DraftStrategy.__init_subclass__`` builds the class's ``Declaration`` from those keywords (``cls.declaration``) and
registers the class under its method names (:mod:`~hf_speculative.drafters.registry`); whatever reads drafters (the
spec reader and writer, the routing and the checks of a call, the command line, the app, the test matrix) reads the
declaration, never an optional attribute of the class or of an instance.

Names follow one rule (``tests/drafters/test_names.py`` holds every name to it): a drafter's name is its spec method
(``method``, what a saved model's ``generation_config.json`` records), and a variant of it is named
``<method>-<variant>``: ``-tree`` drafts trees (``tree=`` set), ``-fixed`` drafts a fixed length (``adaptive=False``),
``-uag`` a draft model of another tokenizer, ``-adapter`` early exit with a trained adapter, ``-auto`` a calibrated
layer skip, ``-copy`` a draft model that is a copy of the target; EAGLE's network versions are ``eagle1`` and
``eagle3``. The command line's methods (a folder's ``methods.py``), the spec's methods and the test matrix's examples
share a name where they are the same drafter: ``hybrid`` is prompt lookup, then EAGLE, in all three.

This module imports nothing heavy (no torch).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

from ..options import unknown_key
from .registry import CHAINS_ONLY, NO_FILES, Capabilities, SpecFiles


@dataclasses.dataclass(frozen=True, eq=False)
class Declaration:
    """What a drafter class is: the keywords of its class statement (all but ``method`` optional).

    Args:
        method (`str`): its name in the registry and in a saved model's spec (``"prompt-lookup"``).
        capabilities (`Capabilities`, defaults to chains of one row): what it can do (see
            :class:`~hf_speculative.drafters.registry.Capabilities`); an instance narrows it by its settings
            (``DraftStrategy.declared``: ``trees`` only while its ``tree`` is set).
        variants (`tuple[str, ...]` or `dict[str, SpecFiles]`): further spec method names of the class, each with what
            its spec keeps in files (``{"early-exit-adapter": SpecFiles(network="checkpoint", ...)}``; a name alone
            keeps none); an instance's ``spec_method()`` says which name its settings make it.
        name (`str`, *optional*): its name in the statistics (``hfs.last_stats(model).method``); the method by default.
        examples (`tuple[str, ...]`): the labels of its instances in the test suite's identity matrix, built by its
            ``example(target, label)`` classmethod (``registry.examples()``).
        live_fields (`tuple[str, ...]`): its init fields that hold objects (a network, a model, a tokenizer), never
            options: a spec records the other fields.
        files (`SpecFiles`): what the spec of ``method`` keeps in files beside a saved model (a trained network, a
            draft model, a history file); none by default.
        spec_only_options (`dict[str, Any]`): options a spec records beyond the fields, with their defaults
            (DraftModel's ``across_tokenizers``), read back by ``spec_load_beside``.
        holds_members (`bool`): its spec lists its members' specs (``"members"``, ``hfs.Hybrid``), not options.
    """

    method: str
    capabilities: Capabilities = CHAINS_ONLY
    variants: Mapping[str, SpecFiles] = dataclasses.field(default_factory=dict)
    name: str | None = None
    examples: tuple[str, ...] = ()
    live_fields: tuple[str, ...] = ()
    files: SpecFiles = NO_FILES
    spec_only_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    holds_members: bool = False

    def __post_init__(self):
        for method in (self.method, *self._variant_names()):
            if not isinstance(method, str) or not method:
                raise TypeError(f"Declaration(method={method!r}): a method name is a non-empty string.")
        if not isinstance(self.capabilities, Capabilities):
            raise TypeError(f"Declaration(capabilities=...) takes a registry.Capabilities, got "
                            f"{type(self.capabilities).__name__}.")
        variants = self.variants if isinstance(self.variants, Mapping) else dict.fromkeys(self.variants, NO_FILES)
        for files in (self.files, *variants.values()):
            if not isinstance(files, SpecFiles):
                raise TypeError(f"Declaration(files=...) and the files of variants= take a registry.SpecFiles, got "
                                f"{type(files).__name__}.")
        for field in ("examples", "live_fields"):
            names = getattr(self, field)
            if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
                raise TypeError(f"Declaration({field}=...) takes a tuple of names, got {names!r}.")
            object.__setattr__(self, field, tuple(names))
        if not isinstance(self.spec_only_options, Mapping):
            raise TypeError(f"Declaration(spec_only_options=...) takes a dict of option -> default, got "
                            f"{type(self.spec_only_options).__name__}.")
        object.__setattr__(self, "variants", types.MappingProxyType(dict(variants)))
        object.__setattr__(self, "spec_only_options", types.MappingProxyType(dict(self.spec_only_options)))
        object.__setattr__(self, "holds_members", bool(self.holds_members))
        if self.name is None:
            object.__setattr__(self, "name", self.method)

    def _variant_names(self) -> tuple:
        """The variants' names as given (a mapping's keys, or the names), before they are checked."""
        if isinstance(self.variants, Mapping):
            return tuple(self.variants)
        if isinstance(self.variants, (tuple, list)):
            return tuple(self.variants)
        raise TypeError(f"Declaration(variants=...) takes method names, or a dict of method name -> SpecFiles, got "
                        f"{type(self.variants).__name__}.")

    @property
    def methods(self) -> tuple[str, ...]:
        """Every spec method name of the class: its ``method``, then its variants."""
        return (self.method, *self.variants)

    def files_for(self, method: str) -> SpecFiles:
        """What the spec of ``method`` (one of :attr:`methods`) keeps in files."""
        return self.files if method == self.method else self.variants[method]

    @classmethod
    def from_keywords(cls, owner: str, keywords: dict[str, Any]) -> Declaration:
        """The declaration of the class ``owner`` from its class statement's ``keywords``; an unknown keyword names
        the close match."""
        known = [field.name for field in dataclasses.fields(cls)]
        unknown = unknown_key(keywords, known)
        if unknown is not None:
            key, hint = unknown
            raise TypeError(f"{owner}({key}=...): not a field of a drafter's declaration; {hint}a class statement "
                            f"declares {', '.join(known)}.")
        if "method" not in keywords:
            raise TypeError(f"{owner}({', '.join(f'{k}=...' for k in keywords)}) needs method=...: a class without "
                            "method= declares nothing (it is the same drafter as its base class).")
        try:
            return cls(**keywords)
        except TypeError as error:
            raise TypeError(f"{owner}: {error}") from None


# What a class body may no longer set: each is a keyword of the class statement (a field of its Declaration)
DECLARED_IN_THE_STATEMENT = ("method", "capabilities", "variants", "name", "examples", "live_fields", "spec_files",
                             "files", "spec_only_options", "holds_members")
