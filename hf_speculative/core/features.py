"""Forward hooks that capture the target's hidden states for the drafters that read them (EAGLE,
exit adapters), and the queue of those states on verified tokens that such a drafter consumes.

Hooks are portable across transformers versions (no modeling code is touched), are registered for
one ``generate()`` call only and removed when it ends, and record only the forwards of the thread
that registered them, so concurrent calls on one model do not see each other's states.
"""

from __future__ import annotations

import threading

import torch

from .. import compat
from .call import TargetView

class StatesFeed:
    """The hidden states of a verifier's forwards, handed to the taps of its call: a static-cache verifier runs the
    target with ``output_hidden_states=True`` and publishes them, so that a compiled forward runs no hook (hooks
    break its graphs, and a CUDA graph's outputs are overwritten by its next replay: what is kept is copied).
    The taps of a call whose :class:`~hf_speculative.core.call.TargetView` holds it subscribe to it instead of hooking
    the target."""

    def __init__(self):
        self.taps: list[FeatureTap] = []

    @property
    def wanted(self) -> bool:
        return bool(self.taps)

    def publish(self, hidden_states: tuple[torch.Tensor, ...]) -> None:
        """``hidden_states``: the forward's (embeddings, layer 0's output, ..., the final norm's output), each
        `[B, T, H]`; a static step's padding positions (the view's ``padding``) are left out, as the hooks leave
        them."""
        for tap in self.taps:
            tap.receive(hidden_states)


class FeatureTap:
    """Records, for every forward of ``target`` on this thread, the hidden states of some modules (through forward
    hooks, or from the :class:`StatesFeed` of the call's verifier when its view has one).

    Args:
        target (`PreTrainedModel`): a decoder-only causal LM (``layers`` + final ``norm``).
        layers (`list[int]`): decoder layers whose outputs are recorded, concatenated in this order
            along the feature axis; empty for the final norm's output (the normed last hidden state).
        view (`TargetView`, *optional*): how the call's forwards look (``CallContext.view``): its feed, the padding
            rows of the running forward, a batch row's columns. Default: hooks, no padding, one row.
    """

    def __init__(self, target: torch.nn.Module, layers: list[int], view: TargetView | None = None):
        decoder = compat.decoder_of(target)
        if decoder is None:
            raise ValueError(
                f"{type(target).__name__} has no decoder stack with `layers` and a final `norm` that hf_speculative can "
                "hook; EAGLE drafters need a decoder-only model such as Llama, Qwen2 or Gemma3."
            )
        depth = len(decoder.layers)
        bad = [i for i in layers if not 0 <= i < depth]
        if bad:
            raise ValueError(f"The drafter reads target layers {layers}, but {type(target).__name__} has {depth} layers "
                             f"(0..{depth - 1}); this drafter was made for a deeper model.")
        modules = [decoder.layers[i] for i in layers] if layers else [decoder.norm]
        self._thread = threading.get_ident()
        self._captured: list[list[torch.Tensor]] = [[] for _ in modules]
        self.view = view if view is not None else TargetView()
        self._feed = self.view.feed
        if self._feed is not None:
            if depth - 1 in layers:
                raise ValueError(
                    f"The drafter reads target layer {depth - 1}'s output before the final norm, which a compiled "
                    f"forward's hidden_states do not give (their last entry is the normed one); use it without "
                    f"compile= (on a static cache too: hfs.enable(model, compile=False), cache_implementation='static').")
            # hidden_states[0] holds the embeddings, [i + 1] layer i's output, [-1] the final norm's
            self._indices = [i + 1 for i in layers] if layers else [-1]
            self._handles = []
            self._feed.taps.append(self)
            return
        self._handles = [m.register_forward_hook(self._hook(i)) for i, m in enumerate(modules)]

    def receive(self, hidden_states: tuple[torch.Tensor, ...]) -> None:
        """Record a forward's states published by the call's :class:`StatesFeed` (copies: see there)."""
        padding = self.view.padding
        for captured, index in zip(self._captured, self._indices):
            states = hidden_states[index]  # [B, T, H] (a detach only where they carry a graph: each op is host work)
            states = states.detach() if states.requires_grad else states
            captured.append((states[:, : states.shape[1] - padding] if padding else states).clone())

    def _hook(self, index: int):
        def hook(module, args, output):
            if threading.get_ident() == self._thread:
                states, padding = compat.module_output(output).detach(), self.view.padding  # [B, T, H]
                self._captured[index].append(states[:, : states.shape[1] - padding] if padding else states)
        return hook

    def take(self) -> torch.Tensor | None:
        """The states recorded since the last call, `[B, T, F]` (time-concatenated), or ``None``; while the view
        holds a batch ``row``, that row's real columns of the one batched forward recorded, `[1, T', F]`."""
        if not self._captured[0]:
            return None
        view = self.view.row
        # a batch's columns belong to its last forward (the loop hands every forward to each running row; one
        # missed would leave VerifiedFeatures.known short, and drafting stops)
        parts = [chunks[-1] if view is not None or len(chunks) == 1 else torch.cat(chunks, dim=1)
                 for chunks in self._captured]
        for chunks in self._captured:
            chunks.clear()
        states = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        if view is not None:
            row, columns = view
            states = states[row:row + 1].index_select(1, columns.to(states.device))
        return states

    def take_verified(self, num_accepted: int, num_proposed: int) -> torch.Tensor | None:
        """:meth:`take` after a verifying forward, without the positions of rejected draft tokens:
        the states of the tokens that stay, `[B, T - (num_proposed - num_accepted), F]`, or ``None``."""
        states = self.take()
        if states is None:
            return None
        return states[:, : states.shape[1] - (num_proposed - num_accepted)]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._feed is not None and self in self._feed.taps:
            self._feed.taps.remove(self)
        self._captured = [[] for _ in self._captured]


class VerifiedFeatures:
    """The target's features on verified tokens, in order, queued for a drafter to feed (one per call).

    After every target forward, :meth:`follow` takes what the tap recorded, drops the positions of
    rejected draft tokens and queues the rest in :attr:`pending` (`[1, P, F]`), which the drafter
    takes with :meth:`pop` when it catches up. :attr:`known` counts the positions whose features a
    forward gave; when it no longer matches the verified length (a forward not seen, or seen twice),
    features and tokens no longer line up: :attr:`lost` is set for the rest of the call, and the
    drafter stops drafting (the output stays exact, only the speedup is lost).

    Args:
        target, layers: as for :class:`FeatureTap`.
        skip_first (`bool`, defaults to `False`): leave position 0 out of the queue (still counted in
            :attr:`known`): an exit adapter's entry ``t`` reads position ``t + 1``.
        view (`TargetView`, *optional*): the call's (``CallContext.view``).
    """

    def __init__(self, target: torch.nn.Module, layers: list[int], skip_first: bool = False,
                 view: TargetView | None = None):
        self.tap = FeatureTap(target, layers, view)
        self.skip_first = skip_first
        self.known = 0
        self._queued: list[torch.Tensor] = []  # [1, P_i, F] each, joined once by pop(): a drafter that pauses
        self.lost = False                      # for many steps would otherwise copy the whole queue every step

    @property
    def empty(self) -> bool:
        """Whether no features are queued (without joining the queue)."""
        return not self._queued

    @property
    def pending(self) -> torch.Tensor | None:
        """The queued features `[1, P, F]`, or ``None`` when none are queued."""
        if not self._queued:
            return None
        if len(self._queued) > 1:
            self._queued = [torch.cat(self._queued, dim=1)]
        return self._queued[0]

    def follow(self, length: int, num_accepted: int, num_proposed: int) -> None:
        """Queue the verified features of the forward that just ran (``num_accepted`` of
        ``num_proposed`` drafted tokens kept); ``length`` is the verified length after it."""
        valid = self.tap.take_verified(num_accepted, num_proposed)  # [1, T', F]
        if valid is not None:
            self._queue(valid)
        if self.known != length - 1:  # the newest token has no features until the next forward
            self.lost = True

    def follow_tree(self, length: int, tree_size: int, path: list[int]) -> None:
        """:meth:`follow` after a forward that verified a draft tree of ``tree_size`` nodes (hf_speculative's
        loop): the states of the tokens before the nodes, then of the accepted ``path``'s nodes, in order."""
        states = self.tap.take()  # [1, m + n, F]
        if states is not None:
            before = states.shape[1] - tree_size
            if list(path) == list(range(len(path))):  # a chain's path (or a branch drafted first): a prefix
                self._queue(states[:, : before + len(path)])
            else:  # the indices made on the host, one copy to the device
                keep = torch.tensor([*range(before), *(before + p for p in path)], dtype=torch.long)
                self._queue(states.index_select(1, keep.to(states.device)))
        if self.known != length - 1:
            self.lost = True

    def _queue(self, valid: torch.Tensor) -> None:
        first = self.known == 0
        self.known += valid.shape[1]
        if first and self.skip_first:
            valid = valid[:, 1:]
        self._queued.append(valid)

    def pop(self) -> torch.Tensor | None:
        """The queued features `[1, P, F]` (``None`` if none), emptying the queue."""
        pending = self.pending
        self._queued = []
        return pending

    def discard(self) -> None:
        """Drop what the tap recorded since the last forward that counts (a draft's own passes
        through the tapped layers are not verified features)."""
        self.tap.take()

    def close(self) -> None:
        self.tap.remove()
        self._queued = []


@torch.no_grad()
def tapped_features(target: torch.nn.Module, layers: list[int], input_ids: torch.Tensor) -> torch.Tensor:
    """The states :class:`FeatureTap` records for ``layers`` over one no-cache forward of ``target`` on
    ``input_ids`` `[B, T]`: `[B, T, F]` (a whole sequence's features at once, as analyses need them)."""
    tap = FeatureTap(target, layers)
    try:
        target(input_ids=input_ids, use_cache=False)
        return tap.take()
    finally:
        tap.remove()
