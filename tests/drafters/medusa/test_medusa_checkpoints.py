"""Medusa checkpoints in each project's layout, built here as that project writes them, load into heads that
compute what that project's module computes; ours and the exports round-trip; bad checkpoints are refused with
messages naming both sides."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import hf_speculative as hfs
from hf_speculative.drafters.medusa import checkpoints
from hf_speculative.drafters.medusa.checkpoints import CheckpointError
from hf_speculative.hf.spec import file_sha256
from tests.conftest import build_model
from tests.drafters.medusa.conftest import random_heads

H, V = 32, 96


class ResBlock(nn.Module):  # FasterDecoding's (medusa/model/medusa_model.py): x + SiLU(Linear(x)), with a bias
    def __init__(self, hidden):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


def fasterdecoding_heads(num_heads=3, num_layers=1, seed=0):
    """Medusa's ``medusa_head``: ``[ResBlock] * num_layers`` (one block repeated) then Linear(H, V, bias=False)."""
    torch.manual_seed(seed)
    heads = nn.ModuleList(nn.Sequential(*([ResBlock(H)] * num_layers), nn.Linear(H, V, bias=False))
                          for _ in range(num_heads))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.3)
    return heads


@pytest.fixture(scope="module")
def target():
    return build_model("llama")


def assert_same_logits(loaded, reference_heads, target):
    x = torch.randn(5, H)
    expected = torch.stack([head(x) for head in reference_heads])
    torch.testing.assert_close(loaded.heads.logits(x, target.get_output_embeddings()), expected)


def test_fasterdecoding_medusa1_safetensors(tmp_path, target):
    ref = fasterdecoding_heads()
    save_file(ref.state_dict(), str(tmp_path / "medusa_lm_head.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 1,
                                                      "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    loaded = hfs.Medusa.from_pretrained(tmp_path, target=target)
    assert loaded.heads.config.num_heads == 3 and loaded.heads.config.lm_head == "per_head"
    assert_same_logits(loaded, ref, target)


def test_fasterdecoding_pt_with_repeated_blocks(tmp_path, target):
    ref = fasterdecoding_heads(num_heads=2, num_layers=2)
    torch.save(ref.state_dict(), tmp_path / "medusa_lm_head.pt")  # 0.0.* and 0.1.* name one tensor
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 2}))
    assert_same_logits(hfs.Medusa.from_pretrained(tmp_path, target=target), ref, target)


def test_medusa2_model_saved_whole(tmp_path, target):
    """Medusa-2: the fine-tuned model's config with the medusa fields, its weights and the heads under medusa_head."""
    ref = fasterdecoding_heads()
    state = {k: v.clone() for k, v in target.state_dict().items()}
    state.update({f"medusa_head.{k}": v for k, v in ref.state_dict().items()})
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**target.config.to_dict(), "medusa_num_heads": 3,
                                                      "medusa_num_layers": 1}))
    assert_same_logits(hfs.Medusa.from_pretrained(tmp_path, target=target), ref, target)


@pytest.mark.parametrize("shared", [False, True])
def test_vllm_layout(tmp_path, target, shared):
    """vLLM's Medusa: blocks.{i}.layers.{j} (no bias unless medusa_fc_bias), lm_heads.{i}; one lm_heads.0 with
    original_lm_head."""
    torch.manual_seed(1)
    blocks = [nn.Linear(H, H, bias=False) for _ in range(3)]
    lm_heads = [nn.Linear(H, V, bias=False) for _ in range(1 if shared else 3)]
    state = {f"medusa_heads.blocks.{i}.layers.0.weight": b.weight.detach() for i, b in enumerate(blocks)}
    state.update({f"lm_heads.{i}.weight": h.weight.detach() for i, h in enumerate(lm_heads)})
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": H, "vocab_size": V,
        "num_heads": 3, "num_hidden_layers": 1, "original_lm_head": shared, "truncated_vocab_size": V}))
    loaded = hfs.Medusa.from_pretrained(tmp_path, target=target)
    assert loaded.heads.config.lm_head == ("shared" if shared else "per_head")
    x = torch.randn(5, H)
    expected = torch.stack([lm_heads[0 if shared else i](x + nn.functional.silu(b(x))) for i, b in enumerate(blocks)])
    torch.testing.assert_close(loaded.heads.logits(x), expected)


@pytest.mark.parametrize("lm_head", ["per_head", "shared", "target"])
@pytest.mark.parametrize("fmt", ["native", "vllm", "medusa"])
def test_our_format_and_exports_round_trip(tmp_path, target, lm_head, fmt):
    heads = random_heads(target, num_heads=3, lm_head=lm_head, layers=1)
    if fmt == "native":
        checkpoints.save_pretrained(heads, tmp_path)
    else:
        checkpoints.export(heads, tmp_path, fmt, target=target)
    loaded = hfs.Medusa.from_pretrained(tmp_path, target=target)
    x = torch.randn(5, H)
    head = target.get_output_embeddings()
    torch.testing.assert_close(loaded.heads.logits(x, head), heads.logits(x, head))


def test_export_refusals(tmp_path, target):
    with pytest.raises(CheckpointError, match="export them with the target"):
        checkpoints.export(random_heads(target, lm_head="target"), tmp_path / "a", "vllm")
    with pytest.raises(CheckpointError, match=r"repeats one residual block 2 times per head.*format='vllm'"):
        checkpoints.export(random_heads(target, layers=2), tmp_path / "b", "medusa")
    with pytest.raises(CheckpointError, match="Unknown export format 'tgi'"):
        checkpoints.export(random_heads(target), tmp_path / "c", "tgi")


@pytest.fixture
def saved(tmp_path, target):
    checkpoints.save_pretrained(random_heads(target, num_heads=3), tmp_path / "heads")
    return tmp_path / "heads"


def test_wrong_hidden_size_and_vocabulary_name_both_sides(saved):
    wide = build_model("llama", hidden=64)
    with pytest.raises(CheckpointError, match="hidden size: heads 32, target 64"):
        hfs.Medusa.from_pretrained(saved, target=wide)
    other_vocab = build_model("llama", vocab_size=128)
    with pytest.raises(CheckpointError, match="vocabulary: heads 96, target 128"):
        hfs.Medusa.from_pretrained(saved, target=other_vocab)
    heads = checkpoints.load_heads(saved)
    with pytest.raises(ValueError, match="hidden size: heads 32, target 64.*train-medusa"):
        hfs.Medusa(heads).validate_target(wide)
    deeper = build_model("llama", layers=3)
    with pytest.raises(ValueError, match="depth: heads trained on a 2-layer target, target has 3"):
        hfs.Medusa(heads).validate_target(deeper)


def _edit_weights(folder, edit):
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"))


def test_missing_and_extra_keys(saved, target):
    _edit_weights(saved, lambda s: s.pop("blocks.2.layers.0.bias"))
    with pytest.raises(CheckpointError, match=r"missing keys \['blocks.2.layers.0.bias'\]"):
        hfs.Medusa.from_pretrained(saved, target=target)
    _edit_weights(saved, lambda s: s.update({"blocks.2.layers.0.bias": torch.zeros(H), "blocks.3.layers.0.weight":
                                             torch.zeros(H, H)}))
    with pytest.raises(CheckpointError, match=r"3 heads of 1 blocks.*unexpected keys \['blocks.3.layers.0.weight'\]"):
        hfs.Medusa.from_pretrained(saved, target=target)


def test_shape_mismatch_and_config_disagreeing_with_weights(tmp_path, target):
    ref = fasterdecoding_heads(num_heads=2)
    save_file(ref.state_dict(), str(tmp_path / "medusa_lm_head.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 1}))
    with pytest.raises(CheckpointError, match=r"missing keys \['blocks.2.layers.0.bias'.*medusa_num_heads"):
        hfs.Medusa.from_pretrained(tmp_path, target=target)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "hidden_size": 48}))
    with pytest.raises(CheckpointError, match=r"shape mismatches .*checkpoint \(32, 32\), heads \(48, 48\)"):
        hfs.Medusa.from_pretrained(tmp_path)


def test_sha256_mismatch(saved, target):
    good = file_sha256(saved / "model.safetensors")
    hfs.Medusa.from_pretrained(saved, target=target, sha256={"model.safetensors": good})
    with pytest.raises(CheckpointError, match="sha256 of .*model.safetensors is .*, expected 00"):
        hfs.Medusa.from_pretrained(saved, target=target, sha256={"model.safetensors": "00" * 32})
    (saved / "sha256sums.json").write_text(json.dumps({"sha256": {"model.safetensors": "11" * 32}}))
    with pytest.raises(CheckpointError, match="failed its integrity check: model.safetensors"):
        hfs.Medusa.from_pretrained(saved, target=target)


def test_not_medusa_and_truncated_vocabulary(tmp_path, target):
    save_file({"fc.weight": torch.zeros(H, 2 * H)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(CheckpointError, match="Not Medusa heads: config.json names LlamaForCausalLM"):
        hfs.Medusa.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "medusa", "num_heads": 2, "vocab_size": V,
                                                      "truncated_vocab_size": 64, "hidden_size": H}))
    with pytest.raises(CheckpointError, match="truncated vocabulary"):
        hfs.Medusa.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "medusa", "vocab_size": V}))
    with pytest.raises(CheckpointError, match="no num_heads field"):
        hfs.Medusa.from_pretrained(tmp_path)


def test_missing_folder_and_tree_file(tmp_path, saved, target):
    with pytest.raises(FileNotFoundError, match="No Medusa heads at 'nowhere'.*train-medusa"):
        hfs.Medusa.from_pretrained("nowhere")
    with pytest.raises(ValueError, match="'calibrated' loads the tree.json"):
        hfs.Medusa.from_pretrained(saved, target=target, tree="calibrated")
    hfs.StaticTree([(0,), (1,), (0, 0)]).save(saved / "tree.json")
    assert hfs.Medusa.from_pretrained(saved, target=target, tree="calibrated").tree.size == 3


def test_heads_on_another_device_than_the_target_are_named(target, monkeypatch):
    strategy = hfs.Medusa(random_heads(target))
    meta = torch.device("meta")
    monkeypatch.setattr(type(strategy.heads), "parameters", lambda self, recurse=True: iter([torch.empty(1, device=meta)]))
    with pytest.raises(ValueError, match="heads are on meta and the target on cpu"):
        strategy.validate_target(target)
