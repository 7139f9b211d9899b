"""How hf_speculative enters ``model.generate()`` without patching transformers: the public surface and the
``generate()`` route.

``enable(model)`` sets five *instance* attributes (bound methods, so ``copy.deepcopy`` rebinds
them to the copy):

- ``generate``: resolves the call's strategy (the ``candidate_generator=`` keyword, else the one in
  the ``GenerationConfig`` passed in, else the model's own ``generation_config.candidate_generator``;
  the keyword ``None`` turns speculation off: :mod:`~hf_speculative.hf.drafter_source`), validates the call
  (:mod:`~hf_speculative.hf.call_checks`), and runs transformers' ``generate`` with
  hf_speculative's loop as its ``custom_generate`` callable (:mod:`hf_speculative.core.entry`): transformers
  prepares the processors, stopping criteria, length limit and cache; our loop verifies the drafts. With
  ``speculative_loop="transformers"`` it runs transformers' own assisted loop instead (entered through its
  ``prompt_lookup_num_tokens`` switch), where our drafters serve as its ``CandidateGenerator`` s;
- ``save_pretrained``: writes the model's default strategy into ``generation_config.json`` as a spec
  (and a trained drafter beside the model; see ``spec.py``);
- ``_get_candidate_generator``, ``_get_stopping_criteria`` / ``_get_logits_processor``: the hooks transformers'
  loop calls back, which read the running call from the package's one ``ContextVar``
  (:mod:`~hf_speculative.hf.loop_hooks`).

``speculative_generate`` takes the same route for one call on a model that was not enabled, as a
``custom_generate`` callable, with the hooks installed for the duration of the call.
"""

from __future__ import annotations

import functools
import os
import warnings
from types import MethodType
from typing import Any

import torch

from .. import compat
from . import spec
from ..core import entry
from .call_checks import (ASSISTANT_OPTIONS, ASSISTED_SWITCH, CONFLICTING_ARGS, LOOPS, check_call,
                          check_generation_config, default_cache_unsupported, is_batched, may_sample, named_arguments,
                          our_loop, sampling_mode, set_for_call, static_cache_asked, streamer_left_out,
                          warn_assistant_options, warn_seed_unused, with_config)
from .checks import check_batch_strategy, check_call_inputs, check_strategy, draft_budget
from .drafter_source import (UNSET, check_candidate_generator, explain, is_default, model_default, model_dir,
                             resolve_strategy, without_strategy)
from .loop_hooks import (ENABLED_FLAG, LOOP_HOOKS, active_call, install_loop_hooks, is_enabled, running_call,
                         temporary_loop_hooks)
from ..core.sampling import check_mode, check_seed, seeded_processors
from ..core.static_cache import compiled_mode, static_requested
from ..core.state import state_of
from ..core.stats import SpeculativeStats

# the names users may import from here (the hooks' and the checks' own modules hold them)
__all__ = ["LOOPS", "active_call", "disable", "enable", "is_enabled", "last_stats", "speculative_generate"]

_PATCHED_METHODS = ("generate", "save_pretrained", *LOOP_HOOKS)


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
    model_default(model)  # a bad spec fails here, not in the first generate()
    from ..core.static_cache import configure

    configure(model, compile, static_budget)
    if getattr(model, ENABLED_FLAG, False):
        return model
    model.generate = MethodType(_generate, model)
    model.save_pretrained = MethodType(_save_pretrained, model)
    install_loop_hooks(model)
    setattr(model, ENABLED_FLAG, True)
    return model


def disable(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`enable`: ``model.generate`` and ``model.save_pretrained`` are transformers' own again (a
    strategy left in ``model.generation_config.candidate_generator`` is then only data to transformers)."""
    for name in _PATCHED_METHODS:
        model.__dict__.pop(name, None)
    model.__dict__.pop(ENABLED_FLAG, None)
    return model


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
        given, default = getattr(generation_config, spec.FIELD, None), model_default(model)
        candidate_generator = default if given is None or is_default(given, default) else given
        if isinstance(candidate_generator, dict):
            candidate_generator = spec.from_spec(candidate_generator, model, model_dir(model))
    if candidate_generator is None:
        raise ValueError("custom_generate=hfs.speculative_generate needs candidate_generator=, e.g. hfs.PromptLookup() "
                         "(or a generation config holding one).")
    check_generation_config(model, generation_config)
    strategy = check_candidate_generator(model, candidate_generator)
    mask = model_kwargs.get("attention_mask")
    if mask is None and getattr(generation_config, "_mask_length", None) is not None:
        # transformers 5 drops an all-ones mask before calling a custom_generate callable; the position ids it made
        # from it keep its shape
        mask = model_kwargs.get("position_ids")
    check_call_inputs(input_ids, mask)
    if is_batched(input_ids):
        check_batch_strategy(strategy)
    seed = None if sampling_seed is None else check_seed(sampling_seed)
    warn_seed_unused(seed, getattr(generation_config, "do_sample", False))
    warn_assistant_options(strategy, [name for name in ASSISTANT_OPTIONS
                                      if set_for_call(model, name, getattr(generation_config, name, None))])
    if streamer is None and streamer_left_out() is not None:
        warnings.warn("streamer= is ignored under custom_generate=hfs.speculative_generate: transformers hands a "
                      "custom_generate callable no streamer (it was given the prompt only). To stream, call "
                      "hfs.enable(model) and generate(..., candidate_generator=..., streamer=...) instead.",
                      UserWarning, stacklevel=2)
    sampling = check_mode(sampling_mode(model, speculative_sampling, generation_config, seed), seed)
    ours = is_batched(input_ids) or our_loop(speculative_loop, strategy, static=False, batched=False)
    compiled = ours and static_requested(model, False)  # a compiled model verifies on a static cache
    if compiled:
        check_strategy(strategy, compiled=True)
    logits_processor, sampler = seeded_processors(logits_processor, generation_config, seed, sampling, ours)
    if compat.cache_kwarg() in model_kwargs:
        model_kwargs[compat.cache_kwarg()] = compat.rollbackable_cache(model_kwargs[compat.cache_kwarg()])
    budget = draft_budget(strategy) if compiled else None
    with temporary_loop_hooks(model), running_call(model, strategy, seed, sampling, ours, seeded=False,
                                                   static=compiled, draft_budget=budget) as call:
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
def _generate(self: torch.nn.Module, *args: Any, candidate_generator: Any = UNSET, sampling_seed: Any = None,
              speculative_loop: str | None = None, speculative_sampling: str | None = None, **kwargs: Any):
    named = named_arguments(self, args, kwargs)
    passed = named.get("generation_config")
    seed = None
    if sampling_seed is not None:
        seed = check_seed(sampling_seed)
        warn_seed_unused(seed, may_sample(self, named), stacklevel=2)
    mode = sampling_mode(self, speculative_sampling, passed, seed)
    sampling = "seeded" if mode is None else check_mode(mode, seed)
    strategy, origin = resolve_strategy(self, candidate_generator, passed)
    if strategy is None:
        if passed is not None and spec.FIELD in vars(passed):
            args, kwargs = with_config(args, kwargs, without_strategy(passed))
        if seed is None:
            return type(self).generate(self, *args, **kwargs)  # exactly transformers' call, its own draws too
        # plain decoding with the seeded draws: the text every drafter gives for the seed
        with running_call(self, None, seed):
            return type(self).generate(self, *args, **kwargs)
    inputs, cache = named.get("inputs", named.get("input_ids")), compat.user_cache(named)
    batched = is_batched(inputs)
    try:
        strategy = check_call(self, strategy, named, inputs, batched, cache)
    except (ValueError, TypeError) as error:
        if origin is None:
            raise
        explain(error, origin)
    if passed is not None or ASSISTANT_OPTIONS.keys() & named.keys():
        warn_assistant_options(strategy, [name for name in ASSISTANT_OPTIONS if named.get(name) is not None or (
            passed is not None and set_for_call(self, name, getattr(passed, name, None)))], stacklevel=2)
    for name in CONFLICTING_ARGS:
        kwargs.pop(name, None)  # explicit Nones
    static = static_cache_asked(self, named)
    if batched and static:
        raise ValueError("Batched speculative decoding (batch size > 1) runs on the dynamic cache: drop "
                         "cache_implementation='static' (and enable(model, compile=...)) for batches, or generate "
                         "one prompt at a time.")
    ours = (speculative_loop is None and compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE
            or our_loop(speculative_loop, strategy, static=static, batched=batched))
    # our loop, entered as transformers' custom_generate; or, asked for, transformers' assisted loop
    extra = {} if ours else dict(ASSISTED_SWITCH)
    if static or default_cache_unsupported(self, named):
        # our loop builds its own static cache (room for the padded drafts); the assisted loop cannot roll one back
        extra["cache_implementation"] = None
    if passed is not None:
        # Set the switch on a copy of the user's config rather than as a kwarg beside it (which
        # transformers 5 warns about); the user's object is left untouched.
        config = without_strategy(passed)
        for key, value in extra.items():
            setattr(config, key, value)
        extra = {}
        args, kwargs = with_config(args, kwargs, config)
    if static:
        kwargs.pop("cache_implementation", None)
    if ours and static:  # (static is also set when the model is compiled)
        check_strategy(strategy, compiled=compiled_mode(self) is not None)
    budget = draft_budget(strategy) if static else None  # what a static step is padded to
    with running_call(self, strategy, seed, sampling, ours, static=static, draft_budget=budget) as call:
        if ours:  # what transformers does not hand a custom_generate callable, the call keeps for the loop
            call.streamer, call.tokenizer, call.cache = named.get("streamer"), named.get("tokenizer"), cache
            extra["custom_generate"] = functools.partial(entry.generate, call=call)
        return type(self).generate(self, *args, **kwargs, **extra)


def _save_pretrained(self: torch.nn.Module, save_directory: str | os.PathLike, *args: Any, **kwargs: Any):
    """transformers' ``save_pretrained``; with a default strategy in ``generation_config.candidate_generator``,
    its spec goes into ``generation_config.json`` and a trained drafter into a subfolder
    (``strategy.save_pretrained``)."""
    strategy = model_default(self)
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
