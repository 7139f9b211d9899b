"""The registry of decoding methods that the CLI, the benchmark and the demo app can run.

A :class:`MethodSpec` says how to turn one ``model.generate()`` call into a given decoding method:
which extra keyword arguments to pass (built fresh for every call) and which options it reads.
Every method is registered here with :func:`register_method`; callers look them up by name with
:func:`get_method` and list them with :func:`available_methods`, so no other module keeps its own
list of methods.

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
import time
from typing import Any, Callable, Literal

import torch

from ..options import MAX_DRAFT_TOKENS, MAX_LAYERS, MAX_NGRAM, check_int

MethodKind = Literal["baseline", "hfs", "transformers"]
BuildFn = Callable[[Any, Any, dict], dict]

_REGISTRY: dict[str, "MethodSpec"] = {}


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
    """

    name: str
    label: str
    description: str
    kind: MethodKind
    build: BuildFn
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    unlisted_options: tuple[str, ...] = ()

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
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"a method named {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def get_method(name: str) -> MethodSpec:
    """The registered method called ``name``; raises `ValueError` listing the known names (and the close match,
    for a typo such as ``prompt_lookup``)."""
    try:
        return _REGISTRY[name]
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
    everywhere = list(dict.fromkeys(key for spec in _REGISTRY.values() for key in spec.option_names))
    for key in options or {}:
        if (isinstance(key, str) and key.startswith("_")) or key in known or (shared and key in everywhere):
            continue
        key = str(key)
        names = ", ".join(spec.name for spec in specs) or "no method"
        readers = [spec.name for spec in _REGISTRY.values() if key in spec.option_names]
        their = f"options of {names}: {', '.join(known) or 'none'}"
        if readers:
            raise ValueError(f"option {key!r} is not read by {names} ({their}); {', '.join(readers)} read it")
        message = f"unknown option {key!r} for {names}"
        close = difflib.get_close_matches(key, known, n=1) or difflib.get_close_matches(key, everywhere, n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
        raise ValueError(f"{message} ({their})")


def available_methods() -> list[str]:
    """Names of the registered methods, in registration order."""
    return list(_REGISTRY)


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
    """The draft model of ``options``; a registry name or path is loaded once (onto ``target``'s device)
    and cached there."""
    draft = options.get("draft_model")
    if draft is None:
        raise ValueError(f"method {spec.name!r} needs a draft model (option draft_model / --draft-model)")
    if isinstance(draft, str):
        from ..registry.models import load_model

        device = getattr(target, "device", None)
        draft, _ = load_model(draft, device=None if device is None or device.type == "cpu" else device)
        options["draft_model"] = draft
    return draft


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
        from ..hf.loop_entry import runs_in_our_loop

        run.shape = "tree" if runs_in_our_loop(extra.get("candidate_generator")) else "chain"
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


def problem_on(spec: MethodSpec | str, model: Any, tokenizer: Any = None, options: dict | None = None) -> str | None:
    """Why ``spec`` cannot run on ``model`` with ``options`` (``None``: nothing found), without generating: the
    method builds its drafter for the model (a trained drafter must ship for it or be given, a draft model must be
    given) and the drafter checks itself against the model (``validate_target``: layers, vocabulary, features);
    transformers' early exit needs fewer exit layers than the model has. What only a call finds out (a model whose
    architecture the loop does not support) is not checked here.

    Args:
        spec (`MethodSpec` or `str`): the method or its registry name.
        model, tokenizer: the loaded target and its tokenizer.
        options (`dict`, *optional*): method options, as :func:`run_method` takes them (a draft model named by
            ``draft_model`` is loaded and cached in it).

    Returns:
        `str` or `None`: the reason, in words that name the option to give.
    """
    spec = get_method(spec) if isinstance(spec, str) else spec
    options = {} if options is None else options
    check_options([spec], options, shared=True)
    if spec.needs_draft_model and options.get("draft_model") is None:
        return "needs a draft model: a smaller model with the same tokenizer (--draft-model NAME, option draft_model)"
    try:
        extra = spec.build(model, tokenizer, options)
        strategy = extra.get("candidate_generator")
        if strategy is not None and hasattr(strategy, "validate_target"):
            strategy.validate_target(model)
        exit_layer = extra.get("assistant_early_exit")
        layers = _layer_count(model)
        if exit_layer is not None and layers is not None and exit_layer >= layers:
            return (f"exit_layer {exit_layer} must be below the model's {layers} layers "
                    f"(--exit-layer N, option exit_layer)")
    except (ValueError, TypeError, RuntimeError, OSError) as err:  # OptionTypeError is a ValueError too
        return str(err) or type(err).__name__
    return None


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


# -- the built-in methods -------------------------------------------------------------------------
def _build_greedy(model: Any, tokenizer: Any, options: dict) -> dict:
    return {}


def _build_prompt_lookup(model: Any, tokenizer: Any, options: dict) -> dict:
    import hf_speculative as hfs

    spec = get_method("prompt-lookup")
    kwargs = {k: spec.option(options, k) for k in ("num_tokens", "max_ngram")}
    return {"candidate_generator": hfs.PromptLookup(**{k: v for k, v in kwargs.items() if v is not None})}


def _build_draft_model(model: Any, tokenizer: Any, options: dict) -> dict:
    import hf_speculative as hfs

    spec = get_method("draft-model")
    draft = resolve_draft_model(spec, options, model)
    num_tokens = spec.option(options, "num_tokens")
    strategy = hfs.DraftModel(draft) if num_tokens is None else hfs.DraftModel(draft, num_tokens=num_tokens)
    return {"candidate_generator": strategy}


def _shipped_for(model: Any, names: list[str]) -> str | None:
    """The shipped drafter (of ``names``) for ``model``, recognised by its registry folder or name."""
    parts = str(getattr(model, "name_or_path", "")).replace("\\", "/").split("/")
    return next((name for name in names if name in parts), None)


def _trained_strategy(method: str, model: Any, options: dict, *, source_option: str, what: str, shipped: list[str],
                      missing: str, cache_key: str, load: Callable[[Any, dict], Any],
                      settings: dict | None = None) -> dict:
    """The kwargs of a method whose drafter is trained (``eagle``, ``early-exit-adapter``): the drafter
    (``what``, for messages) named by option ``source_option``, else the one shipped for ``model``
    (``shipped``: their names), else a `ValueError` that ends with ``missing``. ``load(source,
    settings)`` builds the strategy once per model, source and settings (cached in
    ``options[cache_key]``), not per call."""
    spec = get_method(method)
    source = spec.option(options, source_option)
    if source is None:
        source = _shipped_for(model, shipped)
        if source is None:
            raise ValueError(f"no {what} ships for {getattr(model, 'name_or_path', 'this model')!r} (shipped: "
                             f"{', '.join(shipped) or 'none'}); {missing}")
    settings = {**_length_options(spec, options), **(settings or {})}
    cache = options.setdefault(cache_key, {})
    key = (id(model), str(source), tuple(sorted(settings.items())))
    if key not in cache:
        cache[key] = load(source, settings)
    return {"candidate_generator": cache[key]}


def _build_eagle(model: Any, tokenizer: Any, options: dict) -> dict:
    import hf_speculative as hfs
    from hf_speculative.drafters.eagle.drafter import pretrained_names

    return _trained_strategy("eagle", model, options, source_option="eagle", what="EAGLE drafter",
                             shipped=pretrained_names(), missing="pass --eagle PATH to a trained drafter.",
                             cache_key="_eagle_strategies",
                             load=lambda source, settings: hfs.Eagle.from_pretrained(source, target=model, **settings))


def _build_eagle_lookup(model: Any, tokenizer: Any, options: dict) -> dict:
    import hf_speculative as hfs

    spec = get_method("eagle+lookup")
    eagle = _build_eagle(model, tokenizer, options)["candidate_generator"]  # --eagle, --num-tokens
    max_ngram = spec.option(options, "max_ngram")
    lookup = hfs.PromptLookup() if max_ngram is None else hfs.PromptLookup(max_ngram=max_ngram)  # it checks the type
    return {"candidate_generator": hfs.Hybrid(lookup, eagle)}


def tree_shape(nodes: int) -> Any:
    """The EAGLE-2 dynamic tree the tree methods draft with a budget of ``nodes``: deeper and wider as it grows
    (the shape ``benchmarks/tree_tau.py`` measured)."""
    import hf_speculative as hfs

    return hfs.DynamicTree(nodes=nodes, depth=min(8, max(3, nodes // 4)), top_k=min(8, nodes))


def _tree_nodes(spec: MethodSpec, options: dict) -> int:
    return _checked(spec, options, "tree_nodes", 1, 64)


def _build_eagle_tree(model: Any, tokenizer: Any, options: dict) -> dict:
    """EAGLE drafting dynamic trees, their size per step chosen from the measured verification cost."""
    import hf_speculative as hfs
    from hf_speculative.drafters.eagle.drafter import pretrained_names

    spec = get_method("eagle-tree")
    shape = tree_shape(_tree_nodes(spec, options))
    return _trained_strategy("eagle-tree", model, options, source_option="eagle", what="EAGLE drafter",
                             shipped=pretrained_names(), missing="pass --eagle PATH to a trained drafter.",
                             cache_key="_eagle_tree_strategies", settings={"adaptive": _adaptive(spec, options),
                                                                           "tree_nodes": shape.nodes},
                             load=lambda source, settings: hfs.Eagle.from_pretrained(
                                 source, target=model, tree=shape,
                                 **{k: v for k, v in settings.items() if k != "tree_nodes"}))


def _adaptive(spec: MethodSpec, options: dict) -> bool:
    """Option ``adaptive`` (``--fixed-budget`` turns it off): the tree methods' budget per step from the measured
    verification cost (``True``), or always the whole ``--tree-nodes`` (for measuring τ by budget)."""
    value = spec.option(options, "adaptive")
    if not isinstance(value, bool):
        raise ValueError(f"method {spec.name!r}: option adaptive must be True or False, got {value!r}.")
    return value


def _build_eagle_lookup_tree(model: Any, tokenizer: Any, options: dict) -> dict:
    """The hybrid of lookup trees (several n-gram matches) and EAGLE trees, in hf_speculative's own loop."""
    import hf_speculative as hfs

    spec = get_method("eagle+lookup-tree")
    nodes = _tree_nodes(spec, options)
    eagle = _build_eagle_tree(model, tokenizer, options)["candidate_generator"]  # (loaded once: cached in options)
    max_ngram = spec.option(options, "max_ngram")
    lookup = hfs.PromptLookup(tree=tree_shape(nodes), adaptive=_adaptive(spec, options),
                              **({} if max_ngram is None else {"max_ngram": max_ngram}))
    return {"candidate_generator": hfs.Hybrid(lookup, eagle)}


def _length_options(spec: MethodSpec, options: dict) -> dict:
    """``num_tokens`` as an int, when given (the option the self-speculative and trained drafters share),
    checked here (not coerced: ``int()`` would turn ``2.7`` into 2 silently) because it keys a cache of
    loaded drafters before any strategy sees it."""
    value = spec.option(options, "num_tokens")
    return {} if value is None else {"num_tokens": _checked(spec, options, "num_tokens", 1, MAX_DRAFT_TOKENS)}


def _build_early_exit(model: Any, tokenizer: Any, options: dict) -> dict:
    import hf_speculative as hfs

    spec = get_method("early-exit")
    exit_layer = spec.option(options, "exit_layer")  # EarlyExit checks it
    return {"candidate_generator": hfs.EarlyExit(exit_layer=exit_layer, **_length_options(spec, options))}


def _build_early_exit_adapter(model: Any, tokenizer: Any, options: dict) -> dict:
    import hf_speculative as hfs
    from ..drafters.self_speculative.exit_adapter import shipped_adapters

    return _trained_strategy("early-exit-adapter", model, options, source_option="adapter", what="exit adapter",
                             shipped=shipped_adapters(), missing="pass --adapter PATH to one trained with "
                             "`hf-speculative train-eagle --exit-layer K`.", cache_key="_exit_adapters",
                             load=lambda source, settings: hfs.EarlyExit(adapter=source, **settings))


def _build_layer_skip(model: Any, tokenizer: Any, options: dict) -> dict:
    import hf_speculative as hfs

    spec = get_method("layer-skip")
    skip = spec.option(options, "skip")
    if isinstance(skip, str) and skip != "auto":
        try:
            skip = [int(i) for i in skip.replace(" ", "").split(",") if i]
        except ValueError:
            raise ValueError(f"--skip {skip!r}: give 'auto' or comma-separated layer indices, e.g. --skip 4,6,9") from None
    extra = _length_options(spec, options)
    if skip == "auto" and spec.option(options, "calibration_file") is not None:
        extra["calibration_file"] = spec.option(options, "calibration_file")
    return {"candidate_generator": hfs.LayerSkip(skip, **extra)}


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


def _build_hf_early_exit(model: Any, tokenizer: Any, options: dict) -> dict:
    spec = get_method("hf-early-exit")
    kwargs = {"assistant_early_exit": _checked(spec, options, "exit_layer", 1, MAX_LAYERS - 1)}
    if spec.option(options, "num_tokens") is not None:
        kwargs["num_assistant_tokens"] = _checked(spec, options, "num_tokens", 1, MAX_DRAFT_TOKENS)
    return kwargs


def _build_suffix(model: Any, tokenizer: Any, options: dict) -> dict:
    import hf_speculative as hfs

    spec = get_method("suffix")
    nodes = spec.option(options, "num_tokens")  # --num-tokens: the most nodes per step (SuffixDecoding checks it)
    return {"candidate_generator": hfs.SuffixDecoding() if nodes is None else hfs.SuffixDecoding(max_nodes=nodes)}


def _build_lookahead(model: Any, tokenizer: Any, options: dict) -> dict:
    import hf_speculative as hfs

    spec = get_method("lookahead")
    ngram = spec.option(options, "max_ngram")  # --max-ngram: the n-gram size N (Lookahead checks it)
    return {"candidate_generator": hfs.Lookahead() if ngram is None else hfs.Lookahead(ngram=ngram)}


def _medusa_strategy(method: str, model: Any, options: dict, tree: bool) -> dict:
    """The Medusa heads shipped for ``model``: chains of each head's top guess, or the tree calibrated when they
    were trained (its first ``tree_nodes`` rank paths, parents first). Loaded once per model and settings."""
    import hf_speculative as hfs
    from hf_speculative.drafters.medusa.drafter import pretrained_names

    spec = get_method(method)
    extra = {"adaptive": _adaptive(spec, options), "tree_nodes": _tree_nodes(spec, options)} if tree else {}

    def load(source: Any, settings: dict) -> Any:
        nodes = settings.pop("tree_nodes", None)
        strategy = hfs.Medusa.from_pretrained(source, target=model, tree="calibrated" if tree else None, **settings)
        if tree and strategy.tree.size > nodes:
            strategy = dataclasses.replace(strategy, tree=hfs.StaticTree(strategy.tree.paths[:nodes]))
        return strategy

    return _trained_strategy(method, model, options, source_option="medusa", what="Medusa heads",
                             shipped=pretrained_names(),
                             missing="train heads with `hf-speculative train-medusa --target ...` and pass them with "
                                     "candidate_generator=hfs.Medusa.from_pretrained(path, target=model).",
                             cache_key=f"_{method}_strategies", settings=extra, load=load)


def _build_medusa(model: Any, tokenizer: Any, options: dict) -> dict:
    return _medusa_strategy("medusa", model, options, tree=False)


def _build_medusa_tree(model: Any, tokenizer: Any, options: dict) -> dict:
    return _medusa_strategy("medusa-tree", model, options, tree=True)


def _checked(spec: MethodSpec, options: dict, key: str, low: int, high: int) -> int:
    """Option ``key`` of a transformers method, held to the limits hf_speculative's own strategies keep
    (transformers checks none of them)."""
    return check_int(spec.name, key, spec.option(options, key), low, high)


def _register_builtin_methods() -> None:
    for spec in (
        MethodSpec("greedy", "Greedy", "Plain greedy decoding: the baseline.", "baseline", _build_greedy),
        MethodSpec(
            "prompt-lookup",
            "Prompt lookup (hfs)",
            "hf_speculative's n-gram prompt lookup: drafts the continuation of the last n-gram seen earlier.",
            "hfs",
            _build_prompt_lookup,
            {"num_tokens": None, "max_ngram": None},
        ),
        MethodSpec(
            "draft-model",
            "Draft model (hfs)",
            "hf_speculative's draft model: a smaller model with the same tokenizer drafts greedily.",
            "hfs",
            _build_draft_model,
            {"draft_model": None, "num_tokens": None},
        ),
        MethodSpec(
            "eagle",
            "EAGLE (hfs)",
            "hf_speculative's EAGLE drafter: one trained layer reading the target's own hidden states.",
            "hfs",
            _build_eagle,
            {"eagle": None, "num_tokens": None},
        ),
        MethodSpec(
            "eagle+lookup",
            "EAGLE + lookup (hfs)",
            "hf_speculative's hybrid: prompt lookup when an n-gram match pays, else the EAGLE drafter (hfs.Hybrid).",
            "hfs",
            _build_eagle_lookup,
            {"eagle": None, "num_tokens": None, "max_ngram": None},
        ),
        MethodSpec(
            "eagle-tree",
            "EAGLE tree (hfs)",
            "hf_speculative's EAGLE drafter drafting EAGLE-2 dynamic trees, verified in one forward with tree attention "
            "in hf_speculative's own loop; the tree's size per step follows the measured verification cost.",
            "hfs",
            _build_eagle_tree,
            {"eagle": None, "num_tokens": None, "tree_nodes": 32, "adaptive": True},
        ),
        MethodSpec(
            "eagle+lookup-tree",
            "EAGLE + lookup trees (hfs)",
            "hf_speculative's hybrid with trees: a tree of several prompt-lookup matches when one pays, else an EAGLE "
            "dynamic tree (hfs.Hybrid with tree= members, hf_speculative's own loop).",
            "hfs",
            _build_eagle_lookup_tree,
            {"eagle": None, "num_tokens": None, "max_ngram": None, "tree_nodes": 32, "adaptive": True},
        ),
        MethodSpec(
            "early-exit",
            "Early exit (hfs)",
            "hf_speculative's early exit: the target's first layers draft, on the target's own KV cache.",
            "hfs",
            _build_early_exit,
            {"exit_layer": 8, "num_tokens": None},
        ),
        MethodSpec(
            "early-exit-adapter",
            "Early exit + adapter (hfs)",
            "hf_speculative's early exit with a trained exit adapter (Kangaroo): the target's first layers and one "
            "small trained layer draft, on the target's own KV cache.",
            "hfs",
            _build_early_exit_adapter,
            {"adapter": None, "num_tokens": None},
        ),
        MethodSpec(
            "layer-skip",
            "Layer skip (hfs)",
            "hf_speculative's layer skipping: the target minus a calibrated set of layers drafts, on its own KV cache.",
            "hfs",
            _build_layer_skip,
            {"skip": "auto", "calibration_file": None, "num_tokens": None},
        ),
        MethodSpec(
            "hf-prompt-lookup",
            "Prompt lookup (transformers)",
            "transformers' own prompt lookup decoding (prompt_lookup_num_tokens).",
            "transformers",
            _build_hf_prompt_lookup,
            {"num_tokens": 10, "max_ngram": None},
        ),
        MethodSpec(
            "hf-assisted",
            "Assisted (transformers)",
            "transformers' own assisted generation with a draft model (assistant_model).",
            "transformers",
            _build_hf_assisted,
            {"draft_model": None, "num_tokens": None},
        ),
        MethodSpec(
            "hf-early-exit",
            "Early exit (transformers)",
            "transformers' own self-speculation that drafts with the first layers (assistant_early_exit).",
            "transformers",
            _build_hf_early_exit,
            {"exit_layer": 8, "num_tokens": None},
        ),
        MethodSpec(
            "suffix",
            "SuffixDecoding (hfs)",
            "hf_speculative's SuffixDecoding: draft trees from suffix tries over the call's text and the model's "
            "earlier outputs in this process.",
            "hfs",
            _build_suffix,
            {"num_tokens": None},
        ),
        MethodSpec(
            "lookahead",
            "Lookahead (hfs)",
            "hf_speculative's lookahead decoding: a Jacobi window and an n-gram pool verified in one tree per "
            "forward.",
            "hfs",
            _build_lookahead,
            {"max_ngram": None},
        ),
        MethodSpec(
            "medusa",
            "Medusa (hfs)",
            "hf_speculative's Medusa heads on the target's last hidden state: a chain of each head's top guess "
            "(the heads shipped for the model).",
            "hfs",
            _build_medusa,
            {"num_tokens": None},
            unlisted_options=("medusa",),  # a folder of trained heads (default: the ones shipped for the model)
        ),
        MethodSpec(
            "medusa-tree",
            "Medusa tree (hfs)",
            "hf_speculative's Medusa heads drafting the static tree calibrated on their validation ranks, verified "
            "in one forward in hf_speculative's own loop; the tree's size per step follows the measured cost.",
            "hfs",
            _build_medusa_tree,
            {"num_tokens": None, "tree_nodes": 16, "adaptive": True},
            unlisted_options=("medusa",),
        ),
    ):
        register_method(spec, replace=True)


_register_builtin_methods()
