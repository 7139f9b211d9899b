"""``python -m tools.carry``: a model folder cut into parts of a bounded size and rebuilt, every part and every file
checked by sha256; the weights stored in another dtype when asked; a missing or damaged part refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.conftest import build_model
from tools import carry


@pytest.fixture
def folder(tmp_path):
    model = build_model("llama")
    model.save_pretrained(tmp_path / "model")
    return model, tmp_path / "model"


def test_a_folder_rebuilt_from_its_parts_loads_as_the_same_model(folder, tmp_path):
    model, source = folder
    weights = (source / "model.safetensors").stat().st_size
    manifest = carry.split(source, tmp_path / "carry", part_bytes=weights // 3)
    assert len(manifest["parts"]) >= 4 and all(p["size"] <= weights // 3 for p in manifest["parts"])
    assert json.loads((tmp_path / "carry" / "manifest.json").read_text()) == manifest
    written = carry.join(tmp_path / "carry", tmp_path / "rebuilt")
    assert sorted(p.name for p in written) == sorted(p.name for p in source.iterdir())
    for path in written:
        assert path.read_bytes() == (source / path.name).read_bytes()
    rebuilt = AutoModelForCausalLM.from_pretrained(tmp_path / "rebuilt")
    for (name, a), (_, b) in zip(model.state_dict().items(), rebuilt.state_dict().items()):
        assert torch.equal(a, b), name


def test_weights_stored_in_another_dtype(folder, tmp_path):
    model, source = folder
    carry.main(["split", str(source), str(tmp_path / "carry"), "--dtype", "bfloat16"])
    carry.main(["join", str(tmp_path / "carry"), str(tmp_path / "rebuilt")])
    assert (tmp_path / "rebuilt" / "model.safetensors").stat().st_size < 0.6 * (source / "model.safetensors").stat().st_size
    rebuilt = AutoModelForCausalLM.from_pretrained(tmp_path / "rebuilt", dtype=torch.bfloat16)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor.to(torch.bfloat16), rebuilt.state_dict()[name]), name
    with pytest.raises(SystemExit, match="floating-point torch dtype"):
        carry.split(source, tmp_path / "other", dtype="int8")


def test_missing_and_damaged_parts_are_refused_by_name(folder, tmp_path):
    _, source = folder
    parts = tmp_path / "carry"
    carry.split(source, parts, part_bytes=1 << 14)
    damaged = parts / "part-001"
    data = bytearray(damaged.read_bytes())
    data[10] ^= 1
    damaged.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match="part-001: damaged"):
        carry.join(parts, tmp_path / "rebuilt")
    damaged.unlink()
    with pytest.raises(SystemExit, match="part-001: missing"):
        carry.join(parts, tmp_path / "rebuilt")
    assert not (tmp_path / "rebuilt").exists()  # nothing written before every part checked
    with pytest.raises(SystemExit, match="no manifest"):
        carry.join(tmp_path, tmp_path / "rebuilt")
    with pytest.raises(SystemExit, match="not a folder"):
        carry.split(tmp_path / "nowhere", parts)
