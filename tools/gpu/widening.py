"""Shapes, and where a small network's channels, heads and layers go in a wider copy (``inflate.py``'s rules).

Every helper writes into a zeroed wider network: the small weights' block at the real channels' indices (copied run
by run of consecutive indices), times a factor where a norm needs one, and nothing anywhere else.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class Shape:
    """A target shape at the small model's ``head_dim``: its widths, not its head count (``inflate.py``'s docstring).

    Args:
        name (`str`): what tables call it.
        hidden_size, num_layers, intermediate_size (`int`): the large model's.
        num_heads, num_kv_heads (`int`): query and key/value heads of the small model's ``head_dim``.
    """

    name: str
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int


# Small shapes for tests and the CPU dry run (SmolLM2-135M: hidden 576, 30 layers, 9/3 heads of 64, MLP 1536).
SMALL_SHAPES = {
    "smollm2-wide": Shape("smollm2-wide", 640, 32, 1664, 16, 4),  # 9/3 heads (groups of 3) -> 16/4 (groups of 4)
}


def shipped_shape(name: str, head_dim: int) -> Shape:
    """``name`` from ``SMALL_SHAPES`` or the package's shipped real-size configs (``hf_speculative/bench/configs``),
    its attention widths counted in heads of ``head_dim``."""
    if name in SMALL_SHAPES:
        return SMALL_SHAPES[name]
    from hf_speculative.bench.profile import CONFIG_DIR, shipped_configs

    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"--shape {name!r}: use one of {', '.join([*SMALL_SHAPES, *shipped_configs()])}, or give "
                         "--hidden, --layers, --intermediate, --heads and --kv-heads.")
    cfg = json.loads(path.read_text())
    own = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * own, cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * own
    if q % head_dim or kv % head_dim:
        raise ValueError(f"--shape {name}: its attention widths ({q}, {kv}) are not multiples of the small model's "
                         f"head_dim {head_dim}; give the heads with --heads and --kv-heads.")
    return Shape(name, cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], q // head_dim,
                 kv // head_dim)


# -- where the small model's channels go ----------------------------------------------------------------
def head_slots(heads: int, kv_heads: int, big_heads: int, big_kv_heads: int) -> list[int]:
    """The large model's query head for each small one, so that each keeps its key/value head: with groups of
    ``g = heads / kv_heads`` and ``G = big_heads / big_kv_heads``, small head ``i`` (key/value head ``i // g``) goes to
    slot ``(i // g) * G + i % g`` (key/value head ``i // g`` of the large model too)."""
    group, big_group = heads // kv_heads, big_heads // big_kv_heads
    if big_heads % big_kv_heads or big_kv_heads < kv_heads or big_group < group:
        raise ValueError(f"cannot place {heads} query heads in groups of {group} over {kv_heads} key/value heads into "
                         f"{big_heads} heads over {big_kv_heads}: the large shape needs whole groups, at least "
                         f"{kv_heads} key/value heads and groups of at least {group} (--heads, --kv-heads).")
    return [(i // group) * big_group + i % group for i in range(heads)]


def channels(width: int, big_width: int, segments: int = 1) -> torch.Tensor:
    """Indices in a large input of ``segments`` concatenated parts of ``big_width`` of the small input's ``segments``
    parts of ``width`` (the real channels first in each part): `[segments * width]`."""
    return torch.cat([torch.arange(width) + k * big_width for k in range(segments)])


def head_channels(slots: list[int], head_dim: int) -> torch.Tensor:
    """Indices of the heads ``slots`` in a projection's rows (or ``o_proj``'s columns): `[len(slots) * head_dim]`."""
    return torch.cat([torch.arange(head_dim) + s * head_dim for s in slots])


def runs(index: torch.Tensor) -> list[tuple[int, int, int]]:
    """``index`` `[n]` as runs of consecutive values: ``(start in index, start value, length)`` each."""
    values, out, start = index.tolist(), [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            out.append((start, values[start], i - start))
            start = i
    return out


@torch.no_grad()
def put(big: torch.Tensor, small: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor | None = None,
        scale: float = 1.0) -> None:
    """``big[rows][:, cols] = small * scale`` in place (``cols`` ``None``: a vector, ``big[rows]``), copied block by
    block over the runs of consecutive indices; a ``scale`` is applied in float64 and rounded once."""
    value = small.detach().to(big.device)
    value = (value.double() * scale if scale != 1.0 else value).to(big.dtype)
    for at, row, height in runs(rows):
        if cols is None:
            big[row:row + height] = value[at:at + height]
            continue
        for at_col, col, width in runs(cols):
            big[row:row + height, col:col + width] = value[at:at + height, at_col:at_col + width]


def put_linear(big: torch.nn.Linear, small: torch.nn.Linear, rows: torch.Tensor, cols: torch.Tensor,
               scale: float = 1.0) -> None:
    """A Linear's weight block (and its bias's rows), times ``scale``."""
    put(big.weight, small.weight, rows, cols, scale)
    if small.bias is not None:
        put(big.bias, small.bias, rows, None, scale)


@dataclasses.dataclass(frozen=True)
class Widening:
    """How one network's channels map into its wider copy: ``hidden`` (d) -> ``big_hidden`` (D), heads into
    ``q_slots`` / ``kv_slots``, ``intermediate`` MLP channels first."""

    hidden: int
    big_hidden: int
    head_dim: int
    q_slots: list[int]
    kv_slots: list[int]
    intermediate: int

    @property
    def norm_scale(self) -> float:
        """sqrt(d / D): the RMSNorm weights' factor (and eps's is d / D)."""
        return math.sqrt(self.hidden / self.big_hidden)

    def eps(self, eps: float) -> float:
        return eps * self.hidden / self.big_hidden

    def norm(self, big: torch.nn.Module, small: torch.nn.Module) -> None:
        """An RMSNorm over the hidden channels: the real channels' weights times sqrt(d / D)."""
        put(big.weight, small.weight, torch.arange(self.hidden), None, self.norm_scale)

    def attention(self, big: Any, small: Any, in_segments: int = 1, qk_scale: float = 1.0) -> None:
        """q/k/v/o of one attention block whose input is ``in_segments`` hidden-wide parts; ``qk_scale`` multiplies
        q and k (DFlash's per-head norms: see ``inflate_drafters``)."""
        cols = channels(self.hidden, self.big_hidden, in_segments)
        q_rows, kv_rows = head_channels(self.q_slots, self.head_dim), head_channels(self.kv_slots, self.head_dim)
        put_linear(big.q_proj, small.q_proj, q_rows, cols, qk_scale)
        put_linear(big.k_proj, small.k_proj, kv_rows, cols, qk_scale)
        put_linear(big.v_proj, small.v_proj, kv_rows, cols)
        put_linear(big.o_proj, small.o_proj, torch.arange(self.hidden), q_rows)

    def mlp(self, big: Any, small: Any) -> None:
        hidden, inner = torch.arange(self.hidden), torch.arange(self.intermediate)
        put_linear(big.gate_proj, small.gate_proj, inner, hidden)
        put_linear(big.up_proj, small.up_proj, inner, hidden)
        put_linear(big.down_proj, small.down_proj, hidden, inner)


def check_fits(what: str, shape: Shape, **sizes: int) -> None:
    """Refuse, naming each, the sizes of ``what`` (``hidden_size=``, ``intermediate_size=``, ``num_layers=``) larger
    than ``shape``'s."""
    short = [f"{name} {getattr(shape, name)} < {size}" for name, size in sizes.items() if getattr(shape, name) < size]
    if short:
        raise ValueError(f"{what} does not fit in the shape {shape.name}: " + ", ".join(short)
                         + "; give a larger shape.")


def widening(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, shape: Shape,
             what: str) -> Widening:
    """The :class:`Widening` of a network of these sizes into ``shape``; a shape too small is refused, naming it."""
    check_fits(what, shape, hidden_size=hidden, intermediate_size=intermediate)
    if shape.hidden_size % shape.num_heads:  # transformers 5 refuses such a config (head_dim given or not)
        raise ValueError(f"the shape {shape.name}: hidden size {shape.hidden_size} is not a multiple of its "
                         f"{shape.num_heads} heads, which transformers' configs require; choose other heads.")
    slots = head_slots(heads, kv_heads, shape.num_heads, shape.num_kv_heads)
    return Widening(hidden, shape.hidden_size, head_dim, slots, list(range(kv_heads)), intermediate)


def materialized(big: torch.nn.Module, small: torch.nn.Module, device: Any, dtype: torch.dtype) -> torch.nn.Module:
    """``big``, built on the meta device (no random initialisation of billions of weights), on ``device`` in ``dtype``:
    every parameter zero, every buffer (rotary frequencies, id maps) copied from ``small``'s of the same name, which
    must have its shape (head_dim is kept)."""
    big = big.to_empty(device=device).to(dtype)
    buffers = dict(small.named_buffers())
    with torch.no_grad():
        for parameter in big.parameters():
            parameter.zero_()
        for name, buffer in big.named_buffers():
            # (every supported network's buffers are its rotary frequencies and id maps, which do not widen)
            assert name in buffers and buffers[name].shape == buffer.shape, (name, tuple(buffer.shape))
            buffer.copy_(buffers[name])
    return big.eval().requires_grad_(False)
