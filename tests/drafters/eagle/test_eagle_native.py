"""EAGLE's decoder layer on the native calls (``hf_speculative/cpu/layers.py``): once the drafter's network follows a
target laid out by ``optimize_for_cpu`` (its products on the kernel), its forwards of 1-16 positions compute what
its PyTorch operators compute, with a KV cache, causal or tree masks, for EAGLE-1 and EAGLE-3 (whose q/k/v read the
2H-wide ``[norm(embedding); norm(feature)]``)."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.cpu.layout import follow_layout
from hf_speculative.drafters.eagle.model import DraftKVCache
from tests.conftest import build_model, random_eagle

pytestmark = pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA")


class _Counting:
    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def layer_output(self, plan, x, *args):
        self.calls.append(x.shape[1])
        return self.kernel.layer_output(plan, x, *args)


def _passes(net, features: torch.Tensor, embeds: torch.Tensor) -> list[torch.Tensor]:
    """A catch-up of 5 positions, a step of one, then 3 tree nodes (two siblings and a child) under a mask."""
    cache = DraftKVCache()
    out = [net(embeds[:, :5], features[:, :5], torch.arange(5)[None], cache, fused=True)]
    out.append(net(embeds[:, 5:6], out[-1][:, -1:], torch.tensor([[5]]), cache, fused=False))
    seen = torch.ones(3, 9, dtype=torch.bool)
    seen[0, 7:] = False  # node 0 sees the prefix and itself
    seen[1, 6] = seen[1, 8] = False  # node 1, node 0's sibling
    seen[2, 7] = False  # node 2, node 0's child
    out.append(net(embeds[:, 6:9], out[-1][:, -1:].expand(1, 3, -1).contiguous(), torch.tensor([[6, 6, 7]]), cache,
                   fused=False, attn_mask=seen))
    return out


@pytest.mark.parametrize("version", [1, 3])
def test_eagle_layer_on_native_calls_computes_its_pytorch_function(version, monkeypatch):
    target = build_model("llama", hidden=64)
    net = random_eagle(target, version=version)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    plain = copy.deepcopy(net)
    hfs.optimize_for_cpu(target, kernel=True)
    follow_layout(net, target)
    follow_layout(plain, target)
    calls: list = []
    torch.manual_seed(3)
    width = net.fc.in_features - (net.config.hidden_size if version == 1 else 0)
    features, embeds = torch.randn(1, 9, width), torch.randn(1, 9, net.config.hidden_size)
    with torch.no_grad():
        monkeypatch.setattr(cpu_kernel, "_KERNEL", _Counting(cpu_kernel.load_kernel(), calls))
        got = _passes(net, features, embeds)
        monkeypatch.setattr("hf_speculative.drafters.eagle.model.drafter_kernel", lambda *a: None)
        want = _passes(plain, features, embeds)
    assert calls == [5, 1, 3]  # every pass ran natively
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
