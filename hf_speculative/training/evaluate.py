"""The validation metric that matters: tau of real speculative generation on held-out prompts."""

from __future__ import annotations

import copy
from typing import Any

import torch


@torch.no_grad()
def validation_tau(net: Any, target: Any, examples: list, new_tokens: int = 64, draft: int = 6) -> float:
    """Mean accepted tokens per target forward of greedy generation with ``net`` (an EAGLE drafter or
    an exit adapter) drafting a fixed
    ``draft`` tokens (no cost policy, so the figure does not depend on the machine's speed), over
    the prompts of ``examples`` (their tokens before the first learnt one)."""
    import hf_speculative as hfs
    from hf_speculative.drafters.eagle.drafter import Eagle

    dtype = next(target.parameters()).dtype
    if next(net.parameters()).dtype != dtype:  # a float32 drafter in training, a bfloat16 target: draft as it will ship
        net = copy.deepcopy(net).to(dtype)
    if net.config.exit_layer is not None:
        strategy = hfs.EarlyExit(adapter=net, num_tokens=draft, confidence_threshold=0.0, adaptive=False)
    else:
        strategy = Eagle(net, num_tokens=draft, confidence_threshold=0.0, adaptive=False)
    return greedy_tau(target, strategy, examples, new_tokens)


@torch.no_grad()
def greedy_tau(target: Any, strategy: Any, examples: list, new_tokens: int = 64) -> float:
    """Mean tokens per target forward of greedy generation (``new_tokens`` per prompt) drafting with ``strategy``,
    over the prompts of ``examples`` (their tokens before the first learnt one), rounded to 3 decimals. ``target``
    is enabled for the measurement when it is not yet, and disabled again after it."""
    import hf_speculative as hfs

    enabled_here = not hfs.is_enabled(target)
    if enabled_here:
        hfs.enable(target)
    tokens = forwards = 0
    try:
        for ex in examples:
            ids = torch.tensor([ex.ids[: ex.prompt_length]], device=next(target.parameters()).device)
            target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                            do_sample=False, candidate_generator=strategy)
            stats = hfs.last_stats(target)
            tokens += stats.new_tokens
            forwards += stats.target_forwards
    finally:
        if enabled_here:
            hfs.disable(target)
    return round(tokens / max(forwards, 1), 3)
