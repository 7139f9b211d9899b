"""How hf_speculative enters ``model.generate()`` without patching transformers.

``enable(model)`` sets five *instance* attributes (bound methods, so ``copy.deepcopy`` rebinds
them to the copy):

- ``generate``: resolves the call's strategy (the ``candidate_generator=`` keyword, else the one in
  the ``GenerationConfig`` passed in, else the model's own ``generation_config.candidate_generator``;
  the keyword ``None`` turns speculation off), validates the call, and runs transformers' ``generate`` with
  hf_speculative's loop as its ``custom_generate`` callable (:mod:`hf_speculative.core.entry`): transformers
  prepares the processors, stopping criteria, length limit and cache; our loop verifies the drafts. With
  ``speculative_loop="transformers"`` it runs transformers' own assisted loop instead (entered through its
  ``prompt_lookup_num_tokens`` switch), where our drafters serve as its ``CandidateGenerator`` s;
- ``save_pretrained``: writes the model's default strategy into ``generation_config.json`` as a spec
  (and a trained drafter beside the model; see ``spec.py``);
- ``_get_candidate_generator``: transformers' assisted loop asks the model for its drafter; we hand it the
  per-call generator built from the strategy of *this* call;
- ``_get_stopping_criteria`` / ``_get_logits_processor``: record the call's stopping criteria and its prepared
  logits processors (drafters warp their logits alike); under sampling (``num_beams=1``) the processors end with
  the call's :class:`~hf_speculative.core.sampling.SeededSampler`, so the text is a fixed function of the seed
  whatever the drafter does (``sampling_seed=``, else one draw from torch's global generator); a call without a
  drafter samples so too when ``sampling_seed=`` is given. ``speculative_sampling="rejection"`` (or the
  ``GenerationConfig``'s ``speculative_sampling``, saved in ``generation_config.json``) ends them with a
  :class:`~hf_speculative.core.sampling.RejectionSampler` instead: the classic rule, the highest acceptance, a text
  that depends on the drafts. The seeded rule is the default because it keeps ``torch.manual_seed(s)`` before a
  call reproducing its text (docs/recipes/sampling.md has the measured acceptance of both).

The running call (:class:`~hf_speculative.core.call.Call`) lives in the package's one ``ContextVar``, because transformers calls these
hooks back without a way to pass it: threads never see each other's calls, and a model without an active call
behaves exactly as transformers does (unless it is given a ``sampling_seed=``). Everything below the entry gets
the call explicitly: the loop's entry is bound to it (``functools.partial(core.entry.generate, call=call)``).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import functools
import inspect
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from types import MethodType, SimpleNamespace
from typing import Any, NoReturn

import torch
from transformers import LogitsProcessorList

from .. import compat
from . import spec
from ..core import entry
from ..core.call import Call
from ..drafters.strategy import DraftStrategy
from ..drafters.generator import ExternalStrategy
from ..drafters.registry import name_of
from .checks import check_batch_strategy, check_call_inputs, check_strategy, draft_budget, drafts_trees
from ..core.policy import check_input_ids
from ..core.sampling import RejectionSampler, check_mode, check_seed, seeded_processors
from ..core.static_cache import compiled_mode, static_requested
from ..core.state import state_of
from ..core.stats import SpeculativeStats

_ENABLED_FLAG = "_hf_speculative_enabled"
_LOOP_HOOKS = ("_get_candidate_generator", "_get_stopping_criteria", "_get_logits_processor")
_PATCHED_METHODS = ("generate", "save_pretrained", *_LOOP_HOOKS)
# Arguments that select transformers' own drafters; mixing them with ours is ambiguous.
_CONFLICTING_ARGS = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit")
# transformers enters its assisted loop when this is set; our `_get_candidate_generator` ignores it.
_ASSISTED_SWITCH = {"prompt_lookup_num_tokens": 1}
# Options of transformers' own assistant that no strategy reads (each holds its own): what to set instead.
_ASSISTANT_OPTIONS = {
    "num_assistant_tokens": "num_tokens=, e.g. hfs.PromptLookup(num_tokens=5)",
    "num_assistant_tokens_schedule": "adaptive=, e.g. hfs.PromptLookup(adaptive=False)",
    "assistant_confidence_threshold": "confidence_threshold=, e.g. hfs.DraftModel(m, confidence_threshold=0.4)",
    "max_matching_ngram_size": "max_ngram=, e.g. hfs.PromptLookup(max_ngram=3)",
}


_ACTIVE_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("hf_speculative_call", default=None)
_HOOK_LOCK = threading.Lock()
_DEFAULT_LOCK = threading.Lock()  # building a model's default strategy from its spec, once
_UNSET = object()  # `candidate_generator=` not given (None is given: speculation off for the call)
_FROM_CONFIG = "the GenerationConfig passed to generate()"
_FROM_MODEL = "model.generation_config"


# -- public API ------------------------------------------------------------------------------
def enable(model: torch.nn.Module, *, compile: bool | str | None = None,
           static_budget: int | None = None) -> torch.nn.Module:
    """Let ``model.generate()`` accept ``candidate_generator=`` and honour a default drafter in its
    ``generation_config``. Per instance and idempotent.

    A ``generation_config.candidate_generator`` spec loaded from ``generation_config.json`` (written by
    ``save_pretrained`` of an enabled model) is built into its strategy here, so that
    ``hfs.enable(AutoModelForCausalLM.from_pretrained(dir))`` drafts as the saved model did.

    Args:
        model (`PreTrainedModel`): a decoder-only model with a language modeling head.
        compile (`bool` or `str`, *optional*): verify with a ``torch.compile``-d target forward on a static
            cache, at one shape per step (every draft padded to ``static_budget`` nodes), so the graph is
            built once: ``True`` picks ``mode="reduce-overhead"`` (CUDA graphs) on CUDA and ``"default"``
            elsewhere; a string is the mode. ``False`` turns it off; ``None`` (default) leaves it as set.
            Works with drafters that read only the target's tokens and logits (prompt lookup, draft
            models, their trees, Hybrids of them); ``cache_implementation="static"`` in a call verifies on
            a static cache without compiling (EAGLE too). See docs/gpu.md.
        static_budget (`int`, *optional*): the draft nodes every static-cache step is padded to; defaults to
            the strategy's most (``tree.nodes``, or ``num_tokens`` for chains).

    Returns:
        The same model, for chaining.

    Raises:
        ValueError, FileNotFoundError: the spec in the model's generation config is bad (the message
            names the field, e.g. ``generation_config.candidate_generator.method``).
    """
    if not hasattr(model, "generate") or not hasattr(type(model), "_assisted_decoding"):
        raise TypeError(
            f"hf_speculative.enable() needs a transformers model with `generate()` (a `...ForCausalLM`), "
            f"got {type(model).__name__}."
        )
    _model_default(model)  # a bad spec fails here, not in the first generate()
    from ..core.static_cache import configure

    configure(model, compile, static_budget)
    if getattr(model, _ENABLED_FLAG, False):
        return model
    model.generate = MethodType(_generate, model)
    model.save_pretrained = MethodType(_save_pretrained, model)
    _install_loop_hooks(model)
    setattr(model, _ENABLED_FLAG, True)
    return model


def disable(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`enable`: ``model.generate`` and ``model.save_pretrained`` are transformers' own again (a
    strategy left in ``model.generation_config.candidate_generator`` is then only data to transformers)."""
    for name in _PATCHED_METHODS:
        model.__dict__.pop(name, None)
    model.__dict__.pop(_ENABLED_FLAG, None)
    return model


def is_enabled(model: torch.nn.Module) -> bool:
    return bool(getattr(model, _ENABLED_FLAG, False))


def last_stats(model: torch.nn.Module) -> SpeculativeStats | None:
    """Statistics of the last speculative ``generate()`` call on ``model`` in this thread.

    Returns ``None`` for an enabled model that has made no speculative call yet in this thread (none at all, only
    plain calls without a ``candidate_generator``, or none since ``hf_speculative.core.state.forget(model)``).

    Raises:
        RuntimeError: ``model`` was never enabled (and made no ``custom_generate=hfs.speculative_generate`` call),
            so its calls cannot have recorded statistics: call ``hfs.enable(model)`` first.
    """
    stats = getattr(state_of(model).last_stats, "stats", None)
    if stats is None and not is_enabled(model):
        raise RuntimeError(
            f"hfs.last_stats(model): this {type(model).__name__} is not enabled, so its generate() calls record no "
            "statistics. Call hfs.enable(model) before generate(..., candidate_generator=...), or generate with "
            "custom_generate=hfs.speculative_generate."
        )
    return stats


def speculative_generate(
    model: torch.nn.Module,
    input_ids: torch.LongTensor,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    candidate_generator: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    sampling_seed: int | None = None,
    speculative_loop: str | None = None,
    speculative_sampling: str | None = None,
    **model_kwargs: Any,
):
    """A ``custom_generate`` callable for models that were not enabled (transformers >= 4.57)::

        model.generate(**inputs, custom_generate=hfs.speculative_generate, candidate_generator=hfs.PromptLookup())

    Without ``candidate_generator=``, the ``candidate_generator`` of the generation config is used
    (the one passed in, else the model's own). Under sampling, ``sampling_seed=`` fixes the text (see
    :mod:`hf_speculative.core.sampling`); ``speculative_sampling="rejection"`` verifies by the rejection rule instead
    (default ``"seeded"``: the text a seed gives, whatever is drafted).

    transformers does not pass ``streamer`` or ``tokenizer`` to a ``custom_generate`` callable
    (so no streaming, and a warning when a ``streamer=`` was given, and no ``stop_strings`` on this route): use
    :func:`enable` for those.
    """
    if not compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE:
        raise RuntimeError(
            f"custom_generate=hfs.speculative_generate needs transformers >= 4.57 (installed: "
            f"{compat.TRANSFORMERS_VERSION}). Call hf_speculative.enable(model) and pass candidate_generator= instead."
        )
    if candidate_generator is None:  # the config's (transformers merged the model's own into it)
        given, default = getattr(generation_config, spec.FIELD, None), _model_default(model)
        candidate_generator = default if given is None or _is_default(given, default) else given
        if isinstance(candidate_generator, dict):
            candidate_generator = spec.from_spec(candidate_generator, model, _model_dir(model))
    if candidate_generator is None:
        raise ValueError("custom_generate=hfs.speculative_generate needs candidate_generator=, e.g. hfs.PromptLookup() "
                         "(or a generation config holding one).")
    _check_generation_config(model, generation_config)
    strategy = _check_strategy(model, candidate_generator)
    mask = model_kwargs.get("attention_mask")
    if mask is None and getattr(generation_config, "_mask_length", None) is not None:
        # transformers 5 drops an all-ones mask before calling a custom_generate callable; the position ids it made
        # from it keep its shape
        mask = model_kwargs.get("position_ids")
    check_call_inputs(input_ids, mask)
    if _batched(input_ids):
        check_batch_strategy(strategy)
    seed = None if sampling_seed is None else check_seed(sampling_seed)
    _warn_seed_unused(seed, getattr(generation_config, "do_sample", False))
    _warn_assistant_options(strategy, [name for name in _ASSISTANT_OPTIONS
                                       if _set_for_call(model, name, getattr(generation_config, name, None))])
    if streamer is None and _streamer_left_out() is not None:
        warnings.warn("streamer= is ignored under custom_generate=hfs.speculative_generate: transformers hands a "
                      "custom_generate callable no streamer (it was given the prompt only). To stream, call "
                      "hfs.enable(model) and generate(..., candidate_generator=..., streamer=...) instead.",
                      UserWarning, stacklevel=2)
    sampling = check_mode(_sampling_mode(model, speculative_sampling, generation_config, seed), seed)
    ours = _batched(input_ids) or _our_loop(speculative_loop, strategy, static=False, batched=False)
    compiled = ours and static_requested(model, False)  # a compiled model verifies on a static cache
    if compiled:
        check_strategy(strategy, compiled=True)
    logits_processor, sampler = seeded_processors(logits_processor, generation_config, seed, sampling, ours)
    if compat.cache_kwarg() in model_kwargs:
        model_kwargs[compat.cache_kwarg()] = compat.rollbackable_cache(model_kwargs[compat.cache_kwarg()])
    budget = draft_budget(strategy) if compiled else None
    with _temporary_loop_hooks(model), _call(model, strategy, seed, sampling, ours, seeded=False, static=compiled,
                                             draft_budget=budget) as call:
        # (the processors above are seeded already)
        call.stopping_criteria, call.logits_processor, call.sampler = stopping_criteria, logits_processor, sampler
        if ours:
            return entry.generate(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                  synced_gpus, call=call, **model_kwargs)
        return compat.assisted_decoding(
            model,
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            synced_gpus=synced_gpus,
            streamer=streamer,
            **model_kwargs,
        )


# -- the instance methods that enable() installs ------------------------------------------------
def _generate(self: torch.nn.Module, *args: Any, candidate_generator: Any = _UNSET, sampling_seed: Any = None,
              speculative_loop: str | None = None, speculative_sampling: str | None = None, **kwargs: Any):
    named = _named_arguments(self, args, kwargs)
    passed = named.get("generation_config")
    seed = None
    if sampling_seed is not None:
        seed = check_seed(sampling_seed)
        _warn_seed_unused(seed, _samples(self, named), stacklevel=3)
    mode = _sampling_mode(self, speculative_sampling, passed, seed)
    sampling = "seeded" if mode is None else check_mode(mode, seed)
    strategy, origin = _resolve_strategy(self, candidate_generator, passed)
    if strategy is None:
        if passed is not None and spec.FIELD in vars(passed):
            args, kwargs = _with_config(args, kwargs, _without_strategy(passed))
        if seed is None:
            return type(self).generate(self, *args, **kwargs)  # exactly transformers' call, its own draws too
        with _call(self, None, seed):  # plain decoding with the seeded draws: the text every drafter gives for the seed
            return type(self).generate(self, *args, **kwargs)
    inputs, cache = named.get("inputs", named.get("input_ids")), compat.user_cache(named)
    batched = _batched(inputs)
    try:
        strategy = _check_call(self, strategy, named, inputs, batched, cache)
    except (ValueError, TypeError) as error:
        if origin is None:
            raise
        _explain(error, origin)
    if passed is not None or _ASSISTANT_OPTIONS.keys() & named.keys():
        _warn_assistant_options(strategy, [name for name in _ASSISTANT_OPTIONS if named.get(name) is not None or (
            passed is not None and _set_for_call(self, name, getattr(passed, name, None)))], stacklevel=3)
    for name in _CONFLICTING_ARGS:
        kwargs.pop(name, None)  # explicit Nones
    static = _static_requested(self, named)
    if batched and static:
        raise ValueError("Batched speculative decoding (batch size > 1) runs on the dynamic cache: drop "
                         "cache_implementation='static' (and enable(model, compile=...)) for batches, or generate "
                         "one prompt at a time.")
    ours = (speculative_loop is None and compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE
            or _our_loop(speculative_loop, strategy, static=static, batched=batched))
    # our loop, entered as transformers' custom_generate; or, asked for, transformers' assisted loop
    extra = {} if ours else dict(_ASSISTED_SWITCH)
    if static or _default_cache_unsupported(self, named):
        # our loop builds its own static cache (room for the padded drafts); the assisted loop cannot roll one back
        extra["cache_implementation"] = None
    if passed is not None:
        # Set the switch on a copy of the user's config rather than as a kwarg beside it (which
        # transformers 5 warns about); the user's object is left untouched.
        config = _without_strategy(passed)
        for key, value in extra.items():
            setattr(config, key, value)
        extra = {}
        args, kwargs = _with_config(args, kwargs, config)
    if static:
        kwargs.pop("cache_implementation", None)
    if ours and static:  # (static is also set when the model is compiled)
        check_strategy(strategy, compiled=compiled_mode(self) is not None)
    budget = draft_budget(strategy) if static else None  # what a static step is padded to
    with _call(self, strategy, seed, sampling, ours, static=static, draft_budget=budget) as call:
        if ours:  # what transformers does not hand a custom_generate callable, the call keeps for the loop
            call.streamer, call.tokenizer, call.cache = named.get("streamer"), named.get("tokenizer"), cache
            extra["custom_generate"] = functools.partial(entry.generate, call=call)
        return type(self).generate(self, *args, **kwargs, **extra)


LOOPS = ("hf_speculative", "transformers")


def _sampling_mode(model: torch.nn.Module, keyword: str | None, passed: Any, seed: int | None = None) -> str | None:
    """The call's sampling rule: ``speculative_sampling=``, else (``sampling_seed=`` implies the seeded rule) the
    passed GenerationConfig's ``speculative_sampling``, else the model's own (saved in its ``generation_config.json``);
    ``None``: seeded."""
    if keyword is not None or seed is not None:
        return keyword
    for config in (passed, getattr(model, "generation_config", None)):
        mode = getattr(config, "speculative_sampling", None) if config is not None else None
        if mode is not None:
            return mode
    return None


def _our_loop(speculative_loop: str | None, strategy: Any, *, static: bool, batched: bool) -> bool:
    """Whether a call runs hf_speculative's loop (the default) or, with ``speculative_loop="transformers"`` (and by
    default on transformers older than 4.57, which cannot enter ours), transformers' own assisted loop (chains of one
    row on a dynamic cache: our drafters serve it as transformers ``CandidateGenerator`` s)."""
    if speculative_loop is None and not compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE:
        # our loop is entered as a custom_generate callable, which transformers takes from 4.57 on: before, chains
        # keep transformers' assisted loop, and what only our loop runs says which version it needs
        if drafts_trees(strategy) or static or batched:
            what = "draft trees" if drafts_trees(strategy) else ("static caches" if static else "batches")
            raise ValueError(f"hf_speculative's loop ({what}) needs transformers >= 4.57 (installed: "
                             f"{compat.TRANSFORMERS_VERSION}): upgrade transformers, or draft chains (tree=None) for "
                             "one prompt at a time on the dynamic cache.")
        return False
    if speculative_loop is None or speculative_loop == "hf_speculative":
        return True
    if speculative_loop != "transformers":
        raise ValueError(f"speculative_loop={speculative_loop!r}: choose one of {', '.join(map(repr, LOOPS))} "
                         "(default: 'hf_speculative').")
    if drafts_trees(strategy):
        raise ValueError("speculative_loop='transformers' verifies chains only; this strategy drafts trees (tree=...): "
                         "drop speculative_loop, or use tree=None.")
    if static or batched:
        what = "a static cache (cache_implementation='static', enable(model, compile=...))" if static else "batches"
        raise ValueError(f"speculative_loop='transformers' does not run {what}: drop speculative_loop.")
    return False


def _named_arguments(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict:
    """The call's arguments by name, as transformers' ``generate`` binds them (``**kwargs`` flattened)."""
    named = inspect.signature(type(model).generate).bind_partial(model, *args, **kwargs).arguments
    named.pop("self", None)
    named.update(named.pop("kwargs", {}))
    return named


def _check_call(model: torch.nn.Module, candidate_generator: Any, named: dict, inputs: Any, batched: bool,
                cache: Any) -> Any:
    """Validate a speculative call (``inputs``: its ``input_ids``; ``batched``: B > 1; ``cache``: the one the caller
    passed); the strategy, checked against the model."""
    for name in _CONFLICTING_ARGS:
        if named.get(name) is not None:
            raise ValueError(
                f"`candidate_generator=` and `{name}=` both choose a drafter; pass only one. "
                f"(hfs.PromptLookup() replaces prompt_lookup_num_tokens, hfs.DraftModel(m) replaces assistant_model=m.)"
            )
    if named.get("custom_generate") is not None:
        raise ValueError("`candidate_generator=` cannot be combined with `custom_generate=` on an enabled model.")
    strategy = _check_strategy(model, candidate_generator)
    _check_generation_config(model, None, named)
    if inputs is None and named.get("inputs_embeds") is not None:
        raise ValueError("Speculative decoding needs `input_ids` (drafters read the tokens); `inputs_embeds` alone is "
                         "not supported.")
    if inputs is not None:
        # drafters read the tokens: a 3-D tensor or an empty prompt would otherwise fail deep inside one
        check_input_ids(type(strategy).__name__, inputs, min_length=1)
        check_call_inputs(inputs, named.get("attention_mask"))
        if batched:
            check_batch_strategy(strategy)
    _check_cache(model, named, cache)
    return strategy


def _samples(model: torch.nn.Module, named: dict) -> bool:
    """Whether a call may sample: ``do_sample=`` if given, else either generation config (the one passed, the model's)
    saying so (how transformers merges them varies by version; this never calls a sampling call greedy)."""
    if named.get("do_sample") is not None:
        return bool(named["do_sample"])
    configs = (named.get("generation_config"), getattr(model, "generation_config", None))
    return any(getattr(config, "do_sample", False) for config in configs if config is not None)


def _warn_seed_unused(seed: int | None, samples: bool, stacklevel: int = 2) -> None:
    if seed is not None and not samples:
        warnings.warn(f"sampling_seed={seed} fixes the draws of sampling, and this call decodes greedily (do_sample is "
                      "not True), so it changes nothing: pass do_sample=True to sample, or drop sampling_seed=.",
                      UserWarning, stacklevel=stacklevel + 1)


def _set_for_call(model: torch.nn.Module, name: str, value: Any) -> bool:
    """Whether a generation config's ``value`` of field ``name`` was set for the call: neither the model's own value
    nor transformers' default (which 5.x writes into the config it hands a ``custom_generate`` callable)."""
    own = getattr(getattr(model, "generation_config", None), name, None)
    return value is not None and value != own and value != compat.generation_default(name)


def _warn_assistant_options(strategy: Any, names: list[str], stacklevel: int = 2) -> None:
    for name in names:
        warnings.warn(f"{name}= is an option of transformers' own assistant (assistant_model=, "
                      f"prompt_lookup_num_tokens=), which {type(strategy).__name__} does not read: it changes nothing "
                      f"in this call. Set the strategy's own {_ASSISTANT_OPTIONS[name]}, or drop {name}=.",
                      UserWarning, stacklevel=stacklevel + 1)


def _streamer_left_out() -> Any:
    """The ``streamer=`` given to the transformers ``generate()`` that called this ``custom_generate`` callable (the
    caller of the caller), else ``None``: transformers puts the prompt into it and hands the callable nothing, so
    its frame is the one place to see it."""
    frame = sys._getframe(2)
    if frame.f_code.co_name != "generate" or not str(frame.f_globals.get("__name__", "")).startswith("transformers."):
        return None
    return frame.f_locals.get("streamer")


def _with_config(args: tuple, kwargs: dict, config: Any) -> tuple[tuple, dict]:
    """The call's arguments with ``config`` as its generation config (given by keyword or second positional)."""
    if "generation_config" in kwargs:
        return args, {**kwargs, "generation_config": config}
    return (args[0], config, *args[2:]), kwargs


def _save_pretrained(self: torch.nn.Module, save_directory: str | os.PathLike, *args: Any, **kwargs: Any):
    """transformers' ``save_pretrained``; with a default strategy in ``generation_config.candidate_generator``,
    its spec goes into ``generation_config.json`` and a trained drafter into a subfolder
    (``strategy.save_pretrained``)."""
    strategy = _model_default(self)
    if strategy is None or not kwargs.get("is_main_process", True):
        result = type(self).save_pretrained(self, save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True) and getattr(self.generation_config, "speculative_sampling", None):
            spec.keep_field_on_load(save_directory)  # the sampling rule survives the load
        return result
    os.makedirs(save_directory, exist_ok=True)
    saved = strategy.save_pretrained(save_directory)
    if kwargs.get("push_to_hub") and saved != strategy.to_dict():
        # transformers uploads inside its save, with the spec it serialized (to_dict) and only the files it wrote
        raise ValueError(f"save_pretrained(..., push_to_hub=True) with a default {type(strategy).__name__}: "
                         "transformers uploads the folder before hf_speculative writes the drafter's spec (and its "
                         "files) into it, so the upload would miss them. Save to a folder "
                         "(model.save_pretrained(folder)), then upload the whole folder "
                         "(huggingface_hub.upload_folder(repo_id=..., folder_path=folder)).")
    result = type(self).save_pretrained(self, save_directory, *args, **kwargs)
    spec.keep_field_on_load(save_directory, saved)  # the spec of the files written, not transformers' to_dict()
    return result


def _get_candidate_generator(self: torch.nn.Module, *args: Any, **kwargs: Any):
    call = active_call(self)
    if call is None:  # transformers' own drafter (prompt_lookup_num_tokens=, assistant_model=...)
        return type(self)._get_candidate_generator(self, *args, **kwargs)
    named = compat.bind_get_candidate_generator_args(self, args, kwargs)
    # transformers < 4.57 hands the drafter the user's processors only, not the prepared list
    # (temperature, repetition penalty, ...): prefer the one recorded when it was built.
    processors = call.logits_processor if call.logits_processor is not None else named.get("logits_processor")
    if call.sampling == "rejection" and getattr(named["generation_config"], "do_sample", False):
        # transformers samples by its rejection rule: the drafter draws from its q and hands q over as its logits
        processors = LogitsProcessorList([*(processors or []), RejectionSampler()])
    call.handed_over(named["generation_config"], processors, call.stopping_criteria, named.get("model_kwargs"))
    call.generator = call.strategy.open(call)
    return call.generator


def _get_stopping_criteria(self: torch.nn.Module, *args: Any, **kwargs: Any):
    call = _ACTIVE_CALL.get()
    if call is not None and call.target is self and call.tokenizer is not None and kwargs.get("tokenizer") is None:
        kwargs["tokenizer"] = call.tokenizer  # our loop's route: transformers leaves it out (stop strings need it)
    criteria = type(self)._get_stopping_criteria(self, *args, **kwargs)
    if call is not None and call.target is self:
        call.stopping_criteria = criteria
    return criteria


def _get_logits_processor(self: torch.nn.Module, *args: Any, **kwargs: Any):
    processors = type(self)._get_logits_processor(self, *args, **kwargs)
    call = _ACTIVE_CALL.get()
    if call is None or call.target is not self:
        return processors
    if call.seeded:
        config = kwargs["generation_config"] if "generation_config" in kwargs else args[0]
        processors, sampler = seeded_processors(processors, config, call.seed, call.sampling, call.ours)
        if call.logits_processor is None:  # the call's sampling rule: the sampler that now ends the list, if any
            call.logits_processor, call.sampler = processors, sampler
    return processors


def _install_loop_hooks(model: torch.nn.Module) -> None:
    model._get_candidate_generator = MethodType(_get_candidate_generator, model)
    model._get_stopping_criteria = MethodType(_get_stopping_criteria, model)
    model._get_logits_processor = MethodType(_get_logits_processor, model)


def active_call(model: torch.nn.Module) -> Call | None:
    """The speculative call running on ``model`` in this context, or ``None`` (none, or a plain seeded one)."""
    call = _ACTIVE_CALL.get()
    return call if call is not None and call.target is model and call.strategy is not None else None


@contextlib.contextmanager
def _temporary_loop_hooks(model: torch.nn.Module):
    """For ``custom_generate`` on a model that was not enabled: the loop looks its drafter up on the
    instance, so install the (call-scoped, otherwise transparent) hooks for the duration of the call. The calls
    holding them are counted in the model's state (``hook_users``, which ``hfs.forget`` carries over)."""
    users = state_of(model).hook_users
    with _HOOK_LOCK:
        if users.count == 0 and not is_enabled(model):
            _install_loop_hooks(model)
        users.count += 1
    try:
        yield
    finally:
        with _HOOK_LOCK:
            users.count -= 1
            if users.count == 0 and not is_enabled(model):
                for name in _LOOP_HOOKS:
                    model.__dict__.pop(name, None)


@contextlib.contextmanager
def _call(model: torch.nn.Module, strategy: Any, seed: int | None, sampling: str = "seeded", ours: bool = True,
          **settings: Any):
    """Within: the call object of ``model``'s call in this context (:data:`_ACTIVE_CALL`), which the hooks transformers
    calls back read and complete. Under sampling it draws with a SeededSampler of ``seed`` (``None``: a seed drawn from
    torch's global generator when the processors are built). ``strategy`` ``None``: plain decoding (seeded), no
    statistics. ``settings``: more of the call's fields (``static``, ``seeded``)."""
    if strategy is None:  # transformers' own sampling loop reads the draws (`ours`: see seeded_processors)
        call = Call(model, seed=seed, ours=False)
        token = _ACTIVE_CALL.set(call)
        try:
            yield call
        finally:
            _ACTIVE_CALL.reset(token)
        return
    stats = SpeculativeStats(method=name_of(strategy))
    opened = strategy if isinstance(strategy, DraftStrategy) else ExternalStrategy(strategy)  # a user's raw one
    call = Call(model, stats=stats, strategy=opened, seed=seed, sampling=sampling, ours=ours, sampler=None,
                trees=drafts_trees(strategy), **settings)
    token = _ACTIVE_CALL.set(call)
    start = time.perf_counter()
    try:
        yield call
    finally:
        _ACTIVE_CALL.reset(token)
        stats.total_time_s = time.perf_counter() - start
        if call.generator is not None:
            call.generator.close()
        state_of(model).last_stats.stats = stats  # per thread; hfs.forget(model) drops it


# -- which strategy a call uses ---------------------------------------------------------------
def _resolve_strategy(model: torch.nn.Module, keyword: Any, passed_config: Any) -> tuple[Any, str | None]:
    """``(strategy or None, where it came from)``: the call's keyword (``None``: off for this call), else the
    ``candidate_generator`` of the GenerationConfig passed in, else the model's own. ``where`` is ``None`` for
    the keyword, else the config it came from (for error messages)."""
    if keyword is not _UNSET and passed_config is None:
        return keyword, None
    default = _model_default(model)
    given = None if passed_config is None else getattr(passed_config, spec.FIELD, None)
    # a copy of the model's own config (a 4.x pipeline passes one) carries the default: not the user's choice
    users = given is not None and not _is_default(given, default)
    if keyword is not _UNSET:
        if users and given is not keyword:
            warnings.warn("candidate_generator= and the GenerationConfig passed to generate() both choose a drafter; "
                          "the keyword's is used for this call.", UserWarning, stacklevel=3)
        return keyword, None
    if users:
        if isinstance(given, dict):
            given = spec.from_spec(given, model, _model_dir(model))
        return given, _FROM_CONFIG
    return default, _FROM_MODEL


def _is_default(value: Any, default: Any) -> bool:
    """Whether ``value`` is the model's default strategy, or the spec it was built from."""
    if default is None:
        return False
    return value is default or (isinstance(value, dict) and value == spec.to_spec(default))


def _model_default(model: torch.nn.Module) -> Any:
    """The strategy in ``model.generation_config.candidate_generator`` (``None`` when unset). A spec (a dict
    read from ``generation_config.json``) is built into its strategy once and put in its place."""
    config = getattr(model, "generation_config", None)
    value = getattr(config, spec.FIELD, None)
    if isinstance(value, spec.JSON_VALUES):
        with _DEFAULT_LOCK:
            value = getattr(config, spec.FIELD, None)
            if isinstance(value, spec.JSON_VALUES):
                value = spec.from_spec(value, model, _model_dir(model))
                setattr(config, spec.FIELD, value)
    if value is None or (isinstance(value, DraftStrategy) and dataclasses.is_dataclass(value)):
        return value
    if isinstance(value, type):
        _check_strategy(model, value)  # "pass an instance"
    raise TypeError(
        f"model.generation_config.candidate_generator holds a {type(value).__name__}; a model's default drafter must "
        "be one of hf_speculative's strategies (hfs.PromptLookup(), hfs.Eagle.from_pretrained(...), ...: a dataclass), "
        "because transformers copies and serializes the generation config in every call. Pass other drafters per "
        "call with candidate_generator=."
    )


def _model_dir(model: torch.nn.Module) -> str | None:
    """The folder the model was loaded from (``path`` of a spec is relative to it), if it is a local one."""
    name = str(getattr(model, "name_or_path", "") or "")
    return name if name and Path(name).is_dir() else None


def _without_strategy(config: Any) -> Any:
    """A deep copy of a GenerationConfig without its ``candidate_generator`` (never copied: it may hold a
    raw CandidateGenerator, which transformers could neither copy cheaply nor serialize)."""
    shallow = copy.copy(config)
    vars(shallow).pop(spec.FIELD, None)
    return copy.deepcopy(shallow)


def _explain(error: Exception, origin: str) -> NoReturn:
    """An error about a strategy the call did not name says where it came from and how to turn it off."""
    raise type(error)(f"{error} (The drafter comes from {origin}.candidate_generator: pass "
                      "candidate_generator=None to generate() to decode without it.)") from error


# -- validation -----------------------------------------------------------------------------
def _check_strategy(model: torch.nn.Module, candidate_generator: Any) -> Any:
    if isinstance(candidate_generator, DraftStrategy):
        candidate_generator.validate_target(model)
        return candidate_generator
    if isinstance(candidate_generator, compat.CandidateGenerator):
        return candidate_generator
    if isinstance(candidate_generator, type) and issubclass(candidate_generator, DraftStrategy):
        raise TypeError(
            f"candidate_generator= got the class {candidate_generator.__name__}; pass an instance, "
            f"e.g. candidate_generator={candidate_generator.__name__}()."
        )
    raise TypeError(
        f"candidate_generator= must be a hf_speculative strategy (hfs.PromptLookup(), hfs.DraftModel(model), ...) "
        f"or a transformers CandidateGenerator instance, got {type(candidate_generator).__name__}."
    )


def _check_generation_config(model: torch.nn.Module, config: Any, named: dict | None = None) -> None:
    """Refuse what speculation cannot do: beams, several sequences per prompt, recurrent or encoder-decoder models.
    ``named``: the call's arguments, which override ``config`` (else the model's) field by field, as in transformers."""
    if named is not None:
        given = named.get("generation_config")
        given = model.generation_config if given is None else given
        config = SimpleNamespace(num_beams=named.get("num_beams", getattr(given, "num_beams", None)),
                                 num_return_sequences=named.get("num_return_sequences",
                                                                getattr(given, "num_return_sequences", None)))
    if (config.num_beams or 1) > 1:
        raise ValueError(
            "Speculative decoding does not support beam search (num_beams > 1); use num_beams=1 "
            "(greedy or sampling), or drop candidate_generator=."
        )
    if (config.num_return_sequences or 1) > 1:
        raise ValueError(
            "Speculative decoding returns one sequence per prompt; use num_return_sequences=1 and call "
            "generate() several times (with sampling) for several samples."
        )
    if getattr(model, "_is_stateful", False):
        raise ValueError(
            f"{type(model).__name__} keeps a recurrent state that cannot be rolled back after a rejected draft; "
            "speculative decoding supports attention models with a DynamicCache only."
        )
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("hf_speculative supports decoder-only models; this one is encoder-decoder.")


def _batched(inputs: Any) -> bool:
    """Whether a call's ``input_ids`` hold several rows (B > 1: the loop with several rows, core/entry.py)."""
    return isinstance(inputs, torch.Tensor) and inputs.dim() == 2 and inputs.shape[0] > 1


def _check_cache(model: torch.nn.Module, named: dict, cache: Any) -> None:
    chosen = named.get("cache_implementation")
    passed_config = named.get("generation_config")
    if chosen is None and passed_config is not None:
        mine = getattr(passed_config, "cache_implementation", None)
        if mine != getattr(model.generation_config, "cache_implementation", None):
            chosen = mine
    if chosen in compat.UNSUPPORTED_CACHE_IMPLEMENTATIONS and chosen != "static":
        raise ValueError(
            f"cache_implementation={chosen!r} cannot be rolled back after a rejected draft; speculative decoding "
            "needs the default dynamic cache or cache_implementation='static': drop cache_implementation (or pass "
            "cache_implementation=None)."
        )
    if cache is not None and not hasattr(cache, "crop"):
        raise ValueError(
            f"a cache of type {type(cache).__name__} cannot be rolled back; pass a DynamicCache or none."
        )


def _static_requested(model: torch.nn.Module, named: dict) -> bool:
    """A static cache for this call: the model was enabled with ``compile=``, or the call (its arguments or the
    generation config passed) asks for ``cache_implementation="static"``. A model's own default static cache
    (its ``generation_config.json``) is not a request: such calls keep the dynamic cache, as before."""
    if state_of(model).compile_mode is not None:
        return True
    if named.get("cache_implementation") == "static":
        return True
    passed = named.get("generation_config")
    return (passed is not None and getattr(passed, "cache_implementation", None) == "static"
            and getattr(model.generation_config, "cache_implementation", None) != "static")


def _default_cache_unsupported(model: torch.nn.Module, named: dict) -> bool:
    if "cache_implementation" in named:
        return False
    config = named.get("generation_config") or model.generation_config
    return getattr(config, "cache_implementation", None) in compat.UNSUPPORTED_CACHE_IMPLEMENTATIONS
