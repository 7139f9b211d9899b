"""What a Gemma-4 assistant reads of its target, and the checks that the two fit.

A Gemma-4 assistant (transformers' ``Gemma4AssistantForCausalLM``) has no K/V projections and no cache of its own:
every layer attends to the K/V of the target's last *store* layer of its kind (``full_attention`` /
``sliding_attention``; ``config.kv_sharing_modes`` says which layers store). Those are the K/V the target's own
cache holds for those layers after a verify: post-``k_norm``, post-RoPE keys and ``v_norm``'d values, the very
tensors ``return_shared_kv_states=True`` returns (a store layer publishes what ``cache.update`` returned). Reading the
cache after the loop kept the accepted path gives exactly the verified prefix, with nothing of rejected drafts.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import compat
from ...core import kv_cache

KINDS = ("full_attention", "sliding_attention")  # the assistant's masks read both (create_attention_masks)
GEMMA4_ASSISTANT_VERSION = "5.24"  # transformers' first version with Gemma4AssistantForCausalLM used here


def gemma4_assistant_classes() -> tuple[type, ...]:
    """transformers' Gemma-4 assistant classes (``Gemma4AssistantForCausalLM``, and
    ``Gemma4UnifiedAssistantForCausalLM`` where it exists); an ``ImportError`` naming the version needed on a transformers without them (4.x)."""
    try:
        from transformers import Gemma4AssistantForCausalLM
    except ImportError:
        raise ImportError(
            f"Gemma-4 assistants need transformers' Gemma4AssistantForCausalLM, which transformers "
            f"{compat.TRANSFORMERS_VERSION} lacks: pip install \"transformers>={GEMMA4_ASSISTANT_VERSION}\".") from None
    try:
        from transformers import Gemma4UnifiedAssistantForCausalLM
    except ImportError:
        return (Gemma4AssistantForCausalLM,)
    return (Gemma4AssistantForCausalLM, Gemma4UnifiedAssistantForCausalLM)


class AssistantMismatch(ValueError):
    """The assistant cannot draft for this target (architecture, sizes, vocabulary, layer kinds)."""


def store_layers(target: torch.nn.Module) -> dict[str, int]:
    """``{layer kind: index}`` of the target's store layers (the last non-shared layer of each kind), whose K/V the
    assistant reads. Raises :class:`AssistantMismatch` naming what is needed when ``target`` is no Gemma-4 model."""
    config = compat.text_config(target.config)
    modes = getattr(type(config), "kv_sharing_modes", None)
    if not isinstance(modes, property):
        raise AssistantMismatch(
            f"hfs.Assistant drafts for Gemma-4 targets (Gemma4ForCausalLM, Gemma4ForConditionalGeneration, or the "
            f"Unified ones), whose layers store K/V for an assistant (config.kv_sharing_modes); "
            f"{type(target).__name__} (model_type {getattr(config, 'model_type', None)!r}) has none. Use a Gemma-4 "
            "target with its published assistant (google/gemma-4-E2B-it with google/gemma-4-E2B-it-assistant).")
    kinds = list(config.layer_types)
    return {kind: i for i, (kind, mode) in enumerate(zip(kinds, config.kv_sharing_modes)) if mode == "store"}


def check_pair(assistant: torch.nn.Module, target: torch.nn.Module) -> dict[str, int]:
    """Raise :class:`AssistantMismatch` naming both sides unless ``assistant`` can draft for ``target``; returns the
    target's store layers (:func:`store_layers`)."""
    store = store_layers(target)
    config, own = compat.text_config(target.config), assistant.config.get_text_config()
    name = type(assistant).__name__
    if assistant.config.backbone_hidden_size != config.hidden_size:
        raise AssistantMismatch(
            f"{name} was made for a target of hidden size {assistant.config.backbone_hidden_size} "
            f"(config.backbone_hidden_size), but {type(target).__name__} has hidden_size {config.hidden_size}; use "
            "the assistant published with this target.")
    vocab = target.get_output_embeddings().weight.shape[0]
    if own.vocab_size != config.vocab_size or assistant.lm_head.weight.shape[0] != vocab:
        raise AssistantMismatch(
            f"{name} has a vocabulary of {own.vocab_size} tokens and {type(target).__name__} one of "
            f"{config.vocab_size} (lm_head {vocab}): the assistant shares the target's tokenizer; use the assistant "
            "published with this target.")
    needed = sorted(set(KINDS) | set(own.layer_types))
    missing = [kind for kind in needed if kind not in store]
    if missing:
        raise AssistantMismatch(
            f"{name} reads the K/V of the target's {', '.join(needed)} layers, but {type(target).__name__} stores "
            f"{sorted(store) or 'none'} (config.kv_sharing_modes {list(config.kv_sharing_modes)}): no layer of kind "
            f"{', '.join(missing)} stores K/V for an assistant.")
    for i, kind in enumerate(own.layer_types):
        mine, theirs = own.per_layer_config[i], config.per_layer_config[store[kind]]
        if (mine.head_dim, mine.num_key_value_heads) != (theirs.head_dim, theirs.num_key_value_heads):
            raise AssistantMismatch(
                f"{name}'s layer {i} ({kind}) attends with {mine.num_key_value_heads} K/V heads of size "
                f"{mine.head_dim}, but the target's store layer {store[kind]} keeps {theirs.num_key_value_heads} of "
                f"size {theirs.head_dim}; use the assistant published with this target.")
    return store


def sliding_reach(assistant: torch.nn.Module) -> int | None:
    """How many of the newest sliding-attention K/V one assistant query sees (``None``: all). transformers builds the
    assistant's sliding mask from the right edge, and with several queries a later row sees further back; asked
    once with one query, the answer lets every row of a tree's depth get only those entries, so that each sees
    exactly what a single query (transformers' own chain drafting) sees."""
    config = assistant.config.get_text_config()
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    keys = 2 * int(window) + 4
    param = next(assistant.parameters())
    states = torch.zeros(1, 1, keys, 1, dtype=param.dtype, device=param.device)
    masks = assistant.create_attention_masks(
        torch.zeros(1, 1, config.hidden_size, dtype=param.dtype, device=param.device),
        torch.ones(1, keys, dtype=torch.long, device=param.device),
        {"full_attention": (states, states), "sliding_attention": (states, states)})
    mask = masks.get("sliding_attention")
    if mask is None:
        return None
    seen = mask if mask.dtype == torch.bool else mask == 0  # a bool mask (SDPA) or an additive one (eager)
    return int(seen.reshape(-1, keys)[0].sum())


def shared_kv(cache: Any, store: dict[str, int], length: int, reach: int | None) -> dict | None:
    """``{kind: (K, V)}`` `[1, H_kv, T, D]` of the target's store layers over the verified prefix ``[0, length)``, read
    from its cache (the sliding kind's newest ``reach`` only); ``None`` when the cache does not hold exactly that
    prefix (a forward not seen): the drafter then drafts nothing."""
    layers = getattr(cache, "layers", None)
    if layers is None or kv_cache.cache_length(cache) != length or length == 0:
        return None
    out = {}
    for kind, index in store.items():
        if index >= len(layers) or not isinstance(getattr(layers[index], "keys", None), torch.Tensor):
            return None
        keys, values = layers[index].keys, layers[index].values  # [1, H_kv, T', D]; T' < length on a sliding layer
        if keys.shape[-2] != length and (kind != "sliding_attention" or keys.shape[-2] > length):
            return None
        start = 0 if reach is None or kind != "sliding_attention" else max(keys.shape[-2] - reach, 0)
        out[kind] = (keys[:, :, start:], values[:, :, start:])
    return out
