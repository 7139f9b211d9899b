"""The EAGLE drafter's configuration: a self-validating dataclass saved as ``config.json``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ... import compat, options
from .. import checkpoints as bounds
from ..checkpoints import SavedConfig

FORMAT_NAME = "hf_speculative.eagle"


@dataclasses.dataclass
class EagleConfig(SavedConfig):
    """Shape of an EAGLE drafter and how it attaches to its target.

    Args:
        version (`int`): 1 (EAGLE-1, also the weights EAGLE-2 runs with) or 3 (EAGLE-3).
        hidden_size (`int`): the drafter's width; equals the target's hidden size.
        intermediate_size (`int`), num_attention_heads (`int`), num_key_value_heads (`int`),
            head_dim (`int`), rms_norm_eps (`float`), rope_theta (`float`), rope_scaling (`dict`, *optional*),
            max_position_embeddings (`int`), hidden_act (`str`), attention_bias (`bool`), mlp_bias (`bool`):
            the decoder layer's shape, in transformers' Llama terms.
        vocab_size (`int`): the target's vocabulary (width of the target's logits).
        draft_vocab_size (`int`, *optional*): EAGLE-3's own lm_head width (a subset of the target's
            vocabulary, mapped by ``d2t``); defaults to ``vocab_size``. EAGLE-1 always uses the
            target's lm_head.
        target_layers (`list[int]`): EAGLE-3: indices of the target's decoder layers whose outputs
            are fused (low, middle, high); EAGLE-1: empty (the target's final, normed hidden state).
        fc_bias (`bool`): whether ``fc`` has a bias (SafeAILab EAGLE-1 checkpoints do).
        input_layernorm (`bool`): EAGLE-1: whether the decoder layer normalises its input
            (SafeAILab's layer 0 does not). EAGLE-3 always normalises both halves of its input.
        norm_before_residual (`bool`): EAGLE-3: the residual stream starts from the *normed* feature
            (a vLLM speculators variant); by default it starts from the feature itself.
        target_num_layers (`int`, *optional*): the target's depth, checked on attach.
        target (`str`, *optional*): what the drafter was trained for (a registry name or path).
        exit_layer (`int`, *optional*): makes the network an *exit adapter* (Kangaroo, Liu et al.
            2024) for ``hfs.EarlyExit(exit_layer=k, adapter=...)``: at every draft step the target runs
            its first ``k`` layers on the drafted token (on its own cache), and the network reads that
            token's exit state (the output of layer ``k - 1`` through the target's final norm) instead
            of the previous position's features. An EAGLE-3-shaped network with ``target_layers = [k - 1]``.
    """

    FORMAT: ClassVar[str] = FORMAT_NAME

    version: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int | None = None
    draft_vocab_size: int | None = None
    target_layers: list[int] = dataclasses.field(default_factory=list)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 8192
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    fc_bias: bool = False
    input_layernorm: bool = False
    norm_before_residual: bool = False
    target_num_layers: int | None = None
    target: str | None = None
    exit_layer: int | None = None

    def __post_init__(self):
        if self.version not in (1, 3) or isinstance(self.version, bool):
            raise ValueError(f"EagleConfig(version={options.shown(self.version)}): must be 1 (EAGLE-1/2) or 3 (EAGLE-3).")
        self._check_fields()
        if self.exit_layer is not None:
            if self.version != 3 or int(self.exit_layer) < 1:
                raise ValueError(f"EagleConfig(exit_layer={self.exit_layer!r}): an exit adapter is EAGLE-3 shaped "
                                 "(version=3) and reads the output of the first exit_layer >= 1 layers.")
            self.exit_layer = int(self.exit_layer)
            if not self.target_layers:
                self.target_layers = [self.exit_layer - 1]
            if [int(i) for i in self.target_layers] != [self.exit_layer - 1]:
                raise ValueError(f"EagleConfig(exit_layer={self.exit_layer}, target_layers={self.target_layers}): an "
                                 f"exit adapter reads only layer {self.exit_layer - 1}'s output (target_layers=[exit_layer - 1]).")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.draft_vocab_size is None:
            self.draft_vocab_size = self.vocab_size
        self.target_layers = [int(i) for i in self.target_layers]
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                     "head_dim", "draft_vocab_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"EagleConfig({name}={getattr(self, name)}): must be >= 1.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"EagleConfig: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads}).")
        if self.version == 1 and self.draft_vocab_size != self.vocab_size:
            raise ValueError("EagleConfig: an EAGLE-1 drafter uses the target's lm_head; draft_vocab_size must equal "
                             "vocab_size (reduced vocabularies are an EAGLE-3 feature).")
        if self.version == 3 and self.exit_layer is None and len(self.target_layers) != 3:
            raise ValueError(f"EagleConfig(target_layers={self.target_layers}): EAGLE-3 fuses exactly three target "
                             "layers (low, middle, high), e.g. [1, L // 2 - 1, L - 4] for an L-layer target.")
        if self.version == 1 and self.norm_before_residual:
            raise ValueError("EagleConfig(norm_before_residual=True) is an EAGLE-3 variant; EAGLE-1 has no hidden_norm.")
        if self.version == 1 and self.target_layers:
            raise ValueError("EagleConfig: EAGLE-1 reads the target's final hidden state; target_layers must be empty.")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"EagleConfig: draft_vocab_size ({self.draft_vocab_size}) exceeds vocab_size ({self.vocab_size}).")
        depth = self.target_num_layers
        if depth is not None:  # the depth of its target, recorded: refused here, before any target is at hand
            problems = []
            if any(i >= depth for i in self.target_layers):
                problems.append(f"fused layers {self.target_layers} outside the target's 0..{depth - 1}")
            if self.exit_layer is not None and self.exit_layer >= depth:
                problems.append(f"exit after layer {self.exit_layer}, target has {depth} layers")
            if problems:
                raise ValueError(f"EagleConfig(target_layers={self.target_layers}, exit_layer={self.exit_layer}, "
                                 f"target_num_layers={depth}): " + "; ".join(problems) + ": config.json's "
                                 "target_layers, exit_layer or target_num_layers is wrong.")

    def _check_fields(self) -> None:
        """Every field's type and documented bound (``drafters/checkpoints.py``), before anything is built from
        them: a config.json is untrusted input. Errors name the field: ``EagleConfig(hidden_size='x'): must be ...``."""
        owner = "EagleConfig"
        sizes = {"hidden_size": bounds.MAX_HIDDEN_SIZE, "intermediate_size": bounds.MAX_INTERMEDIATE_SIZE,
                 "num_attention_heads": bounds.MAX_ATTENTION_HEADS, "num_key_value_heads": bounds.MAX_ATTENTION_HEADS,
                 "vocab_size": bounds.MAX_VOCAB_SIZE, "max_position_embeddings": bounds.MAX_POSITIONS}
        optional = {"head_dim": bounds.MAX_HEAD_DIM, "draft_vocab_size": bounds.MAX_VOCAB_SIZE,
                    "target_num_layers": bounds.MAX_TARGET_LAYERS, "exit_layer": bounds.MAX_TARGET_LAYERS}
        for name, high in sizes.items():
            setattr(self, name, bounds.check_size(owner, name, getattr(self, name), high))
        for name, high in optional.items():
            if getattr(self, name) is not None:
                setattr(self, name, bounds.check_size(owner, name, getattr(self, name), high))
        if not isinstance(self.target_layers, (list, tuple)) or len(self.target_layers) > 3:
            raise options.OptionError(f"{owner}(target_layers={options.shown(self.target_layers)}): must be a list of "
                                      "at most three layer indices.")
        self.target_layers = [bounds.check_size(owner, "target_layers", i, bounds.MAX_TARGET_LAYERS - 1, low=0)
                              for i in self.target_layers]
        self.rms_norm_eps = options.check_number(owner, "rms_norm_eps", self.rms_norm_eps, 0.0, 1.0)
        self.rope_theta = options.check_number(owner, "rope_theta", self.rope_theta, 1.0, 1e12)
        for name in ("attention_bias", "mlp_bias", "fc_bias", "input_layernorm", "norm_before_residual"):
            setattr(self, name, options.check_bool(owner, name, getattr(self, name)))
        for name in ("target",):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or len(value) > 4096):
                raise options.OptionTypeError(f"{owner}({name}={options.shown(value)}): must be a short string or null.")
        from transformers.activations import ACT2FN

        bounds.check_choice(owner, "hidden_act", self.hidden_act, ACT2FN.keys())
        if self.rope_scaling is not None:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            if not isinstance(self.rope_scaling, dict) or len(self.rope_scaling) > 32:
                raise options.OptionTypeError(f"{owner}(rope_scaling={options.shown(self.rope_scaling)}): must be an "
                                              "object of rope settings (rope_type, factor, ...) or null.")
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            bounds.check_choice(owner, "rope_scaling.rope_type", kind, {"default", *ROPE_INIT_FUNCTIONS})

    @property
    def feature_size(self) -> int:
        """Width of the target features the drafter reads: H (EAGLE-1, exit adapters) or 3H (EAGLE-3)."""
        return self.hidden_size * (len(self.target_layers) if self.version == 3 else 1)

    @property
    def is_exit_adapter(self) -> bool:
        return self.exit_layer is not None

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size != self.vocab_size

    @classmethod
    def for_target(cls, target_config: Any, version: int = 3, draft_vocab_size: int | None = None,
                   target_layers: list[int] | None = None, **overrides: Any) -> "EagleConfig":
        """A drafter shaped like one decoder layer of ``target_config`` (a transformers config)."""
        text = compat.text_config(target_config)
        layers = int(text.num_hidden_layers)
        if version == 3 and target_layers is None:
            target_layers = default_target_layers(layers)
        rope_theta, rope_scaling = compat.rope_settings(text)
        fields = dict(
            version=version, hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
            num_attention_heads=text.num_attention_heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
            vocab_size=text.vocab_size, draft_vocab_size=draft_vocab_size if version == 3 else None,
            target_layers=list(target_layers or []) if version == 3 else [],
            rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)), rope_theta=rope_theta, rope_scaling=rope_scaling,
            max_position_embeddings=int(getattr(text, "max_position_embeddings", 8192)),
            hidden_act=getattr(text, "hidden_act", None) or getattr(text, "hidden_activation", "silu"),
            target_num_layers=layers,
        )
        fields.update(overrides)
        return cls(**fields)

    def check_target(self, target: Any) -> None:
        """Raise ``ValueError`` naming both sides unless ``target`` (a causal LM) fits this drafter."""
        text = compat.text_config(target.config)
        name = getattr(target, "name_or_path", "") or type(target).__name__
        head = target.get_output_embeddings()
        width = int(getattr(head, "out_features", 0) or text.vocab_size)
        layers = int(text.num_hidden_layers)
        problems = []
        if int(text.hidden_size) != self.hidden_size:
            problems.append(f"hidden size: drafter {self.hidden_size}, target {text.hidden_size}")
        if width != self.vocab_size and int(text.vocab_size) != self.vocab_size:
            problems.append(f"vocabulary: drafter {self.vocab_size}, target {width}")
        if self.target_num_layers is not None and self.target_num_layers != layers:
            problems.append(f"depth: drafter trained on a {self.target_num_layers}-layer target, target has {layers}")
        if any(not 0 <= i < layers for i in self.target_layers):
            problems.append(f"fused layers {self.target_layers} outside the target's 0..{layers - 1} (target_layers)")
        if self.exit_layer is not None and self.exit_layer >= layers:
            problems.append(f"exit after layer {self.exit_layer}, target has {layers} layers")
        if problems:
            kind, flag = ("exit adapter", f" --exit-layer {self.exit_layer}") if self.exit_layer else ("EAGLE drafter", "")
            trained = options.escaped(self.target or "an unnamed target", 200)  # a config.json's string
            raise ValueError(
                f"This {kind} (trained for {trained}) does not fit the target {name!r}: "
                + "; ".join(problems) + f". Use {'an' if kind[0] in 'AEIOUaeiou' else 'a'} {kind} trained for this "
                f"model (`hf-speculative train-eagle --model ...{flag}`)."
            )


def default_target_layers(num_layers: int) -> list[int]:
    """EAGLE-3's low / middle / high layers (outputs of layers 1, L/2 - 1 and L - 4, as SpecForge)."""
    return [1, max(num_layers // 2 - 1, 0), max(num_layers - 4, 0)]
