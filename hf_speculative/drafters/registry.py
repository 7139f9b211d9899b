"""The drafter registry: each drafter class declares once what it is, and declaring registers it.

    class PromptLookup(CheckedOnAssignment, DraftStrategy, method="prompt-lookup",
                       capabilities=Capabilities(trees=True, batch=True), examples=(...)):
        ...

The class statement's keywords are one :class:`~hf_speculative.drafters.declaration.Declaration`
(``cls.declaration``); ``DraftStrategy.__init_subclass__`` records the class under its method names
(:func:`registered`). What reads drafters reads this module and the declarations, never a list of its own and never
an attribute probe: the spec reader and writer (``hf/spec.py``, ``spec_writer.py``), the methods of the command line,
benchmark and app (``tooling/methods.py``), the routing and the batch and static-cache checks
(:func:`capabilities_of`), ``hf_speculative``'s lazy public names (:func:`public_names`) and the test matrix
(:func:`examples`). Adding a drafter means adding a folder under ``drafters/``: its ``__init__.py`` names its public
classes (``PUBLIC``), its ``methods.py`` its methods of the command line and the app (``METHODS``), its classes
declare themselves. A folder outside the package joins them when its parent directory is added to
``hf_speculative.drafters.__path__`` (then :func:`rescan`).

This module imports nothing heavy (no torch): ``import hf_speculative`` and ``hf-speculative --help`` read the
folders' declarations through it.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib
import pkgutil
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

READS = ("outputs", "features", "cache")  # what a drafter reads of the target, from the least demanding

_CLASSES: dict[str, type] = {}  # method name -> class, filled as the classes are defined
_LOCK = threading.Lock()  # guards _CLASSES: classes register from whichever thread imports them
_discovered = False
_scans = 0  # how many times the folders were read again (rescan): what read them before reads them again


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a drafter can do, declared once on its class (``capabilities=``) and read through
    :func:`capabilities_of`.

    Args:
        trees (`bool`, defaults to `False`): drafts trees (``tree=``), verified in hf_speculative's own loop.
            On an instance (:meth:`DraftStrategy.declared`): it drafts trees in this configuration.
        batch (`bool`, defaults to `False`): drafts per row for a batch (B > 1).
        reads_target (`str`, defaults to ``"outputs"``): what it reads of the target: ``"outputs"`` (its tokens
            and logits: any cache, compiled or not), ``"features"`` (hidden states, through forward hooks, or from a
            compiled forward's outputs), ``"cache"`` (drafts with the target's own layers over its dynamic KV
            cache).
        static_cache (`bool`, *optional*): drafts for a target verifying on a static KV cache; by default every
            drafter but those reading ``"cache"`` (a static cache cannot lend its layers a dynamic cache).
        compile (`bool`, *optional*): drafts for a compiled target (``hfs.enable(model, compile=...)``), which
            verifies on a static cache; by default what ``static_cache`` says.
    """

    trees: bool = False
    batch: bool = False
    reads_target: str = "outputs"
    static_cache: bool = None  # type: ignore[assignment]  # None: derived from reads_target
    compile: bool = None  # type: ignore[assignment]  # None: what static_cache says

    def __post_init__(self):
        if self.reads_target not in READS:
            raise ValueError(f"Capabilities(reads_target={self.reads_target!r}): use one of {', '.join(READS)}.")
        static = self.reads_target != "cache" if self.static_cache is None else bool(self.static_cache)
        if static and self.reads_target == "cache":
            raise ValueError("Capabilities(reads_target='cache', static_cache=True): a drafter on the target's dynamic "
                             "cache cannot draft for a static one.")
        compiled = static if self.compile is None else bool(self.compile)
        if compiled and not static:
            raise ValueError("Capabilities(compile=True, static_cache=False): a compiled target verifies on a static "
                             "cache.")
        object.__setattr__(self, "static_cache", static)
        object.__setattr__(self, "compile", compiled)


CHAINS_ONLY = Capabilities()
"""What a user's raw transformers ``CandidateGenerator`` (or an undeclared strategy) can do: chains of one row."""


def all_of(capabilities: Iterable[Capabilities]) -> Capabilities:
    """What drafters working together can do (``hfs.Hybrid``): each ability only if every one has it; the most
    demanding ``reads_target``."""
    capabilities = list(capabilities)
    reads = max((c.reads_target for c in capabilities), key=READS.index, default="outputs")
    return Capabilities(trees=all(c.trees for c in capabilities), batch=all(c.batch for c in capabilities),
                        reads_target=reads, static_cache=all(c.static_cache for c in capabilities),
                        compile=all(c.compile for c in capabilities))


@dataclasses.dataclass(frozen=True)
class SpecFiles:
    """What a spec method keeps in files beside a saved model (``generation_config.json``'s ``candidate_generator``).
    ``hf/spec.py`` does every read and write: paths confined to the model's folder, sizes capped, sha256 recorded
    and checked.

    Args:
        network (`str`, *optional*): ``"checkpoint"``: a trained network in hf_speculative's format, written to
            ``subfolder`` beside the model, or named when it is a shipped one; ``"model"``: a transformers causal LM
            (a draft model), named by its registry name or its folder inside the model's; ``None``: no network.
        subfolder (`str`, *optional*): where ``save_pretrained`` writes the network beside the model (``"eagle"``): a
            ``"checkpoint"`` unless it is a shipped one, a ``"model"`` when it was loaded from elsewhere.
        checkpoints (*callable*, *optional*): returns the network's checkpoint module, imported on use
            (``save_pretrained(net, folder)``, ``load_checkpoint(folder)``, ``shipped_names(folder)``,
            ``CheckpointError``).
        shipped_dir (`Path`, *optional*): the folder of the networks that ship with the package.
        file_option (`str`, *optional*): an option naming a JSON file the strategy reads and writes (a history, a
            calibration); in a spec, a relative name inside the model's folder.
        saved_name (`str`, *optional*): that file's name beside a saved model.
        max_bytes (`int`, *optional*): the most bytes read from that file (default: ``integrity.MAX_JSON_BYTES``).
        fingerprint (*callable*, *optional*): ``target -> str``, the model identity the file is kept under in the
            package's cache.
    """

    network: str | None = None
    subfolder: str | None = None
    checkpoints: Callable[[], Any] | None = None
    shipped_dir: Path | None = None
    file_option: str | None = None
    saved_name: str | None = None
    max_bytes: int | None = None
    fingerprint: Callable[[Any], str] | None = None

    def __post_init__(self):
        if self.network not in (None, "checkpoint", "model"):
            raise ValueError(f"SpecFiles(network={self.network!r}): use 'checkpoint', 'model' or None.")
        if self.network == "checkpoint" and None in (self.subfolder, self.checkpoints, self.shipped_dir):
            raise ValueError("SpecFiles(network='checkpoint') needs subfolder, checkpoints and shipped_dir.")
        if self.network == "model" and self.subfolder is None:
            raise ValueError("SpecFiles(network='model') needs subfolder.")
        if self.file_option is not None and None in (self.saved_name, self.fingerprint):
            raise ValueError("SpecFiles(file_option=...) needs saved_name and fingerprint.")


NO_FILES = SpecFiles()


# -- registration ------------------------------------------------------------------------------------
def register(cls: type, methods: Iterable[str]) -> None:
    """Record ``cls`` under each of ``methods`` (``DraftStrategy.__init_subclass__`` calls this). A class defined
    again under the same qualified name (a module reloaded) replaces the old one; another class may not take a
    method name that is taken."""
    with _LOCK:
        for method in methods:
            if not isinstance(method, str) or not method:
                raise TypeError(f"{cls.__qualname__}(method={method!r}): a method name is a non-empty string.")
            held = _CLASSES.get(method)
            if held is not None and _qualified(held) != _qualified(cls):
                raise TypeError(f"{cls.__qualname__} declares method={method!r}, which {_qualified(held)} declares "
                                "already; pick another name.")
            _CLASSES[method] = cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def folders() -> list[str]:
    """The drafter folders (the subpackages of ``hf_speculative.drafters``), by module name, sorted."""
    return sorted(_folder_paths())


def _folder_paths() -> dict[str, Path]:
    """Each drafter folder's module name -> its directory: the subpackages on every entry of
    ``hf_speculative.drafters.__path__`` (the package's own folder first; a directory added there at run time
    brings its folders too)."""
    package = importlib.import_module(__package__)
    return {f"{__package__}.{info.name}": Path(str(getattr(info.module_finder, "path", ""))) / info.name
            for info in pkgutil.iter_modules(package.__path__) if info.ispkg}


def rescan() -> None:
    """Read the drafter folders again, after a directory was added to ``hf_speculative.drafters.__path__`` (a drafter
    of your own kept outside the package, a test's): its folders' public names, methods and classes are then found
    as the package's own are (the tools' method list follows: :func:`scans`)."""
    global _discovered, _scans
    public_names.cache_clear()
    folder_rank.cache_clear()
    with _LOCK:
        _discovered = False
        _scans += 1


def scans() -> int:
    """How many times :func:`rescan` read the folders again: whoever keeps what it read of them reads again when
    this changes."""
    return _scans


def _discover() -> None:
    """Import every drafter folder's public classes once, so that each has registered itself. No lock is held while
    importing (a class registering itself in another thread's import takes :data:`_LOCK`); the import system makes
    each module's import happen once."""
    global _discovered
    if not _discovered:
        for module in sorted(set(public_names().values())):
            importlib.import_module(module)
        _discovered = True


def registered() -> dict[str, type]:
    """Every registered drafter: method name -> class (a class with several spec methods, EarlyExit's
    ``"early-exit"`` and ``"early-exit-adapter"``, under each), the package's folders imported on first use. In the
    order the command line and the app list them (their folders' ``METHODS``: see :func:`folder_rank`), then by
    name."""
    _discover()
    with _LOCK:
        classes = dict(_CLASSES)
    ranks = folder_rank()
    return dict(sorted(classes.items(), key=lambda item: (ranks.get(_folder_of(item[1]), float("inf")), item[0])))


def _folder_of(cls: type) -> str:
    """The drafter folder (module name) a class is defined in, or its module for a class defined elsewhere."""
    prefix = f"{__package__}."
    module = cls.__module__
    return prefix + module[len(prefix):].split(".")[0] if module.startswith(prefix) else module


@functools.cache
def folder_rank() -> dict[str, float]:
    """Each drafter folder's place in lists: the smallest ``order`` of the tooling methods its ``methods.py``
    declares (``METHODS``, read without importing it; see ``hf_speculative.tooling.methods``)."""
    return {folder: min(float(entry.get("order", float("inf"))) for entry in entries)
            for folder, entries in folder_data("methods", "METHODS") if entries}


def strategy_class(method: str) -> type:
    """The class registered for ``method``.

    Raises:
        ValueError: an unknown method; the message names the close match, if any, and the known methods.
    """
    classes = registered()
    if isinstance(method, str) and method in classes:
        return classes[method]
    close = difflib.get_close_matches(str(method), list(classes), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown drafter method {method!r}.{hint} Known: {', '.join(classes)}.")


class Drafter:
    """The root of the drafter classes (``DraftStrategy`` derives from it, here so that this module needs no torch):
    a class's ``declaration`` (``None``: it declares none) and what reads it, its :attr:`name` and
    :attr:`capabilities`, and an instance's :meth:`declared`."""

    declaration: Any = None  # a drafters.declaration.Declaration, given by the class statement
    name: str = "strategy"
    capabilities: Capabilities = CHAINS_ONLY

    def declared(self) -> Capabilities:
        """What this instance can do as configured (by default, its class's capabilities)."""
        return type(self).capabilities


def capabilities_of(strategy: Any) -> Capabilities:
    """What ``strategy`` can do in this configuration: a ``DraftStrategy``'s :meth:`~Drafter.declared` (its class's
    capabilities, narrowed by its settings; ``hfs.Hybrid``'s from its members; a wrapper's, what it wraps); for
    anything else (a user's raw transformers ``CandidateGenerator``, ``None``), chains of one row
    (:data:`CHAINS_ONLY`)."""
    return strategy.declared() if isinstance(strategy, Drafter) else CHAINS_ONLY


def name_of(strategy: Any) -> str:
    """``strategy``'s name in statistics and messages: a drafter's declared ``name`` (``"prompt-lookup"``); anything
    else (a user's raw transformers ``CandidateGenerator``), its class's name."""
    return strategy.name if isinstance(strategy, Drafter) else type(strategy).__name__


# -- the folders' cheap declarations -------------------------------------------------------------------
@functools.cache
def public_names() -> dict[str, str]:
    """``hf_speculative``'s public drafter names -> the module defining each, from every folder's ``PUBLIC``
    (``{"PromptLookup": "drafter"}``: a module of that folder). The folders' ``__init__`` modules import nothing
    heavy, so this loads no torch."""
    names: dict[str, str] = {}
    for folder in folders():
        for name, module in getattr(importlib.import_module(folder), "PUBLIC", {}).items():
            if name in names:
                raise TypeError(f"{folder} and {names[name]} both declare the public name {name!r}.")
            names[name] = f"{folder}.{module}"
    return names


def lazy_attribute(package: str, public: dict[str, str], name: str) -> Any:
    """A drafter folder's module ``__getattr__`` (PEP 562): its public class ``name``, imported on first use from the
    module ``public`` names (``from hf_speculative.drafters.eagle import Eagle`` loads ``eagle.drafter`` then)."""
    if name not in public:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{package}.{public[name]}"), name)


def folder_data(module: str, variable: str) -> list[tuple[str, Any]]:
    """``(folder, value)`` for each drafter folder whose ``module`` assigns the literal ``variable`` at its top, read
    from the source without importing it: the command line lists the methods at import, before any drafter (and
    torch) loads. A folder whose source is not at hand (a zipped install) is imported instead."""
    found = []
    for folder, directory in sorted(_folder_paths().items()):
        path = directory / f"{module}.py"
        if path.is_file():
            value = _literal(path, variable)
        else:
            try:
                value = getattr(importlib.import_module(f"{folder}.{module}"), variable, None)
            except ModuleNotFoundError:
                value = None
        if value is not None:
            found.append((folder, value))
    return found


def _literal(path: Path, variable: str) -> Any:
    """The value of the top-level ``variable = <literal>`` in ``path``'s source, else ``None``."""
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == variable for t in node.targets):
            return ast.literal_eval(node.value)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == variable:
            return None if node.value is None else ast.literal_eval(node.value)
    return None


# -- the test matrix -----------------------------------------------------------------------------------
def examples() -> dict[str, type]:
    """The identity matrix's drafters: label -> class, from every registered class's ``examples`` (``"eagle3"``,
    ``"prompt-lookup-tree"``, ...), in the order of the classes' methods."""
    labels: dict[str, type] = {}
    for cls in dict.fromkeys(registered().values()):
        for label in cls.examples:
            if label in labels and labels[label] is not cls:
                raise TypeError(f"{cls.__qualname__} and {labels[label].__qualname__} both declare the example "
                                f"{label!r}.")
            labels[label] = cls
    return labels


class ExampleNotApplicable(Exception):
    """Raised by a class's ``example`` when its drafter cannot be built for that tiny target (a Gemma-4 assistant
    for a Llama target; a class transformers of this version lacks). The matrix skips the pair, saying why; a
    drafter that applies to every target never raises it."""


def example(label: str, target: Any, **options: Any) -> Any:
    """The matrix's drafter ``label`` (see :func:`examples`) built for the tiny model ``target``; ``options``
    replace the example's settings (``example("eagle3", target, num_tokens=3)``)."""
    classes = examples()
    if label not in classes:
        close = difflib.get_close_matches(str(label), list(classes), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"no drafter example {label!r}.{hint} Known: {', '.join(classes)}.")
    return classes[label].example(target, label, **options)


def example_label(cls: type, label: str | None) -> str:
    """``label`` checked against ``cls.examples`` (``None``: the first), for a class's ``example``."""
    if label is None and cls.examples:
        return cls.examples[0]
    if label not in cls.examples:
        raise ValueError(f"{cls.__qualname__} has no example {label!r}; its examples: {', '.join(cls.examples)}.")
    return label
