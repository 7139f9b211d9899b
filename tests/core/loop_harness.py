"""The loop driven with one row and an already open drafter: for tests and benchmarks of the loop alone.

``generate()`` enters the loop through ``hf_speculative.core.entry.generate``, which builds the rows from the call's
strategy; this harness hands :func:`~hf_speculative.core.loop.ladder` a drafter the test opened itself (a scripted
one, a drafter with fixed budgets), with the same verifier, outputs and :func:`~hf_speculative.core.loop.finish`.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from hf_speculative.core.loop import Drafter, LoopResult, Row, finish, ladder
from hf_speculative.core.rows import Outputs, SoloWidth
from hf_speculative.core.stats import SpeculativeStats
from hf_speculative.core.verify import DynamicVerifier


def run(target: torch.nn.Module, input_ids: torch.LongTensor, drafter: Drafter, *,
        stopping_criteria: Any, logits_processor: Any = None, streamer: Any = None,
        stats: SpeculativeStats | None = None, max_depth: int = 64, max_length: int | None = None,
        verifier: Any = None, cached: int = 0, sampler: Any = None) -> LoopResult:
    """Speculative decoding of one sequence (``input_ids`` ``[1, L]``) with ``drafter``'s trees: greedy, or under
    sampling an exact sample of the target's distribution when ``logits_processor`` ends with the call's
    :class:`~hf_speculative.core.sampling.SeededSampler` (its scores are then the seeded draw; see accept.py).

    ``stopping_criteria`` decides the end (transformers' list: max length, EOS, stop strings, custom ones);
    it is checked after every token, so a stop inside an accepted path ends the text exactly there.
    ``verifier`` runs the forwards and keeps the cache (``forward(uncached, tree)``, ``keep(prefix, tree, path)``):
    a :class:`~hf_speculative.core.verify.DynamicVerifier` by default, a static-cache one for compiled targets;
    ``cached``: the prompt's first tokens already in its cache (a cache the caller passed), not computed again.
    ``sampler``: the call's sampler (a ``SeededSampler`` or a ``RejectionSampler``) when ``logits_processor`` is a
    function that hides it (it is found at the end of a processor list otherwise). The streamer gets each step's new
    tokens as one block ``[1, k]``; the result keeps every new token's scores and logits ``[1, V]``.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"hf_speculative's loop runs one sequence at a time; got input_ids of shape "
                         f"{tuple(input_ids.shape)} (a batch enters through generate(): core/entry.py).")
    stats = stats or SpeculativeStats()
    started = time.perf_counter()
    rows = [Row(input_ids, 0, drafter, logits_processor, owned=False, sampler=sampler)]  # the caller closes it
    outputs = Outputs(1, input_ids.shape[1], 0, streamer, scores=True, logits=True)
    pending = input_ids[:, cached:]  # [1, m]
    if verifier is None:
        verifier = DynamicVerifier(target, cached=cached)
    elif cached:
        verifier.length = cached
    limit = ladder(rows, verifier, pending, torch.ones_like(pending, dtype=torch.bool),
                   stopping_criteria=stopping_criteria, stats=stats,
                   max_length=max_length if max_length is not None else 2 ** 62, max_depth=max_depth,
                   widths=SoloWidth(), outputs=outputs, cut_at_stop=True)
    return finish(rows, input_ids, limit, 0, outputs, stats, started)
