"""How hf_speculative enters ``model.generate()`` without patching transformers.

``enable(model)`` sets four *instance* attributes (bound methods, so ``copy.deepcopy`` rebinds
them to the copy):

- ``generate``: pops ``candidate_generator=``, validates the call, and runs transformers' own
  assisted-generation loop (entered through its ``prompt_lookup_num_tokens`` switch);
- ``_get_candidate_generator``: the loop asks the model for its drafter; we hand it the per-call
  generator built from the strategy of *this* call;
- ``_get_stopping_criteria`` / ``_get_logits_processor``: record the call's stopping criteria (so
  that drafts stop before them) and its prepared logits processors (for drafters that sample).

The strategy of the running call lives in a ``ContextVar``, so threads never see each other's calls,
and a model without an active call behaves exactly as transformers does.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import inspect
import threading
import time
import weakref
from types import MethodType
from typing import Any

import torch

from . import compat
from .base import CallContext, DraftStrategy, ExternalCandidateGenerator, SpeculativeCandidateGenerator
from .stats import SpeculativeStats

_ENABLED_FLAG = "_hf_speculative_enabled"
_PATCHED_METHODS = ("generate", "_get_candidate_generator", "_get_stopping_criteria", "_get_logits_processor")
# Arguments that select transformers' own drafters; mixing them with ours is ambiguous.
_CONFLICTING_ARGS = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit")
# transformers enters its assisted loop when this is set; our `_get_candidate_generator` ignores it.
_ASSISTED_SWITCH = {"prompt_lookup_num_tokens": 1}


@dataclasses.dataclass
class _Call:
    model: torch.nn.Module
    strategy: Any
    stats: SpeculativeStats
    stopping_criteria: Any = None
    logits_processor: Any = None
    generator: SpeculativeCandidateGenerator | None = None


_ACTIVE_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("hf_speculative_call", default=None)
_LAST_STATS = threading.local()
_HOOK_LOCK = threading.Lock()


# -- public API ------------------------------------------------------------------------------
def enable(model: torch.nn.Module) -> torch.nn.Module:
    """Let ``model.generate()`` accept ``candidate_generator=``. Per instance and idempotent.

    Args:
        model (`PreTrainedModel`): a decoder-only model with a language modeling head.

    Returns:
        The same model, for chaining.
    """
    if not hasattr(model, "generate") or not hasattr(type(model), "_assisted_decoding"):
        raise TypeError(
            f"hf_speculative.enable() needs a transformers model with `generate()` (a `...ForCausalLM`), "
            f"got {type(model).__name__}."
        )
    if getattr(model, _ENABLED_FLAG, False):
        return model
    model.generate = MethodType(_generate, model)
    _install_loop_hooks(model)
    setattr(model, _ENABLED_FLAG, True)
    return model


def disable(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`enable`: ``model.generate`` is transformers' own again."""
    for name in _PATCHED_METHODS:
        model.__dict__.pop(name, None)
    model.__dict__.pop(_ENABLED_FLAG, None)
    return model


def is_enabled(model: torch.nn.Module) -> bool:
    return bool(getattr(model, _ENABLED_FLAG, False))


def last_stats(model: torch.nn.Module) -> SpeculativeStats | None:
    """Statistics of the last speculative ``generate()`` call on ``model`` in this thread."""
    table = getattr(_LAST_STATS, "by_model", None)
    return None if table is None else table.get(model)


def speculative_generate(
    model: torch.nn.Module,
    input_ids: torch.LongTensor,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    candidate_generator: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    **model_kwargs: Any,
):
    """A ``custom_generate`` callable for models that were not enabled (transformers >= 4.57)::

        model.generate(**inputs, custom_generate=hfs.speculative_generate, candidate_generator=hfs.PromptLookup())

    transformers does not pass ``streamer`` or ``tokenizer`` to a ``custom_generate`` callable
    (so no streaming and no ``stop_strings`` on this route): use :func:`enable` for those.
    """
    if not compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE:
        raise RuntimeError(
            f"custom_generate=hfs.speculative_generate needs transformers >= 4.57 (installed: "
            f"{compat.TRANSFORMERS_VERSION}). Call hf_speculative.enable(model) and pass candidate_generator= instead."
        )
    if candidate_generator is None:
        raise ValueError("custom_generate=hfs.speculative_generate needs candidate_generator=, e.g. hfs.PromptLookup().")
    _check_generation_config(model, generation_config)
    _check_batch(input_ids)
    strategy = _check_strategy(model, candidate_generator)
    if compat.CACHE_KWARG in model_kwargs:
        model_kwargs[compat.CACHE_KWARG] = compat.rollbackable_cache(model_kwargs[compat.CACHE_KWARG])
    with _temporary_loop_hooks(model), _speculative_call(model, strategy) as call:
        call.stopping_criteria = stopping_criteria
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
def _generate(self: torch.nn.Module, *args: Any, candidate_generator: Any = None, **kwargs: Any):
    if candidate_generator is None:
        return type(self).generate(self, *args, **kwargs)
    named = inspect.signature(type(self).generate).bind_partial(self, *args, **kwargs).arguments
    named.pop("self", None)
    named.update(named.pop("kwargs", {}))
    for name in _CONFLICTING_ARGS:
        if named.get(name) is not None:
            raise ValueError(
                f"`candidate_generator=` and `{name}=` both choose a drafter; pass only one. "
                f"(hfs.PromptLookup() replaces prompt_lookup_num_tokens, hfs.DraftModel(m) replaces assistant_model=m.)"
            )
    if named.get("custom_generate") is not None:
        raise ValueError("`candidate_generator=` cannot be combined with `custom_generate=` on an enabled model.")
    strategy = _check_strategy(self, candidate_generator)
    config = _effective_generation_config(self, named)
    _check_generation_config(self, config)
    inputs = named.get("inputs", named.get("input_ids"))
    if inputs is None and named.get("inputs_embeds") is not None:
        raise ValueError("Speculative decoding needs `input_ids` (drafters read the tokens); `inputs_embeds` alone is not supported.")
    if inputs is not None:
        _check_batch(inputs)
    _check_cache(self, named)
    kwargs = {k: v for k, v in kwargs.items() if k not in _CONFLICTING_ARGS}  # explicit Nones
    extra = dict(_ASSISTED_SWITCH)
    if _default_cache_unsupported(self, named):
        extra["cache_implementation"] = None  # the model's default static cache cannot be rolled back
    if named.get("generation_config") is not None:
        # Set the switch on a copy of the user's config rather than as a kwarg beside it (which
        # transformers 5 warns about); the user's object is left untouched.
        config = copy.deepcopy(named["generation_config"])
        for key, value in extra.items():
            setattr(config, key, value)
        extra = {}
        if "generation_config" in kwargs:
            kwargs["generation_config"] = config
        else:
            args = (args[0], config, *args[2:])
    with _speculative_call(self, strategy):
        return type(self).generate(self, *args, **kwargs, **extra)


def _get_candidate_generator(self: torch.nn.Module, *args: Any, **kwargs: Any):
    call = _ACTIVE_CALL.get()
    if call is None or call.model is not self:
        return type(self)._get_candidate_generator(self, *args, **kwargs)
    named = compat.bind_get_candidate_generator_args(self, args, kwargs)
    ctx = CallContext(
        target=self,
        generation_config=named["generation_config"],
        # transformers < 4.57 hands the drafter the user's processors only, not the prepared list
        # (temperature, repetition penalty, ...): prefer the one recorded when it was built.
        logits_processor=call.logits_processor if call.logits_processor is not None else named.get("logits_processor"),
        stopping_criteria=call.stopping_criteria,
        stats=call.stats,
        model_kwargs=named.get("model_kwargs"),
    )
    if isinstance(call.strategy, DraftStrategy):
        call.generator = call.strategy.open(ctx)
    else:
        call.generator = ExternalCandidateGenerator(ctx, call.strategy)
    return call.generator


def _get_stopping_criteria(self: torch.nn.Module, *args: Any, **kwargs: Any):
    criteria = type(self)._get_stopping_criteria(self, *args, **kwargs)
    call = _ACTIVE_CALL.get()
    if call is not None and call.model is self:
        call.stopping_criteria = criteria
    return criteria


def _get_logits_processor(self: torch.nn.Module, *args: Any, **kwargs: Any):
    processors = type(self)._get_logits_processor(self, *args, **kwargs)
    call = _ACTIVE_CALL.get()
    if call is not None and call.model is self and call.logits_processor is None:
        call.logits_processor = processors
    return processors


def _install_loop_hooks(model: torch.nn.Module) -> None:
    model._get_candidate_generator = MethodType(_get_candidate_generator, model)
    model._get_stopping_criteria = MethodType(_get_stopping_criteria, model)
    model._get_logits_processor = MethodType(_get_logits_processor, model)


@contextlib.contextmanager
def _temporary_loop_hooks(model: torch.nn.Module):
    """For ``custom_generate`` on a model that was not enabled: the loop looks its drafter up on the
    instance, so install the (call-scoped, otherwise transparent) hooks for the duration of the call."""
    with _HOOK_LOCK:
        users = model.__dict__.get("_hf_speculative_hook_users", 0)
        if users == 0 and not is_enabled(model):
            _install_loop_hooks(model)
        model.__dict__["_hf_speculative_hook_users"] = users + 1
    try:
        yield
    finally:
        with _HOOK_LOCK:
            users = model.__dict__["_hf_speculative_hook_users"] - 1
            model.__dict__["_hf_speculative_hook_users"] = users
            if users == 0:
                model.__dict__.pop("_hf_speculative_hook_users")
                if not is_enabled(model):
                    for name in _PATCHED_METHODS[1:]:
                        model.__dict__.pop(name, None)


@contextlib.contextmanager
def _speculative_call(model: torch.nn.Module, strategy: Any):
    stats = SpeculativeStats(method=getattr(strategy, "name", type(strategy).__name__))
    call = _Call(model=model, strategy=strategy, stats=stats)
    token = _ACTIVE_CALL.set(call)
    start = time.perf_counter()
    try:
        yield call
    finally:
        _ACTIVE_CALL.reset(token)
        stats.total_time_s = time.perf_counter() - start
        if call.generator is not None:
            call.generator.close()
        if not hasattr(_LAST_STATS, "by_model"):
            _LAST_STATS.by_model = weakref.WeakKeyDictionary()
        _LAST_STATS.by_model[model] = stats


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


def _effective_generation_config(model: torch.nn.Module, named: dict) -> Any:
    config = copy.deepcopy(named.get("generation_config") or model.generation_config)
    config.update(**{k: v for k, v in named.items() if hasattr(config, k) and k != "generation_config"})
    return config


def _check_generation_config(model: torch.nn.Module, config: Any) -> None:
    if compat.generation_field(config, "num_beams", 1) > 1:
        raise ValueError(
            "Speculative decoding does not support beam search (num_beams > 1); use num_beams=1 "
            "(greedy or sampling), or drop candidate_generator=."
        )
    if compat.generation_field(config, "num_return_sequences", 1) > 1:
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


def _check_batch(inputs: torch.Tensor) -> None:
    if inputs.dim() == 2 and inputs.shape[0] > 1:
        raise ValueError(
            f"Speculative decoding runs one sequence at a time (batch size 1), got batch size {inputs.shape[0]}. "
            "Call generate() once per prompt (or loop over the batch)."
        )


def _check_cache(model: torch.nn.Module, named: dict) -> None:
    chosen = named.get("cache_implementation")
    passed_config = named.get("generation_config")
    if chosen is None and passed_config is not None:
        mine = getattr(passed_config, "cache_implementation", None)
        if mine != getattr(model.generation_config, "cache_implementation", None):
            chosen = mine
    if chosen in compat.UNSUPPORTED_CACHE_IMPLEMENTATIONS:
        raise ValueError(
            f"cache_implementation={chosen!r} cannot be rolled back after a rejected draft; speculative decoding "
            "needs the default dynamic cache: drop cache_implementation (or pass cache_implementation=None)."
        )
    cache = compat.user_cache(named)
    if cache is not None and not hasattr(cache, "crop"):
        raise ValueError(
            f"a cache of type {type(cache).__name__} cannot be rolled back; pass a DynamicCache or none."
        )


def _default_cache_unsupported(model: torch.nn.Module, named: dict) -> bool:
    if "cache_implementation" in named:
        return False
    config = named.get("generation_config") or model.generation_config
    return getattr(config, "cache_implementation", None) in compat.UNSUPPORTED_CACHE_IMPLEMENTATIONS
