"""``hfs.use_profile``: the cost models decide by a profile of the model instead of measuring during calls."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core.batch_costs import batch_costs_for
from hf_speculative.bench import profile as P
from hf_speculative.core.costs import verify_costs_for
from hf_speculative.core.state import forget
from tests.conftest import build_model, prompt_inputs, stock_generate


def profile_of(relative: dict, device: str = "cpu (x86_64)", batch_seconds: dict | None = None) -> dict:
    """A profile as ``P.profile`` writes it, with the given one-row ratios at context 512 (tree and chain)."""
    data = {"format": P.FORMAT, "device": device, "relative": {"512": {"tree": relative, "chain": relative}}}
    if batch_seconds is not None:
        data["batch_seconds"] = {"512": batch_seconds}
    return data


def test_one_row_ratios_come_from_the_profile_and_stay():
    model = build_model("llama")
    try:
        loaded = hfs.use_profile(model, profile_of({"0": 1.0, "4": 1.4, "8": 1.3, "16": 3.0}))
        costs = verify_costs_for(model, 8)
        assert loaded["context"] == 512 and loaded["batches"] == []
        assert costs.ratio(0) == 1.0 and costs.ratio(2) == pytest.approx(1.2) and costs.ratio(4) == pytest.approx(1.4)
        assert costs.ratio(8) == pytest.approx(1.4)  # the profile's dip at 8 is not kept: costs never decrease
        assert costs.ratio(16) == pytest.approx(3.0)
        costs.observe(4, 100.0)  # timings no longer move it
        costs.observe(4, 100.0)
        assert costs.ratio(4) == pytest.approx(1.4)
    finally:
        forget(model)
    assert verify_costs_for(model, 8).ratio(4) != pytest.approx(1.4)  # forget: measured again (the prior first)


def test_a_free_verification_profile_drafts_whole_trees_and_a_dear_one_nothing():
    """The decisions follow the profile: GPU-like (extra tokens nearly free) verifies the whole tree of an
    adaptive drafter, a profile where each token costs a forward drafts nothing; the text is greedy's either way."""
    model = hfs.enable(build_model("llama", eos=None))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40)
    drafted = {}
    for name, ratios in {"free": {"0": 1.0, "64": 1.05}, "dear": {"0": 1.0, "1": 2.0, "64": 65.0}}.items():
        hfs.use_profile(model, profile_of(ratios))
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=40,
                             candidate_generator=hfs.PromptLookup(tree=hfs.DynamicTree(nodes=8, depth=4, top_k=3)))
        assert out.tolist() == expected.tolist()
        drafted[name] = hfs.last_stats(model).drafted_tokens
        forget(model)
    assert drafted["dear"] == 0 < drafted["free"]


def test_batch_costs_come_from_the_profile():
    model = build_model("qwen2")
    seconds = {"1": {str(n): 1.0 + 0.01 * n for n in range(5)},  # one row: extra tokens nearly free
               "4": {str(n): 1.0 + n for n in range(5)}}          # four rows: each token a whole forward
    try:
        loaded = hfs.use_profile(model, profile_of({"0": 1.0, "4": 1.2}, batch_seconds=seconds))
        costs = batch_costs_for(model)
        assert loaded["batches"] == [1, 4]
        assert costs.seconds(4, 5) == pytest.approx(5.0) and costs.ratio(4, 4) == pytest.approx(5.0)
        assert costs.knows(3)  # an unprofiled batch size plans on the line through the profiled ones
        costs.observe(4, 5, 0.001)
        assert costs.seconds(4, 5) == pytest.approx(5.0)
        assert costs.plan([0.9] * 4, [1.0] * 4, max_tokens=4, batch=4) == 0  # compute-bound: never pays
        assert costs.plan([0.9], [1.0], max_tokens=4, batch=1) == 4          # nearly free at one row
    finally:
        forget(model)
    assert batch_costs_for(model).seconds(4, 5) != pytest.approx(5.0)


def test_a_real_profile_loads(tmp_path):
    model = build_model("llama")
    settings = P.ProfileSettings(contexts=(16,), sizes=(0, 2, 4), repeats=1, warmup=0, batches=(2,))
    path = P.save(P.profile(model, settings), tmp_path / "p.json")
    try:
        loaded = hfs.use_profile(model, path, context=100)
        assert loaded["context"] == 16 and loaded["batches"] == [2] and len(loaded["ratios"]) == 5
        assert all(b >= a for a, b in zip(loaded["ratios"], loaded["ratios"][1:]))
    finally:
        forget(model)


def test_bad_profiles_name_the_fix(tmp_path):
    model = build_model("llama")
    with pytest.raises(ValueError, match=r"measured on NVIDIA H100 .* and the model is on cpu; profile it on this "
                                         r"device: `hf-speculative profile --model ... --device cpu`"):
        hfs.use_profile(model, profile_of({"0": 1.0, "4": 1.1}, device="NVIDIA H100 80GB HBM3"))
    with pytest.raises(ValueError, match="use 'tree' or 'chain'"):
        hfs.use_profile(model, profile_of({"0": 1.0, "4": 1.1}), shape="ring")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="not an hf-speculative profile"):
        hfs.use_profile(model, tmp_path / "x.json")
    assert torch.is_tensor(next(model.parameters()))
