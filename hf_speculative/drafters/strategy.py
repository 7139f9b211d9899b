"""The strategy root: a reusable, self-validating drafting strategy (configuration only).

A :class:`DraftStrategy` is safe to share between calls and threads. For each ``generate()`` call,
:meth:`DraftStrategy.open` builds the call's drafter (:class:`~hf_speculative.drafters.generator.SpeculativeCandidateGenerator`,
in generator.py), which holds the state of that one call and is dropped afterwards. How it runs inside transformers' own
assisted loop is assisted.py's.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..core.call import CallContext
from .registry import CHAINS_ONLY, NO_FILES, Capabilities, Drafter, SpecFiles, register

if TYPE_CHECKING:
    from .generator import SpeculativeCandidateGenerator


class DraftStrategy(Drafter):
    """Base of the reusable drafting strategies (``hfs.PromptLookup``, ``hfs.DraftModel``, ...).

    Subclasses are dataclasses that validate themselves in ``__post_init__`` and implement
    :meth:`open`. A strategy never holds per-call state.

    A drafter declares what it is once, in its class statement, and declaring registers it
    (:mod:`~hf_speculative.drafters.registry`)::

        class PromptLookup(CheckedOnAssignment, DraftStrategy, method="prompt-lookup",
                           capabilities=Capabilities(trees=True, batch=True)):

    ``variants=("early-exit-adapter",)`` registers further spec method names for the class (see :meth:`spec_method`).
    A subclass that declares no ``method`` is the same drafter (a variant, a wrapper by inheritance): it keeps its
    base's method and capabilities and registers nothing. A strategy that holds another one and forwards to it
    overrides :meth:`declared` to return that one's: everything reads capabilities through
    :func:`~hf_speculative.drafters.registry.capabilities_of`, never by probing attributes.
    """

    method: ClassVar[str | None] = None  # its registry name; None: not registered (e.g. a user's own strategy)
    capabilities: ClassVar[Capabilities] = CHAINS_ONLY  # what the class can do (see declared for an instance)
    name: ClassVar[str] = "strategy"  # its name in the statistics; the method by default
    examples: ClassVar[tuple[str, ...]] = ()  # labels of its instances in the test matrix (see example)
    # its spec in generation_config.json, read by hf/spec.py (see the spec_ methods below)
    live_fields: ClassVar[tuple[str, ...]] = ()  # init fields holding objects (a network, a model), never options
    spec_files: ClassVar[SpecFiles] = NO_FILES  # what its spec keeps in files beside the model
    holds_members: ClassVar[bool] = False  # its spec lists its members' specs ("members"), not options

    def __init_subclass__(cls, method: str | None = None, capabilities: Capabilities | None = None,
                          variants: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if capabilities is not None:
            if not isinstance(capabilities, Capabilities):
                raise TypeError(f"{cls.__qualname__}(capabilities=...) takes a registry.Capabilities, got "
                                f"{type(capabilities).__name__}.")
            cls.capabilities = capabilities
        if method is None:
            if variants:
                raise TypeError(f"{cls.__qualname__}(variants=...) needs method=...")
            return
        cls.method = method
        if "name" not in cls.__dict__:
            cls.name = method
        register(cls, (method, *variants))

    def __new__(cls, *args: Any, **kwargs: Any) -> "DraftStrategy":
        # a mistyped option (PromptLookup(num_token=3)) names the close match, not dataclasses' bare TypeError
        if kwargs and dataclasses.is_dataclass(cls):
            known = [f.name for f in dataclasses.fields(cls) if f.init]
            for key in kwargs:
                if key not in known:
                    close = difflib.get_close_matches(key, known, n=1)
                    hint = f"did you mean {close[0]!r}? " if close else ""
                    raise TypeError(f"{cls.__name__}() got an unknown option {key!r}: {hint}"
                                    f"its options are {', '.join(known)}.")
        return super().__new__(cls)

    def open(self, ctx: CallContext) -> "SpeculativeCandidateGenerator":  # pragma: no cover - abstract
        raise NotImplementedError

    def validate_target(self, target: torch.nn.Module) -> None:
        """Raise a clear error if this strategy cannot serve ``target`` (device, vocabulary...)."""

    # -- what it can do -----------------------------------------------------------------------------
    def declared(self) -> Capabilities:
        """What this strategy can do as configured: its class's capabilities, with ``trees`` only when it drafts
        trees (its ``tree`` setting is not ``None``; a strategy configured for chains declares none)."""
        capabilities = type(self).capabilities
        if capabilities.trees and getattr(self, "tree", None) is None:
            return dataclasses.replace(capabilities, trees=False)
        return capabilities

    def draft_budget(self) -> int | None:
        """The most draft tokens one step proposes: its tree's ``nodes`` (a ``StaticTree``'s paths), else its
        ``num_tokens``; ``None`` when it does not say."""
        tree = getattr(self, "tree", None)
        if tree is not None:
            return int(getattr(tree, "nodes", None) or len(tree.paths))
        tokens = getattr(self, "num_tokens", None)
        return None if tokens is None else int(tokens)

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> "DraftStrategy":
        """The test matrix's instance ``label`` (one of :attr:`examples`; default the first) for the tiny random model
        ``target``: it drafts there at every step (random networks shaped for ``target``, no confidence cut, fixed
        lengths). ``options`` replace its settings."""
        raise NotImplementedError(f"{cls.__qualname__} declares no example for the test matrix.")

    # -- as a model's default drafter, in its GenerationConfig (see spec.py) ------------------------
    def spec_method(self) -> str | None:
        """The method name its spec records: the class's ``method`` (or one of its ``variants``, by settings)."""
        return type(self).method

    @classmethod
    def files_for(cls, method: str) -> SpecFiles:
        """What the spec of ``method`` (one of the class's names) keeps in files: :attr:`spec_files` by default."""
        return cls.spec_files

    def spec_path(self) -> str | None:
        """The spec's ``path`` as far as it is known without writing files (``None``: none)."""
        return None

    def spec_network(self) -> Any:
        """The network its spec names (``spec_files.network``): a trained network to save, or the draft model."""
        return None

    def spec_members(self) -> list[tuple["DraftStrategy", str]] | None:
        """``(member, label)`` of a strategy whose spec lists members (:attr:`holds_members`), else ``None``."""
        return None

    @classmethod
    def load_network(cls, method: str, folder: Any, target: torch.nn.Module) -> Any:
        """What a ``"checkpoint"`` spec's ``folder`` holds, loaded for ``target`` (hf/spec.py has checked the folder:
        confined to the model's, digests matched); handed to :meth:`from_spec_options`."""
        raise NotImplementedError(f"{cls.__qualname__} loads no network.")

    @classmethod
    def from_spec_options(cls, method: str, options: dict, network: Any = None) -> "DraftStrategy":
        """The strategy a spec of ``method`` describes: its checked ``options`` and the ``network`` loaded for it (a
        checkpoint's, :meth:`load_network`, or a draft model), if its spec names one."""
        return cls(**options)

    @classmethod
    def from_spec_members(cls, members: list["DraftStrategy"]) -> "DraftStrategy":
        """A strategy whose spec lists members (:attr:`holds_members`), built from them."""
        return cls(*members)

    def to_dict(self) -> dict:
        """The JSON spec of this strategy (``{"method": ..., "options": {...}, ...}``), without writing files.

        transformers calls ``to_dict()`` on the dataclasses a ``GenerationConfig`` holds when it prints,
        hashes, compares or saves it, so a config holding a strategy stays serializable."""
        from ..hf import spec

        return spec.to_spec(self)

    def save_pretrained(self, save_directory: str | os.PathLike) -> dict:
        """Write what this strategy needs beside a model saved in ``save_directory`` and return its spec
        for ``generation_config.json``: a trained network (``Eagle``, ``EarlyExit(adapter=...)``) goes to a
        subfolder (``eagle/``, ``exit-adapter/``) unless it ships with hf_speculative; a draft model is
        named (registry name, folder or Hub id), not copied. ``model.save_pretrained(dir)`` on an enabled
        model whose ``generation_config.candidate_generator`` holds the strategy calls this itself."""
        from ..hf import spec

        return spec.save_strategy(self, save_directory)

    def __deepcopy__(self, memo: dict) -> "DraftStrategy":
        # A strategy is shared, read-only configuration (one instance serves many calls and threads).
        # transformers deep-copies the GenerationConfig holding it in every generate() call: share it,
        # rather than copy a drafter network or a draft model each time.
        return self
