"""The hooks of transformers' decoding loop that hf_speculative installs on a model, and the running call they read.

transformers' ``generate`` calls three methods of the model back while it prepares a call; an enabled model (and a
stock one, for the duration of a ``custom_generate=hfs.speculative_generate`` call) has *instance* attributes in
their place (bound methods, so ``copy.deepcopy`` rebinds them to the copy):

- ``_get_candidate_generator``: transformers' assisted loop asks the model for its drafter; we hand it the
  per-call generator built from the strategy of *this* call;
- ``_get_stopping_criteria`` / ``_get_logits_processor``: record the call's stopping criteria and its prepared
  logits processors (drafters warp their logits alike); under sampling (``num_beams=1``) the processors end with
  the call's :class:`~hf_speculative.core.sampling.SeededSampler`, so the text is a fixed function of the seed
  whatever the drafter does (``sampling_seed=``, else one draw from torch's global generator); a call without a
  drafter samples so too when ``sampling_seed=`` is given. ``speculative_sampling="rejection"`` (or the
  ``GenerationConfig``'s ``speculative_sampling``, saved in ``generation_config.json``) ends them with a
  :class:`~hf_speculative.core.sampling.RejectionSampler` instead: the classic rule, the highest acceptance, a text
  that depends on the drafts. The seeded rule is the default because it keeps ``torch.manual_seed(s)`` before a
  call reproducing its text (docs/recipes/sampling.md has the measured acceptance of both).

The running call (:class:`~hf_speculative.core.call.Call`, built by :func:`running_call`) lives in the package's one
``ContextVar``, because transformers calls these hooks back without a way to pass it: threads never see each other's
calls, and a model without an active call behaves exactly as transformers does (unless it is given a
``sampling_seed=``). Everything below the entry gets the call explicitly: the loop's entry is bound to it
(``functools.partial(core.entry.generate, call=call)``).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from types import MethodType
from typing import Any

import torch

from .. import compat
from ..core.call import Call
from ..drafters.strategy import DraftStrategy
from ..drafters.generator import ExternalStrategy
from ..drafters.registry import name_of
from .checks import drafts_trees
from ..core.processor_list import ProcessorList
from ..core.sampling import RejectionSampler, seeded_processors
from ..core.state import state_of
from ..core.stats import SpeculativeStats

ENABLED_FLAG = "_hf_speculative_enabled"
LOOP_HOOKS = ("_get_candidate_generator", "_get_stopping_criteria", "_get_logits_processor")

_ACTIVE_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("hf_speculative_call", default=None)
_HOOK_LOCK = threading.Lock()


def is_enabled(model: torch.nn.Module) -> bool:
    return bool(getattr(model, ENABLED_FLAG, False))


def _get_candidate_generator(self: torch.nn.Module, *args: Any, **kwargs: Any):
    call = active_call(self)
    if call is None:  # transformers' own drafter (prompt_lookup_num_tokens=, assistant_model=...)
        return type(self)._get_candidate_generator(self, *args, **kwargs)
    named = compat.bind_get_candidate_generator_args(self, args, kwargs)
    # transformers < 4.57 hands the drafter the user's processors only, not the prepared list
    # (temperature, repetition penalty, ...): prefer the one recorded when it was built.
    processors = call.logits_processor if call.logits_processor is not None else named.get("logits_processor")
    if call.sampling == "rejection" and getattr(named["generation_config"], "do_sample", False):
        # transformers samples by its rejection rule: the drafter draws from its q and hands q over as its logits
        processors = ProcessorList([*(processors or []), RejectionSampler()])
    call.handed_over(named["generation_config"], processors, call.stopping_criteria, named.get("model_kwargs"))
    call.generator = call.strategy.open(call)
    return call.generator


def _get_stopping_criteria(self: torch.nn.Module, *args: Any, **kwargs: Any):
    call = _ACTIVE_CALL.get()
    if call is not None and call.target is self and call.tokenizer is not None and kwargs.get("tokenizer") is None:
        kwargs["tokenizer"] = call.tokenizer  # our loop's route: transformers leaves it out (stop strings need it)
    criteria = type(self)._get_stopping_criteria(self, *args, **kwargs)
    if call is not None and call.target is self:
        call.stopping_criteria = criteria
    return criteria


def _get_logits_processor(self: torch.nn.Module, *args: Any, **kwargs: Any):
    processors = type(self)._get_logits_processor(self, *args, **kwargs)
    call = _ACTIVE_CALL.get()
    if call is None or call.target is not self:
        return processors
    if call.seeded:
        config = kwargs["generation_config"] if "generation_config" in kwargs else args[0]
        processors, sampler = seeded_processors(processors, config, call.seed, call.sampling, call.ours)
        if call.logits_processor is None:  # the call's sampling rule: the sampler that now ends the list, if any
            call.logits_processor, call.sampler = processors, sampler
    return processors


def install_loop_hooks(model: torch.nn.Module) -> None:
    model._get_candidate_generator = MethodType(_get_candidate_generator, model)
    model._get_stopping_criteria = MethodType(_get_stopping_criteria, model)
    model._get_logits_processor = MethodType(_get_logits_processor, model)


def active_call(model: torch.nn.Module) -> Call | None:
    """The speculative call running on ``model`` in this context, or ``None`` (none, or a plain seeded one)."""
    call = _ACTIVE_CALL.get()
    return call if call is not None and call.target is model and call.strategy is not None else None


@contextlib.contextmanager
def temporary_loop_hooks(model: torch.nn.Module):
    """For ``custom_generate`` on a model that was not enabled: the loop looks its drafter up on the
    instance, so install the (call-scoped, otherwise transparent) hooks for the duration of the call. The calls
    holding them are counted in the model's state (``hook_users``, which ``hfs.forget`` carries over)."""
    users = state_of(model).hook_users
    with _HOOK_LOCK:
        if users.count == 0 and not is_enabled(model):
            install_loop_hooks(model)
        users.count += 1
    try:
        yield
    finally:
        with _HOOK_LOCK:
            users.count -= 1
            if users.count == 0 and not is_enabled(model):
                for name in LOOP_HOOKS:
                    model.__dict__.pop(name, None)


@contextlib.contextmanager
def running_call(model: torch.nn.Module, strategy: Any, seed: int | None, sampling: str = "seeded", ours: bool = True,
                 **settings: Any):
    """Within: the call object of ``model``'s call in this context (:data:`_ACTIVE_CALL`), which the hooks transformers
    calls back read and complete. Under sampling it draws with a SeededSampler of ``seed`` (``None``: a seed drawn from
    torch's global generator when the processors are built). ``strategy`` ``None``: plain decoding (seeded), no
    statistics. ``settings``: more of the call's fields (``static``, ``seeded``)."""
    if strategy is None:  # transformers' own sampling loop reads the draws (`ours`: see seeded_processors)
        call = Call(model, seed=seed, ours=False)
        token = _ACTIVE_CALL.set(call)
        try:
            yield call
        finally:
            _ACTIVE_CALL.reset(token)
        return
    stats = SpeculativeStats(method=name_of(strategy))
    opened = strategy if isinstance(strategy, DraftStrategy) else ExternalStrategy(strategy)  # a user's raw one
    call = Call(model, stats=stats, strategy=opened, seed=seed, sampling=sampling, ours=ours, sampler=None,
                trees=drafts_trees(strategy), **settings)
    token = _ACTIVE_CALL.set(call)
    start = time.perf_counter()
    try:
        yield call
    finally:
        _ACTIVE_CALL.reset(token)
        stats.total_time_s = time.perf_counter() - start
        if call.generator is not None:
            call.generator.close()
        state_of(model).last_stats.stats = stats  # per thread; hfs.forget(model) drops it
