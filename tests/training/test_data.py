"""``FeatureCache``: the target's features cached for drafter training, one example per forward or
batched by length, resumed after an interruption; ``length_batches``'s grouping."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_speculative.training import data
from hf_speculative.training.data import Example, FeatureCache, length_batches
from tests.conftest import build_model


def examples_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(4, 60, (n,), generator=g).tolist()
        out.append(Example(ids, [0] * (n // 2) + [1] * (n - n // 2 - 1) + [0]))
    return out


LENGTHS = [9, 31, 12, 12, 40, 5, 17, 23, 8, 33, 14, 6]


def test_length_batches_cover_every_index_once_within_the_budget():
    batches = length_batches(LENGTHS, range(len(LENGTHS)), batch_tokens=64)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(LENGTHS)))
    assert [LENGTHS[i] for i in flat] == sorted(LENGTHS, reverse=True)  # longest first, so padding is small
    for b in batches:
        assert len(b) * max(LENGTHS[i] for i in b) <= 64
    assert length_batches(LENGTHS, range(3, 7), batch_tokens=1) == [[4], [6], [3], [5]]  # one per forward
    assert length_batches(LENGTHS, [], batch_tokens=64) == []
    assert length_batches([100, 3], [0, 1], batch_tokens=10) == [[0], [1]]  # too long for the budget: alone


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("layers", [[1, 0], []])
def test_batched_cache_matches_one_forward_per_example(tmp_path, arch, layers):
    """Right-padded batches give every example the features, final states and argmax of its own forward."""
    target = build_model(arch, layers=3)
    examples = examples_of(LENGTHS)
    cache = FeatureCache.build(tmp_path / "b", target, examples, layers, chunk=5, batch_tokens=80, progress=False)
    assert len(cache) == len(examples)
    assert all(not m._forward_hooks for m in target.modules())
    for i, ex in enumerate(examples):
        with torch.no_grad():
            out = target(input_ids=torch.tensor([ex.ids]), output_hidden_states=True, use_cache=False)
        feats, final, top = cache.get(i)
        assert feats.shape == (len(ex.ids), 32 * max(len(layers), 1)) and final.shape == (len(ex.ids), 32)
        assert torch.equal(top, out.logits[0].argmax(-1))
        expected = torch.cat([out.hidden_states[k + 1][0] for k in layers], -1) if layers else final
        torch.testing.assert_close(feats, expected, atol=2e-3, rtol=2e-3)
        # the final normed state is the one the lm_head reads: it reproduces the target's logits
        head = target.get_output_embeddings()
        logits = head(final)
        cap = getattr(target.config, "final_logit_softcapping", None)
        if cap:  # Gemma soft-caps its logits (a monotone map: the argmax is the same)
            logits = torch.tanh(logits / cap) * cap
        torch.testing.assert_close(logits, out.logits[0], atol=2e-3, rtol=2e-3)

    single = FeatureCache.build(tmp_path / "s", target, examples, layers, batch_tokens=1, progress=False)
    np.testing.assert_array_equal(np.asarray(single.top), np.asarray(cache.top))
    np.testing.assert_allclose(np.asarray(single.features, np.float32), np.asarray(cache.features, np.float32), atol=2e-3)


def test_a_kill_while_the_index_is_written_leaves_the_last_one(tmp_path, monkeypatch):
    """The index is replaced by a rename: killed half-way through writing it, the cache keeps the last whole one and
    resumes from it (a half-written index had stopped the next start on its JSON)."""
    target = build_model("llama", layers=3)
    examples = examples_of(LENGTHS)
    whole = FeatureCache.build(tmp_path / "whole", target, examples, [0, 1], chunk=4, batch_tokens=64, progress=False)
    real_replace, writes = os.replace, []

    def replace(src, dst, *args, **kwargs):  # the rename that puts a written index in place
        if Path(dst).parent.name == "part" and Path(dst).name == "index.json":
            writes.append(dst)
            if len(writes) == 3:  # the start's index, the first chunk's, then the second chunk's dies half-written
                text = Path(src).read_text()
                Path(src).write_text(text[: len(text) // 2])
                raise KeyboardInterrupt
        return real_replace(src, dst, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", replace)
        with pytest.raises(KeyboardInterrupt):
            FeatureCache.build(tmp_path / "part", target, examples, [0, 1], chunk=4, batch_tokens=64, progress=False)
    assert FeatureCache(tmp_path / "part").done == 4  # the first chunk's index, whole
    resumed = FeatureCache.build(tmp_path / "part", target, examples, [0, 1], chunk=4, batch_tokens=64, progress=False)
    np.testing.assert_array_equal(np.asarray(resumed.features), np.asarray(whole.features))
    assert resumed.done == len(LENGTHS) and not list((tmp_path / "part").glob(".index.json.*"))  # no temporary left


def test_interrupted_cache_resumes_from_the_last_saved_chunk(tmp_path, monkeypatch):
    target = build_model("llama", layers=3)
    examples = examples_of(LENGTHS)
    whole = FeatureCache.build(tmp_path / "whole", target, examples, [0, 1, 2], chunk=4, batch_tokens=64, progress=False)

    real, calls = data._forward_features, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # inside the second chunk
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(data, "_forward_features", failing)
    with pytest.raises(KeyboardInterrupt):
        FeatureCache.build(tmp_path / "part", target, examples, [0, 1, 2], chunk=4, batch_tokens=64, progress=False)
    assert FeatureCache(tmp_path / "part").done == 4  # the first chunk was saved, the second was not
    assert all(not m._forward_hooks for m in target.modules())  # hooks removed on the way out

    seen = []
    monkeypatch.setattr(data, "_forward_features", lambda t, seqs, *a, **k: seen.extend(map(len, seqs)) or real(t, seqs, *a, **k))
    resumed = FeatureCache.build(tmp_path / "part", target, examples, [0, 1, 2], chunk=4, batch_tokens=64, progress=False)
    assert sorted(seen) == sorted(LENGTHS[4:])  # only the examples not saved yet
    np.testing.assert_array_equal(np.asarray(resumed.features), np.asarray(whole.features))
    np.testing.assert_array_equal(np.asarray(resumed.top), np.asarray(whole.top))

    # another source starts over instead of mixing two datasets
    seen.clear()
    FeatureCache.build(tmp_path / "part", target, examples, [0, 1, 2], source="other", chunk=4, batch_tokens=64,
                       progress=False)
    assert sorted(seen) == sorted(LENGTHS)


def test_bad_sizes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="batch_tokens=0"):
        FeatureCache.build(tmp_path, build_model("llama"), examples_of([6]), [], batch_tokens=0, progress=False)


def test_training_batches_features_on_accelerators_only(tmp_path, monkeypatch):
    """On a CPU one example per forward measured as fast as batching; a GPU gets batches by default."""
    real, sizes = data._forward_features, []
    monkeypatch.setattr(data, "_forward_features", lambda t, seqs, *a, **k: sizes.append(len(seqs)) or real(t, seqs, *a, **k))
    FeatureCache.build(tmp_path, build_model("llama"), examples_of(LENGTHS), [0, 1], progress=False)
    assert sizes == [1] * len(LENGTHS)  # the target is on the CPU here
    from hf_speculative.training.config import TrainConfig
    from hf_speculative.training.data import default_batch_tokens

    assert default_batch_tokens(torch.device("cpu")) == 1
    assert default_batch_tokens(torch.device("cuda")) == 4096
    assert TrainConfig(target="t", data=["d"], out="o").feature_batch_tokens is None
    with pytest.raises(ValueError, match="feature_batch_tokens=0"):
        TrainConfig(target="t", data=["d"], out="o", feature_batch_tokens=0)


class _Threads:
    """Two "processes" as threads: what FeatureCache.build reads of accelerate's state."""

    def __init__(self, rank: int, barrier):
        self.process_index, self.num_processes, self._barrier = rank, barrier.parties, barrier

    def wait_for_everyone(self):
        self._barrier.wait(timeout=120)


def build_together(directory, targets, examples, **kw):
    """``FeatureCache.build`` run by ``len(targets)`` threads sharing the files, as processes would."""
    import copy
    import threading

    barrier, errors = threading.Barrier(len(targets)), []

    def run(rank):
        try:
            FeatureCache.build(directory, targets[rank], examples, [0, 1, 2], state=_Threads(rank, barrier),
                               progress=False, **kw)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return FeatureCache(directory)


def test_processes_share_the_cache_and_write_what_one_writes(tmp_path, monkeypatch):
    """Each process computes every N-th chunk into the shared files; the cache equals one process's,
    and a cache whose processes stopped resumes from the chunks they noted as finished."""
    import copy
    import json

    target = build_model("llama", layers=3)
    examples = examples_of(LENGTHS)
    whole = FeatureCache.build(tmp_path / "whole", target, examples, [0, 1, 2], chunk=4, batch_tokens=1, progress=False)
    seen = {}
    real = data._forward_features

    def counting(t, seqs, *a, **k):
        seen.setdefault(id(t), []).extend(map(len, seqs))
        return real(t, seqs, *a, **k)

    monkeypatch.setattr(data, "_forward_features", counting)
    targets = [target, copy.deepcopy(target)]  # one model each, as processes have: hooks are per model
    shared = build_together(tmp_path / "shared", targets, examples, chunk=4, batch_tokens=1)
    assert shared.done == len(examples) and not list((tmp_path / "shared").glob("finished.*"))
    for name in ("features", "final", "top"):
        np.testing.assert_array_equal(np.asarray(getattr(shared, name)), np.asarray(getattr(whole, name)))
    # 12 examples in chunks of at most 4, as many for each process: 4 chunks of 3, dealt out in turn
    assert sorted(seen[id(targets[0])]) == sorted(LENGTHS[0:3] + LENGTHS[6:9])
    assert sorted(seen[id(targets[1])]) == sorted(LENGTHS[3:6] + LENGTHS[9:12])

    # stopped: the second process had noted examples 4-7 as finished, the first process nothing
    folder = tmp_path / "stopped"
    built = build_together(folder, targets, examples, chunk=4, batch_tokens=1)
    index = json.loads((folder / "index.json").read_text())
    (folder / "index.json").write_text(json.dumps(dict(index, done=0, finished=[])))
    (folder / "finished.1.json").write_text(json.dumps([[4, 8]]))
    seen.clear()
    again = build_together(folder, targets, examples, chunk=4, batch_tokens=1)
    assert sorted(n for lengths in seen.values() for n in lengths) == sorted(LENGTHS[:4] + LENGTHS[8:])
    np.testing.assert_array_equal(np.asarray(again.features), np.asarray(whole.features))
    assert json.loads((folder / "index.json").read_text())["done"] == len(examples) and built.done == len(examples)

    # one process alone resumes what several left, and counts the notes they wrote
    (folder / "index.json").write_text(json.dumps(dict(index, done=0, finished=[[8, 12]])))
    (folder / "finished.0.json").write_text(json.dumps([[0, 4]]))
    seen.clear()
    alone = FeatureCache.build(folder, target, examples, [0, 1, 2], chunk=4, batch_tokens=1, progress=False)
    assert sorted(n for lengths in seen.values() for n in lengths) == sorted(LENGTHS[4:8])
    np.testing.assert_array_equal(np.asarray(alone.final), np.asarray(whole.final))
    assert alone.done == len(examples) and not list(folder.glob("finished.*"))


def test_the_pass_runs_on_the_cpu_path_and_leaves_the_target_as_it_was(tmp_path):
    """An fp32 CPU target runs the feature pass on optimize_for_cpu's path (the kernel, native layers for the short
    examples), which is undone after: the features of the stock forward up to float rounding, the same argmax."""
    from hf_speculative.cpu.layout import cpu_layout

    target = build_model("llama", layers=3)
    examples = examples_of(LENGTHS)
    stock = FeatureCache.build(tmp_path / "stock", target, examples, [1, 0], batch_tokens=1, progress=False,
                               fast_cpu=False)
    seen = []
    original = data._cpu_path

    def spy(model):
        undo = original(model)
        seen.append(cpu_layout(model))
        return undo

    data._cpu_path = spy
    try:
        fast = FeatureCache.build(tmp_path / "fast", target, examples, [1, 0], batch_tokens=1, progress=False)
    finally:
        data._cpu_path = original
    assert seen in (["all+kernel"], ["all"])  # the kernel where it builds, else the column-major layout
    assert cpu_layout(target) == "none" and all(not m._forward_hooks for m in target.modules())
    np.testing.assert_array_equal(np.asarray(fast.top), np.asarray(stock.top))
    np.testing.assert_allclose(np.asarray(fast.features, np.float32), np.asarray(stock.features, np.float32),
                               atol=2e-3)
    np.testing.assert_allclose(np.asarray(fast.final, np.float32), np.asarray(stock.final, np.float32), atol=2e-3)
    # a target laid out already, or not fp32, is left as it is
    assert data._cpu_path(target.to(torch.bfloat16)) is None and cpu_layout(target) == "none"
