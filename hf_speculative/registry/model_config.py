"""A model folder's ``config.json`` bounded before transformers builds anything from it.

transformers allocates every layer its config describes before it reads a byte of the weights, so a
``num_hidden_layers`` of 10⁶ beside a few kilobytes of weights builds for minutes and gigabytes. Here the
config's sizes are read (a capped JSON read) and checked one by one (positive integers under caps far above
any open model), then the parameters they describe are compared with what the folder's weight files hold:
a safetensors file by its header (the tensors it declares, never more than its bytes on disk), any other
weights file by its size. Used by ``hfs.load_model(folder)`` and by a ``draft-model`` spec's folder.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from ..options import escaped, shown
from . import integrity

__all__ = ["ConfigRefused", "check_model_config", "MAX_PARAMS_PER_BYTE", "SIZE_CAPS"]

# a config may describe at most this many parameters per byte of its weights (4 bits a parameter at the least)
MAX_PARAMS_PER_BYTE = 4
# (field, other names transformers' configs give it, cap): caps far above the largest open models
SIZE_CAPS = (
    ("num_hidden_layers", ("n_layer", "num_layers", "n_layers"), 4096),
    ("hidden_size", ("n_embd", "d_model", "dim"), 65_536),
    ("intermediate_size", ("n_inner", "ffn_dim", "d_ff"), 262_144),
    ("num_attention_heads", ("n_head", "num_heads", "n_heads"), 1024),
    ("num_key_value_heads", ("n_kv_heads", "num_kv_heads"), 1024),
    ("vocab_size", ("n_vocab",), 1 << 22),
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
MAX_HEADER_BYTES = 16 << 20  # a safetensors header read here (a 405B model's shard: under 100 KB)
_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
                "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1, "F4": 1, "F6_E2M3": 1,
                "F6_E3M2": 1}


class ConfigRefused(ValueError):
    """A model folder's config.json whose sizes are not sizes, or describe far more than its weights hold."""


def check_model_config(folder: str | os.PathLike, what: str) -> None:
    """Raise :class:`ConfigRefused` (naming ``what``, the file, the field and the fix) unless ``folder``'s
    ``config.json`` gives sane sizes whose parameters its weight files can hold. A folder without a config.json
    or without weight files beside it (a Hub-cache layout transformers resolves itself) is left to transformers."""
    folder = Path(folder)
    try:
        path = integrity.folder_file(folder, "config.json", f"{what} config.json")
        if not path.is_file():
            return
        config = integrity.read_json_capped(path, f"{what} config.json")
    except integrity.FileRefused as error:
        raise ConfigRefused(str(error)) from None
    if not isinstance(config, dict):
        raise ConfigRefused(f"{what}: its config.json ({escaped(path)}) holds no JSON object; use the model's own "
                            "config.json.")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    sizes = {}
    for key, aliases, cap in SIZE_CAPS:
        name = next((k for k in (key, *aliases) if text.get(k) is not None), None)
        if name is None:
            continue
        value = text[name]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cap:
            raise ConfigRefused(f"{what}: its config.json's {name} is {shown(value)}, not a size (an integer from 1 to "
                                f"{cap:,}; {escaped(path)}); refused before anything is built. Use the config.json "
                                "saved with the model's weights.")
        sizes[key] = value
    h, n, v = sizes.get("hidden_size", 0), sizes.get("num_hidden_layers", 0), sizes.get("vocab_size", 0)
    i = sizes.get("intermediate_size", 4 * h)
    params = n * (4 * h * h + 3 * h * i) + 2 * v * h  # a decoder's count (an overestimate under GQA or tying)
    weights = weight_bytes(folder)
    if weights is None:
        return
    if params > MAX_PARAMS_PER_BYTE * weights + (1 << 20):
        raise ConfigRefused(f"{what}: its config.json describes about {params:,} parameters (num_hidden_layers {n:,}, "
                            f"hidden_size {h:,}, intermediate_size {i:,}, vocab_size {v:,}), far more than its "
                            f"{weights:,} bytes of weights hold ({escaped(folder)}); refused before anything is "
                            "allocated. Use the config.json saved with these weights.")


def weight_bytes(folder: Path) -> int | None:
    """The bytes of weights ``folder`` holds (its weight files and the shards its ``*.index.json`` name), or
    ``None`` without any; a safetensors file counts the tensors its header declares, at most its bytes on disk."""
    names = {p.name for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES}
    for index in folder.glob("*.index.json"):
        try:
            shards = integrity.read_json_capped(index, escaped(index)).get("weight_map", {})
        except (integrity.FileRefused, AttributeError):
            continue  # transformers reports a broken index itself
        names.update(s for s in (shards.values() if isinstance(shards, dict) else ()) if isinstance(s, str))
    total, found = 0, False
    for name in sorted(names):
        try:
            path = integrity.folder_file(folder, name, "weights")
            fd, st = integrity.open_regular(path, "weights")
        except (integrity.FileRefused, OSError):
            continue  # what is refused or missing here, check_model_folder or transformers reports
        try:
            found = True
            total += _safetensors_bytes(fd, st.st_size) if name.endswith(".safetensors") else st.st_size
        finally:
            os.close(fd)
    return total if found else None


def _safetensors_bytes(fd: int, size: int) -> int:
    """The bytes of the tensors a safetensors header declares, at most those the file holds after it (a header
    claiming more than the file has is no weight); an unreadable header counts as nothing."""
    head = os.pread(fd, 8, 0)
    if len(head) < 8:
        return 0
    (length,) = struct.unpack("<Q", head)
    if length > min(MAX_HEADER_BYTES, size - 8):
        return 0
    try:
        header = json.loads(os.pread(fd, length, 8))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return 0
    declared = 0
    for name, entry in header.items() if isinstance(header, dict) else ():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        numel = 1
        for dim in entry.get("shape") or ():
            numel = min(numel * (dim if isinstance(dim, int) and dim >= 0 else 0), 1 << 62)  # a forged shape stays cheap
        declared += numel * _DTYPE_BYTES.get(entry.get("dtype"), 1)
    return min(declared, size - 8 - length)
