"""``hf_speculative.bench.bandwidth``: the weights' bytes per token (counted by hand here, from the tiny models'
shapes), the machine's read bandwidth (a few MiB, never timed against anything) and the line the tables print."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.bench import bandwidth as B
from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.cpu.kernel import KernelLinear
from tests.conftest import build_model

needs_kernel = pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA")
HIDDEN, INTER, LAYERS, KV = 32, 64, 2, 16  # build_model's shapes: 4 heads of 8, 2 key/value heads


def _padded(out_features: int) -> int:
    return -(-out_features // 16) * 16


def _expected(vocab: int, *, tied: bool = False, qkv_bias: bool = False, copy=None) -> int:
    """One token's weight bytes of build_model's tiny model, from its shapes: ``copy(out, in)`` gives a linear
    weight's bytes (default fp32, unpadded)."""
    copy = copy or (lambda out, inp: 4 * out * inp)
    shapes = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (INTER, HIDDEN), (INTER, HIDDEN),
              (HIDDEN, INTER)]  # q, k, v, o, gate, up, down
    layer = sum(copy(out, inp) for out, inp in shapes) + 4 * 2 * HIDDEN  # and two RMSNorms
    layer += 4 * (HIDDEN + 2 * KV) if qkv_bias else 0
    embedding_row = 0 if tied else 4 * HIDDEN  # tied: the lm_head's whole read is the table's only count
    return LAYERS * layer + 4 * HIDDEN + copy(vocab, HIDDEN) + embedding_row  # final norm, lm_head, embedding


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_weight_bytes_counts_every_weight_once_and_one_embedding_row(arch):
    model = build_model(arch)
    assert B.weight_bytes(model) == _expected(96, qkv_bias=arch == "qwen2")
    model.lm_head.weight = model.model.embed_tokens.weight  # tie_word_embeddings: one parameter
    assert B.weight_bytes(model) == _expected(96, tied=True, qkv_bias=arch == "qwen2")


@needs_kernel
def test_weight_bytes_counts_the_kernels_copies_where_they_are_read(monkeypatch):
    monkeypatch.delenv("HFS_KERNEL_BF16", raising=False)
    model = build_model("llama", vocab_size=100)  # an lm_head of 100 outputs: a copy padded to 112
    q = model.model.layers[0].self_attn.q_proj
    q.weight.data = q.weight.data.bfloat16().float()  # every value a bf16 number: copied in bf16
    hfs.optimize_for_cpu(model, kernel=True)
    assert type(model.lm_head) is KernelLinear and q._hfs_blocked.tensor[0].dtype == torch.bfloat16

    def exact(out, inp):
        return 4 * _padded(out) * inp

    narrow = 2 * HIDDEN * HIDDEN - 4 * HIDDEN * HIDDEN  # layer 0's q_proj at 2 bytes instead of 4
    assert B.weight_bytes(model) == _expected(100, copy=exact) + narrow
    hfs.optimize_for_cpu(model, kernel=True, weights="int8")
    assert B.weight_bytes(model) == _expected(100, copy=lambda out, inp: _padded(out) * inp + 4 * _padded(out))
    hfs.optimize_for_cpu(model, False)  # the weights again: fp32, unpadded
    assert B.weight_bytes(model) == _expected(100)


def test_no_bandwidth_fields_off_the_cpu():
    meta = build_model("llama").to("meta")  # weights elsewhere, as on a GPU: a CPU's read is not their limit
    assert B.bandwidth_fields(meta) == {}


def test_bandwidth_fields_of_a_cpu_model(monkeypatch):
    monkeypatch.setenv(B.ENV, "21.5")
    model = build_model("llama")
    assert B.bandwidth_fields(model) == {"weight_bytes_per_token": _expected(96), "read_bandwidth_gbs": 21.5,
                                         "read_bandwidth_from": B.ENV}


def test_the_environment_variable_replaces_the_measurement(monkeypatch):
    monkeypatch.setattr(B, "_measured", lambda *args: pytest.fail("measured despite HFS_READ_BANDWIDTH_GBS"))
    monkeypatch.setenv(B.ENV, "23.5")
    assert B.measure_read_bandwidth() == 23.5 and B.read_bandwidth_source() == B.ENV
    for bad in ("fast", "0", "-3", "nan", "inf"):
        monkeypatch.setenv(B.ENV, bad)
        with pytest.raises(ValueError, match=f"HFS_READ_BANDWIDTH_GBS={bad!r}: give this machine's"):
            B.measure_read_bandwidth()


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=needs_kernel)])
def test_measure_read_bandwidth_of_a_few_mib(monkeypatch, kernel):
    monkeypatch.delenv(B.ENV, raising=False)
    assert B.read_bandwidth_source() == "measured"
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gbs = B.measure_read_bandwidth(4 << 20, repeats=2, kernel=kernel)
        assert torch.get_num_threads() == 2  # measured on one thread, the caller's count given back
    finally:
        torch.set_num_threads(previous)
    assert isinstance(gbs, float) and 0 < gbs < float("inf")
    assert B.measure_read_bandwidth(4 << 20, repeats=2, kernel=kernel) == gbs  # once per process: not timed again


def test_the_kernels_read_covers_the_bytes_asked(monkeypatch):
    """The kernel's measurement reads blocked matrices of ``nbytes`` in all (8 of 128 MiB for 1 GiB)."""
    made = []
    monkeypatch.setattr(B._kernel, "skinny_linear", lambda x, blocked, *rest: made.append(blocked))
    assert B._kernel_read_gbs(3 << 20, 1) > 0
    assert sum(b.numel() * 4 for b in made) == 2 * (3 << 20)  # the untimed first pass, then the timed one
    assert all(b.shape[1:] == (8192, 16) and b.dtype == torch.float32 for b in made)


def test_format_bandwidth():
    line = B.format_bandwidth(540_000_000, tokens_per_s=25.0, read_bandwidth_gbs=23.0)
    assert line == "weights 540 MB/token -> 13.5 GB/s at 25.0 tok/s, 59% of this machine's 23.0 GB/s single-thread read"
    assert B.format_bandwidth(540_000_000, seconds_per_token=0.04, read_bandwidth_gbs=23.0) == line
    assert (B.format_bandwidth(71_200, tokens_per_s=400.0, read_bandwidth_gbs=20.0, source=B.ENV, threads=2)
            == "weights 71.2 kB/token -> 0.0285 GB/s at 400.0 tok/s, 0% of this machine's 20.0 GB/s single-thread "
               "read (HFS_READ_BANDWIDTH_GBS) (decoding on 2 threads)")
    assert B.format_bandwidth(3_090_000_000, tokens_per_s=2.0) == "weights 3.09 GB/token -> 6.18 GB/s at 2.0 tok/s"
    assert B.format_bandwidth(999_600_000, tokens_per_s=1500.0) == "weights 1 GB/token -> 1499 GB/s at 1500.0 tok/s"
    assert B.format_bandwidth(999_400_000, tokens_per_s=1.0).startswith("weights 999 MB/token -> 0.999 GB/s")
