"""The strategy root: a reusable, self-validating drafting strategy (configuration only).

A :class:`DraftStrategy` is safe to share between calls and threads. For each ``generate()`` call,
:meth:`DraftStrategy.open` builds the call's drafter (:class:`~hf_speculative.drafters.generator.SpeculativeCandidateGenerator`,
in generator.py), which holds the state of that one call and is dropped afterwards. How it runs inside transformers' own
assisted loop is assisted.py's; what a drafter declares, declaration.py's; how a strategy writes its spec,
spec_writer.py's.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..core.call import CallContext
from ..options import unknown_key
from ..core.tree_shapes import DynamicTree
from . import spec_writer
from .declaration import DECLARED_IN_THE_STATEMENT, Declaration
from .registry import CHAINS_ONLY, Capabilities, Drafter, register

if TYPE_CHECKING:
    from .generator import SpeculativeCandidateGenerator


class DraftStrategy(Drafter):
    """Base of the reusable drafting strategies (``hfs.PromptLookup``, ``hfs.DraftModel``, ...).

    Subclasses are dataclasses that validate themselves in ``__post_init__`` and implement
    :meth:`open`. A strategy never holds per-call state.

    A drafter declares what it is once, by the keywords of its class statement, the fields of one
    :class:`~hf_speculative.drafters.declaration.Declaration` (``cls.declaration``), and declaring registers it
    (:mod:`~hf_speculative.drafters.registry`)::

        class PromptLookup(CheckedOnAssignment, DraftStrategy, method="prompt-lookup",
                           capabilities=Capabilities(trees=True, batch=True), examples=("prompt-lookup", ...)):

    A subclass that declares nothing is the same drafter (a variant, a wrapper by inheritance): it keeps its base's
    declaration and registers nothing. A strategy that holds another one and forwards to it overrides :meth:`declared`
    to return that one's: everything reads capabilities through
    :func:`~hf_speculative.drafters.registry.capabilities_of` and the rest of the declaration through
    ``type(strategy).declaration``, never by probing attributes. The class attributes ``method``, ``name``,
    ``capabilities`` and ``examples`` read the declaration (for a class that declares none: not registered, chains of
    one row).
    """

    declaration: ClassVar[Declaration | None] = None  # what the class statement declared; None: a user's own strategy
    method: ClassVar[str | None] = None  # declaration.method: its registry name
    name: ClassVar[str] = "strategy"  # declaration.name: its name in the statistics (one that declares nothing may set it)
    capabilities: ClassVar[Capabilities] = CHAINS_ONLY  # declaration.capabilities (see declared for an instance)
    examples: ClassVar[tuple[str, ...]] = ()  # declaration.examples: its labels in the test matrix (see example)

    def __init_subclass__(cls, **declared: Any) -> None:
        super().__init_subclass__()
        # (a strategy that declares nothing may name its statistics with a class attribute ``name``)
        in_body = [name for name in DECLARED_IN_THE_STATEMENT if name in cls.__dict__ and (declared or name != "name")]
        if in_body:
            raise TypeError(f"{cls.__qualname__} sets {', '.join(in_body)} in its body; declare it in the class "
                            f"statement instead: class {cls.__name__}(DraftStrategy, method=..., {in_body[0]}=...).")
        if not declared:
            return  # the same drafter as its base class: its declaration, registered nothing
        declaration = Declaration.from_keywords(cls.__qualname__, declared)
        cls.declaration, cls.method, cls.name = declaration, declaration.method, declaration.name
        cls.capabilities, cls.examples = declaration.capabilities, declaration.examples
        register(cls, declaration.methods)

    def __new__(cls, *args: Any, **kwargs: Any) -> "DraftStrategy":
        # a mistyped option (PromptLookup(num_token=3)) names the close match, not dataclasses' bare TypeError
        if kwargs and dataclasses.is_dataclass(cls):
            known = [f.name for f in dataclasses.fields(cls) if f.init]
            unknown = unknown_key(kwargs, known)
            if unknown is not None:
                key, hint = unknown
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
        trees (a class that declares trees has a ``tree`` setting; configured with ``None``, it drafts chains)."""
        capabilities = type(self).capabilities
        if capabilities.trees and self.tree is None:
            return _as_chains(capabilities)
        return capabilities

    def draft_budget(self) -> int | None:
        """The most draft tokens one step proposes: its tree's ``nodes`` (a ``StaticTree``'s paths) when it drafts
        trees, else its ``num_tokens`` option (a dataclass field: the longest chain of every chain drafter);
        ``None`` when it has neither."""
        if self.declared().trees:
            return tree_budget(self.tree)
        options = {field.name for field in dataclasses.fields(self)} if dataclasses.is_dataclass(self) else ()
        return int(self.num_tokens) if "num_tokens" in options and self.num_tokens is not None else None

    def private(self) -> "DraftStrategy":
        """This strategy without state it shares across calls that one caller could read another's answers from (a
        public server's visitors: ``app/session.py``); most strategies share none and return themselves
        (SuffixDecoding turns off its history of the model's earlier outputs)."""
        return self

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> "DraftStrategy":
        """The test matrix's instance ``label`` (one of :attr:`examples`; default the first) for the tiny random model
        ``target``: it drafts there at every step (random networks shaped for ``target``, no confidence cut, fixed
        lengths). ``options`` replace its settings."""
        raise NotImplementedError(f"{cls.__qualname__} declares no example for the test matrix.")

    # -- as a model's default drafter, in its GenerationConfig (written by spec_writer.py, read by hf/spec.py) ------
    def spec_method(self) -> str | None:
        """The method name its spec records: the declared ``method`` (or one of its ``variants``, by settings)."""
        return type(self).method

    def spec_path(self) -> str | None:
        """The spec's ``path`` as far as it is known without writing files (``None``: none)."""
        return None

    def spec_network(self) -> Any:
        """The network its spec names (``declaration.files.network``): a trained network to save, or the draft
        model."""
        return None

    def spec_members(self) -> list[tuple["DraftStrategy", str]] | None:
        """``(member, label)`` of a strategy whose spec lists members (``declaration.holds_members``), else ``None``."""
        return None

    def spec_save_beside(self, directory: str | os.PathLike, path: str) -> dict:
        """After its spec named its draft model by ``path`` (``files.network == "model"``): write what it keeps with
        the draft model beside the model saved in ``directory``; the options that records (none by default)."""
        return {}

    @classmethod
    def spec_load_beside(cls, options: dict, path: str, base_dir: Any, where: str) -> dict:
        """A spec's ``options`` with what :meth:`spec_save_beside` kept beside the draft model read back (``options``
        as they are by default)."""
        return options

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
        """A strategy whose spec lists members (``declaration.holds_members``), built from them."""
        return cls(*members)

    def to_dict(self) -> dict:
        """The JSON spec of this strategy (``{"method": ..., "options": {...}, ...}``), without writing files.

        transformers calls ``to_dict()`` on the dataclasses a ``GenerationConfig`` holds when it prints,
        hashes, compares or saves it, so a config holding a strategy stays serializable."""
        return spec_writer.to_spec(self)

    def save_pretrained(self, save_directory: str | os.PathLike) -> dict:
        """Write what this strategy needs beside a model saved in ``save_directory`` and return its spec
        for ``generation_config.json``: a trained network (``Eagle``, ``EarlyExit(adapter=...)``) goes to a
        subfolder (``eagle/``, ``exit-adapter/``) unless it ships with hf_speculative; a draft model is
        named (registry name, folder or Hub id), not copied. ``model.save_pretrained(dir)`` on an enabled
        model whose ``generation_config.candidate_generator`` holds the strategy calls this itself."""
        return spec_writer.save_strategy(self, save_directory)

    def __deepcopy__(self, memo: dict) -> "DraftStrategy":
        # A strategy is shared, read-only configuration (one instance serves many calls and threads).
        # transformers deep-copies the GenerationConfig holding it in every generate() call: share it,
        # rather than copy a drafter network or a draft model each time.
        return self


def tree_budget(tree: Any) -> int:
    """The draft nodes of one step of ``tree``: a ``DynamicTree``'s ``nodes``, a ``StaticTree``'s paths."""
    return int(tree.nodes) if isinstance(tree, DynamicTree) else len(tree.paths)


@functools.lru_cache(maxsize=None)
def _as_chains(capabilities: Capabilities) -> Capabilities:
    """``capabilities`` without ``trees``: what a tree drafter configured for chains declares (made once per class)."""
    return dataclasses.replace(capabilities, trees=False)
