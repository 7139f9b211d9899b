"""``hf_speculative.bench.profile``: verification timings on a model, saved, then loaded and interpolated by
``hf_speculative.core.cost_profile`` (the reading side, which the core uses)."""

from __future__ import annotations

import json

import pytest
from tests.conftest import build_model

from hf_speculative.bench import profile as P
from hf_speculative.core.cost_profile import load, relative_cost


def test_profile_of_a_tiny_model_round_trips(tmp_path):
    model = build_model("llama")
    settings = P.ProfileSettings(contexts=(16, 40), sizes=(0, 1, 4), repeats=2, warmup=1)
    result = P.profile(model, settings, label="tiny")
    assert set(result["seconds"]) == {"16", "40"}
    for context in ("16", "40"):
        for shape in ("chain", "tree"):
            assert set(result["seconds"][context][shape]) == {"0", "1", "4"}
            assert all(t > 0 for t in result["seconds"][context][shape].values())
            assert result["relative"][context][shape]["0"] == 1.0
    path = P.save(result, tmp_path / "p.json")
    assert load(path) == json.loads(path.read_text()) == result
    # the cache is left as found: a second profile on the same model measures the same shapes
    assert P.profile(model, settings)["settings"] == result["settings"]


def test_relative_cost_interpolates_and_extrapolates():
    result = {"relative": {"512": {"tree": {"0": 1.0, "4": 1.2, "8": 2.0}},
                           "2048": {"tree": {"0": 1.0, "4": 1.5, "8": 3.0}}}}
    assert relative_cost(result, 0) == 1.0
    assert relative_cost(result, 2) == pytest.approx(1.1)
    assert relative_cost(result, 6, context=600) == pytest.approx(1.6)
    assert relative_cost(result, 6, context=1800) == pytest.approx(2.25)
    assert relative_cost(result, 12) == pytest.approx(2.8)  # past the last size: the last slope


def test_shipped_configs_build_their_real_architectures():
    assert P.shipped_configs() == ["llama-3.1-8b", "qwen2.5-1.5b", "qwen2.5-7b", "smollm2-135m"]
    model = P.random_model("llama-3.1-8b", device="meta")
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248
    small = P.random_model("smollm2-135m", device="meta")
    assert sum(p.numel() for p in small.parameters()) == 134_515_008


def test_batch_profile_times_the_batch_loop_s_forwards():
    model = build_model("qwen2")
    settings = P.ProfileSettings(contexts=(12,), sizes=(0, 2, 6), repeats=2, warmup=1, batches=(1, 3))
    result = P.profile(model, settings)
    assert set(result["batch_seconds"]["12"]) == {"1", "3"}
    for batch in ("1", "3"):
        assert set(result["batch_seconds"]["12"][batch]) == {"0", "2", "6"}
        assert all(t > 0 for t in result["batch_seconds"]["12"][batch].values())
        assert result["batch_relative"]["12"][batch]["0"] == 1.0
    assert "batch_seconds" not in P.profile(model, P.ProfileSettings(contexts=(12,), sizes=(0, 2), repeats=1))


def test_batch_verifier_undo_leaves_the_cache_as_it_was():
    """What the batch profile relies on: a forward undone leaves no trace in the next forward's logits."""
    import torch

    from hf_speculative.core.batch_verify import BatchVerifier
    from hf_speculative.core.tree import DraftTree

    model = build_model("llama")
    prompt = torch.tensor([[3, 5, 6, 7, 8], [0, 0, 4, 9, 10]])
    mask = prompt != 0

    def verifier():
        v = BatchVerifier(model, 2)
        v.forward(prompt[:, :-1], mask[:, :-1], [DraftTree.empty()] * 2)
        v.keep([(), ()])
        return v

    chain = DraftTree.chain(torch.tensor([11, 12, 13]))
    undone, fresh = verifier(), verifier()
    undone.forward(prompt[:, -1:], torch.ones(2, 1, dtype=torch.bool), [chain, DraftTree.empty()])
    undone.undo()
    step = [DraftTree.chain(torch.tensor([20])), chain]
    expected = fresh.forward(prompt[:, -1:], torch.ones(2, 1, dtype=torch.bool), step)
    got = undone.forward(prompt[:, -1:], torch.ones(2, 1, dtype=torch.bool), step)
    torch.testing.assert_close(got, expected)
    assert torch.equal(undone.slots, fresh.slots) and torch.equal(undone.lengths, fresh.lengths)


@pytest.mark.parametrize("kwargs, message", [
    (dict(contexts=()), "contexts"), (dict(contexts=(0,)), "contexts"),
    (dict(sizes=(1, 2)), "need 0"), (dict(sizes=(0, 1000)), "up to 256"),
    (dict(shapes=("ring",)), "chain and/or tree"), (dict(repeats=0), "repeats"),
    (dict(batches=(0, 2)), "batch sizes from 1 to 64"), (dict(batches=(2,), compile="default"), "without compile"),
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        P.ProfileSettings(**kwargs)


def test_bad_inputs_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="use one of llama-3.1-8b"):
        P.random_model("gpt-5")
    (tmp_path / "x.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not an hf-speculative profile"):
        load(tmp_path / "x.json")


def test_a_cpu_profile_records_the_one_token_forwards_weight_bandwidth(monkeypatch):
    from hf_speculative.bench.bandwidth import ENV, weight_bytes

    monkeypatch.setenv(ENV, "18.0")  # measured over 1 GiB otherwise
    model = build_model("llama")
    result = P.profile(model, P.ProfileSettings(contexts=(8, 20), sizes=(0, 2), repeats=1, warmup=0))
    assert result["weight_bytes_per_token"] == weight_bytes(model) and result["read_bandwidth_gbs"] == 18.0
    forwards = P.one_token_seconds(result["seconds"])
    assert forwards == {c: min(result["seconds"][c]["chain"]["0"], result["seconds"][c]["tree"]["0"])
                        for c in ("8", "20")}
    assert result["weights_gbs"] == {c: pytest.approx(weight_bytes(model) / t / 1e9) for c, t in forwards.items()}
