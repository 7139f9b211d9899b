"""What hf_speculative remembers about a model between calls, in one place, with one :func:`forget`.

Some things belong to a model (and the hardware it runs on), not to one ``generate()`` call: the
measured cost of its verifying forwards, which drafter networks were checked against it, the
statistics of its last call, its static cache and compiled forward, the count of calls that lent it
``generate()``'s loop hooks; and what a drafter keeps about it (the layer views self-speculation
drafts with, a LayerSkip calibration, SuffixDecoding's history of its outputs, the target's own MTP
layers...), each in one generic slot, :meth:`ModelState.drafter_state`, keyed by a type that the
drafter's own folder defines. Each model gets one :class:`ModelState` holding them all, held weakly
(it goes when the model does); :func:`forget` drops all of it at once, e.g. after changing the model
in a way that invalidates what was measured, or to let go of the views.

A "model" is whatever a measurement belongs to: a target, but also a drafter network or a layer
view, whose drafting step has its own measured time.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Callable, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(eq=False)
class Users:
    """How many calls running now use something of a model's; changed under its owner's lock."""

    count: int = 0


@dataclasses.dataclass(eq=False)
class ModelState:
    """Everything remembered about one model; each slot is empty until the module that owns it fills it.

    Attributes:
        verify_costs (`VerifyCostModel`, *optional*): measured costs of its verifying forwards
            (``costs.verify_costs_for``).
        padded_costs (`dict[tuple[int, bool], PaddedCostModel]`): those of its static-cache verification, by
            padded budget and whether the forward is compiled.
        batch_costs (`BatchCostModel`, *optional*): measured costs of its forwards over batches
            (``batch_costs.batch_costs_for``).
        draft_step_s (`float`, *optional*): smoothed seconds of one drafting step, for a model that
            drafts (``costs.record_draft_step``).
        catch_up_token_s (`float`, *optional*): smoothed seconds per token of a draft model's long catch-ups (its
            prefill on the prompt; ``costs.record_catch_up``).
        accept_rate (`float`, *optional*): a draft model's per-token acceptance in its earlier calls, smoothed
            (``costs.record_accept_rate``): what its next call expects before its first draft.
        checked (`weakref.WeakSet`): drafter networks already checked against it: vocabulary for a
            draft model, features, device and dtype for EAGLE drafters and exit adapters.
        last_stats (`threading.local`): ``.stats``, the statistics of its last call in each thread.
        static_cache (`tuple`, *optional*): ``((capacity, device, dtype), StaticCache, Lock)``, the static
            cache calls share (``static_cache.StaticVerifier``), the lock held by the call using it.
        compiled (`tuple`, *optional*): ``(mode, compiled forward)`` (``static_cache.compiled_forward``).
        compile_mode, static_budget: what ``hfs.enable(model, compile=..., static_budget=...)`` set.
        drafters (`dict[type, Any]`): what drafters keep about it, one object per type a drafter's folder defines
            (:meth:`drafter_state`): the layer views and LayerSkip calibration of self-speculation
            (``drafters.self_speculative.model_state``), EAGLE's shared compiled drafting step
            (``drafters.eagle.static_drafting``), SuffixDecoding's histories (``drafters.suffix.history``), the
            target's own MTP layers (``drafters.mtp.drafter``).
        hook_users (`Users`): the calls running now that installed ``generate()``'s loop hooks on it for their
            duration (``hf.loop_hooks.temporary_loop_hooks``). The one count that :func:`forget` carries over
            to the model's next state: it counts calls running now, which keep what they hold.
        lock (`threading.RLock`): held by updates that read and then write the slots above.
        forward_turn (`threading.Lock`): held by a compiled call's forward, so that concurrent calls take turns
            (``static_cache.StaticVerifier``).
    """

    verify_costs: Any = None
    padded_costs: dict = dataclasses.field(default_factory=dict)
    batch_costs: Any = None
    draft_step_s: float | None = None
    catch_up_token_s: float | None = None
    accept_rate: float | None = None
    checked: weakref.WeakSet = dataclasses.field(default_factory=weakref.WeakSet)
    last_stats: threading.local = dataclasses.field(default_factory=threading.local)
    static_cache: Any = None
    compiled: Any = None
    compile_mode: str | None = None
    static_budget: int | None = None
    drafters: dict = dataclasses.field(default_factory=dict)
    hook_users: Users = dataclasses.field(default_factory=Users)
    lock: Any = dataclasses.field(default_factory=threading.RLock, repr=False)
    forward_turn: Any = dataclasses.field(default_factory=threading.Lock, repr=False)

    def drafter_state(self, kind: type[T]) -> T:
        """What a drafter keeps about this model: the one ``kind()`` (a type of the drafter's own folder, made
        without arguments on first use) of this state. The drafter reads and writes its fields under
        :attr:`lock` where it reads and then writes; :func:`forget` drops it with the rest."""
        with self.lock:
            value = self.drafters.get(kind)
            if value is None:
                value = self.drafters[kind] = kind()
            return value


_STATES: "weakref.WeakKeyDictionary[Any, ModelState]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def state_of(model: Any) -> ModelState:
    """The state of ``model`` (any object that takes weak references), made empty on first use."""
    with _LOCK:
        state = _STATES.get(model)
        if state is None:
            state = _STATES[model] = ModelState()
        return state


def borrow(model: Any, slot: str, key: tuple, fits: Callable[[tuple], bool], make: Callable[[bool], Any],
           kind: type | None = None) -> tuple[tuple, Any, Callable[[], None] | None]:
    """What calls share one at a time, held in ``state_of(model).<slot>`` as ``(key, value, Lock)`` (a static cache;
    with ``kind``, in the slot of the drafter state ``state_of(model).drafter_state(kind)``: a compiled drafter
    step): the held value when ``fits(its key)`` and no call holds it; else a new one, ``make(shared)``, which
    replaces the held one for ``key`` when no call holds that (this call then holds the new one), or is this call's
    alone (``shared`` False). Returns ``(its key, the value, release)``; ``release`` gives a shared value back,
    ``None`` for one of the call's own."""
    state = state_of(model)
    with state.lock:
        owner = state if kind is None else state.drafter_state(kind)
        held = getattr(owner, slot)
        if held is not None and fits(held[0]) and held[2].acquire(blocking=False):
            return held[0], held[1], held[2].release
        if held is None or not held[2].locked():
            lock = threading.Lock()
            lock.acquire()
            setattr(owner, slot, (key, make(True), lock))
            return key, getattr(owner, slot)[1], lock.release
    return key, make(False), None  # another call holds the shared one


def all_states() -> list[ModelState]:
    """The states of every model still alive (a snapshot, for checks across models)."""
    with _LOCK:
        return list(_STATES.values())


def forget(model: Any) -> None:
    """Drop everything hf_speculative remembers about ``model``: measured costs, checked drafters, last statistics,
    static caches and compiled forwards, and every drafter's own state (layer views, the LayerSkip calibration,
    structure probes, SuffixDecoding's histories of its outputs, whose files stay, ...). Later calls measure and check
    again from scratch; other models are untouched. Calls running now keep what they hold, and the count
    of them that lent the model loop hooks (``hook_users``) goes on to its next state, so the last of them
    still takes the hooks away."""
    with _LOCK:
        old = _STATES.pop(model, None)
        if old is not None:
            _STATES[model] = ModelState(hook_users=old.hook_users)
