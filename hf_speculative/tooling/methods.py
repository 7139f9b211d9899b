"""The registry of decoding methods that the CLI, the benchmark and the demo app can run.

A :class:`MethodSpec` says how to turn one ``model.generate()`` call into a given decoding method:
which extra keyword arguments to pass (built fresh for every call) and which options it reads.
Every method is registered here with :func:`register_method`; callers look them up by name with
:func:`get_method` and list them with :func:`available_methods`, so no other module keeps its own
list of methods. hf_speculative's own methods come from the drafter folders: each folder's ``methods.py``
declares its entries as plain data (``METHODS``, read without importing it, so that ``hf-speculative --help`` lists
the methods before any drafter loads) and the builds: an entry's ``build`` names its function,
``build(model, tokenizer, call)``, called on use with a :class:`MethodCall` (the folders import nothing of tooling),
returns the extra ``generate()`` kwargs of one call; an entry's ``source`` declares the trained drafter an option
names. Greedy and transformers' own methods (``hf-*``) are declared here.

:func:`run_method` runs one method on one prompt and gathers what can be measured about it, the same
way for every kind of method:

- ``"baseline"`` (plain greedy) and ``"transformers"`` (transformers' own speculative methods):
  there are no ``hf_speculative`` statistics, so the target's forwards are counted with a forward
  pre-hook on the target during the call, and tau is ``new_tokens / target_forwards``. Drafted and
  accepted token counts (hence the acceptance rate) are unknown and left as ``None``. For
  ``hf-assisted`` the assistant is another module, so its forwards never reach the hook. For
  ``hf-early-exit`` the assistant *is* the target: transformers lowers
  ``config.num_hidden_layers`` of the base model while drafting, so a forward that runs while the
  layer count is lowered is a drafting forward and is not counted.
- ``"hfs"`` (``hf_speculative`` strategies): the figures come from ``hf_speculative.last_stats``.

The options a caller passes are checked by name (:func:`check_options`): a typo such as ``num_token`` is an
error naming the close match, not a keyword silently ignored. :func:`problem_on` says whether a method can run
on a given model, and why not, without generating (``hf-speculative methods --model NAME``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

from ..drafters import registry
from ..options import MAX_DRAFT_TOKENS, MAX_LAYERS, MAX_NGRAM, check_int

MethodKind = Literal["baseline", "hfs", "transformers"]
BuildFn = Callable[[Any, Any, dict], dict]
if TYPE_CHECKING:  # torch loads on a method's first run: `hf-speculative --help` and `models ...` start without it
    import torch

_REGISTRY: dict[str, "MethodSpec"] = {}
_SOURCES: dict[str, "TrainedSource"] = {}  # option naming a trained drafter -> what it names (the folders declare it)
_ALIASES: dict[str, str] = {}  # an earlier name of a method -> its name (a folder's entry lists its "aliases")
_BUILTIN: dict[str, "MethodSpec"] = {}  # what _register_builtin_methods registered (the rest: register_method's)
_READ = threading.Lock()  # held while the folders' methods are read (again, after drafters.registry.rescan)
_scans_read = -1  # the drafters.registry.scans() the folders' methods were read at


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """How to run one decoding method through ``model.generate()``.

    Attributes:
        name (`str`): registry key, e.g. ``"prompt-lookup"``.
        label (`str`): short human readable name for tables and the UI.
        description (`str`): one sentence.
        kind (`str`): ``"baseline"``, ``"hfs"`` (needs ``hf_speculative.enable(model)``) or
            ``"transformers"`` (transformers' own assisted generation).
        build (`Callable[[model, tokenizer, options], dict]`): the extra ``generate()`` kwargs of
            one call. ``options`` is a shared dict of all options given by the user; a method reads
            only the keys listed in :attr:`options` and may cache resolved values in it (a draft
            model loaded from its registry name).
        options (`dict[str, Any]`): the options the method reads, with their defaults (``None``:
            the underlying strategy's own default); the forms of the app and the CLI offer them.
        unlisted_options (`tuple[str, ...]`): options the method also reads that no form offers (e.g. a folder
            of trained Medusa heads); :func:`check_options` accepts them like :attr:`options`.
        app (`bool`, defaults to `True`): the demo app offers it (the methods with a drafter of another tokenizer
            are the command line's and the benchmark's only: the app's draft-model list holds same-tokenizer models).
    """

    name: str
    label: str
    description: str
    kind: MethodKind
    build: BuildFn
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    unlisted_options: tuple[str, ...] = ()
    app: bool = True

    @property
    def needs_draft_model(self) -> bool:
        return "draft_model" in self.options

    @property
    def option_names(self) -> list[str]:
        """Every option the method reads: :attr:`options`, then :attr:`unlisted_options`."""
        return list(dict.fromkeys([*self.options, *self.unlisted_options]))

    def option(self, options: dict | None, key: str) -> Any:
        """The value of option ``key`` for this method: the user's if given, else the default."""
        value = (options or {}).get(key)
        return self.options.get(key) if value is None else value


def register_method(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Add ``spec`` to the registry (``replace=True`` to overwrite a method of the same name)."""
    if spec.kind not in ("baseline", "hfs", "transformers"):
        raise ValueError(f"unknown method kind {spec.kind!r}: expected 'baseline', 'hfs' or 'transformers'")
    if spec.name in _methods() and not replace:
        raise ValueError(f"a method named {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def _methods() -> dict[str, "MethodSpec"]:
    """The registered methods, the drafter folders' read again if they were rescanned (a folder added at run time:
    ``drafters.registry.rescan``)."""
    if _scans_read != registry.scans():
        _register_builtin_methods()
    return _REGISTRY


def get_method(name: str) -> MethodSpec:
    """The registered method called ``name``; raises `ValueError` listing the known names (and the close match,
    for a typo such as ``prompt_lookup``)."""
    methods = _methods()
    try:
        return methods[name] if name in methods else methods[_ALIASES[name]]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(name), available_methods(), n=1)
        hint = f"; did you mean {close[0]!r}? Known" if close else "; known"
        raise ValueError(f"unknown method {name!r}{hint} methods: {', '.join(available_methods())}") from None


def check_options(methods: list[MethodSpec | str], options: dict | None, *, shared: bool = False) -> None:
    """Refuse an option that none of ``methods`` reads, naming the close match: ``unknown option 'num_token' for
    prompt-lookup; did you mean 'num_tokens'?``. Keys that start with ``_`` (the caches the builders keep in
    ``options``) are not options.

    Args:
        methods: the methods the options are given to (specs or names).
        options (`dict`, *optional*): option name -> value.
        shared (`bool`): the dict is shared with other methods' runs (the CLI and the benchmark pass one dict to
            every method they run): accept, too, a key that any registered method reads.

    Raises:
        ValueError: an unknown option; the message names the methods, the close match if any and their options.
    """
    specs = [get_method(m) if isinstance(m, str) else m for m in methods]
    known = list(dict.fromkeys(key for spec in specs for key in spec.option_names))
    everywhere = list(dict.fromkeys(key for spec in _methods().values() for key in spec.option_names))
    for key in options or {}:
        if (isinstance(key, str) and key.startswith("_")) or key in known or (shared and key in everywhere):
            continue
        key = str(key)
        names = ", ".join(spec.name for spec in specs) or "no method"
        readers = [spec.name for spec in _methods().values() if key in spec.option_names]
        their = f"options of {names}: {', '.join(known) or 'none'}"
        if readers:
            raise ValueError(f"option {key!r} is not read by {names} ({their}); {', '.join(readers)} read it")
        message = f"unknown option {key!r} for {names}"
        close = difflib.get_close_matches(key, known, n=1) or difflib.get_close_matches(key, everywhere, n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
        raise ValueError(f"{message} ({their})")


def canonical_name(name: str) -> str:
    """``name``, or the method's name when ``name`` is an earlier name of it (``eagle+lookup`` -> ``hybrid``)."""
    methods = _methods()
    return name if name in methods else _ALIASES.get(name, name)


def available_methods() -> list[str]:
    """Names of the registered methods, in registration order (an earlier name that still works, an alias, is not
    listed: :func:`get_method` takes it)."""
    return list(_methods())


# -- what one call measured -----------------------------------------------------------------------
@dataclasses.dataclass
class MethodRun:
    """The outcome of :func:`run_method`: new token ids, wall time and speculation figures.

    ``target_forwards`` / ``drafted`` / ``accepted`` / ``tau`` / ``acceptance_rate`` are ``None``
    where the method gives no way to measure them.
    """

    method: str
    output_ids: list[int]
    seconds: float
    target_forwards: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    tau: float | None = None
    acceptance_rate: float | None = None
    extra: dict | None = None  # drafter details from the stats (e.g. LayerSkip's calibration)
    steps: dict | None = None  # per verification step, from the stats: SpeculativeStats.steps()
    shape: str | None = None  # "tree" (our loop verifies the drafts as trees) or "chain"; None for greedy

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def resolve_draft_model(spec: MethodSpec, options: dict, target: Any = None) -> Any:
    """The draft model of ``options``; a registry name or path is loaded once (onto ``target``'s device, in its
    dtype) and cached there."""
    draft = options.get("draft_model")
    if draft is None:
        raise ValueError(f"method {spec.name!r} needs a draft model (option draft_model / --draft-model)")
    if isinstance(draft, str):
        import torch

        from ..registry.models import load_model

        device = getattr(target, "device", None)
        dtype = getattr(target, "dtype", None)  # a bf16 target drafts with a bf16 draft model
        draft, tokenizer = load_model(draft, dtype=dtype if isinstance(dtype, torch.dtype) else None,
                                      device=None if device is None or device.type == "cpu" else device)
        options["draft_model"] = draft
        options["_draft_tokenizer"] = (draft, tokenizer)  # for the methods that draft across tokenizers
    return draft


def resolve_draft_tokenizer(spec: MethodSpec, options: dict, target: Any = None) -> Any:
    """The tokenizer of the draft model of ``options`` (:func:`resolve_draft_model`): the one loaded with it, else the
    one saved in the folder it was loaded from (never downloaded)."""
    draft = resolve_draft_model(spec, options, target)
    known = options.get("_draft_tokenizer")
    if known is not None and known[0] is draft:
        return known[1]
    from ..drafters.draft_model.drafter import _local_tokenizer

    tokenizer = _local_tokenizer(draft)
    if tokenizer is None:
        raise ValueError(f"method {spec.name!r} needs the draft model's tokenizer: name the draft model by its "
                         "registry name or a folder that holds its tokenizer (--draft-model NAME)")
    options["_draft_tokenizer"] = (draft, tokenizer)
    return tokenizer


class _ForwardCounter:
    """Counts the target's own forwards during a call (see the module docstring for early exit)."""

    def __init__(self, model: torch.nn.Module):
        self.count = 0
        self._base_config = getattr(model, getattr(model, "base_model_prefix", ""), model).config
        self._layers = getattr(self._base_config, "num_hidden_layers", None)
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any) -> None:
        if getattr(self._base_config, "num_hidden_layers", None) == self._layers:
            self.count += 1

    def remove(self) -> None:
        self._handle.remove()


def run_method(
    spec: MethodSpec | str,
    model: Any,
    tokenizer: Any,
    input_ids: torch.Tensor,
    *,
    options: dict | None = None,
    max_new_tokens: int = 128,
    **generate_kwargs: Any,
) -> MethodRun:
    """Run one greedy ``generate()`` call of ``spec`` on ``input_ids`` (`[1, L]`) and measure it.

    Args:
        spec (`MethodSpec` or `str`): the method or its registry name.
        model, tokenizer: the target and its tokenizer.
        input_ids (`torch.LongTensor` of shape `[1, L]`): the prompt.
        options (`dict`, *optional*): method options (``num_tokens``, ``draft_model``...).
        max_new_tokens (`int`): generation budget.
        generate_kwargs: passed on to ``generate()``.

    Returns:
        `MethodRun`: ``output_ids`` are the new tokens, at most ``max_new_tokens`` of them (transformers
        < 5.14 may accept a verified block past the budget; the excess is dropped so that every method is
        compared on the same budget).
    """
    import torch

    import hf_speculative as hfs

    spec = get_method(spec) if isinstance(spec, str) else spec
    options = {} if options is None else options
    check_options([spec], options, shared=True)
    input_ids = input_ids.to(model.device)
    if spec.kind == "hfs":
        hfs.enable(model)  # idempotent
    extra = spec.build(model, tokenizer, options)
    kwargs = dict(
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_token_id(model, tokenizer),
    )
    kwargs.update(generate_kwargs)
    kwargs.update(extra)
    counter = _ForwardCounter(model) if spec.kind != "hfs" else None
    try:
        with torch.inference_mode():
            start = time.perf_counter()
            out = model.generate(input_ids, **kwargs)
            seconds = time.perf_counter() - start
    finally:
        if counter is not None:
            counter.remove()
    # transformers < 5.14 can accept a verified block past the budget: keep what greedy could produce.
    new_ids = out[0, input_ids.shape[1] : input_ids.shape[1] + max_new_tokens].tolist()
    run = MethodRun(method=spec.name, output_ids=new_ids, seconds=seconds)
    if spec.kind != "baseline":
        from ..hf.checks import drafts_trees

        run.shape = "tree" if drafts_trees(extra.get("candidate_generator")) else "chain"
    if counter is not None:
        run.target_forwards = counter.count
        run.tau = run.new_tokens / counter.count if counter.count else None
    elif (stats := hfs.last_stats(model)) is not None:
        run.target_forwards, run.drafted = stats.target_forwards, stats.drafted_tokens
        run.accepted = stats.accepted_tokens
        run.tau, run.acceptance_rate = stats.tau, stats.acceptance_rate
        run.extra = dict(stats.extra) or None
        run.steps = stats.steps()
    return run


def problem_on(spec: MethodSpec | str, model: Any, tokenizer: Any = None, options: dict | None = None, *,
               layers: int | None = None, draft_models: list | None = None, may_name: bool = False,
               hint: str = "") -> str | None:
    """Why ``spec`` cannot run on ``model`` with ``options`` (``None``: nothing found), without generating: the
    method builds its drafter for the model (a trained drafter must ship for it or be given, a draft model must be
    given) and the drafter checks itself against the model (``validate_target``: layers, vocabulary, features);
    transformers' early exit needs fewer exit layers than the model has. What only a call finds out (a model whose
    architecture the loop does not support) is not checked here.

    Given the model's *name* (a ``str``: the app's page, before anything loads), only what names and counts tell, in
    words for a page (no command-line option): a draft model must be given or among ``draft_models`` (the models at
    hand that share its tokenizer), a trained drafter must ship for it (recognised by name) or be named in
    ``options``, and the methods that draft with a part of the model's layers need ``layers`` >= 2.

    Args:
        spec (`MethodSpec` or `str`): the method or its registry name.
        model, tokenizer: the loaded target and its tokenizer, or the target's name (then ``tokenizer`` is unused).
        options (`dict`, *optional*): method options, as :func:`run_method` takes them (a draft model named by
            ``draft_model`` is loaded and cached in it).
        layers (`int`, *optional*): by name: the model's layer count, if known.
        draft_models (`list`, *optional*): by name: the models at hand that can draft for it (``None``: not asked).
        may_name (`bool`): by name: a draft model or trained drafter that is not named yet may still be (a form
            not yet sent), so its absence is no problem.
        hint (`str`): by name: appended to the reason a trained drafter is missing (how to name one).

    Returns:
        `str` or `None`: the reason, in words that name the option to give.
    """
    spec = get_method(spec) if isinstance(spec, str) else spec
    options = {} if options is None else options
    if isinstance(model, str):
        return _problem_by_name(spec, model, options, layers, draft_models, may_name, hint)
    check_options([spec], options, shared=True)
    if spec.needs_draft_model and options.get("draft_model") is None:
        return "needs a draft model: a smaller model with the same tokenizer (--draft-model NAME, option draft_model)"
    try:
        extra = spec.build(model, tokenizer, options)
        strategy = extra.get("candidate_generator")
        from ..drafters.strategy import DraftStrategy

        if isinstance(strategy, DraftStrategy):  # (transformers' own methods build none)
            strategy.validate_target(model)
        exit_layer = extra.get("assistant_early_exit")
        layers = _layer_count(model)
        if exit_layer is not None and layers is not None and exit_layer >= layers:
            return (f"exit_layer {exit_layer} must be below the model's {layers} layers "
                    f"(--exit-layer N, option exit_layer)")
    except (ValueError, TypeError, RuntimeError, OSError) as err:  # OptionTypeError is a ValueError too
        return str(err) or type(err).__name__
    return None


def _problem_by_name(spec: MethodSpec, name: str, options: dict, layers: int | None, draft_models: list | None,
                     may_name: bool, hint: str) -> str | None:
    """:func:`problem_on` for a model known by name only."""
    short = short_name(name)
    if spec.needs_draft_model and not may_name and options.get("draft_model") is None and draft_models is not None \
            and not draft_models:
        return f"needs a smaller model with {short}'s tokenizer on this server; none of the models here shares it"
    for source in trained_sources(spec):
        in_form = source.option in spec.options  # (an unlisted one, Medusa's heads, cannot be named in a form)
        named = in_form and (may_name or options.get(source.option) is not None)
        if not named and shipped_for(name, source.names()) is None:
            shipped = ", ".join(source.names()) or "none"
            return (f"no trained {source.singular or source.what} ships for {short} (shipped for: {shipped})"
                    f"{hint if in_form else ''}")
    if layers is not None and layers < 2 and ({"exit_layer", "skip"} & set(spec.options)):
        return f"drafts with a part of the model's layers; {short} has only {layers}"
    return None


def short_name(name: str) -> str:
    """A model's name for messages: a registry name as it is, a folder by its last part."""
    from ..registry.models import REGISTRY

    return name if name in REGISTRY else Path(name).name or name


def _layer_count(model: Any) -> int | None:
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None)
    return layers if isinstance(layers, int) else None


def pad_token_id(model: Any, tokenizer: Any) -> int | None:
    """The id to pad with: the tokenizer's pad, else its EOS, else the model's (first) EOS."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    if pad is None:
        eos = model.generation_config.eos_token_id
        pad = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    return pad


# -- hf_speculative's methods: declared by the drafter folders --------------------------------------
@dataclasses.dataclass(frozen=True)
class TrainedSource:
    """A trained drafter an option names (``eagle``, ``adapter``, ``medusa``), else the one shipped for the model,
    as a drafter folder's ``METHODS`` entry declares it (``"source"``).

    Attributes:
        option (`str`): the option naming it (a folder or a shipped name).
        what (`str`): its name in messages (``"EAGLE drafter"``); ``singular``, when it differs, after "a"
            (``"set of Medusa heads"``).
        missing (`str`): how to give one, for the command line's message when none ships for the model.
        folder (`str`): the drafter folder declaring it; ``shipped``: the function of its ``methods.py`` that lists the
            targets one ships for.
    """

    option: str
    what: str
    missing: str
    folder: str
    shipped: str
    singular: str | None = None

    def names(self) -> list[str]:
        """The targets one ships for (each shipped drafter is named after its model)."""
        return list(getattr(importlib.import_module(f"{self.folder}.methods"), self.shipped)())


def trained_sources(spec: MethodSpec | str) -> list[TrainedSource]:
    """The trained drafters ``spec`` reads (its options that name one, offered in a form or not)."""
    spec = get_method(spec) if isinstance(spec, str) else spec
    _methods()
    return [_SOURCES[key] for key in spec.option_names if key in _SOURCES]


def shipped_for(name: str, shipped: list[str]) -> str | None:
    """The shipped drafter (of ``shipped``) for the model called ``name``, recognised by its registry folder or name."""
    parts = str(name).replace("\\", "/").split("/")
    return next((drafter for drafter in shipped if drafter in parts), None)


class MethodCall:
    """What a drafter folder's build gets: one call of a method (its spec, the target, the options), and the helpers
    the builds share. The drafter folders never import tooling; this is the whole of what they use.

    Args:
        spec (`MethodSpec`): the method being built.
        model, tokenizer: the target and its tokenizer.
        options (`dict`): the shared options of the run (a build may cache loaded drafters in it, under ``_`` keys).
    """

    def __init__(self, spec: MethodSpec, model: Any, tokenizer: Any, options: dict):
        self.spec, self.model, self.tokenizer, self.options = spec, model, tokenizer, options

    @property
    def name(self) -> str:
        return self.spec.name

    def option(self, key: str) -> Any:
        """Option ``key``: the user's if given, else the method's default."""
        return self.spec.option(self.options, key)

    def given(self, *keys: str) -> dict:
        """``{key: value}`` of the options among ``keys`` that have a value (the strategy's defaults stand for the
        others)."""
        return {key: value for key in keys if (value := self.option(key)) is not None}

    def length(self) -> dict:
        """``num_tokens`` as an int, when given (the option the self-speculative and trained drafters share),
        checked here (not coerced: ``int()`` would turn ``2.7`` into 2 silently) because it keys a cache of
        loaded drafters before any strategy sees it."""
        value = self.option("num_tokens")
        return {} if value is None else {"num_tokens": _checked(self.spec, self.options, "num_tokens", 1,
                                                                MAX_DRAFT_TOKENS)}

    def flag(self, key: str) -> bool:
        """A boolean option (``adaptive``: ``--fixed-budget`` turns it off), refused unless ``True`` or ``False``."""
        value = self.option(key)
        if not isinstance(value, bool):
            raise ValueError(f"method {self.name!r}: option {key} must be True or False, got {value!r}.")
        return value

    def tree_nodes(self) -> int:
        """Option ``tree_nodes``, the tree methods' node budget (1-64)."""
        return _checked(self.spec, self.options, "tree_nodes", 1, 64)

    def tree_shape(self, nodes: int) -> Any:
        """:func:`tree_shape`: the dynamic tree the tree methods draft with a budget of ``nodes``."""
        return tree_shape(nodes)

    def draft_model(self) -> Any:
        """:func:`resolve_draft_model`: the draft model of the options, loaded once onto the target's device."""
        return resolve_draft_model(self.spec, self.options, self.model)

    def draft_tokenizer(self) -> Any:
        """:func:`resolve_draft_tokenizer`: the draft model's own tokenizer."""
        return resolve_draft_tokenizer(self.spec, self.options, self.model)

    def trained(self, source_option: str, load: Callable[[Any, dict], Any], *, cache_key: str,
                settings: dict | None = None) -> dict:
        """:func:`_trained_strategy`: the kwargs of a method whose drafter is trained, named by ``source_option``."""
        return _trained_strategy(self.spec, self.model, self.options, _SOURCES[source_option], cache_key=cache_key,
                                 load=load, settings=settings)

    def build(self, method: str) -> dict:
        """Another method's kwargs for this call, with the same options (a hybrid's trained member)."""
        return get_method(method).build(self.model, self.tokenizer, self.options)

    def strategy(self, method: str, **settings: Any) -> Any:
        """A strategy of the drafter registry's ``method``, built with ``settings`` (a hybrid's other member)."""
        return registry.strategy_class(method)(**settings)


def tree_shape(nodes: int) -> Any:
    """The EAGLE-2 dynamic tree the tree methods draft with a budget of ``nodes``: deeper and wider as it grows
    (the shape ``benchmarks/tree_tau.py`` measured)."""
    import hf_speculative as hfs

    return hfs.DynamicTree(nodes=nodes, depth=min(8, max(3, nodes // 4)), top_k=min(8, nodes))


def _trained_strategy(spec: MethodSpec, model: Any, options: dict, source: TrainedSource, *, cache_key: str,
                      load: Callable[[Any, dict], Any], settings: dict | None = None) -> dict:
    """The kwargs of a method whose drafter is trained (``eagle``, ``early-exit-adapter``): the drafter named by
    option ``source.option``, else the one shipped for ``model``, else a `ValueError` that ends with
    ``source.missing``. ``load(source, settings)`` builds the strategy once per model, source and settings (cached
    in ``options[cache_key]``), not per call."""
    named = spec.option(options, source.option)
    if named is None:
        shipped = source.names()
        named = shipped_for(str(getattr(model, "name_or_path", "")), shipped)
        if named is None:
            raise ValueError(f"no {source.what} ships for {getattr(model, 'name_or_path', 'this model')!r} (shipped: "
                             f"{', '.join(shipped) or 'none'}); {source.missing}")
    settings = {**MethodCall(spec, model, None, options).length(), **(settings or {})}
    cache = options.setdefault(cache_key, {})
    key = (id(model), str(named), tuple(sorted(settings.items())))
    if key not in cache:
        cache[key] = load(named, settings)
    return {"candidate_generator": cache[key]}


def _declared_build(folder: str, function: str, method: str, model: Any, tokenizer: Any, options: dict) -> dict:
    """Run the build a drafter folder declares for ``method`` (its ``methods.py`` is imported now)."""
    build = getattr(importlib.import_module(f"{folder}.methods"), function)
    return build(model, tokenizer, MethodCall(get_method(method), model, tokenizer, options))


def _declared_methods(sources: dict, aliases: dict) -> list[tuple[float, MethodSpec]]:
    """``(order, spec)`` of every method the drafter folders declare; their trained sources and earlier names
    (``aliases``) recorded into ``sources`` and ``aliases`` on the way."""
    found = []
    for folder, entries in registry.folder_data("methods", "METHODS"):
        for entry in entries:
            build = functools.partial(_declared_build, folder, entry["build"], entry["name"])
            found.append((float(entry.get("order", float("inf"))), MethodSpec(
                entry["name"], entry["label"], entry["description"], "hfs", build, dict(entry.get("options", {})),
                tuple(entry.get("unlisted_options", ())), bool(entry.get("app", True)))))
            if "source" in entry:
                sources[entry["source"]["option"]] = TrainedSource(folder=folder, **entry["source"])
            for alias in entry.get("aliases", ()):
                aliases[alias] = entry["name"]
    return found


# -- greedy and transformers' own methods ------------------------------------------------------------
def _build_greedy(model: Any, tokenizer: Any, options: dict) -> dict:
    return {}


def _build_hf_prompt_lookup(model: Any, tokenizer: Any, options: dict) -> dict:
    spec = get_method("hf-prompt-lookup")
    kwargs = {"prompt_lookup_num_tokens": _checked(spec, options, "num_tokens", 1, MAX_DRAFT_TOKENS)}
    if spec.option(options, "max_ngram") is not None:
        kwargs["max_matching_ngram_size"] = _checked(spec, options, "max_ngram", 1, MAX_NGRAM)
    return kwargs


def _build_hf_assisted(model: Any, tokenizer: Any, options: dict) -> dict:
    spec = get_method("hf-assisted")
    kwargs = {"assistant_model": resolve_draft_model(spec, options, model)}
    if spec.option(options, "num_tokens") is not None:
        kwargs["num_assistant_tokens"] = _checked(spec, options, "num_tokens", 1, MAX_DRAFT_TOKENS)
    return kwargs


def _build_hf_assisted_uag(model: Any, tokenizer: Any, options: dict) -> dict:
    spec = get_method("hf-assisted-uag")
    if tokenizer is None:
        raise ValueError(f"method {spec.name!r} needs the target's tokenizer")
    kwargs = {"assistant_model": resolve_draft_model(spec, options, model), "tokenizer": tokenizer,
              "assistant_tokenizer": resolve_draft_tokenizer(spec, options, model)}
    if kwargs["assistant_tokenizer"].get_vocab() == tokenizer.get_vocab():  # transformers refuses the pair itself
        raise ValueError(f"method {spec.name!r} is transformers' assisted generation with a draft model of another "
                         "tokenizer; this draft model shares the target's tokenizer: use method 'hf-assisted'")
    if spec.option(options, "num_tokens") is not None:
        kwargs["num_assistant_tokens"] = _checked(spec, options, "num_tokens", 1, MAX_DRAFT_TOKENS)
    return kwargs


def _build_hf_early_exit(model: Any, tokenizer: Any, options: dict) -> dict:
    spec = get_method("hf-early-exit")
    kwargs = {"assistant_early_exit": _checked(spec, options, "exit_layer", 1, MAX_LAYERS - 1)}
    if spec.option(options, "num_tokens") is not None:
        kwargs["num_assistant_tokens"] = _checked(spec, options, "num_tokens", 1, MAX_DRAFT_TOKENS)
    return kwargs


def _checked(spec: MethodSpec, options: dict, key: str, low: int, high: int) -> int:
    """Option ``key`` of a method, held to the limits hf_speculative's own strategies keep (transformers checks
    none of them)."""
    return check_int(spec.name, key, spec.option(options, key), low, high)


def _own_methods() -> list[tuple[float, MethodSpec]]:
    """``(order, spec)`` of greedy and transformers' own methods (the drafter folders' ``order`` places theirs)."""
    return [
        (0, MethodSpec("greedy", "Greedy", "Plain greedy decoding: the baseline.", "baseline", _build_greedy)),
        (100, MethodSpec(
            "hf-prompt-lookup",
            "Prompt lookup (transformers)",
            "transformers' own prompt lookup decoding (prompt_lookup_num_tokens).",
            "transformers",
            _build_hf_prompt_lookup,
            {"num_tokens": 10, "max_ngram": None},
        )),
        (110, MethodSpec(
            "hf-assisted",
            "Assisted (transformers)",
            "transformers' own assisted generation with a draft model (assistant_model).",
            "transformers",
            _build_hf_assisted,
            {"draft_model": None, "num_tokens": None},
        )),
        (120, MethodSpec(
            "hf-early-exit",
            "Early exit (transformers)",
            "transformers' own self-speculation that drafts with the first layers (assistant_early_exit).",
            "transformers",
            _build_hf_early_exit,
            {"exit_layer": 8, "num_tokens": None},
        )),
        (125, MethodSpec(
            "hf-assisted-uag",
            "Universal assisted (transformers)",
            "transformers' own assisted generation with a draft model of another tokenizer (assistant_model with "
            "tokenizer and assistant_tokenizer; greedy: universal assisted generation).",
            "transformers",
            _build_hf_assisted_uag,
            {"draft_model": None, "num_tokens": None},
            app=False,
        )),
    ]


def _register_builtin_methods() -> None:
    """Register greedy, transformers' methods and the drafter folders' (read again after ``registry.rescan``), in
    their ``order``; a method registered by hand (:func:`register_method`) stays, after them. Everything is read
    first, then swapped in."""
    global _scans_read
    with _READ:
        scans = registry.scans()
        sources: dict[str, TrainedSource] = {}
        aliases: dict[str, str] = {}
        builtin = {spec.name: spec for _, spec in sorted(_own_methods() + _declared_methods(sources, aliases),
                                                          key=lambda item: item[0])}
        by_hand = {name: spec for name, spec in _REGISTRY.items() if _BUILTIN.get(name) is not spec}
        methods = {**builtin, **by_hand}
        taken = sorted(set(aliases) & set(methods))
        if taken:
            raise ValueError(f"the method name(s) {', '.join(taken)} are also declared as earlier names (aliases) of "
                             "other methods; drop one of them.")
        for held, new in ((_REGISTRY, methods), (_BUILTIN, builtin), (_SOURCES, sources), (_ALIASES, aliases)):
            held.clear()
            held.update(new)
        _scans_read = scans


_register_builtin_methods()
