"""Hostile model configs and drafter checkpoints (issue 67, items 2 and 3): refused at load, by content.

A model folder's ``config.json`` is bounded before transformers builds anything from it (``hfs.load_model``):
sizes that are not sizes, or that describe far more parameters than the folder's weights hold (a safetensors
file counted by its header, never more than its bytes), would otherwise build for minutes and gigabytes.
A drafter checkpoint is checked by what it holds, not only by its shapes: its vocabulary map inside the
vocabulary, its layer ids inside the target's depth, its dtypes the network's; else the first ``generate()``
indexes past the target's embedding (an ``IndexError``) or runs on truncated ids.

Every case runs through ``test_hostile_folder``'s measure: refused with the expected error whose message names
the file and the field, within its seconds and memory budgets. The negative controls load valid folders of every
kind and check that they draft exactly as greedy decoding.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import hf_speculative as hfs
from hf_speculative.drafters.eagle import checkpoints as eagle_checkpoints
from hf_speculative.drafters.eagle.checkpoints import CheckpointError
from hf_speculative.drafters.registry import example
from hf_speculative.hf import spec
from hf_speculative.registry import models
from tests.conftest import build_model, char_tokenizer, prompt_inputs, random_eagle, random_exit_adapter, stock_generate
from tests.security.test_hostile_folder import Case, World, frozen_heap, model_cache_at, run, save_medusa_heads

CASES: list[Case] = []


def case(name: str, group: str, error, match: str):
    def register(prepare):
        CASES.append(Case(name, group, prepare, error, match))
        return prepare
    return register


class Folders(World):
    """The hostile-folder world, plus fresh copies of a tiny model folder and of saved drafters to spoil."""

    def __init__(self, root: Path):
        super().__init__(root)
        char_tokenizer().save_pretrained(self.template)  # load_model loads the tokenizer too

    def copy(self, source: Path) -> Path:
        self._count += 1
        folder = self.root / f"checkpoint{self._count}"
        shutil.copytree(source, folder)
        return folder

    def model(self, **config) -> Path:
        """The tiny Llama's folder (2 layers, hidden 32, vocabulary 96) with ``config`` written into its config.json."""
        folder = self.copy(self.template)
        edit(folder / "config.json", **config)
        return folder

    def drafter(self, kind: str) -> Path:
        """A fresh copy of a saved drafter: ``eagle3`` (reduced vocabulary, so with a d2t), ``exit`` (an exit adapter
        for the first layer), ``dflash`` (with a draft vocabulary), ``medusa``, ``safeailab3`` (SafeAILab's EAGLE-3)."""
        saved = self.root / f"saved-{kind}"
        if not saved.exists():
            if kind == "eagle3":
                eagle_checkpoints.save_pretrained(random_eagle(self.target), saved)
            elif kind == "exit":
                eagle_checkpoints.save_pretrained(random_exit_adapter(self.target, exit_layer=1), saved)
            elif kind == "dflash":
                strategy = example("dflash", self.target)
                strategy.network.set_draft_vocab(torch.arange(0, self.target.config.vocab_size, 2))
                strategy.save_pretrained_network(saved)
            elif kind == "medusa":
                save_medusa_heads(example("medusa-tree", self.target), saved)
            elif kind == "safeailab3":
                eagle_checkpoints.export(random_eagle(self.target), saved, "safeailab",
                                         target_config=self.target.config)
        return self.copy(saved)


def edit(path: Path, **fields) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def edit_weights(path: Path, change) -> None:
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def loading(folder: Path):
    return lambda: models.load_model(str(folder))


def eagle_loads(folder: Path, target=None):
    return lambda: hfs.Eagle.from_pretrained(folder, target=target)


VOCAB = 96  # the tiny models' (tests/conftest.py)
USER_CACHE = os.environ.get("HF_SPECULATIVE_CACHE")  # the module's fixture points the cache elsewhere meanwhile


# 1. a model's own config.json, before transformers builds it (hfs.load_model)
@case("load_model: num_hidden_layers 10**6 beside small weights", "model config", models.RegistryError,
      r"load_model\(.*\): its config\.json's num_hidden_layers is 1000000, not a size")
def _(w):
    return loading(w.model(num_hidden_layers=10**6))


@case("load_model: 4000 layers (under the cap) beside small weights", "model config", models.RegistryError,
      r"its config\.json describes about [\d,]+ parameters \(num_hidden_layers 4,000.*far more than its [\d,]+ bytes")
def _(w):
    return loading(w.model(num_hidden_layers=4000))


@case("load_model: hidden_size -32", "model config", models.RegistryError,
      r"its config\.json's hidden_size is -32, not a size")
def _(w):
    return loading(w.model(hidden_size=-32))


@case("load_model: vocab_size 10**9", "model config", models.RegistryError,
      r"its config\.json's vocab_size is 1000000000, not a size")
def _(w):
    return loading(w.model(vocab_size=10**9))


@case("load_model: intermediate_size 8.5", "model config", models.RegistryError,
      r"its config\.json's intermediate_size is 8\.5, not a size")
def _(w):
    return loading(w.model(intermediate_size=8.5))


@case("load_model: a vocabulary of 1M beside small weights", "model config", models.RegistryError,
      r"describes about [\d,]+ parameters .*vocab_size 1,000,000\), far more")
def _(w):
    return loading(w.model(vocab_size=1_000_000))


@case("load_model: 4000 layers, the safetensors header claiming 64 GB", "model config", models.RegistryError,
      r"describes about [\d,]+ parameters .* far more than its [\d,]+ bytes of weights hold")
def _(w):
    folder = w.model(num_hidden_layers=4000)
    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 34], "data_offsets": [0, 1 << 36]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(64))
    return loading(folder)


@case("draft-model spec: num_hidden_layers 10**6", "model config", spec.SpecError,
      r"candidate_generator\.path: its config\.json's num_hidden_layers is 1000000, not a size")
def _(w):
    folder = w.full_folder("draft-model")
    edit(folder / "draft-model" / "config.json", num_hidden_layers=10**6)
    return lambda: hfs.enable(AutoModelForCausalLM.from_pretrained(folder))


# 2. drafter checkpoints, by content
@case("EAGLE-3 d2t pointing past the vocabulary", "drafter content", CheckpointError,
      rf"model\.safetensors \(native\): d2t maps 48 draft ids outside the vocabulary of {VOCAB} \(config\.json's "
      r"vocab_size\), the first draft id 0 to target id 96")
def _(w):
    folder = w.drafter("eagle3")
    edit_weights(folder / "model.safetensors", lambda t: t.update(d2t=t["d2t"] + VOCAB))
    return eagle_loads(folder)


@case("EAGLE-3 d2t pointing below 0 (with the target)", "drafter content", CheckpointError,
      r"model\.safetensors \(native\): d2t maps 1 draft ids outside the vocabulary .* to target id -1")
def _(w):
    folder = w.drafter("eagle3")
    edit_weights(folder / "model.safetensors", lambda t: t["d2t"].__setitem__(5, -6))
    return eagle_loads(folder, w.target)


@case("EAGLE-3 d2t mapping two draft ids to one token", "drafter content", CheckpointError,
      r"model\.safetensors \(native\): d2t maps 1 draft ids to a target id another draft id already has")
def _(w):
    folder = w.drafter("eagle3")
    edit_weights(folder / "model.safetensors", lambda t: t["d2t"].__setitem__(1, t["d2t"][0] - 1))
    return eagle_loads(folder)


@case("EAGLE-3 float d2t", "drafter content", CheckpointError,
      r"config\.json \(native\): .*dtype mismatches d2t: checkpoint float32, drafter integer")
def _(w):
    folder = w.drafter("eagle3")
    edit_weights(folder / "model.safetensors", lambda t: t.update(d2t=t["d2t"].float() + 0.5))
    return eagle_loads(folder)


@case("EAGLE-3 t2d of the wrong size", "drafter content", CheckpointError,
      rf"config\.json \(native\): .*shape mismatches t2d: checkpoint \({VOCAB + 3},\), drafter \({VOCAB},\)")
def _(w):
    folder = w.drafter("eagle3")
    edit_weights(folder / "model.safetensors", lambda t: t.update(t2d=torch.ones(VOCAB + 3, dtype=torch.bool)))
    return eagle_loads(folder)


@case("EAGLE-3 float t2d", "drafter content", CheckpointError,
      r"config\.json \(native\): .*dtype mismatches t2d: checkpoint float32, drafter bool")
def _(w):
    folder = w.drafter("eagle3")
    edit_weights(folder / "model.safetensors", lambda t: t.update(t2d=t["t2d"].float()))
    return eagle_loads(folder)


@case("EAGLE-3 integer weights", "drafter content", CheckpointError,
      r"config\.json \(native\): .*dtype mismatches fc\.weight: checkpoint int32, drafter floating point")
def _(w):
    folder = w.drafter("eagle3")
    edit_weights(folder / "model.safetensors", lambda t: t.update({"fc.weight": t["fc.weight"].to(torch.int32)}))
    return eagle_loads(folder)


@case("EAGLE-3 layer id 99 on a 2-layer target (depth recorded)", "drafter content", CheckpointError,
      r"config\.json \(native\): EagleConfig\(target_layers=\[0, 1, 99\], exit_layer=None, target_num_layers=2\): "
      r"fused layers \[0, 1, 99\] outside the target's 0\.\.1")
def _(w):
    folder = w.drafter("eagle3")
    edit(folder / "config.json", target_layers=[0, 1, 99])
    return eagle_loads(folder)


@case("EAGLE-3 layer id 99, depth unrecorded, with the target", "drafter content", CheckpointError,
      r"config\.json: This EAGLE drafter does not fit the target config .*fused layers \[0, 1, 99\] outside the "
      r"target's 0\.\.1 \(target_layers")
def _(w):
    folder = w.drafter("eagle3")
    edit(folder / "config.json", target_layers=[0, 1, 99], target_num_layers=None)
    return eagle_loads(folder, w.target)


@case("EAGLE-3 layer id 99, depth unrecorded: refused at attach, before any forward", "drafter content", ValueError,
      r"fused layers \[0, 1, 99\] outside the target's 0\.\.1 \(target_layers\)")
def _(w):
    folder = w.drafter("eagle3")
    edit(folder / "config.json", target_layers=[0, 1, 99], target_num_layers=None)
    strategy = hfs.Eagle.from_pretrained(folder)
    target = build_model("llama")
    hfs.enable(target)
    calls = []
    target.register_forward_pre_hook(lambda *args: calls.append(1))

    def generate():
        target.generate(**prompt_inputs(), max_new_tokens=4, do_sample=False, candidate_generator=strategy)

    return generate, [], lambda: not calls


@case("SafeAILab EAGLE-3 float d2t", "drafter content", CheckpointError,
      r"config\.json \(safeailab-eagle3\): its weights' d2t is float32, not an integer tensor")
def _(w):
    folder = w.drafter("safeailab3")
    edit_weights(folder / "model.safetensors", lambda t: t.update(d2t=t["d2t"].float()))
    return eagle_loads(folder, w.target)


@case("SafeAILab EAGLE-3 d2t pointing past the vocabulary", "drafter content", CheckpointError,
      r"model\.safetensors \(safeailab-eagle3\): d2t maps \d+ draft ids outside the vocabulary")
def _(w):
    folder = w.drafter("safeailab3")
    edit_weights(folder / "model.safetensors", lambda t: t.update(d2t=t["d2t"] + 1000))
    return eagle_loads(folder, w.target)


@case("exit adapter d2t pointing past the vocabulary", "drafter content", CheckpointError,
      r"model\.safetensors \(native\): d2t maps \d+ draft ids outside the vocabulary")
def _(w):
    folder = w.drafter("exit")
    edit_weights(folder / "model.safetensors", lambda t: t.update(d2t=t["d2t"] + VOCAB))
    return lambda: hfs.EarlyExit(exit_layer=1, adapter=str(folder))


@case("exit adapter exit_layer 99 on a 2-layer target", "drafter content", CheckpointError,
      r"config\.json \(native\): EagleConfig\(target_layers=\[98\], exit_layer=99, target_num_layers=2\): "
      r"fused layers \[98\] outside the target's 0\.\.1; exit after layer 99, target has 2 layers")
def _(w):
    folder = w.drafter("exit")
    edit(folder / "config.json", exit_layer=99, target_layers=[98])
    return lambda: hfs.EarlyExit(exit_layer=99, adapter=str(folder))


@case("DFlash draft vocabulary pointing past the vocabulary", "drafter content", CheckpointError,
      rf"draft_vocab\.safetensors: its d2t maps a draft id to the target id \d+, outside the vocabulary of {VOCAB}")
def _(w):
    folder = w.drafter("dflash")
    edit_weights(folder / "draft_vocab.safetensors", lambda t: t.update(d2t=t["d2t"] + VOCAB))
    return lambda: hfs.DFlash.from_pretrained(folder)


@case("DFlash target layer id 99 on a 2-layer target (depth recorded)", "drafter content", CheckpointError,
      r"config\.json \(z-lab\): DFlashConfig\(target_layer_ids=\[0, 99\], num_target_layers=2\): \[99\] outside "
      r"the target's 2 layers \(0\.\.1\) that num_target_layers records")
def _(w):
    folder = w.drafter("dflash")
    config = json.loads((folder / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [0, 99]
    (folder / "config.json").write_text(json.dumps(config))
    return lambda: hfs.DFlash.from_pretrained(folder)


@case("Medusa integer weights", "drafter content", CheckpointError,
      r"config\.json \(.*\): .*dtype mismatches .*: checkpoint int64, heads floating point")
def _(w):
    folder = w.drafter("medusa")
    weights = folder / "model.safetensors"
    edit_weights(weights, lambda t: t.update({k: v.long() for k, v in t.items()}))
    return lambda: hfs.Medusa.from_pretrained(folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    with model_cache_at(root / "cache"):
        world = Folders(root)
        models.load_model(str(world.template))  # warm: the first load imports the model's classes
        hfs.enable(build_model("llama"))
        with frozen_heap():
            yield world


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case, folders):
    result = run(case, folders)
    assert result.refused, f"{case.name}: {result.problem}"


# -- negative controls: valid folders still load, and draft exactly as greedy ----------------------------------
def test_valid_model_folder_loads(folders):
    model, _ = models.load_model(str(folders.model()))
    assert model.config.num_hidden_layers == 2


@pytest.mark.parametrize("method", ["eagle", "medusa", "dflash", "early-exit-adapter"])
def test_valid_drafter_folders_draft_as_greedy(folders, method):
    """Each kind of drafter saved by the package, loaded through the checks above, drafts exactly as greedy."""
    folder = folders.full_folder(method)
    model = AutoModelForCausalLM.from_pretrained(folder)
    expected = stock_generate(model, **prompt_inputs(), max_new_tokens=12, do_sample=False)
    hfs.enable(model)
    assert torch.equal(model.generate(**prompt_inputs(), max_new_tokens=12, do_sample=False), expected)


@pytest.mark.parametrize("kind", ["eagle3", "safeailab3"])
def test_valid_eagle_checkpoints_draft_as_greedy(folders, kind):
    strategy = hfs.Eagle.from_pretrained(folders.drafter(kind), target=folders.target)
    model = folders.target
    expected = stock_generate(model, **prompt_inputs(), max_new_tokens=12, do_sample=False)
    hfs.enable(model)
    got = model.generate(**prompt_inputs(), max_new_tokens=12, do_sample=False, candidate_generator=strategy)
    assert torch.equal(got, expected)


def test_valid_dflash_with_draft_vocabulary_loads(folders):
    strategy = hfs.DFlash.from_pretrained(folders.drafter("dflash"), target=folders.target)
    assert strategy.network.draft_vocab is not None and int(strategy.network.draft_vocab.max()) < VOCAB


def test_registry_model_still_loads(monkeypatch):
    """A real registry model passes the config bound (its config against its safetensors header)."""
    if USER_CACHE is None:
        monkeypatch.delenv("HF_SPECULATIVE_CACHE", raising=False)
    else:
        monkeypatch.setenv("HF_SPECULATIVE_CACHE", USER_CACHE)
    name = "smollm2-135m-instruct"
    if not models.is_cached(name):
        pytest.skip(f"{name} is not in the cache (nothing is downloaded here)")
    model, tokenizer = models.load_model(name)
    assert model.config.num_hidden_layers == 30 and tokenizer is not None
