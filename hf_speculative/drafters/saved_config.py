"""The file format trained drafters' configs share (EAGLE's, Medusa's): a dataclass saved as ``config.json``
with a ``format`` field naming whose it is."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar


class SavedConfig:
    """Mixin for a dataclass config: ``to_dict`` / ``from_dict`` / ``save`` with ``FORMAT`` in the file."""

    FORMAT: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - {"format"})
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {unknown}; was this file written by a newer "
                             "hf_speculative?")
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path
