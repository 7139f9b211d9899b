"""What MagicDec reads of the target's verifying forwards: the keys and values each wrote, and its wall time.

A forward pre-hook and a forward hook on the target (the ``...ForCausalLM`` module) see every forward of the call:
the verifier's (one row or a batch), or transformers' own in its assisted loop. After a forward, its cache holds
the keys and values of the ``T`` tokens it ran as the last ``T`` positions of every layer; the hook keeps those
(:class:`Forward`) until every row of the group has taken its own columns (``group.py``), and the seconds the
forward took, which the cost model reads (``costs.py``). Nothing of the model is patched or copied: hooks only.

The drafter's own forwards call the target's ``forward`` directly (not the module), so no hook sees them: they are
not verifications, and a counter of the target's forwards (``hfs.last_stats(model).target_forwards``, a test's
forward hook) does not count them either. Like ``core/features.py``'s taps, the hooks record the forwards of the
thread that made them only, so concurrent calls on one model do not see each other's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ... import compat

# forwards of at most this many tokens are copied (a verification, a few KB per layer); a longer one (a prefill) is
# kept as views of the cache, whose positions nothing overwrites before the rows have read them
_COPIED_TOKENS = 64


@dataclasses.dataclass
class Forward:
    """One forward of the target, as the hook saw it.

    Attributes:
        layers: the keys and values of its tokens, every layer: a verification's copied into one tensor each,
            ``(keys, values)`` of ``[L, B, H, T, D]`` (one copy for all the layers); a longer forward's (a prefill) as
            per-layer views of the cache, ``[(keys, values)]`` of ``[B, H, T, D]`` each; ``None`` when the forward
            had no dynamic cache to read them from.
        batch (`int`), width (`int`): ``B`` and ``T``.
        seconds (`float`): its wall time.
    """

    layers: tuple[torch.Tensor, torch.Tensor] | list[tuple[torch.Tensor, torch.Tensor]] | None
    batch: int
    width: int
    seconds: float

    def row(self, b: int) -> list[tuple[torch.Tensor, torch.Tensor]] | tuple[torch.Tensor, torch.Tensor]:
        """Row ``b``'s keys and values: ``(keys, values)`` of ``[L, H, T, D]`` (a verification), or per layer
        ``[H, T, D]`` each (views)."""
        if isinstance(self.layers, tuple):
            return self.layers[0][:, b], self.layers[1][:, b]
        return [(k[b], v[b]) for k, v in self.layers]


class ForwardTap:
    """Hooks on ``target`` calling ``receive(forward)`` after each of its forwards on this thread.

    Args:
        target (`PreTrainedModel`): the model the call verifies with.
        receive (`Callable[[Forward], None]`): called with each forward.
    """

    def __init__(self, target: torch.nn.Module, receive: Callable[[Forward], None]):
        self._thread = threading.get_ident()
        self._receive = receive
        self._started: float | None = None
        self._handles = [target.register_forward_pre_hook(self._before, with_kwargs=True),
                         target.register_forward_hook(self._after, with_kwargs=True)]

    # torch marks a hook as taking kwargs just after adding it (not thread-safe): a forward on another thread in
    # between calls it without them, so the hooks take ``*rest`` and return early for any other thread
    def _before(self, module: torch.nn.Module, args: tuple, *rest: dict) -> None:
        if threading.get_ident() == self._thread:
            self._started = time.perf_counter()

    def _after(self, module: torch.nn.Module, args: tuple, *rest: Any) -> None:
        if threading.get_ident() != self._thread or self._started is None or len(rest) != 2:
            return
        kwargs, output = rest
        started, self._started = self._started, None
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        logits = getattr(output, "logits", None)
        if logits is not None and logits.is_cuda:
            torch.cuda.synchronize(logits.device)  # the loop reads the logits next: this wait costs nothing more
        seconds = time.perf_counter() - started
        if ids is None:
            return
        batch, width = int(ids.shape[0]), int(ids.shape[1])
        cache = None
        for holder, name in ((output, compat.cache_kwarg()), (output, "past_key_values"), (kwargs, None)):
            if cache is None:  # (never `or`: a cache with no layer yet is falsy)
                cache = holder.get(compat.cache_kwarg()) if name is None else getattr(holder, name, None)
        self._receive(Forward(self._last_positions(cache, width), batch, width, seconds))

    @staticmethod
    def _last_positions(cache: Any, width: int) -> Any:
        """The keys and values of the forward's ``width`` tokens (the cache's last positions), as
        :attr:`Forward.layers` holds them: a verification's copied (later forwards overwrite its positions), stacked
        over the layers in one copy each; a longer forward's as per-layer views."""
        if cache is None or not hasattr(cache, "get_seq_length"):
            return None
        layers = []
        for keys, values in compat.cache_layer_tensors(cache):
            if not isinstance(keys, torch.Tensor) or keys.dim() != 4 or keys.shape[-2] < width:
                return None
            layers.append((keys[..., -width:, :], values[..., -width:, :]))
        if not layers:
            return None
        if width <= _COPIED_TOKENS and len({k.shape for k, _ in layers}) == 1:
            return torch.stack([k for k, _ in layers]), torch.stack([v for _, v in layers])  # [L, B, H, T, D]
        if width <= _COPIED_TOKENS:  # layers of other shapes: copied one by one
            layers = [(k.clone(), v.clone()) for k, v in layers]
        return layers

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def row_columns(forwards: list[Forward], view_row: tuple[int, torch.Tensor] | None
                ) -> tuple[Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None, torch.Tensor | None]:
    """A row's keys and values in the forwards since its last step, and the columns of them that are its tokens
    ``[T']``: a batch row's real columns of the last forward, or every column of a lone row's forwards (a prefill the
    verifier split in two, transformers' separate prefill), in order. The keys and values come as ``take(columns)``,
    which gives those columns of every layer, ``(keys, values)`` of ``[L, H, n, D]`` each (only they are copied)."""
    if not forwards or any(f.layers is None for f in forwards):
        return None, None
    if view_row is not None:
        row, columns = view_row
        parts = [forwards[-1].row(row)]
    else:
        parts = [f.row(0) for f in forwards]
    widths = [f.width for f in (forwards[-1:] if view_row is not None else forwards)]
    device = (parts[0][0] if isinstance(parts[0], tuple) else parts[0][0][0]).device

    def take(pick: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values, offset = [], [], 0
        for part, width in zip(parts, widths):
            here = pick[(pick >= offset) & (pick < offset + width)] - offset  # (pick is ascending)
            if isinstance(part, tuple):  # [L, H, T, D]
                keys.append(part[0].index_select(2, here))
                values.append(part[1].index_select(2, here))
            else:  # per layer [H, T, D] views
                keys.append(torch.stack([k.index_select(1, here) for k, _ in part]))
                values.append(torch.stack([v.index_select(1, here) for _, v in part]))
            offset += width
        if len(keys) == 1:
            return keys[0], values[0]
        return torch.cat(keys, dim=2), torch.cat(values, dim=2)

    if view_row is None:
        columns = torch.arange(sum(widths), device=device)
    return take, columns.to(device)
