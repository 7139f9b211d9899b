"""Feeding a draft model on its own KV cache: shared by the same-tokenizer generator (drafter.py) and the one that
drafts across tokenizers (other_tokenizer.py)."""

from __future__ import annotations

import time
from typing import Any

import torch

from ... import compat
from ...core.costs import record_catch_up, record_draft_step

LONG_CATCH_UP = 32  # tokens fed at once from which a catch-up is timed per token, and weighed before it runs


def size_ratio(drafter: torch.nn.Module, target: torch.nn.Module) -> float:
    """The drafter's parameters over the target's: the price of one drafter forward, in target forwards, until both
    are measured (forwards cost in proportion to parameters)."""
    return sum(p.numel() for p in drafter.parameters()) / max(sum(p.numel() for p in target.parameters()), 1)


def feed(generator: Any, tokens: list[int], device: torch.device) -> torch.Tensor:
    """Feed ``tokens`` (the drafter's ids) to ``generator.drafter`` on its cache: ``generator.cache`` becomes the
    extended cache and ``generator.fed`` gains ``tokens``; a one-token forward is timed as one draft step
    (core/costs.py). Returns the drafter's logits for the next position, `[V_draft]`.

    ``generator`` holds ``drafter`` (the model), ``cache``, ``fed`` (the tokens whose keys/values are in the cache)
    and ``_keep_last`` (``compat.logits_to_keep_kwargs(drafter, 1)``).
    """
    start = time.perf_counter()
    ids = torch.tensor([tokens], dtype=torch.long, device=device)  # [1, T]
    out = generator.drafter(input_ids=ids, **{compat.cache_kwarg(): generator.cache}, use_cache=True,
                            **generator._keep_last)
    generator.cache = compat.output_cache(out)
    generator.fed.extend(tokens)
    if len(tokens) == 1:
        record_draft_step(generator.drafter, time.perf_counter() - start)
    elif len(tokens) >= LONG_CATCH_UP:
        record_catch_up(generator.drafter, (time.perf_counter() - start) / len(tokens))
    return out.logits[0, -1]
