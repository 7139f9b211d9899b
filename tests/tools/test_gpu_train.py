"""Issue 72's GPU agenda, ``make gpu-check GPU_STEPS=train``: its dry run on this CPU (``DEVICE=cpu TINY=1``: a corpus
of 20 of the real model's answers with the issue's mix, the three trainers a few steps each, the export in the shipped
format and the parts a lent call brings back), the parts joined and checked here (``unpack``), and the pieces: the
budget, the trainers' commands, the lists carried beside the model's wheels, the parts' limit."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tools import carry
from tools.gpu import train_drafters as td
from tools.gpu import travel

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.single_version
def test_the_train_agenda_dry_run_on_the_cpu_and_its_parts_brought_back(tmp_path):
    out, work = tmp_path / "gc", tmp_path / "work"
    done = subprocess.run(["make", "-s", "gpu-check", "DEVICE=cpu", "TINY=1", "GPU_STEPS=train",
                           f"GPU_CHECK_OUT={out}", f"GPU_PY={sys.executable}", "GPU_BENCH=",
                           f"GPU_REAL_ARGS=--train-work {work}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    train = json.loads((out / "report.json").read_text())["train"]
    corpus = train["corpus"]
    assert corpus["answers_asked"] == corpus["answers"]["done"] == 20 and not corpus["stopped_by_max_minutes"]
    assert set(corpus["answers"]["by_source"]) == {"wordnet", "magpie", "builtin"}  # the mix, Magpie included
    assert corpus["lists"]["lists"].keys() == {"wordnet", "builtin"}  # read from the lists, as on the GPU
    assert "--lists" in train["commands"]["corpus"] and "--device cpu" in train["commands"]["corpus"]
    for kind in td.DRAFTERS:
        run = train["runs"][kind]
        assert run["returncode"] == 0 and "error" not in run, run
        assert f"train-{kind}" in train["commands"][kind] and "--features online" in train["commands"][kind]
        assert [point["step"] for point in run["curve"]] == [3, 5]  # 2 validations: a curve
        assert run["summary"]["optimizer_steps"] == 5 and not run["summary"]["stopped_by_max_minutes"]
        measured = "val_tau" if kind != "medusa" else "val_top1"
        assert all(measured in point for point in run["curve"]), run["curve"]
        assert train["exported"][kind]["model.safetensors"]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(p.stat().st_size <= 16 << 20 for p in files), files
    assert sum(p.stat().st_size for p in files) <= 64 << 20
    assert len(train["parts"]["parts"]) <= td.MAX_PARTS and train["parts"]["left_out"] is None
    assert "## Drafters trained for smollm2-135m-instruct (cpu)" in (out / "summary.md").read_text()

    back = tmp_path / "back"  # here: the parts joined and checked, each drafter drafting greedy's exact tokens
    found = td.unpack(out / td.RESULTS, back)
    for kind in td.DRAFTERS:
        assert found[kind]["files_checked"] >= 3 and found[kind]["drafted_exactly"], found
        meta = json.loads((back / kind / "training.json").read_text())
        assert meta["train_config"]["target"] == "smollm2-135m-instruct" and meta["stored_dtype"] == "float16"
        assert meta["command"] == train["commands"][kind] and meta["corpus"]["answers"]["done"] == 20
        assert meta["train_log"] == train["runs"][kind]["curve"]
    assert json.loads((back / "eagle" / "config.json").read_text())["target"] == "smollm2-135m-instruct"
    assert found["corpus"]["restored"] == 20  # text and response decoded again: the files as the build wrote them
    for split in ("train", "held_out"):
        name = f"answers/{split}.jsonl"
        assert (back / "corpus" / name).read_bytes() == (work / "corpus" / name).read_bytes()


def test_the_budget_gives_the_corpus_and_the_trainers_their_minutes_and_keeps_the_reserve():
    budget = td.Budget(minutes=8.0, corpus_minutes=3.5, reserve_minutes=1.5)
    assert budget.corpus() == 3.5 and 7.9 < budget.left() <= 8.0
    assert 6.4 < budget.training() <= 6.5 and budget.hard_stop() == budget.started + 8 * 60 - 15
    budget.started -= 6 * 60  # 6 minutes gone (a slow corpus): training gets what is left but the reserve
    assert budget.training() == 0.5 and budget.corpus() == 0.1  # half a minute at least; the corpus none to speak of
    budget.started -= 4 * 60
    assert budget.training() == 0.5 and budget.left() < 0
    free = td.Budget(minutes=None, corpus_minutes=None)
    assert free.corpus() is None and free.training() is None and free.hard_stop() is None


def test_the_trainers_commands_carry_the_recipe_the_curve_and_the_time_already_trained(tmp_path):
    size = td.sizes(False)
    assert td.planned_steps(20_000, 32, 2.0) == 2 * math.ceil((20_000 - 1000) / 32) == 1188
    commands = {kind: td.trainer_command(kind, target="/tmp/lent/model", data=tmp_path / "a.jsonl",
                                         out=tmp_path / kind, size=size, examples=20_000, max_minutes=4.0, threads=5)
                for kind in td.DRAFTERS}
    eagle = commands["eagle"]
    assert eagle[:2] == ["train-eagle", "--target"] and eagle[eagle.index("--unroll") + 1] == "7"
    assert eagle[eagle.index("--draft-vocab-size") + 1] == "8192" and "--eagle3" in eagle
    assert eagle[eagle.index("--eval-every") + 1] == str(1188 // 5 + 1)  # 4 validations, then the end's
    assert eagle[eagle.index("--max-minutes") + 1] == "4.00" and eagle[eagle.index("--features") + 1] == "online"
    dflash = commands["dflash"]
    assert dflash[dflash.index("--anchors") + 1] == "512" and dflash[dflash.index("--save-dtype") + 1] == "float16"
    assert "--target-dtype" not in commands["medusa"] and "--target-dtype" in dflash  # train-medusa has none
    (tmp_path / "eagle" / "checkpoint").mkdir(parents=True)  # a run that trained 90 s on a warm machine
    (tmp_path / "eagle" / "checkpoint" / "progress.json").write_text(json.dumps({"step": 9, "train_seconds": 90.0}))
    again = td.trainer_command("eagle", target="m", data=tmp_path / "a.jsonl", out=tmp_path / "eagle", size=size,
                               examples=20_000, max_minutes=4.0, threads=None)
    assert again[again.index("--max-minutes") + 1] == "5.50" and "--threads" not in again
    tiny = td.sizes(True, answers=40, epochs=3.0, batch_size=2)
    assert (tiny.answers, tiny.epochs["dflash"], tiny.batch_size["medusa"]) == (40, 3.0, 2)


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("carry/\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "code.py").write_bytes(os.urandom(1 << 20))
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    return root


def test_pack_carries_the_corpus_lists_beside_the_wheels_in_parts_that_fit(tmp_path, monkeypatch):
    from tests.tools.test_wordnet_prompts import _fortunes, _wordnet
    from tools.prompts import builtin

    monkeypatch.setattr(builtin, "_german_paragraphs", lambda limit=600: [])  # this machine's manual pages: slow
    root, wheels = _repo(tmp_path), tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "llm_model-1.0-py3-none-any.whl").write_bytes(os.urandom(3 << 20))
    monkeypatch.setattr(travel, "LIMIT_MIB", 5)  # a call of 5 MiB: the tree takes 1 and a bit, the margin 1
    manifest = td.pack(root, wheels, root / "carry", answers=40, wordnet_dir=_wordnet(tmp_path / "wn"),
                       fortune_dir=_fortunes(tmp_path / "fortunes"))
    assert {f["name"] for f in manifest["files"]} == {"llm_model-1.0-py3-none-any.whl", td.LISTS_TAR}
    assert len(manifest["parts"]) == 2 and all(part["size"] <= 2 << 20 for part in manifest["parts"])
    pkg = tmp_path / "pkg"  # the device: lent_real.sh joins the parts into $WORK/pkg, the train step reads the lists
    carry.join(root / "carry", pkg)
    lists = td.extract(pkg / td.LISTS_TAR, tmp_path / "lists")
    meta = json.loads((lists / "lists.json").read_text())
    assert (meta["answers"], meta["seed"], meta["mix"]) == (40, 0, "wordnet=1/2,magpie=3/10,builtin=1/5")
    assert {name: entry["rows"] for name, entry in meta["lists"].items()} == {"wordnet": 130, "builtin": 112}
    with pytest.raises(SystemExit, match="not a folder; pip download"):
        td.pack(root, tmp_path / "none", root / "carry")


def test_the_parts_leave_the_corpus_out_when_it_would_need_more_than_a_call_brings_back(tmp_path):
    stage, out = tmp_path / "stage", tmp_path / "out"
    stage.mkdir()
    drafters = os.urandom(3000)
    (stage / td.DRAFTERS_TAR).write_bytes(drafters)
    (stage / td.CORPUS_TAR).write_bytes(os.urandom(5000))
    kept = td.cut_parts(stage, out, with_corpus=True, max_parts=4, part_bytes=2048)
    assert kept["left_out"] is None and len(kept["manifest"]["parts"]) == 4  # 8000 bytes
    (out / "part-003").rename(out / "stale")  # a part of an earlier cut is not left beside the new ones
    (out / "stale").rename(out / "part-009")
    left = td.cut_parts(stage, out, with_corpus=True, max_parts=3, part_bytes=2048)
    assert left["left_out"]["file"] == td.CORPUS_TAR and left["left_out"]["bytes"] == 5000
    assert sorted(p.name for p in out.glob("part-*")) == ["part-000", "part-001"]
    assert carry.join(out, tmp_path / "joined")[0].read_bytes() == drafters
    with pytest.raises(RuntimeError, match="more than a call brings back"):
        td.cut_parts(stage, out, with_corpus=False, max_parts=1, part_bytes=2048)


def test_a_slim_corpus_keeps_every_file_but_the_answers_decoded_text(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "answers").mkdir(parents=True)
    (folder / "prompts").mkdir()
    row = {"id": "w1", "seat": 0, "source": "wordnet", "category": "qa", "prompt": "Why?", "text": "<s>Why? Because",
           "response": "Because", "prompt_tokens": [1, 2], "response_tokens": [3, 4]}
    (folder / "answers" / "train.jsonl").write_text(json.dumps(row) + "\n")
    (folder / "prompts" / "train.jsonl").write_text('{"id": "w1"}\n')
    (folder / ".lock").write_text("")
    td.slim_corpus(folder, tmp_path / td.CORPUS_TAR)
    with tarfile.open(tmp_path / td.CORPUS_TAR) as tar:
        assert sorted(tar.getnames()) == ["answers/train.jsonl", "prompts/train.jsonl"]
        slim = json.loads(tar.extractfile("answers/train.jsonl").read())
    assert slim == {k: v for k, v in row.items() if k not in ("text", "response")}

    class Tokens:  # decodes as the target's tokenizer would these ids
        @staticmethod
        def decode(ids, skip_special_tokens=False):
            words = {1: "<s>", 2: "Why?", 3: " Because", 4: "</s>"}
            return "".join(words[i] for i in ids if not (skip_special_tokens and i in (1, 4))).strip(" ")

    back = td.extract(tmp_path / td.CORPUS_TAR, tmp_path / "back")
    assert td.restore_answers(back, Tokens()) == 1
    restored = json.loads((back / "answers" / "train.jsonl").read_text())
    assert list(restored) == list(row) and (restored["text"], restored["response"]) == ("<s>Why? Because</s>", "Because")
