"""A draft step as one compiled region (issue 69): what EAGLE's, DFlash's and Medusa's captured steps share.

Under ``hfs.enable(model, compile=...)`` a drafter whose step has a fixed shape (a chain's length, a tree's node
count and levels, a block's width) runs the whole step, its network's forwards and the choice of its tokens, as one
``nn.Module`` compiled for that shape: on a GPU one CUDA graph (``mode="reduce-overhead"``), where the host would
otherwise launch every kernel of every forward and read the chosen tokens between them. The host reads once, after
the region. Regions are kept per shape, like CUDA graphs per batch size, at most :data:`MAX_REGIONS` of a kind;
a shape past them drafts as it did before (eagerly, reading as it goes).

Tests and ``benchmarks/host_ops.py`` replace :func:`compile_region` to run the regions as they are (uncompiled).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from torch import nn

from .. import compat
from .static_cache import new_replay

MAX_REGIONS = 16  # shapes of a kind captured per drafter; others draft as before (many tree sizes)
# where a chain under the cost rules drafts its longest length in one region and the rule is replayed after the read:
# on a GPU a drafter forward in a graph costs less than a read of the device per token; on a CPU it costs real time
ADAPTIVE_CHAIN_DEVICES = ("cuda",)


def compile_region(module: nn.Module, mode: str) -> Callable:
    """``module`` compiled for fixed shapes (tests replace this to run the regions eagerly)."""
    return torch.compile(module, mode=mode, dynamic=False)


def replays_longest_chain(device: torch.device) -> bool:
    """Whether a chain under the cost rules is drafted at its longest in one region on ``device`` (then cut by the
    rule replayed on what was read), rather than token by token with a read each."""
    return device.type in ADAPTIVE_CHAIN_DEVICES


class Regions:
    """The compiled regions of one drafter, by shape.

    Args:
        mode (`str`, *optional*): ``torch.compile``'s mode; ``None``: the regions run as they are (a step borrowed
            while another call holds the shared, compiled one).
        device (`torch.device`): where they run (a CUDA replay starts a new graph-tree step).
        runs (`dict`, *optional*): where they are kept, by shape (the module they run over keeps them, so that the
            calls sharing it share its regions); a new one by default.
    """

    def __init__(self, mode: str | None, device: torch.device, runs: dict | None = None):
        self.mode, self.device = mode, torch.device(device)
        self.runs = {} if runs is None else runs

    @property
    def compiled(self) -> bool:
        return self.mode is not None

    def get(self, key: tuple[Hashable, ...], make: Callable[[], nn.Module]) -> Callable | None:
        """The region for shape ``key`` (its first item is its kind), made by ``make()`` and compiled on first use;
        ``None`` past :data:`MAX_REGIONS` of its kind."""
        run = self.runs.get(key)
        if run is None:
            if sum(1 for other in self.runs if other[0] == key[0]) >= MAX_REGIONS:
                return None
            region = make()
            run = self.runs[key] = _limited(compile_region(region, self.mode)) if self.compiled else region
        return run

    def replay(self, run: Callable, *inputs: torch.Tensor):
        """``run(*inputs)``, a compiled one as a fresh replay. Its outputs are the graph's buffers on a GPU:
        copy what outlives the next replay."""
        if self.compiled:
            new_replay(self.device)
        return run(*inputs)


def _limited(run: Callable) -> Callable:
    """``run`` (a compiled region) called where torch may compile its class's forward once per shape: the regions of
    a kind share one code object, and torch's default of 8 compiles of one would run the later shapes eagerly."""
    def call(*inputs: torch.Tensor):
        with compat.recompile_limit(MAX_REGIONS + 1):
            return run(*inputs)
    call.compiled = run  # (what tests look at)
    return call
