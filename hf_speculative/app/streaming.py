"""Run one decoding method in a background thread and observe it live through a streamer.

transformers' ``generate()`` hands its streamer the prompt first, then one block of new tokens per
target forward: plain greedy one token at a time, the assisted loop (which ``hf_speculative`` and
transformers' own speculative methods all run) the ``n`` draft tokens that forward accepted plus the
token the target chose itself. So the streamer alone gives, for *every* kind of method, the number of
target forwards (blocks), the accepted length of each step (block size - 1) and which tokens were
drafted; ``hf_speculative.last_stats`` agrees with it after the call (the tests check this). The
number of *proposed* tokens (for the acceptance rate) is only known to ``hf_speculative`` strategies:
the streamer reads it live from the call's own statistics object, which
:func:`hf_speculative.hf.loop_hooks.active_call` hands out inside the call (the streamer runs in the
generation thread). The strategy goes to ``generate()`` as built, unwrapped: the app's call takes the
route the library takes for it (a tree strategy runs in hf_speculative's own loop), and the streamer
records which route that was (:attr:`MethodTrace.route`).

Stopping: the streamer raises :class:`GenerationCancelled` from ``put()`` once the run is cancelled
(the visitor left or pressed Stop), which ends ``generate()`` at its next token block without
touching its stopping criteria (custom criteria turn drafting off under sampling on transformers >= 5.18).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer

from ..tooling.methods import MethodSpec


class GenerationCancelled(Exception):
    """Raised inside the generation thread to stop ``generate()`` early."""


@dataclasses.dataclass
class MethodTrace:
    """What one method produced so far, filled in by the generation thread and read by the page.

    Lists only grow and are appended under ``lock``; readers take :meth:`snapshot` copies.
    """

    spec: MethodSpec
    max_new_tokens: int
    status: str = "waiting"  # waiting -> running -> done | error | cancelled
    ids: list[int] = dataclasses.field(default_factory=list)
    accepted_lengths: list[int] = dataclasses.field(default_factory=list)  # one per target forward
    block_ends: list[int] = dataclasses.field(default_factory=list)  # len(ids) after each target forward
    token_times: list[tuple[float, int]] = dataclasses.field(default_factory=list)  # (seconds, tokens so far)
    started: float | None = None
    seconds: float | None = None  # wall time of the whole generate() call
    error: str | None = None
    live_stats: Any = None  # hf_speculative's per-call SpeculativeStats while it runs
    route: str | None = None  # "ours" (hf_speculative's own loop), "assisted" (transformers'), "plain" (no drafter)
    final_stats: Any = None  # hfs.last_stats(model) after the call (hfs methods)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add_block(self, ids: list[int], now: float) -> None:
        """Record one target forward's block (cut at the budget: transformers < 5.14 may accept a
        verified block past ``max_new_tokens``)."""
        with self.lock:
            self.ids.extend(ids[: max(0, self.max_new_tokens - len(self.ids))])
            self.accepted_lengths.append(len(ids) - 1)
            self.block_ends.append(len(self.ids))
            start = now if self.started is None else self.started
            self.token_times.append((now - start, len(self.ids)))

    def blocks_since(self, start: int) -> list[tuple[list[int], int]]:
        """``(ids, accepted)`` of the blocks from index ``start`` on (for incremental rendering)."""
        with self.lock:
            out, ends = [], self.block_ends
            for i in range(start, len(ends)):
                ids = self.ids[(ends[i - 1] if i else 0) : ends[i]]
                out.append((ids, min(self.accepted_lengths[i], len(ids))))
            return out

    # -- figures --------------------------------------------------------------------------------
    @property
    def new_tokens(self) -> int:
        return len(self.ids)

    @property
    def target_forwards(self) -> int:
        return len(self.accepted_lengths)

    @property
    def accepted_tokens(self) -> int:
        if self.final_stats is not None:  # exact: a path cut by EOS or a stop string streams no bonus token
            return int(self.final_stats.accepted_tokens)
        return sum(self.accepted_lengths)

    @property
    def drafted_tokens(self) -> int | None:
        """Proposed tokens: known for ``hf_speculative`` strategies, 0 for greedy, else ``None``."""
        stats = self.final_stats or self.live_stats
        if stats is not None:
            return int(stats.drafted_tokens)
        return 0 if self.spec.kind == "baseline" else None

    @property
    def elapsed(self) -> float:
        if self.seconds is not None:
            return self.seconds
        return 0.0 if self.started is None else time.perf_counter() - self.started

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def tau(self) -> float | None:
        """New tokens per target forward (1.0 = no gain)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else None

    @property
    def acceptance_rate(self) -> float | None:
        drafted = self.drafted_tokens
        if not drafted:
            return None
        return min(self.accepted_tokens, drafted) / drafted


class TokenStreamer(BaseStreamer):
    """A transformers streamer that records each block of new tokens in a :class:`MethodTrace`.

    Args:
        trace (`MethodTrace`): where blocks go.
        cancel (`threading.Event`): once set, the next ``put()`` raises :class:`GenerationCancelled`.

    Only ids and a timestamp are recorded here, in the generation thread: decoding text happens in
    the page's thread so that it does not count in the method's timing.
    """

    def __init__(self, trace: MethodTrace, cancel: threading.Event, model: Any = None):
        self.trace = trace
        self.cancel = cancel
        self.model = model
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if self.cancel.is_set():
            raise GenerationCancelled()
        if not self._prompt_seen:  # generate() streams the prompt first
            self._prompt_seen = True
            self._observe_call()
            return
        self.trace.add_block([int(t) for t in value.reshape(-1).tolist()], time.perf_counter())

    def _observe_call(self) -> None:
        """The call's statistics object and route, read inside ``generate()`` (this thread's call)."""
        if self.model is None:
            return
        from ..hf.loop_hooks import active_call

        call = active_call(self.model)
        if call is None:  # greedy, or transformers' own drafters: no hf_speculative call
            self.trace.route = "plain" if self.trace.spec.kind == "baseline" else "assisted"
            return
        self.trace.live_stats = call.stats
        # our loop's route keeps the streamer on the call (transformers does not hand it a custom_generate)
        self.trace.route = "ours" if call.streamer is self else "assisted"

    def end(self) -> None:
        pass


def generate_into(
    trace: MethodTrace,
    model: Any,
    input_ids: torch.Tensor,
    extra: dict,
    *,
    cancel: threading.Event,
    pad_token_id: int | None,
    sampling: dict | None = None,
) -> None:
    """Run one ``generate()`` call of ``trace.spec`` and fill ``trace`` (never raises).

    Args:
        trace (`MethodTrace`): filled in live; ``status`` ends as ``done``, ``error`` or ``cancelled``.
        model: the target (already ``hfs.enable``-d for ``hfs`` methods).
        input_ids (`torch.LongTensor` `[1, L]`): the prompt, on the model's device.
        extra (`dict`): the method's ``generate()`` kwargs (``MethodSpec.build``).
        cancel (`threading.Event`): stops the call at its next token block.
        pad_token_id (`int`, *optional*): passed to ``generate()``.
        sampling (`dict`, *optional*): ``{"temperature": float, "seed": int}`` to sample (seeded: the same text
            for every method), else greedy.
    """
    import hf_speculative as hfs

    kwargs: dict[str, Any] = dict(
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=trace.max_new_tokens,
        pad_token_id=pad_token_id,
        streamer=TokenStreamer(trace, cancel, model),
    )
    if sampling:
        # every method (the baseline and transformers' own included) draws with the seed's noise on an enabled
        # model: one seed, one text, so each pane's sample can be checked against the baseline's token for token
        hfs.enable(model)
        kwargs.update(do_sample=True, temperature=float(sampling["temperature"]), sampling_seed=int(sampling["seed"]))
    else:
        kwargs.update(do_sample=False)
    kwargs.update(extra)
    trace.status = "running"
    trace.started = time.perf_counter()
    try:
        with torch.inference_mode():
            model.generate(input_ids, **kwargs)
        trace.seconds = time.perf_counter() - trace.started
        if trace.spec.kind == "hfs":
            trace.final_stats = hfs.last_stats(model)  # thread-local: read it in this thread
        trace.status = "done"
    except GenerationCancelled:
        trace.seconds = time.perf_counter() - trace.started
        trace.status = "cancelled"
    except Exception as err:  # noqa: BLE001 - shown in the pane; the app keeps serving
        trace.seconds = time.perf_counter() - trace.started
        trace.error = describe_error(err)
        trace.status = "error"


def describe_error(err: BaseException) -> str:
    """A one-paragraph message for the page (the exception's own text, never a traceback)."""
    text = str(err).strip() or type(err).__name__
    if isinstance(err, torch.cuda.OutOfMemoryError):
        text = "the GPU ran out of memory; try fewer new tokens or a smaller model."
    return text if len(text) <= 600 else text[:600] + "…"
