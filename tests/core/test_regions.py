"""``core/regions.py``: a drafter's compiled regions by shape, at most ``MAX_REGIONS`` of a kind, compiled where the
drafter is, replayed as a new CUDA-graph step; drafters' own tests check each region against eager drafting."""

from __future__ import annotations

import torch
from torch import nn

from hf_speculative.core import regions


class Doubles(nn.Module):
    def forward(self, x):
        return 2 * x


def test_regions_are_made_once_per_shape_and_capped_per_kind(monkeypatch):
    monkeypatch.setattr(regions, "MAX_REGIONS", 3)
    made = []
    kept = regions.Regions(None, "cpu")

    def make():
        made.append(1)
        return Doubles()

    runs = [kept.get(("chain", n), make) for n in range(3)]
    assert kept.get(("chain", 1), make) is runs[1] and len(made) == 3
    assert kept.get(("chain", 3), make) is None  # a fourth chain shape: drafted as before
    assert kept.get(("tree", 5), make) is not None  # another kind has its own count
    assert all(isinstance(run, Doubles) for run in runs)  # uncompiled: the modules themselves


def test_compiled_regions_share_their_runs_and_replay_as_a_new_step(monkeypatch):
    compiled, replays = [], []
    monkeypatch.setattr(regions, "compile_region", lambda module, mode: compiled.append(mode) or module)
    monkeypatch.setattr(regions, "new_replay", lambda device: replays.append(device.type))
    shared: dict = {}
    first = regions.Regions("reduce-overhead", "cpu", runs=shared)
    run = first.get(("chain", 2), Doubles)
    assert compiled == ["reduce-overhead"] and isinstance(run.compiled, Doubles)
    assert regions.Regions("reduce-overhead", "cpu", runs=shared).get(("chain", 2), Doubles) is run  # not again
    assert compiled == ["reduce-overhead"]
    assert first.replay(run, torch.ones(2)).tolist() == [2.0, 2.0] and replays == ["cpu"]
    eager = regions.Regions(None, "cpu")
    assert eager.replay(eager.get(("chain", 2), Doubles), torch.ones(1)).tolist() == [2.0] and replays == ["cpu"]


def test_compiled_regions_run_under_a_recompile_limit_above_their_count():
    seen = []
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    before = getattr(config, name)
    run = regions._limited(lambda x: seen.append(getattr(config, name)) or x)
    run(torch.ones(1))
    assert seen == [max(before, regions.MAX_REGIONS + 1)]
    assert getattr(config, name) == before  # around the call only, not for the process


def test_longest_chains_are_replayed_on_cuda_only():
    assert regions.replays_longest_chain(torch.device("cuda"))
    assert not regions.replays_longest_chain(torch.device("cpu"))
