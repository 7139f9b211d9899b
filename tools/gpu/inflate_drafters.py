"""The shipped drafters inflated with their target (``inflate.py``): the same proposals at the large shape's cost.

Each network widens by the rules of ``inflate.py`` (real channels first, zero elsewhere, head_dim kept, RMSNorm
weights times sqrt(d / D) and eps times d / D), with the shape's hidden size, heads and MLP width (its own layer as
wide as one of the target's, as published EAGLE-3 drafters for Llama-3.1-8B are), its depth and vocabulary kept:

- EAGLE (1 and 3): ``fc`` reads concatenated hidden-wide parts (EAGLE-3: the target's three layers; EAGLE-1: the
  embedding and the feature), and EAGLE-3's q/k/v read ``[norm(embedding) ; norm(hidden)]``: each part's real
  channels go to the start of its wider part. The draft vocabulary (its ``lm_head`` rows, ``d2t``) is kept.
- DFlash: ``fc`` over its target layers as EAGLE's; its per-head q/k norms (over head_dim, which does not widen)
  would see the hidden norms' eps ``c eps`` too, so q and k are multiplied by sqrt(c) before them:
  ``norm(sqrt(c) q)`` with ``c eps`` is ``norm(q)`` with ``eps`` (RMSNorm is scale-invariant but for eps).
- Medusa: each residual block ``x + SiLU(W x + b)`` in the top-left block of a wider one (extra channels: 0 + SiLU(0)).

The layer indices the drafters read stay valid (the extra target layers come after the real ones); their recorded
target depth becomes the large one, and EAGLE's and Medusa's ``target`` field says ``inflated (cost model)``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from .inflate import COST_MODEL, marker
from .widening import Shape, channels, check_fits, materialized, put, put_linear, widening

METHODS = ("eagle", "dflash", "medusa")


def label(small_name: str, shape: Shape) -> str:
    """The ``target`` field of an inflated drafter's config."""
    return f"{COST_MODEL}: {small_name} -> {shape.name}"


def _built(cls: Any, config: Any, small: torch.nn.Module, like: torch.nn.Module) -> torch.nn.Module:
    """``cls(config)`` on ``like``'s device and dtype, every weight zero, its buffers ``small``'s, in eval mode."""
    param = next(like.parameters())
    with torch.device("meta"):
        net = cls(config)
    return materialized(net, small, param.device, param.dtype)


def _segments(linear: torch.nn.Linear, hidden: int) -> int:
    """How many hidden-wide parts a Linear's input concatenates."""
    assert linear.in_features % hidden == 0, (linear.in_features, hidden)  # the configs' checks guarantee it
    return linear.in_features // hidden


# -- EAGLE -------------------------------------------------------------------------------------------------
def inflate_eagle(net: Any, shape: Shape, target_layers: int, like: torch.nn.Module, target: str) -> Any:
    """An :class:`EagleDraftModel` of ``shape`` proposing what ``net`` proposes, on ``like``'s device and dtype."""
    from hf_speculative.drafters.eagle.model import EagleDraftModel

    config = net.config
    widen = widening(config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                     config.intermediate_size, shape, "The EAGLE drafter")
    big_config = dataclasses.replace(
        config, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
        rms_norm_eps=widen.eps(config.rms_norm_eps), target_num_layers=target_layers, target=target)
    big = _built(EagleDraftModel, big_config, net, like)
    with torch.no_grad():
        hidden = torch.arange(widen.hidden)
        put_linear(big.fc, net.fc, hidden, channels(widen.hidden, widen.big_hidden, _segments(net.fc, widen.hidden)))
        layer, big_layer = net.midlayer, big.midlayer
        widen.attention(big_layer.self_attn, layer.self_attn, _segments(layer.self_attn.q_proj, widen.hidden))
        widen.mlp(big_layer.mlp, layer.mlp)
        for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
            if hasattr(layer, norm):
                widen.norm(getattr(big_layer, norm), getattr(layer, norm))
        if config.version == 3:
            widen.norm(big.norm, net.norm)
            put_linear(big.lm_head, net.lm_head, torch.arange(config.draft_vocab_size), hidden)
    return big


# -- DFlash ------------------------------------------------------------------------------------------------
def inflate_dflash(net: Any, shape: Shape, target_layers: int, like: torch.nn.Module) -> Any:
    """A :class:`DFlashDraftModel` of ``shape`` proposing what ``net`` proposes (its draft vocabulary kept)."""
    from hf_speculative.drafters.dflash.model import DFlashDraftModel

    config = net.config
    widen = widening(config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                     config.intermediate_size, shape, "The DFlash drafter")
    big_config = dataclasses.replace(
        config, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
        rms_norm_eps=widen.eps(config.rms_norm_eps), num_target_layers=target_layers)
    big = _built(DFlashDraftModel, big_config, net, like)
    with torch.no_grad():
        hidden, per_head = torch.arange(widen.hidden), torch.arange(config.head_dim)
        put_linear(big.fc, net.fc, hidden, channels(widen.hidden, widen.big_hidden, _segments(net.fc, widen.hidden)))
        widen.norm(big.hidden_norm, net.hidden_norm)
        for layer, big_layer in zip(net.layers, big.layers):
            # q and k times sqrt(c) before their per-head norms, whose eps became c * eps (module docstring)
            widen.attention(big_layer.self_attn, layer.self_attn, qk_scale=widen.norm_scale)
            for norm in ("q_norm", "k_norm"):
                put(getattr(big_layer.self_attn, norm).weight, getattr(layer.self_attn, norm).weight, per_head)
            widen.mlp(big_layer.mlp, layer.mlp)
            widen.norm(big_layer.input_layernorm, layer.input_layernorm)
            widen.norm(big_layer.post_attention_layernorm, layer.post_attention_layernorm)
        widen.norm(big.norm, net.norm)
    big.set_draft_vocab(None if net.draft_vocab is None else net.draft_vocab.clone())
    return big


# -- Medusa ------------------------------------------------------------------------------------------------
def inflate_medusa(heads: Any, shape: Shape, target_layers: int, like: torch.nn.Module, target: str) -> Any:
    """:class:`MedusaHeads` of ``shape``'s hidden size proposing what ``heads`` propose."""
    from hf_speculative.drafters.medusa.model import MedusaHeads

    config = heads.config
    check_fits("The Medusa heads", shape, hidden_size=config.hidden_size)
    big_config = dataclasses.replace(config, hidden_size=shape.hidden_size, target_num_layers=target_layers,
                                     target=target)
    big = _built(MedusaHeads, big_config, heads, like)
    hidden, vocab = torch.arange(config.hidden_size), torch.arange(config.vocab_size)
    with torch.no_grad():
        for blocks, big_blocks in zip(heads.blocks, big.blocks):
            for layer, big_layer in zip(blocks.layers, big_blocks.layers):
                put_linear(big_layer, layer, hidden, hidden)
        for name in ("lm_heads", "lm_head"):
            small_heads, wide_heads = getattr(heads, name, None), getattr(big, name, None)
            if small_heads is None:
                continue
            pairs = zip(small_heads, wide_heads) if name == "lm_heads" else [(small_heads, wide_heads)]
            for small_head, wide_head in pairs:
                put_linear(wide_head, small_head, vocab, hidden)
    return big


# -- strategies ----------------------------------------------------------------------------------------------
def load_shipped(method: str, name: str, small: torch.nn.Module) -> Any:
    """The shipped ``method`` drafter (one of ``METHODS``) of the registry model ``name``, for ``small``."""
    import hf_speculative as hfs

    if method == "eagle":
        return hfs.Eagle.from_pretrained(name, target=small)
    if method == "dflash":
        return hfs.DFlash.from_pretrained(name, target=small)
    if method == "medusa":
        return hfs.Medusa.from_pretrained(name, target=small, tree="calibrated")
    raise ValueError(f"--drafters: {method!r} is not one of {', '.join(METHODS)}.")


def inflate_strategy(strategy: Any, big: torch.nn.Module, shape: Shape, small_name: str) -> Any:
    """``strategy`` (an EAGLE, DFlash or Medusa strategy for the small target) with its network inflated for
    ``big`` (the inflated target), its other options kept; checked against ``big``."""
    import hf_speculative as hfs

    layers, target = int(big.config.num_hidden_layers), label(small_name, shape)
    if isinstance(strategy, hfs.Eagle):
        inflated = dataclasses.replace(strategy, drafter=inflate_eagle(strategy.drafter, shape, layers, big, target))
    elif isinstance(strategy, hfs.DFlash):
        inflated = dataclasses.replace(strategy, network=inflate_dflash(strategy.network, shape, layers, big))
    elif isinstance(strategy, hfs.Medusa):
        inflated = dataclasses.replace(strategy, heads=inflate_medusa(strategy.heads, shape, layers, big, target))
    else:
        raise TypeError(f"inflate: {type(strategy).__name__} has no network to inflate; EAGLE, DFlash and Medusa do.")
    inflated.validate_target(big)
    return inflated


def save_strategy(strategy: Any, folder: Path, dtype: torch.dtype | None = None, shape: Shape | None = None,
                  small_name: str | None = None) -> Path:
    """Write an inflated strategy's network where its ``from_pretrained`` reads it, with ``inflated.json`` beside
    (the cost-model marker, as the target's config holds one)."""
    import hf_speculative as hfs
    from hf_speculative.drafters.eagle.checkpoints import save_pretrained

    network = strategy.spec_network()
    if dtype is not None:
        network.to(dtype)
    if isinstance(strategy, hfs.Eagle):
        save_pretrained(network, folder)
    elif isinstance(strategy, hfs.DFlash):
        strategy.save_pretrained_network(folder)
    else:  # Medusa: its heads, and its tree where it drafts one (from_pretrained(tree="calibrated") reads tree.json)
        from hf_speculative.drafters.medusa import checkpoints as medusa_checkpoints
        from hf_speculative.drafters.medusa.drafter import TREE_FILE

        medusa_checkpoints.save_pretrained(network, folder)
        if strategy.tree is not None:
            strategy.tree.save(Path(folder) / TREE_FILE)
    note = marker(small_name, shape) if shape is not None else {"label": COST_MODEL}
    (Path(folder) / "inflated.json").write_text(json.dumps(note, indent=1) + "\n")
    return Path(folder)
