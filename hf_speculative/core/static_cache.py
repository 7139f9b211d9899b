"""Verification at one fixed shape on a static KV cache, so that a compiled target forward is reused.

transformers refuses a static cache for assisted generation (transformers issue 32946): a rejected draft
must be rolled back and a static cache cannot be cropped. Our loop never crops it. It keeps the number of
verified positions itself, every forward writes from there (the static layers' ``cumulative_length``, or
``cache_position`` on versions that take it), and every mask hides everything past it::

    capacity K  = prompt + max_new_tokens + budget + 1, rounded up to 256, or the model's held cache when
                  it is at least that large (calls share one cache, hence one mask width and one compiled
                  graph per budget: torch.compile's recompile limit, 8 shapes, is not spent on lengths)
    prefill       the prompt but its last token, eagerly, once per call
    every step    [1, 1 + budget] tokens: the root, the tree's n nodes, then budget - n padding tokens
                  mask [1, 1, 1 + budget, K]: the tree's visibility over the prefix; padding rows see the
                  prefix and the root only, and nothing ever sees a position >= the verified length
                  except its own tree's nodes. A step without a draft (the cost model chose none) runs
                  at [1, 1]: a second graph, so that not drafting costs one plain forward
    keep path     the accepted nodes' keys and values move next to the root, in place (the cache's
                  addresses stay fixed, which CUDA graphs need); length = prefix + 1 + len(path)

One shape per step is what lets ``torch.compile`` (and CUDA graphs with ``mode="reduce-overhead"``)
build the target's verifying forward once: the padding costs little on a GPU, where a forward over
65 tokens costs about what one over 33 does (docs/benchmark.md, GPU profile).
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from .. import compat
from . import kv_cache
from ..options import MAX_TREE_NODES as MAX_BUDGET
from ..options import check_int
from .state import borrow, state_of
from .tree import DraftTree
from .features import StatesFeed
from .call import TargetView
from .verify import RowVerifier, check_tree_attention

CAPACITY_STEP = 256  # capacities are rounded up to this, so that calls of similar lengths share a cache
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class StaticCacheError(ValueError):
    """The model or the call cannot verify on a static cache."""


def check_static(model: torch.nn.Module) -> None:
    """Raise :class:`StaticCacheError` when ``model``'s layers cannot share one static full-attention mask."""
    check_tree_attention(model)
    config = compat.text_config(model.config)
    kinds = set(getattr(config, "layer_types", None) or [])
    windowed = "sliding_attention" in kinds or (not kinds and getattr(config, "sliding_window", None)
                                                and getattr(config, "use_sliding_window", True))
    if windowed:
        raise StaticCacheError(
            f"{type(model).__name__} has sliding-window layers, whose static cache is a ring buffer that a draft "
            f"tree's positions cannot be written into; verify with the dynamic cache (drop "
            f"cache_implementation='static' and compile=).")


def capacity_for(max_length: int, budget: int) -> int:
    """Static cache positions a call of ``max_length`` tokens with ``budget``-node trees needs, rounded up."""
    need = max_length + budget + 1
    return -(-need // CAPACITY_STEP) * CAPACITY_STEP


class StaticVerifier(RowVerifier):
    """Verifies trees of up to ``budget`` nodes on a static cache of ``capacity`` positions, at one shape.

    Args:
        model (`PreTrainedModel`): the target (full attention, SDPA or eager).
        budget (`int`): the most draft nodes a step verifies; every step is padded to it.
        capacity (`int`): positions the call needs (``capacity_for(max_length, budget)``); the model's held
            static cache is used when it has at least as many, and :attr:`capacity` is then its size.
        forward (*callable*, *optional*): the target's forward to run the steps with (a compiled one), else
            the model itself.
    """

    def __init__(self, model: torch.nn.Module, budget: int, capacity: int, forward: Any = None):
        check_static(model)
        self.model, self.budget = model, int(budget)
        self.step_forward = model if forward is None else forward
        weight = model.get_input_embeddings().weight
        self.device, self.dtype = weight.device, weight.dtype
        self.cache, self._release, self.capacity = _borrow_cache(model, int(capacity), self.device, self.dtype)
        self.takes_position = "cache_position" in compat.forward_params(type(model))
        self.length = 0  # positions holding verified tokens
        # an additive mask's two values, as tensors: torch.where over them is one operation a forward
        self._open = torch.tensor(0.0, dtype=self.dtype, device=self.device)
        self._shut = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        self._columns = torch.arange(self.capacity, device=self.device)  # [K]
        # a compiled forward hands the hidden states that drafters read (EAGLE, Medusa) as outputs: no hooks in it
        self.feed = StatesFeed() if forward is not None else None
        # the call's view of its forwards (CallContext.view): the feed, and the padding rows of each step
        self.view = TargetView(feed=self.feed)
        # the drafters' cost model (costs.PaddedCostModel): by budget, compiled or not (their costs differ)
        self.cost_key = (self.budget, forward is not None)
        # compiled calls on one model run their forwards one at a time: CUDA graphs replay from fixed buffers, and
        # transformers 4 records the hidden states a compiled forward returns with hooks shared by every thread
        self._turn = state_of(model).forward_turn if forward is not None else contextlib.nullcontext()

    # -- the two steps the loop calls --------------------------------------------------------------
    def forward_row(self, uncached: torch.Tensor, tree: DraftTree) -> torch.Tensor:
        """Like :func:`hf_speculative.core.verify.forward_tree`: ``[1 + n, V]`` logits of the root and the nodes."""
        uncached = torch.as_tensor(uncached, dtype=torch.long, device=self.device).reshape(-1)  # [m]
        if uncached.numel() > 1:  # the prompt: eagerly, at its own length, once
            self._prefill(uncached[:-1])
        n = tree.size
        if n > self.budget:
            raise StaticCacheError(f"a draft of {n} nodes does not fit this call's static verification budget of "
                                   f"{self.budget}; pass a larger static_budget= to hfs.enable().")
        if self.length + 1 + self.budget > self.capacity:
            raise StaticCacheError(f"the static cache ({self.capacity} positions) is full at {self.length}; this "
                                   f"is a bug in hf_speculative's capacity rule: please report it.")
        width = self.budget if n else 0  # a plain step is not padded: its own graph, one token
        start, q = self.length, 1 + width
        root = uncached[-1:]  # [1] (not read: on a GPU the root stays there)
        positions = torch.full((q,), start, dtype=torch.long, device=self.device)  # [Q]
        if n:
            tokens = torch.cat([root, tree.tokens.to(self.device), root.expand(width - n)])  # [Q] padding: the root
            positions[1: 1 + n] = start + 1 + tree.depths().to(self.device)
            seen = (self._columns <= start).expand(q, -1).clone()  # [Q, K] the prefix and the root, for every row
            seen[1: 1 + n, start + 1: start + 1 + n] = tree.ancestors().to(self.device)
        else:  # a plain step: the root alone (nothing of an empty tree is built: each operation is host work)
            tokens, seen = root, (self._columns <= start)[None]  # [1], [1, K]
        self.view.padding = width - n  # what reads the target's states leaves them out
        try:
            with self._turn:
                # a CUDA graph's output is overwritten by its next replay, another call's too: copied in turn
                return self._run(self.step_forward, tokens, positions, seen, start)[: 1 + n].clone()  # [1 + n, V]
        finally:
            self.view.padding = 0

    def keep_row(self, prefix_length: int, tree: DraftTree, path: Sequence[int]) -> None:
        """Keep the root and ``path``'s nodes after the ``prefix_length`` verified positions."""
        if prefix_length != self.length:
            raise RuntimeError(f"static verification out of step: {prefix_length} verified, cache at {self.length}")
        kv_cache.move_tree_path(self.cache, prefix_length + 1, path)
        self.length = prefix_length + 1 + len(path)

    def close(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None

    # -- internals ---------------------------------------------------------------------------------
    def _prefill(self, ids: torch.Tensor) -> None:
        m, start = ids.numel(), self.length
        if start + m + 1 + self.budget > self.capacity:
            raise StaticCacheError(f"a prompt of {m + 1} tokens does not fit the static cache ({self.capacity}).")
        positions = torch.arange(start, start + m, device=self.device)  # [m]
        seen = self._columns[None, :] <= positions[:, None]  # [m, K] causal
        with self._turn:
            self._run(self.model, ids, positions, seen, start, keep=1)
        self.length = start + m

    def _run(self, forward: Any, ids: torch.Tensor, positions: torch.Tensor, seen: torch.Tensor, start: int,
             keep: int = 0) -> torch.Tensor:
        compat.set_static_length(self.cache, start)
        mask = torch.where(seen, self._open, self._shut)  # [Q, K] additive
        kwargs = dict(input_ids=ids[None], position_ids=positions[None], attention_mask=mask[None, None],
                      use_cache=True, **{compat.cache_kwarg(): self.cache})
        if self.takes_position:  # versions whose static layers write at cache_position
            kwargs["cache_position"] = torch.arange(start, start + ids.numel(), device=self.device)
        if keep:
            kwargs.update(compat.logits_to_keep_kwargs(self.model, keep))
        feed = self.feed if self.feed is not None and self.feed.wanted else None
        if feed is not None:
            kwargs["output_hidden_states"] = True  # (the compiled graph returns them)
        with torch.no_grad():
            if forward is not self.model:
                new_replay(self.device)
            out = forward(**kwargs)
        if feed is not None:
            feed.publish(out.hidden_states)
        return out.logits[0]  # [Q, V]


# -- the static cache a model keeps between calls ---------------------------------------------------
def _borrow_cache(model: torch.nn.Module, capacity: int, device: torch.device, dtype: torch.dtype):
    """The model's static cache when it is free and holds at least ``capacity`` positions (one cache, one compiled
    graph), else a new one: it replaces the held one when that one is free (so the held cache only grows), and is
    this call's alone when another call holds it. Returns ``(cache, release, its capacity)``."""
    key, cache, release = borrow(model, "static_cache", (capacity, device, dtype),
                                 fits=lambda held: held[1:] == (device, dtype) and held[0] >= capacity,
                                 make=lambda shared: kv_cache.new_static_cache(model, capacity))
    return cache, release, key[0]


def new_replay(device: torch.device) -> None:
    """Before a compiled call on CUDA: the outputs of earlier replays are copied already, so CUDA-graph trees may
    start from the root (the target's verify graph and EAGLE's drafter graphs alternate a varying number of times
    a step: each call a root, one recorded graph per shape, instead of one per sequence of calls)."""
    if device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()


def compiled_forward(model: torch.nn.Module, mode: str) -> Any:
    """The model's forward compiled with ``mode`` for fixed shapes, made once per model and mode."""
    state = state_of(model)
    with state.lock:
        if state.compiled is None or state.compiled[0] != mode:
            state.compiled = (mode, torch.compile(model, mode=mode, dynamic=False))
        return state.compiled[1]


# -- what enable(compile=...) sets, and the verifier a call gets -------------------------------------
def configure(model: torch.nn.Module, compile: bool | str | None, static_budget: int | None) -> None:
    """Record ``hfs.enable(model, compile=..., static_budget=...)`` (``None``: leave as set)."""
    if compile is not None:
        if isinstance(compile, bool):
            mode = None if not compile else "auto"
        elif isinstance(compile, str) and compile in COMPILE_MODES:
            mode = compile
        else:
            raise ValueError(f"hfs.enable(model, compile={compile!r}): use True, False or a torch.compile mode: "
                             f"{', '.join(COMPILE_MODES)}.")
        if mode is not None:
            check_static(model)
        state_of(model).compile_mode = mode
    if static_budget is not None:
        state_of(model).static_budget = check_int("hfs.enable", "static_budget", static_budget, 1, MAX_BUDGET)


def static_requested(model: torch.nn.Module, static: bool) -> bool:
    """Whether a call verifies on a static cache: it asked for one (``static``), or the model is compiled."""
    return static or state_of(model).compile_mode is not None


def verifier_for(model: torch.nn.Module, static: bool, max_length: int, needed: int,
                 drafter: str) -> StaticVerifier | None:
    """The static verifier of a call, or ``None`` for the default dynamic cache. ``needed``: the most draft nodes
    the call's strategy proposes in a step (``drafter``, its name, for the message when the model's budget is
    smaller); the caller has checked that the strategy can draft for a static cache."""
    state = state_of(model)
    if not static_requested(model, static):
        return None
    budget = state.static_budget or needed
    if budget < needed:
        raise StaticCacheError(f"hfs.enable(model, static_budget={budget}) is smaller than the {needed} draft nodes "
                               f"{drafter} proposes per step; raise static_budget or draft less.")
    mode = compiled_mode(model)
    forward = None if mode is None else compiled_forward(model, mode)
    return StaticVerifier(model, budget, capacity_for(max_length, budget), forward)


def compiled_mode(model: torch.nn.Module) -> str | None:
    """The ``torch.compile`` mode of ``model``'s calls (``hfs.enable(model, compile=...)``; ``True`` is
    ``"reduce-overhead"``, CUDA graphs, on a GPU and ``"default"`` elsewhere), ``None`` when not compiled."""
    mode = state_of(model).compile_mode
    if mode != "auto":
        return mode
    device = model.get_input_embeddings().weight.device
    return "reduce-overhead" if device.type == "cuda" else "default"
