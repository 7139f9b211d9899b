"""The DFlash drafter's shape: a self-validating dataclass, checked against its target before anything is built."""

from __future__ import annotations

import dataclasses
from typing import Any

from ... import compat, options
from .. import checkpoints as bounds

LAYER_TYPES = ("full_attention", "sliding_attention")
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "relu")
MAX_BLOCK_SIZE = options.MAX_DRAFT_TOKENS + 1  # the anchor and up to 64 drafted positions
MAX_DRAFT_LAYERS = 64


@dataclasses.dataclass
class DFlashConfig:
    """Shape of a DFlash block drafter and how it attaches to its target.

    Args:
        hidden_size (`int`): the drafter's width; equals the target's hidden size (the window is embedded with the
            target's input embedding and read out with its lm_head).
        num_hidden_layers (`int`): the number of decoder layers (Qwen3-like: QK-norm, SwiGLU MLP).
        num_attention_heads (`int`): query heads per layer.
        num_key_value_heads (`int`): key/value heads per layer.
        head_dim (`int`): the width of one head.
        intermediate_size (`int`): the MLP's inner width.
        target_layer_ids (`list[int]`): the target's decoder layers whose raw outputs (before the final norm) form
            the context, concatenated in this order; never the last layer (see :meth:`check_target`).
        block_size (`int`, defaults to 16): the window: the anchor (the last verified token) and ``block_size - 1``
            mask tokens, each drafting one position.
        mask_token_id (`int`, defaults to 0): the token id the window is filled with; below the target's vocabulary.
        vocab_size (`int`, *optional*): the target vocabulary the drafter was trained for, checked on attach.
        num_target_layers (`int`, *optional*): the target depth it was trained for, checked on attach.
        rms_norm_eps (`float`, defaults to 1e-6): the layers' RMS norms' epsilon.
        rope_theta (`float`, defaults to 1e6): the rotary embedding's base.
        max_position_embeddings (`int`, defaults to 32768): the longest position the rotary embedding serves.
        hidden_act (`str`, defaults to ``"silu"``): the MLP's activation.
        attention_bias (`bool`, defaults to `False`): biases on the attention projections.
        layer_types (`list[str]`, *optional*): ``"full_attention"`` or ``"sliding_attention"`` per layer; ``None``: all
            full.
        sliding_window (`int`, *optional*): on sliding layers a query at position ``q`` sees keys at ``k`` with
            ``|q - k| <= sliding_window`` (transformers' bidirectional window; z-lab's ``< w`` reads as ``w - 1``).
        causal (`bool`, defaults to `False`): window queries see only keys at positions up to their own (newer
            z-lab drafters' ``is_causal``); the default is DFlash's bidirectional window.
        embed_scale (`float`, *optional*): ``None``: the window is embedded by the target's embedding module as
            transformers does (Gemma's ``sqrt(H)`` scale included, an ``embed_norm`` bypassed); a number: a raw lookup
            in the target's embedding table times it (z-lab's ``input_embedding_scale``).
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    target_layer_ids: list[int]
    block_size: int = 16
    mask_token_id: int = 0
    vocab_size: int | None = None
    num_target_layers: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    hidden_act: str = "silu"
    attention_bias: bool = False
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    causal: bool = False
    embed_scale: float | None = None

    def __post_init__(self):
        owner, size = "DFlashConfig", bounds.check_size
        self.hidden_size = size(owner, "hidden_size", self.hidden_size, bounds.MAX_HIDDEN_SIZE)
        self.num_hidden_layers = size(owner, "num_hidden_layers", self.num_hidden_layers, MAX_DRAFT_LAYERS)
        self.num_attention_heads = size(owner, "num_attention_heads", self.num_attention_heads,
                                        bounds.MAX_ATTENTION_HEADS)
        self.num_key_value_heads = size(owner, "num_key_value_heads", self.num_key_value_heads,
                                        bounds.MAX_ATTENTION_HEADS)
        self.head_dim = size(owner, "head_dim", self.head_dim, bounds.MAX_HEAD_DIM)
        if self.head_dim % 2:
            raise options.OptionError(f"{owner}(head_dim={self.head_dim}): must be even (rotary embedding).")
        self.intermediate_size = size(owner, "intermediate_size", self.intermediate_size, bounds.MAX_INTERMEDIATE_SIZE)
        if self.num_attention_heads % self.num_key_value_heads:
            raise options.OptionError(f"{owner}: num_attention_heads={self.num_attention_heads} is not a multiple of "
                                      f"num_key_value_heads={self.num_key_value_heads}.")
        ids = options.bounded_items(self.target_layer_ids, 65)
        checked = [options.as_int(i) for i in ids] if ids is not None else None
        if (not checked or len(checked) > 64 or any(i is None or not 0 <= i < bounds.MAX_TARGET_LAYERS for i in checked)
                or len(set(checked)) != len(checked)):
            raise options.OptionError(f"{owner}(target_layer_ids={options.shown(self.target_layer_ids)}): must be a "
                                      f"list of 1 to 64 distinct target layer indices from 0 to "
                                      f"{bounds.MAX_TARGET_LAYERS - 1}.")
        self.target_layer_ids = checked  # their order is the order of the context's features: kept
        self.block_size = options.check_int(owner, "block_size", self.block_size, 2, MAX_BLOCK_SIZE)
        self.mask_token_id = options.check_int(owner, "mask_token_id", self.mask_token_id, 0,
                                               bounds.MAX_VOCAB_SIZE - 1)
        if self.vocab_size is not None:
            self.vocab_size = size(owner, "vocab_size", self.vocab_size, bounds.MAX_VOCAB_SIZE)
            if self.mask_token_id >= self.vocab_size:
                raise options.OptionError(f"{owner}: mask_token_id={self.mask_token_id} is outside its vocabulary "
                                          f"of {self.vocab_size}.")
        if self.num_target_layers is not None:
            self.num_target_layers = size(owner, "num_target_layers", self.num_target_layers,
                                          bounds.MAX_TARGET_LAYERS)
            outside = [i for i in self.target_layer_ids if i >= self.num_target_layers]
            if outside:  # the depth it records is its target's: refused before any target is at hand
                raise options.OptionError(f"{owner}(target_layer_ids={self.target_layer_ids}, num_target_layers="
                                          f"{self.num_target_layers}): {outside} outside the target's "
                                          f"{self.num_target_layers} layers (0..{self.num_target_layers - 1}) that "
                                          "num_target_layers records.")
        self.rms_norm_eps = options.check_number(owner, "rms_norm_eps", self.rms_norm_eps, 0.0, 1.0)
        self.rope_theta = options.check_number(owner, "rope_theta", self.rope_theta, 1.0, 1e12)
        self.max_position_embeddings = size(owner, "max_position_embeddings", self.max_position_embeddings,
                                            bounds.MAX_POSITIONS)
        bounds.check_choice(owner, "hidden_act", self.hidden_act, ACTIVATIONS)
        self.attention_bias = options.check_bool(owner, "attention_bias", self.attention_bias)
        self.causal = options.check_bool(owner, "causal", self.causal)
        if self.layer_types is not None:
            types = options.bounded_items(self.layer_types, MAX_DRAFT_LAYERS + 1)
            if types is None or len(types) != self.num_hidden_layers or any(t not in LAYER_TYPES for t in types):
                raise options.OptionError(f"{owner}(layer_types={options.shown(self.layer_types)}): must list "
                                          f"{self.num_hidden_layers} of {', '.join(LAYER_TYPES)} (one per layer).")
            self.layer_types = [str(t) for t in types]
        if self.sliding_window is not None:
            self.sliding_window = size(owner, "sliding_window", self.sliding_window, bounds.MAX_POSITIONS, low=0)
        elif "sliding_attention" in (self.layer_types or ()):
            raise options.OptionError(f"{owner}: sliding_attention layers need a sliding_window.")
        if self.embed_scale is not None:
            self.embed_scale = options.check_number(owner, "embed_scale", self.embed_scale, 1e-6, 1e6)

    @property
    def drafted(self) -> int:
        """Positions one forward drafts: ``block_size - 1``."""
        return self.block_size - 1

    def sliding(self, layer: int) -> int | None:
        """Layer ``layer``'s window, or ``None`` for full attention."""
        if self.layer_types is None or self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    @classmethod
    def for_target(cls, target_config: Any, **fields: Any) -> DFlashConfig:
        """A config shaped for ``target_config`` (its hidden size, vocabulary and depth; layers evenly spread over
        the target's depth, never its last), ``fields`` replacing any of it."""
        text = compat.text_config(target_config)
        depth = int(text.num_hidden_layers)
        heads = int(getattr(text, "num_attention_heads", 4))
        kv = int(getattr(text, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        defaults = dict(hidden_size=int(text.hidden_size), num_hidden_layers=1, num_attention_heads=heads,
                        num_key_value_heads=kv, head_dim=head_dim, intermediate_size=int(text.intermediate_size),
                        target_layer_ids=spread_layer_ids(depth, 2), vocab_size=int(text.vocab_size),
                        num_target_layers=depth, rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
                        block_size=8, mask_token_id=int(text.vocab_size) - 1)
        return cls(**{**defaults, **fields})

    def check_target(self, target: Any) -> None:
        """Raise a ValueError naming both sides unless this drafter fits ``target`` (a model or its config):
        hidden size, vocabulary and mask id, depth, and target layers inside its depth and before its last layer."""
        config = getattr(target, "config", target)
        text = compat.text_config(config)
        name = getattr(config, "_name_or_path", "") or type(config).__name__
        problems = []
        if int(text.hidden_size) != self.hidden_size:
            problems.append(f"hidden size: drafter {self.hidden_size}, target {int(text.hidden_size)}")
        vocab = int(text.vocab_size)
        if self.vocab_size is not None and self.vocab_size != vocab:
            problems.append(f"vocabulary: drafter {self.vocab_size}, target {vocab}")
        if self.mask_token_id >= vocab:
            problems.append(f"mask_token_id {self.mask_token_id} is outside the target's vocabulary of {vocab}")
        depth = int(text.num_hidden_layers)
        if self.num_target_layers is not None and self.num_target_layers != depth:
            problems.append(f"depth: drafter trained for {self.num_target_layers} target layers, target {depth}")
        outside = [i for i in self.target_layer_ids if i >= depth]
        if outside:
            problems.append(f"target_layer_ids {self.target_layer_ids}: {outside} outside the target's {depth} "
                            f"layers (0..{depth - 1})")
        elif depth - 1 in self.target_layer_ids:
            problems.append(f"target_layer_ids {self.target_layer_ids} read the target's last layer {depth - 1}, "
                            "whose hidden state transformers returns after the final norm (DFlash drafters are "
                            "trained on raw layer outputs): use layers before it")
        if problems:
            raise ValueError(f"This DFlash drafter does not fit the target {name}: " + "; ".join(problems) + ". Use "
                             "a drafter made for this target.")


def spread_layer_ids(depth: int, count: int) -> list[int]:
    """``count`` layer ids spread evenly over ``1 .. depth - 3`` (z-lab's ``build_target_layer_ids``), inside
    ``0 .. depth - 2`` for shallow targets (never the last layer)."""
    if depth < 2:
        raise ValueError(f"A DFlash drafter reads layers before the target's last one; a target of {depth} layer "
                         "has none.")
    if count == 1 or depth < 5:
        low, high = 0 if depth < 5 else 1, depth - 2 if depth < 5 else depth - 3
    else:
        low, high = 1, depth - 3
    if count == 1:
        return [(low + high) // 2]
    ids = sorted({round(low + i * (high - low) / (count - 1)) for i in range(count)})
    return ids
