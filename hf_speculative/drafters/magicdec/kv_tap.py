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
        prefix (`int`): the cache's positions before the call's first forward (a cache passed to ``generate()``
            holding the prompt's first tokens): ``layers`` then starts with them, ``prefix + T`` columns.
    """

    layers: tuple[torch.Tensor, torch.Tensor] | list[tuple[torch.Tensor, torch.Tensor]] | None
    batch: int
    width: int
    seconds: float
    prefix: int = 0

    @property
    def device(self) -> torch.device:
        return (self.layers[0] if isinstance(self.layers, tuple) else self.layers[0][0]).device

    @property
    def token_bytes(self) -> int:
        """Bytes of one token's keys and values over every layer."""
        if isinstance(self.layers, tuple):  # [L, B, H, T, D]
            k = self.layers[0]
            return 2 * k.shape[0] * k.shape[2] * k.shape[4] * k.element_size()
        return sum(2 * k.shape[1] * k.shape[3] * k.element_size() for k, _ in self.layers)

    def columns(self, b: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``b``'s keys and values at the columns ``index`` ``[n]`` of :attr:`layers` (the forward's own are
        ``prefix + i``), every layer: ``[L, H, n, D]`` each (a copy of those columns only)."""
        if isinstance(self.layers, tuple):
            return self.layers[0][:, b].index_select(2, index), self.layers[1][:, b].index_select(2, index)
        return (torch.stack([k[b].index_select(1, index) for k, _ in self.layers]),
                torch.stack([v[b].index_select(1, index) for _, v in self.layers]))


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
        self._prefix: int | None = None  # the cache's length before the first forward (then 0: read once)
        self._handles = [target.register_forward_pre_hook(self._before, with_kwargs=True),
                         target.register_forward_hook(self._after, with_kwargs=True)]

    # torch marks a hook as taking kwargs just after adding it (not thread-safe): a forward on another thread in
    # between calls it without them, so the hooks take ``*rest`` and return early for any other thread
    def _before(self, module: torch.nn.Module, args: tuple, *rest: dict) -> None:
        if threading.get_ident() == self._thread:
            if self._prefix is None:  # the call's first forward: what a cache passed to generate() holds already
                kwargs = rest[0] if rest else {}
                cache = kwargs.get(compat.cache_kwarg(), kwargs.get("past_key_values"))
                self._prefix = int(cache.get_seq_length()) if hasattr(cache, "get_seq_length") else 0
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
        prefix, self._prefix = self._prefix or 0, 0
        self._receive(Forward(self._last_positions(cache, prefix + width), batch, width, seconds, prefix))

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
        parts = [(forwards[-1], row)]
    else:
        parts = [(f, 0) for f in forwards]
        columns = torch.arange(sum(f.width for f in forwards))

    def take(pick: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values, offset = [], [], 0
        for forward, b in parts:
            here = pick[(pick >= offset) & (pick < offset + forward.width)] - offset  # (pick is ascending)
            k, v = forward.columns(b, here + forward.prefix)
            keys.append(k)
            values.append(v)
            offset += forward.width
        if len(keys) == 1:
            return keys[0], values[0]
        return torch.cat(keys, dim=2), torch.cat(values, dim=2)

    return take, columns.to(forwards[-1].device)
