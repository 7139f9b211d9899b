"""``--format vllm`` exports (no vLLM needed; vLLM itself runs them in test_vllm_serving.py, ``-m vllm``).

``export-dflash`` writes the folder vLLM 0.32's DFlash loads: every safetensors file of it is loaded, so the draft
vocabulary travels as vLLM reads one (``draft_vocab_size``, ``d2t`` and the target's lm_head rows), never as our
``draft_vocab.safetensors``. What vLLM cannot run (a target without inner hidden states, an embedding vLLM does not
reproduce, mixed sliding and full layers, a folder with other safetensors files) is refused before anything is
written, by ``export-dflash`` and ``export-eagle`` alike.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from hf_speculative.cli.main import app
from hf_speculative.drafters import vllm_support
from hf_speculative.drafters.checkpoints import CheckpointError
from hf_speculative.drafters.dflash.checkpoints import save_pretrained
from hf_speculative.drafters.dflash.config import DFlashConfig
from hf_speculative.drafters.dflash.model import DFlashDraftModel
from hf_speculative.drafters.dflash.vllm_export import export_vllm
from hf_speculative.drafters.eagle import checkpoints as eagle_checkpoints
from hf_speculative.drafters.eagle.config import EagleConfig
from hf_speculative.drafters.eagle.model import EagleDraftModel
from tests.conftest import build_model

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
DRAFT_IDS = torch.tensor([3, 7, 8, 20, 41, 60, 95])


def dflash_folder(tmp_path, target, *, vocab: bool = True, **fields):
    """A tiny DFlash drafter for ``target`` saved in our format (with a draft vocabulary unless ``vocab=False``)."""
    torch.manual_seed(0)
    net = DFlashDraftModel(DFlashConfig.for_target(target.config, **{"num_hidden_layers": 2, **fields}))
    if vocab:
        net.set_draft_vocab(DRAFT_IDS.clone())
    return save_pretrained(net, tmp_path / "ours"), net


def test_dflash_folder_holds_the_draft_vocabulary_as_vllm_reads_it(tmp_path):
    target = build_model("llama")
    source, net = dflash_folder(tmp_path, target)
    assert (source / "draft_vocab.safetensors").exists()  # ours: what vLLM fails on
    out = export_vllm(source, tmp_path / "vllm", target=target)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["draft_vocab_size"] == len(DRAFT_IDS)
    assert cfg["dflash_config"]["causal"] is False and cfg["is_causal"] is False  # what vLLM reads, and z-lab's
    assert cfg["dflash_config"]["is_causal"] is False
    tensors = load_file(out / "model.safetensors")
    assert torch.equal(tensors.pop("d2t"), DRAFT_IDS - torch.arange(len(DRAFT_IDS)))
    assert torch.equal(tensors.pop("lm_head.weight"), target.lm_head.weight.detach()[DRAFT_IDS])
    ours = net.state_dict()
    assert set(tensors) == set(ours) and all(torch.equal(tensors[k], ours[k]) for k in ours)


def test_full_vocab_leaves_the_vocabulary_out_and_needs_no_target(tmp_path):
    target = build_model("llama")
    source, _ = dflash_folder(tmp_path, target, causal=True)
    out = export_vllm(source, tmp_path / "vllm", full_vocab=True)
    cfg = json.loads((out / "config.json").read_text())
    assert "draft_vocab_size" not in cfg and cfg["dflash_config"]["causal"] is True and cfg["is_causal"] is True
    assert not {"d2t", "lm_head.weight"} & set(load_file(out / "model.safetensors"))


def test_a_draft_vocabulary_needs_the_target(tmp_path):
    source, _ = dflash_folder(tmp_path, build_model("llama"))
    with pytest.raises(CheckpointError, match="give the target \\(--target NAME\\).*or --full-vocab"):
        export_vllm(source, tmp_path / "vllm")
    assert not (tmp_path / "vllm").exists()


def _scaled_embedding(target):
    target.get_input_embeddings().embed_scale = 4.0  # as Gemma's scaled embedding module carries one
    return target


@pytest.mark.parametrize("case, target, fields, message", [
    ("input_embedding_scale", lambda: build_model("llama"), {"embed_scale": 2.0}, "raw lookup times 2.0"),
    ("scaled embedding module", lambda: _scaled_embedding(build_model("llama")), {}, "which scales by 4"),
    ("mixed layers", lambda: build_model("llama"),
     {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4}, "mixes sliding and full"),
    ("gemma3 target", lambda: build_model("gemma3"), {"target_layer_ids": [0, 1]},
     "its target is a Gemma3ForCausalLM.*does not output the hidden states"),
])
def test_dflash_vllm_cannot_run_is_refused_before_writing(tmp_path, case, target, fields, message):
    model = target()
    source, _ = dflash_folder(tmp_path, model, vocab=False, **fields)
    with pytest.raises(CheckpointError, match=message):
        export_vllm(source, tmp_path / "vllm", target=model)
    assert not (tmp_path / "vllm").exists()


def test_a_folder_with_other_safetensors_is_refused(tmp_path):
    target = build_model("llama")
    source, _ = dflash_folder(tmp_path, target)
    with pytest.raises(CheckpointError, match="draft_vocab.safetensors.*vLLM loads every \\*.safetensors"):
        export_vllm(source, source, target=target)  # into the drafter's own folder


# -- EAGLE-3 ---------------------------------------------------------------------------------------------
def eagle_drafter(target_config, target: str | None = None) -> EagleDraftModel:
    torch.manual_seed(0)
    return EagleDraftModel(EagleConfig.for_target(target_config, version=3, target=target)).eval()


def test_eagle_export_for_a_target_without_hidden_states_is_refused(tmp_path):
    gemma = build_model("gemma3").config
    gemma.architectures = ["Gemma3ForCausalLM"]
    with pytest.raises(CheckpointError, match="vLLM cannot serve this EAGLE-3 drafter: its target is a Gemma3"):
        eagle_checkpoints.export(eagle_drafter(gemma), tmp_path / "a", target_config=gemma)
    # a drafter recording a registry name: its architecture comes from the registry, nothing is downloaded
    with pytest.raises(CheckpointError, match="Gemma3ForCausalLM"):
        eagle_checkpoints.export(eagle_drafter(gemma, target="gemma-3-270m"), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_eagle_export_records_the_registry_targets_architecture(tmp_path):
    llama = build_model("llama").config
    out = eagle_checkpoints.export(eagle_drafter(llama, target="smollm2-135m-instruct"), tmp_path / "e")
    verifier = json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": "smollm2-135m-instruct", "architectures": ["LlamaForCausalLM"]}


def test_registry_targets_and_vllm():
    """The registry's Llama and Qwen2 targets serve EAGLE-3 / DFlash drafters in vLLM; its Gemma3 does not."""
    assert vllm_support.target_architectures(None, "smollm2-135m-instruct") == ["LlamaForCausalLM"]
    vllm_support.check_reads_hidden_states("EAGLE-3", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
    vllm_support.check_reads_hidden_states("EAGLE-3", ["SomeFutureForCausalLM"])  # vLLM's transformers backend
    with pytest.raises(CheckpointError, match="Gemma3ForCausalLM"):
        vllm_support.check_reads_hidden_states("DFlash", vllm_support.target_architectures(None, "gemma-3-270m"))


# -- the command line, on the shipped drafter and the registry's model -----------------------------------
def test_export_dflash_command_on_the_shipped_drafter(tmp_path):
    result = CliRunner().invoke(app, ["export-dflash", "smollm2-135m-instruct", "--out", str(tmp_path / "d")], env=ENV)
    assert result.exit_code == 0, result.output + repr(result.exception)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 8192 and sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "config.json", "model.safetensors"]
    bad = CliRunner().invoke(app, ["export-dflash", "smollm2-135m-instruct", "--out", str(tmp_path / "z"),
                                   "--format", "z-lab"], env=ENV)
    assert bad.exit_code == 2 and "train-dflash already writes z-lab's format" in bad.output
    again = CliRunner().invoke(app, ["export-dflash", "smollm2-135m-instruct", "--out", str(tmp_path / "d"),
                                     "--full-vocab"], env=ENV)  # the folder now holds a model.safetensors: fine
    assert again.exit_code == 0 and "draft_vocab_size" not in json.loads((tmp_path / "d" / "config.json").read_text())
