"""The Medusa heads' configuration: a self-validating dataclass saved as ``config.json``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ... import compat, options
from .. import checkpoints as bounds
from ..checkpoints import SavedConfig

FORMAT_NAME = "hf_speculative.medusa"
LM_HEADS = ("per_head", "shared", "target")


@dataclasses.dataclass
class MedusaConfig(SavedConfig):
    """Shape of a set of Medusa heads and how they attach to their target.

    Head ``k`` (0-based) reads the target's last hidden state ``h_t`` (the final norm's output, the
    lm_head's input) at position ``t`` and guesses the token at ``t + k + 2`` (the target's own lm_head
    guesses ``t + 1``): ``num_layers`` residual blocks ``x + SiLU(W x + b)``, then a vocabulary head.

    Args:
        num_heads (`int`): how many tokens ahead the heads guess (Medusa uses 4 or 5).
        num_layers (`int`, defaults to 1): residual blocks per head.
        hidden_size (`int`): the target's hidden size.
        vocab_size (`int`): the target's vocabulary (width of its logits).
        lm_head (`str`, defaults to ``"per_head"``): the vocabulary head after the blocks. ``"per_head"``:
            each head its own trained Linear (Medusa-1/2, vLLM); ``"shared"``: one trained Linear for every
            head (vLLM's ``original_lm_head``); ``"target"``: the target's own frozen lm_head, nothing stored
            (hf_speculative's small variant: a head is then ``hidden_size**2`` parameters, not ``hidden * vocab``).
        block_bias (`bool`, defaults to `True`): whether the blocks' Linear layers have a bias (Medusa's
            do; vLLM's only with ``medusa_fc_bias``).
        target (`str`, *optional*): what the heads were trained for (a registry name or path).
        target_num_layers (`int`, *optional*): the target's depth, checked on attach.
    """

    FORMAT: ClassVar[str] = FORMAT_NAME

    num_heads: int
    hidden_size: int
    vocab_size: int
    num_layers: int = 1
    lm_head: str = "per_head"
    block_bias: bool = True
    target: str | None = None
    target_num_layers: int | None = None

    def __post_init__(self):
        # every size within its bound (drafters/checkpoints.py) before a head is built: a config.json is untrusted
        owner = "MedusaConfig"
        self.num_heads = bounds.check_size(owner, "num_heads", self.num_heads, bounds.MAX_MEDUSA_HEADS)
        self.hidden_size = bounds.check_size(owner, "hidden_size", self.hidden_size, bounds.MAX_HIDDEN_SIZE)
        self.vocab_size = bounds.check_size(owner, "vocab_size", self.vocab_size, bounds.MAX_VOCAB_SIZE)
        self.num_layers = bounds.check_size(owner, "num_layers", self.num_layers, bounds.MAX_MEDUSA_LAYERS, low=0)
        if self.target_num_layers is not None:
            self.target_num_layers = bounds.check_size(owner, "target_num_layers", self.target_num_layers,
                                                       bounds.MAX_TARGET_LAYERS)
        self.block_bias = options.check_bool(owner, "block_bias", self.block_bias)
        if self.target is not None and (not isinstance(self.target, str) or len(self.target) > 4096):
            raise options.OptionTypeError(f"{owner}(target={options.shown(self.target)}): must be a short string or null.")
        if not isinstance(self.lm_head, str) or self.lm_head not in LM_HEADS:
            raise ValueError(f"MedusaConfig(lm_head={options.shown(self.lm_head)}): use one of {list(LM_HEADS)}.")

    @classmethod
    def for_target(cls, target_config: Any, num_heads: int = 4, **overrides: Any) -> "MedusaConfig":
        """Heads shaped for ``target_config`` (a transformers config)."""
        text = compat.text_config(target_config)
        fields = dict(num_heads=num_heads, hidden_size=int(text.hidden_size), vocab_size=int(text.vocab_size),
                      target_num_layers=int(text.num_hidden_layers),
                      target=getattr(target_config, "_name_or_path", None) or None)
        fields.update(overrides)
        return cls(**fields)

    def check_target(self, target: Any) -> None:
        """Raise ``ValueError`` naming both sides unless ``target`` (a causal LM) fits these heads."""
        text = compat.text_config(target.config)
        name = getattr(target, "name_or_path", "") or type(target).__name__
        head = target.get_output_embeddings()
        width = int(getattr(head, "out_features", 0) or text.vocab_size)
        problems = []
        if int(text.hidden_size) != self.hidden_size:
            problems.append(f"hidden size: heads {self.hidden_size}, target {text.hidden_size}")
        if width != self.vocab_size and int(text.vocab_size) != self.vocab_size:
            problems.append(f"vocabulary: heads {self.vocab_size}, target {width}")
        layers = int(text.num_hidden_layers)
        if self.target_num_layers is not None and self.target_num_layers != layers:
            problems.append(f"depth: heads trained on a {self.target_num_layers}-layer target, target has {layers}")
        if problems:
            trained = options.escaped(self.target or "an unnamed target", 200)  # a config.json's string
            raise ValueError(f"These Medusa heads (trained for {trained}) do not fit the "
                             f"target {name!r}: " + "; ".join(problems) + ". Use heads trained for this model "
                             "(`hf-speculative train-medusa --target ...`).")
