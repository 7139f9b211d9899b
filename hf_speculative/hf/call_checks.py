"""The checks of one ``generate()`` call's arguments, before anything runs, and what they decide for the call.

Speculation cannot do everything ``generate()`` takes: beams, several sequences per prompt, a second drafter, a cache
that cannot be rolled back are refused here, each with an error naming the fix, because deep in the loop the same
mistakes would fail obscurely or silently change the text. The same arguments decide the call's route (our loop or
transformers' assisted loop: :func:`our_loop`), its sampling rule (:func:`sampling_mode`) and its cache
(:func:`static_cache_asked`); arguments that change nothing in a speculative call (a seed without sampling,
transformers' own assistant's options) warn. What the call's *strategy* must be able to do, read from its declared
capabilities, is :mod:`hf_speculative.hf.checks`'.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from types import SimpleNamespace
from typing import Any

import torch

from .. import compat
from .checks import check_batch_strategy, check_call_inputs, drafts_trees
from .drafter_source import check_candidate_generator
from ..core.policy import check_input_ids
from ..core.state import state_of

LOOPS = ("hf_speculative", "transformers")
# Arguments that select transformers' own drafters; mixing them with ours is ambiguous.
CONFLICTING_ARGS = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit")
# transformers enters its assisted loop when this is set; our `_get_candidate_generator` ignores it.
ASSISTED_SWITCH = {"prompt_lookup_num_tokens": 1}
# Options of transformers' own assistant that no strategy reads (each holds its own): what to set instead.
ASSISTANT_OPTIONS = {
    "num_assistant_tokens": "num_tokens=, e.g. hfs.PromptLookup(num_tokens=5)",
    "num_assistant_tokens_schedule": "adaptive=, e.g. hfs.PromptLookup(adaptive=False)",
    "assistant_confidence_threshold": "confidence_threshold=, e.g. hfs.DraftModel(m, confidence_threshold=0.4)",
    "max_matching_ngram_size": "max_ngram=, e.g. hfs.PromptLookup(max_ngram=3)",
}


def sampling_mode(model: torch.nn.Module, keyword: str | None, passed: Any, seed: int | None = None) -> str | None:
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


def our_loop(speculative_loop: str | None, strategy: Any, *, static: bool, batched: bool) -> bool:
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


def named_arguments(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict:
    """The call's arguments by name, as transformers' ``generate`` binds them (``**kwargs`` flattened)."""
    named = inspect.signature(type(model).generate).bind_partial(model, *args, **kwargs).arguments
    named.pop("self", None)
    named.update(named.pop("kwargs", {}))
    return named


def check_call(model: torch.nn.Module, candidate_generator: Any, named: dict, inputs: Any, batched: bool,
               cache: Any) -> Any:
    """Validate a speculative call (``inputs``: its ``input_ids``; ``batched``: B > 1; ``cache``: the one the caller
    passed); the strategy, checked against the model."""
    for name in CONFLICTING_ARGS:
        if named.get(name) is not None:
            raise ValueError(
                f"`candidate_generator=` and `{name}=` both choose a drafter; pass only one. "
                f"(hfs.PromptLookup() replaces prompt_lookup_num_tokens, hfs.DraftModel(m) replaces assistant_model=m.)"
            )
    if named.get("custom_generate") is not None:
        raise ValueError("`candidate_generator=` cannot be combined with `custom_generate=` on an enabled model.")
    strategy = check_candidate_generator(model, candidate_generator)
    check_generation_config(model, None, named)
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


def check_generation_config(model: torch.nn.Module, config: Any, named: dict | None = None) -> None:
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


def may_sample(model: torch.nn.Module, named: dict) -> bool:
    """Whether a call may sample: ``do_sample=`` if given, else either generation config (the one passed, the model's)
    saying so (how transformers merges them varies by version; this never calls a sampling call greedy)."""
    if named.get("do_sample") is not None:
        return bool(named["do_sample"])
    configs = (named.get("generation_config"), getattr(model, "generation_config", None))
    return any(getattr(config, "do_sample", False) for config in configs if config is not None)


def warn_seed_unused(seed: int | None, samples: bool, stacklevel: int = 2) -> None:
    if seed is not None and not samples:
        warnings.warn(f"sampling_seed={seed} fixes the draws of sampling, and this call decodes greedily (do_sample is "
                      "not True), so it changes nothing: pass do_sample=True to sample, or drop sampling_seed=.",
                      UserWarning, stacklevel=stacklevel + 1)


def set_for_call(model: torch.nn.Module, name: str, value: Any) -> bool:
    """Whether a generation config's ``value`` of field ``name`` was set for the call: neither the model's own value
    nor transformers' default (which 5.x writes into the config it hands a ``custom_generate`` callable)."""
    own = getattr(getattr(model, "generation_config", None), name, None)
    return value is not None and value != own and value != compat.generation_default(name)


def warn_assistant_options(strategy: Any, names: list[str], stacklevel: int = 2) -> None:
    for name in names:
        warnings.warn(f"{name}= is an option of transformers' own assistant (assistant_model=, "
                      f"prompt_lookup_num_tokens=), which {type(strategy).__name__} does not read: it changes nothing "
                      f"in this call. Set the strategy's own {ASSISTANT_OPTIONS[name]}, or drop {name}=.",
                      UserWarning, stacklevel=stacklevel + 1)


def streamer_left_out() -> Any:
    """The ``streamer=`` given to the transformers ``generate()`` that called this ``custom_generate`` callable (the
    caller of the caller), else ``None``: transformers puts the prompt into it and hands the callable nothing, so
    its frame is the one place to see it."""
    frame = sys._getframe(2)
    if frame.f_code.co_name != "generate" or not str(frame.f_globals.get("__name__", "")).startswith("transformers."):
        return None
    return frame.f_locals.get("streamer")


def with_config(args: tuple, kwargs: dict, config: Any) -> tuple[tuple, dict]:
    """The call's arguments with ``config`` as its generation config (given by keyword or second positional)."""
    if "generation_config" in kwargs:
        return args, {**kwargs, "generation_config": config}
    return (args[0], config, *args[2:]), kwargs


def is_batched(inputs: Any) -> bool:
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


def static_cache_asked(model: torch.nn.Module, named: dict) -> bool:
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


def default_cache_unsupported(model: torch.nn.Module, named: dict) -> bool:
    if "cache_implementation" in named:
        return False
    config = named.get("generation_config") or model.generation_config
    return getattr(config, "cache_implementation", None) in compat.UNSUPPORTED_CACHE_IMPLEMENTATIONS
