"""Every difference between supported transformers versions, in one place.

Supported: transformers >= 4.45, < 6. The facts behind each shim are in the team's notes on
transformers' assisted-generation internals. Only shims live here: what differs between versions (names, signatures,
where a cache keeps its tensors) behind one function each. What is built on them lives with its user: KV-cache
surgery in ``core/kv_cache.py``, the SDPA names in ``core/sdpa.py``, a drafter's lookups of
transformers classes (``MtpModel``, the Gemma-4 assistants) in its folder.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import transformers
from packaging.version import Version
from transformers.generation.candidate_generator import CandidateGenerator  # noqa: F401  (re-exported)

TRANSFORMERS_VERSION = Version(transformers.__version__)
IS_TRANSFORMERS_5 = TRANSFORMERS_VERSION.major >= 5
# `custom_generate=<callable>` lifts the callable's extra kwargs out of `generate()` since 4.57.
SUPPORTS_CUSTOM_GENERATE_CALLABLE = TRANSFORMERS_VERSION >= Version("4.57.0")
# From 5.18 the assisted loop no longer drops the bonus token after a candidate that already
# satisfies a stopping criterion (`is_done_candidate`); it only crops at EOS and max_length.
HAS_IS_DONE_CANDIDATE_RULE = TRANSFORMERS_VERSION < Version("5.18.0")


@functools.cache
def cache_kwarg() -> str:
    """The KV cache argument's name: 5.24 renamed ``past_key_values`` to ``cache`` everywhere (model and layer
    forwards, ``generate()``, the loop's ``model_kwargs``, the mask builders; the old name is deprecated, with a
    warning; outputs keep ``.past_key_values`` as an alias). Read from the signature, which follows the rename, on
    first use: ``transformers.GenerationMixin`` imports accelerate when it is installed, which ``import
    hf_speculative`` leaves for later."""
    from transformers.generation.utils import GenerationMixin

    method = getattr(GenerationMixin, "prepare_inputs_for_generation", lambda past_key_values: None)
    return "cache" if "cache" in inspect.signature(method).parameters else "past_key_values"


def update_layer_cache(cache: Any, key: torch.Tensor, value: torch.Tensor, layer_idx: int, cos: torch.Tensor,
                       sin: torch.Tensor, layer_kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``cache.update`` as a stock attention layer calls it (for layers that run their own forward: cpu/layers.py):
    from 5.24 with the layer's keyword arguments (``kwargs=``), before with ``{"sin", "cos", "cache_position"}``,
    whose ``cache_position`` 4.x's static layers need."""
    if cache_kwarg() == "cache":
        return cache.update(key, value, layer_idx, kwargs=layer_kwargs)
    extra = {"sin": sin, "cos": cos, "cache_position": layer_kwargs.get("cache_position")}
    return cache.update(key, value, layer_idx, extra)


# Cache implementations that assisted decoding cannot roll back.
UNSUPPORTED_CACHE_IMPLEMENTATIONS = ("static", "hybrid", "sliding_window", "offloaded_static", "offloaded_hybrid",
                                     "hybrid_chunked", "mamba", "quantized", "offloaded")


def crop_cache(cache: Any, num_tokens_to_remove: int) -> None:
    """Remove the last ``num_tokens_to_remove`` positions of a ``DynamicCache``.

    Only a negative argument means "remove" on every version (a positive one is an absolute length
    up to 5.14 and an error from 5.20), and ``crop(0)`` empties the cache up to 5.12: so never call
    it with 0.
    """
    if num_tokens_to_remove > 0:
        cache.crop(-num_tokens_to_remove)


@functools.lru_cache(maxsize=None)
def _forward_params(model_cls: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_cls.forward).parameters)


def logits_to_keep_kwargs(model: torch.nn.Module, n: int) -> dict[str, int]:
    """``{"logits_to_keep": n}`` (>= 4.50) or ``{"num_logits_to_keep": n}`` (4.45-4.49) or ``{}``."""
    params = _forward_params(type(model))
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: n}
    return {}


def text_config(config: Any) -> Any:
    """The text part of a (possibly multimodal) config; ``get_text_config`` is missing on old versions."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def generation_field(generation_config: Any, name: str, default: Any) -> Any:
    """Read a ``GenerationConfig`` field with our own fallback (5.x leaves most fields ``None``)."""
    value = getattr(generation_config, name, None)
    return default if value is None else value


@functools.lru_cache(maxsize=None)
def generation_default(name: str) -> Any:
    """What transformers gives the ``GenerationConfig`` field ``name`` when neither the call nor the model sets it: its
    constructor's default (4.x), else the default ``generate()`` fills in (5.x, whose fields start as ``None``)."""
    from transformers import GenerationConfig

    defaults = getattr(GenerationConfig, "_get_default_generation_params", None)
    value = getattr(GenerationConfig(), name, None)
    return defaults().get(name, value) if value is None and defaults is not None else value


def eos_token_ids(generation_config: Any) -> list[int]:
    """The EOS ids of the call as a list (empty when the model has none)."""
    tensor = getattr(generation_config, "_eos_token_tensor", None)
    if tensor is not None:
        return [int(t) for t in tensor.reshape(-1).tolist()]
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(t) for t in eos]


def bind_get_candidate_generator_args(model: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Name the arguments of ``_get_candidate_generator``: its order changed across versions, the
    names did not (``generation_config``, ``input_ids``, ``logits_processor``, ``model_kwargs``...)."""
    signature = inspect.signature(type(model)._get_candidate_generator)
    bound = signature.bind_partial(model, *args, **kwargs)
    named = dict(bound.arguments)
    named.pop("self", None)
    named.update(named.pop("kwargs", {}) or {})
    return named


def stopping_result(value: Any) -> bool:
    """Stopping criteria return a bool (4.38 and older custom ones) or a ``[B]`` bool tensor."""
    if isinstance(value, torch.Tensor):
        return bool(value.any())
    return bool(value)


def assisted_decoding(model: Any, input_ids: torch.Tensor, **kwargs: Any) -> Any:
    """Call transformers' own ``_assisted_decoding`` on ``model`` (only the >= 4.57 signature, where
    the loop builds its candidate generator itself; used by the ``custom_generate`` route)."""
    from transformers.generation.utils import GenerationMixin

    return GenerationMixin._assisted_decoding(model, input_ids, **kwargs)


def rollbackable_cache(cache: Any) -> Any:
    """The cache an assisted loop can crop. On 4.x, ``generate()`` builds sliding-window layers
    unless it knows the call is assisted (the ``custom_generate`` route), and those cannot be
    cropped once past the window: an empty cache is swapped for a full-attention one."""
    if IS_TRANSFORMERS_5 or cache is None or cache.get_seq_length() > 0:
        return cache
    from transformers import DynamicCache

    return DynamicCache()  # full attention only: every layer can be cropped


# -- EAGLE / self-speculative building blocks ----------------------------------------------------
def rope_settings(config: Any) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) of a text config: 5.x keeps them in ``rope_parameters``
    (per layer type for Gemma3), 4.x as top-level fields."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        params = params.get("full_attention", params)
        theta = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0) or 10000.0))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        return theta, (scaling if scaling.get("rope_type", "default") != "default" else None)
    return float(getattr(config, "rope_theta", 10000.0) or 10000.0), getattr(config, "rope_scaling", None)


def llama_config(**fields: Any) -> Any:
    """A ``LlamaConfig`` for building blocks, with rope settings in the form this version reads."""
    from transformers import LlamaConfig

    rope_theta = fields.pop("rope_theta", 10000.0)
    rope_scaling = fields.pop("rope_scaling", None)
    if TRANSFORMERS_VERSION >= Version("5.0.0"):
        params = {"rope_type": "default", **(rope_scaling or {}), "rope_theta": rope_theta}
        return LlamaConfig(rope_parameters=params, **fields)
    return LlamaConfig(rope_theta=rope_theta, rope_scaling=rope_scaling, **fields)


def decoder_of(model: Any) -> Any:
    """The decoder stack (the module with ``layers`` and the final ``norm``) of a causal LM, or
    ``None`` when this model is not built that way."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    if base is not None and not hasattr(base, "layers") and hasattr(base, "language_model"):
        base = base.language_model
    if base is None or not isinstance(getattr(base, "layers", None), torch.nn.ModuleList) or not hasattr(base, "norm"):
        return None
    return base


def module_output(output: Any) -> torch.Tensor:
    """The hidden states a decoder layer returned (a tensor on 5.x, a tuple's first item on 4.x)."""
    return output[0] if isinstance(output, (tuple, list)) else output


# -- self-speculative drafting on the target's own cache ------------------------------------------
def forward_params(model_cls: type) -> frozenset[str]:
    """Names of the parameters of ``model_cls.forward``."""
    return _forward_params(model_cls)


def cache_layer_length(cache: Any, layer_idx: int) -> int:
    """Positions seen by one layer of a cache (0 for a layer not created yet)."""
    if hasattr(cache, "layers"):  # >= 4.56: a list of layer objects
        return int(cache.get_seq_length(layer_idx)) if layer_idx < len(cache.layers) else 0
    keys = getattr(cache, "key_cache", [])  # 4.45-4.55: lists of tensors
    return int(keys[layer_idx].shape[-2]) if layer_idx < len(keys) and keys[layer_idx].numel() else 0


def cache_mask_sizes(cache: Any, layer_idx: int, position: int) -> tuple[int, int]:
    """``(kv_length, kv_offset)`` of the keys one layer attends to when a single query at
    ``position`` is added: the cache's own answer (>= 4.56; its argument is the query length from
    5.0, the cache positions before), else every stored key plus the query."""
    if hasattr(cache, "get_mask_sizes") and hasattr(cache, "layers"):
        if IS_TRANSFORMERS_5:
            return tuple(int(x) for x in cache.get_mask_sizes(1, layer_idx))
        return tuple(int(x) for x in cache.get_mask_sizes(torch.tensor([position]), layer_idx))
    return cache_layer_length(cache, layer_idx) + 1, 0


def crop_cache_layer(cache: Any, layer_idx: int, num_tokens_to_remove: int) -> None:
    """Remove the last ``num_tokens_to_remove`` positions of one layer (the layers a draft wrote)."""
    if num_tokens_to_remove <= 0:
        return
    if hasattr(cache, "layers"):
        cache.layers[layer_idx].crop(-num_tokens_to_remove)
        return
    cache.key_cache[layer_idx] = cache.key_cache[layer_idx][..., :-num_tokens_to_remove, :]
    cache.value_cache[layer_idx] = cache.value_cache[layer_idx][..., :-num_tokens_to_remove, :]


def target_cache(model_kwargs: Any) -> Any:
    """The cache object the assisted loop will use for the target (``None`` if not built yet)."""
    if not isinstance(model_kwargs, dict):
        return None
    return model_kwargs.get(cache_kwarg())


def output_cache(outputs: Any) -> Any:
    """The cache a forward returned: ``outputs.cache`` from 5.24 (where ``.past_key_values`` is only a
    backward-compatible alias), ``outputs.past_key_values`` before."""
    return getattr(outputs, cache_kwarg())


def user_cache(kwargs: dict) -> Any:
    """The cache a caller passed to ``generate()``, under either name (``cache=`` from 5.24 on, where
    ``past_key_values=`` still works with a deprecation warning)."""
    return kwargs.get("cache", kwargs.get("past_key_values"))


# -- where a cache keeps its tensors (the surgery on them: core/kv_cache.py) -----------------------------
def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """Every non-empty key and value tensor of a dynamic cache (each ``[B, H, T, D]``), the tensors themselves, so
    that writes into them land in the cache: layer objects' ``keys`` / ``values`` from 4.56, the ``key_cache`` /
    ``value_cache`` lists before."""
    if hasattr(cache, "layers"):
        return [tensor for layer in cache.layers for tensor in (getattr(layer, "keys", None),
                                                                getattr(layer, "values", None))
                if isinstance(tensor, torch.Tensor) and tensor.numel()]
    return [tensor for name in ("key_cache", "value_cache") for tensor in getattr(cache, name, []) if tensor.numel()]


def replace_cache_tensors(cache: Any, fn: Any) -> None:
    """Replace every non-empty key and value tensor of a dynamic cache (``[B, H, T, D]``) with ``fn(tensor)``: layer
    objects' ``keys`` / ``values`` (>= 4.56), the ``key_cache`` / ``value_cache`` lists before."""
    if hasattr(cache, "layers"):
        for layer in cache.layers:
            for name in ("keys", "values"):
                tensor = getattr(layer, name, None)
                if isinstance(tensor, torch.Tensor) and tensor.numel():
                    setattr(layer, name, fn(tensor))
        return
    for name in ("key_cache", "value_cache"):
        tensors = getattr(cache, name, [])
        for i, tensor in enumerate(tensors):
            if tensor.numel():
                tensors[i] = fn(tensor)


def borrowed_cache(cache: Any) -> Any:
    """A dynamic cache over ``cache``'s tensors, not copies of them: its layer objects (the ``key_cache`` /
    ``value_cache`` lists before 4.56) are its own, so an update, which replaces a layer's tensors (``torch.cat``),
    a crop or a row selection changes it alone and ``cache`` stays as it was. Writes into the shared tensors
    themselves would reach both: the batch verifier writes only into tensors its own updates made."""
    import copy

    borrowed = copy.copy(cache)
    if hasattr(cache, "layers"):
        borrowed.layers = [copy.copy(layer) for layer in cache.layers]
    else:
        borrowed.key_cache, borrowed.value_cache = list(cache.key_cache), list(cache.value_cache)
    return borrowed


def sliding_cache_layers(cache: Any) -> int:
    """How many of a dynamic cache's layers keep a sliding window (they drop old positions; 4.56 on)."""
    return sum(bool(getattr(layer, "is_sliding", False)) for layer in getattr(cache, "layers", None) or [])


def cache_layer_tensors(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(keys, values)`` of every layer of a dynamic cache, each ``[B, H, T, D]`` (the tensors themselves, not
    copies): layer objects from 4.56, the ``key_cache`` / ``value_cache`` lists before (``hfs.MagicDec`` reads the
    keys and values a verifying forward wrote)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(getattr(cache, "key_cache", []), getattr(cache, "value_cache", [])))


def set_static_length(cache: Any, length: int) -> None:
    """Make a static cache's next write start at ``length``: its layers' ``cumulative_length`` where they
    keep one (5.x), set in place (two operations for all the layers, not one per layer: on a GPU each is a launch);
    versions before write where the forward's ``cache_position`` says."""
    counters = [layer.cumulative_length for layer in getattr(cache, "layers", None) or []
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
    if counters:
        torch._foreach_zero_(counters)
        torch._foreach_add_(counters, length)


def dtype_kwargs(dtype: Any) -> dict[str, Any]:
    """``{"dtype": d}`` for ``from_pretrained`` / ``from_config`` from transformers 4.56 (5.x drops
    ``torch_dtype``), ``{"torch_dtype": d}`` before."""
    return {"dtype" if TRANSFORMERS_VERSION >= Version("4.56.0") else "torch_dtype": dtype}


def recompile_limit(limit: int):
    """A context in which ``torch.compile`` may compile one function up to ``limit`` times (torch's
    ``recompile_limit``, ``cache_size_limit`` before 2.6; never lowered): several modules of one class compiled one
    per shape (EAGLE's captured regions) are recompiles of one code object, 8 by default, past which torch runs them
    eagerly. Set only around the calls that compile them, not for the process."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    return config.patch(**{name: max(getattr(config, name), limit)})
