"""What the MagicDec tests share: a strategy that checks, after every step, that each row's compressed cache holds
exactly the target's own keys and values at its sinks and window positions (computed from scratch), and a tiny
model whose drafts over a compressed cache are always right."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hf_speculative as hfs
from hf_speculative import compat
from tests.conftest import build_model


def expected_cache(target, text: torch.Tensor, sinks: int, window: int) -> tuple[list[int], list]:
    """The positions a compressed cache after ``text`` ``[1, n]`` keeps (the first ``sinks``, the last ``window``),
    and per layer the target's own keys and values there, ``[H, k, D]``, from one forward without a cache."""
    with torch.no_grad():  # forward itself: the call's hooks must not take this check's forward for a step
        out = target.forward(input_ids=text, use_cache=True)
    n = text.shape[1]
    positions = sorted(set(range(min(sinks, n))) | set(range(max(0, n - window), n)))
    layers = compat.cache_layer_tensors(compat.output_cache(out))
    return positions, [(k[0][:, positions], v[0][:, positions]) for k, v in layers]


def assert_cache_in_step(generator, sequence: torch.Tensor) -> None:
    """The row's compressed cache, after a step ending with ``sequence`` ``[1, L]``, holds the target's keys and
    values of ``sequence[:, :L - 1]`` (the newest token has none yet) at the kept positions, and nothing else."""
    group, state = generator.group, generator.group.rows[generator.row]
    if state.lost:
        raise AssertionError(f"the row lost its step: {group.info}")
    positions, layers = expected_cache(group.target, sequence[:, :-1], group.cache.sinks, group.cache.window)
    assert state.known == sequence.shape[1] - 1
    slots = group.cache.slots(torch.tensor(positions))
    filled = group.cache.filled[state.index]
    assert int(filled.sum()) == len(positions) and bool(filled[slots].all())
    for (keys, values), store_k, store_v in zip(layers, group.cache.keys, group.cache.values):
        torch.testing.assert_close(store_k[state.index][:, slots], keys, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(store_v[state.index][:, slots], values, atol=2e-5, rtol=1e-4)


@dataclasses.dataclass(eq=False)
class CheckedMagicDec(hfs.MagicDec):
    """``hfs.MagicDec`` whose rows check their compressed cache after every step (:func:`assert_cache_in_step`);
    ``checked`` counts the checks. A subclass declaring no method: the same drafter, registering nothing."""

    def __post_init__(self):
        super().__post_init__()
        self.checked = []

    def open(self, ctx):
        generator = super().open(ctx)
        observe = generator.observe

        def checking(sequence, tree, verdict, scores):
            observe(sequence, tree, verdict, scores)
            assert_cache_in_step(generator, sequence)
            self.checked.append(sequence.shape[1])

        generator.observe = checking
        return generator


def evicting(**options) -> hfs.MagicDec:
    """The matrix's settings (2 sinks, a window of 4, chains of 4 at every step): the tests' prompts evict."""
    return hfs.MagicDec(**{"window": 4, "sinks": 2, "num_tokens": 4, "confidence_threshold": 0.0, "adaptive": False,
                           **options})


def context_free_model(arch: str = "llama"):
    """A tiny model whose attention reads nothing (its value projections are zero): its next token depends on the last
    token alone, so a draft over any part of the cache is the target's own choice and always accepted."""
    model = build_model(arch)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight.zero_()
            if layer.self_attn.v_proj.bias is not None:
                layer.self_attn.v_proj.bias.zero_()
    return model


@pytest.fixture
def magicdec_costs():
    """Forget, after the test, the costs a MagicDec test fixed on its targets."""
    from hf_speculative.core.batch_costs import forget_batch_costs
    from hf_speculative.core.costs import forget_costs

    targets = []
    yield targets.append
    for target in targets:
        forget_costs(target)
        forget_batch_costs(target)
