"""DFlash folders: z-lab's format (what we save) and transformers'/Meta's load to the same network; a model's saved
spec loads again; every refused checkpoint says why, naming both sides."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import hf_speculative as hfs
from hf_speculative.drafters.dflash import checkpoints
from hf_speculative.drafters.dflash.checkpoints import CheckpointError
from hf_speculative.drafters.dflash.drafter import random_network
from tests.conftest import build_model, prompt_inputs, stock_generate


@pytest.fixture
def target():
    return build_model("llama", layers=4)


def meta_folder(net, path, **overrides):
    """``net`` written in transformers'/Meta's format."""
    fields, state = checkpoints.to_transformers(net)
    cfg = {"model_type": "muse_glimmer_assistant", "architectures": ["MuseGlimmerAssistantModel"], **fields,
           **overrides}
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    return path


def same_outputs(a, b):
    window, features = torch.randn(1, a.config.block_size, a.config.hidden_size), torch.randn(1, 3, a.fc.in_features)
    positions = torch.arange(3 + a.config.block_size)[None]
    with torch.no_grad():
        torch.testing.assert_close(a(window, features, positions), b(window, features, positions))


def test_both_formats_load_the_same_network(target, tmp_path):
    net = random_network(target)
    saved = hfs.DFlash(net).save_pretrained_network(tmp_path / "zlab")
    cfg = json.loads((saved / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and "auto_map" not in cfg
    assert cfg["dflash_config"]["target_layer_ids"] == net.config.target_layer_ids
    for folder in (saved, meta_folder(net, tmp_path / "meta")):
        loaded = hfs.DFlash.from_pretrained(folder, target=target)
        same_outputs(loaded.network, net)
    zlab = checkpoints.read_config("z-lab", {**cfg, "layer_types": ["sliding_attention"], "sliding_window": 4,
                                             "dflash_config": {"target_layer_ids": [1], "mask_token_id": 3}})
    assert zlab.sliding_window == 3 and zlab.causal and zlab.embed_scale == 1.0  # z-lab's rules, in ours


def test_saved_model_spec_loads_again(target, tmp_path):
    model = hfs.enable(target)
    strategy = hfs.DFlash(random_network(target), num_tokens=4, adaptive=False, confidence_threshold=0.0)
    model.generation_config.candidate_generator = strategy
    model.save_pretrained(tmp_path / "model")
    spec = json.loads((tmp_path / "model" / "generation_config.json").read_text())["candidate_generator"]
    assert spec["method"] == "dflash" and spec["path"] == "dflash" and spec["options"]["num_tokens"] == 4
    loaded = hfs.enable(type(target).from_pretrained(tmp_path / "model"))
    again = loaded.generation_config.candidate_generator
    assert isinstance(again, hfs.DFlash) and again.num_tokens == 4
    same_outputs(again.network, strategy.network)
    expected = stock_generate(loaded, **prompt_inputs(), do_sample=False, max_new_tokens=12)
    assert loaded.generate(**prompt_inputs(), do_sample=False, max_new_tokens=12).tolist() == expected.tolist()


def edited(folder, cfg_change=None, state_change=None):
    cfg = json.loads((folder / "config.json").read_text())
    if cfg_change:
        cfg_change(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    if state_change:
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
        state_change(state)
        save_file(state, str(folder / "model.safetensors"))
    return folder


BAD = {
    "hidden": (lambda c: c.update(hidden_size=64), None, r"hidden size: drafter 64, target 32"),
    "vocab": (lambda c: c.update(vocab_size=200), None, r"vocabulary: drafter 200, target 96"),
    "mask_vocab": (lambda c: c.update(vocab_size=50), None, r"mask_token_id=95 is outside its vocabulary of 50"),
    "mask": (lambda c: (c.pop("vocab_size"), c["dflash_config"].update(mask_token_id=500)), None,
             r"mask_token_id 500 is outside the target's vocabulary of 96"),
    "depth": (lambda c: c["dflash_config"].update(target_layer_ids=[1, 7]), None,
              r"\[7\] outside the target's 4 layers"),
    "last": (lambda c: c["dflash_config"].update(target_layer_ids=[1, 3]), None, r"read the target's last layer 3"),
    "target_depth": (lambda c: c.update(num_target_layers=36), None, r"drafter trained for 36 target layers, target 4"),
    "missing": (None, lambda s: s.pop("norm.weight"), r"missing keys \['norm.weight'\]"),
    "extra": (None, lambda s: s.update(extra=torch.zeros(1)), r"unexpected keys \['extra'\]"),
    "shape": (lambda c: c.update(intermediate_size=65), None, r"shape mismatches"),
    "type": (lambda c: c.update(num_hidden_layers="2"), None, r"num_hidden_layers='2'.*integer"),
    "huge": (lambda c: c.update(hidden_size=10 ** 9), None, r"hidden_size=1000000000"),
    "no_ids": (lambda c: c["dflash_config"].pop("target_layer_ids"), None, r"lacks target_layer_ids"),
    "dflash2": (lambda c: c.update(architectures=["DFlash2DraftModel"]), None, r"DFlash2"),
    "unknown": (lambda c: (c.pop("architectures"), c.pop("dflash_config")), None, r"neither transformers' DFlash"),
    "rope": (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 2.0}), None, r"rope type 'yarn'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoints_are_refused_by_name(target, tmp_path, case):
    cfg_change, state_change, message = BAD[case]
    folder = edited(hfs.DFlash(random_network(target)).save_pretrained_network(tmp_path / "d"), cfg_change,
                    state_change)
    with pytest.raises(CheckpointError, match=message):
        hfs.DFlash.from_pretrained(folder, target=target)


def test_only_safetensors_and_only_folders(target, tmp_path):
    folder = hfs.DFlash(random_network(target)).save_pretrained_network(tmp_path / "d")
    state = {k: v for k, v in random_network(target).state_dict().items()}
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="pickled .bin files are not read"):
        hfs.DFlash.from_pretrained(folder, target=target)
    with pytest.raises(FileNotFoundError, match="No DFlash drafter"):
        hfs.DFlash.from_pretrained(tmp_path / "nowhere", target=target)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"fc.weight": "../x.safetensors"}}))
    with pytest.raises(CheckpointError):
        hfs.DFlash.from_pretrained(folder, target=target)
