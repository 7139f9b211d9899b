"""Tiny random Gemma-4 pairs: a target and an assistant shaped for it (the test matrix's example, the docs' example).

Sizes follow transformers' own Gemma-4 test fixtures: every layer kind has a store layer in the target, and the
assistant attends with the target's K/V head count and head sizes (it has no K/V projections of its own).
"""

from __future__ import annotations

from typing import Any

import torch

from ... import compat
from .pairing import gemma4_assistant_classes, store_layers


def tiny_target(seed: int = 3, *, vocab_size: int = 96, hidden_size: int = 32, layers: int = 4, shared: int = 0,
                sliding_window: int = 8, eos_token_id: int | None = 1, **overrides: Any) -> torch.nn.Module:
    """A random ``Gemma4ForCausalLM`` in eval mode, seeded with ``seed``: ``layers`` alternating sliding / full
    layers (the last one full), the last ``shared`` of them reusing the K/V of the ones before (as the published
    models do), no per-layer inputs. ``overrides``: further ``Gemma4TextConfig`` fields."""
    gemma4_assistant_classes()  # an ImportError naming the transformers version needed
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    kinds[-1] = "full_attention"
    fields = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  global_head_dim=16, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                  sliding_window=sliding_window, num_kv_shared_layers=shared, layer_types=kinds,
                  eos_token_id=eos_token_id, pad_token_id=0, bos_token_id=2)
    torch.manual_seed(seed)
    return Gemma4ForCausalLM(Gemma4TextConfig(**{**fields, **overrides})).eval().requires_grad_(False)


def tiny_assistant(target: torch.nn.Module, seed: int = 7, *, hidden_size: int = 32, layers: int = 2,
                   num_tokens: int = 4, **overrides: Any) -> torch.nn.Module:
    """A random ``Gemma4AssistantForCausalLM`` for the Gemma-4 ``target``, seeded with ``seed``, in its dtype and on
    its device; ``num_tokens``: its ``generation_config.num_assistant_tokens`` (what transformers' own loop drafts).
    A ``ValueError`` when ``target`` is no Gemma-4 model."""
    (cls, *_) = gemma4_assistant_classes()
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    store = store_layers(target)
    config = compat.text_config(target.config)
    if not {"full_attention", "sliding_attention"} <= set(store):
        raise ValueError(f"{type(target).__name__} stores no K/V of both layer kinds for an assistant.")
    full, sliding = config.per_layer_config[store["full_attention"]], config.per_layer_config[store["sliding_attention"]]
    kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    kinds[-1] = "full_attention"
    fields = dict(vocab_size=config.vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=sliding.num_key_value_heads,
                  head_dim=sliding.head_dim, global_head_dim=full.head_dim,
                  hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, sliding_window=config.sliding_window,
                  rope_parameters=config.rope_parameters, layer_types=kinds,
                  attention_k_eq_v=config.attention_k_eq_v)
    if getattr(config, "num_global_key_value_heads", None) is not None:
        fields["num_global_key_value_heads"] = config.num_global_key_value_heads
    torch.manual_seed(seed)
    assistant = cls(Gemma4AssistantConfig(text_config=Gemma4TextConfig(**{**fields, **overrides}),
                                          backbone_hidden_size=config.hidden_size, use_ordered_embeddings=False))
    assistant.generation_config.num_assistant_tokens = num_tokens
    param = next(target.parameters())
    return assistant.to(param.dtype).to(param.device).eval().requires_grad_(False)
