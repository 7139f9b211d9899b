"""The file format trained drafters' configs share (EAGLE's, Medusa's): a dataclass saved as ``config.json``
with a ``format`` field naming whose it is."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

from .. import options

# Bounds of a trained drafter's config.json, checked before any module is built from it (docs/hosting.md)
MAX_HIDDEN_SIZE = 65_536  # hidden_size (the largest open models: 16_384)
MAX_INTERMEDIATE_SIZE = 262_144  # intermediate_size
MAX_VOCAB_SIZE = 1 << 20  # vocab_size, draft_vocab_size (the largest open vocabularies: 262_144)
MAX_ATTENTION_HEADS = 1024  # num_attention_heads, num_key_value_heads
MAX_HEAD_DIM = 4096  # head_dim
MAX_POSITIONS = 1 << 24  # max_position_embeddings
MAX_TARGET_LAYERS = options.MAX_LAYERS  # target_num_layers, exit_layer, a fused layer's index
MAX_MEDUSA_HEADS = options.MAX_DRAFT_TOKENS  # num_heads: one per drafted token
MAX_MEDUSA_LAYERS = 16  # num_layers: residual blocks per head (Medusa uses 1)


def check_size(owner: str, name: str, value: Any, high: int, low: int = 1) -> int:
    """``value`` as an ``int`` in ``[low, high]``, or a ``ValueError`` naming ``owner(name=value)`` and the bound."""
    return options.check_int(owner, name, value, low, high)


def check_choice(owner: str, name: str, value: Any, allowed: Any) -> Any:
    """``value`` if it is one of ``allowed`` (strings), else a ``ValueError`` naming the field and the choices."""
    if not isinstance(value, str) or value not in allowed:
        shown = sorted(allowed)
        listed = ", ".join(shown[:12]) + (", ..." if len(shown) > 12 else "")
        raise options.OptionError(f"{owner}({name}={options.shown(value)}): must be one of {listed}.")
    return value


class SavedConfig:
    """Mixin for a dataclass config: ``to_dict`` / ``from_dict`` / ``save`` with ``FORMAT`` in the file."""

    FORMAT: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}: config.json holds a {type(data).__name__}, not an object of fields.")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k)[:40] for k in set(data) - known - {"format"})
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {unknown[:8]}; was this file written by a newer "
                             "hf_speculative?")
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path
