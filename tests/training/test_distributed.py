"""``train-eagle`` in several processes (``torchrun``, as ``accelerate launch --multi_gpu`` starts them),
here two CPU processes on gloo: gradients are averaged across processes, so two processes with
``--grad-accum 1`` train exactly the drafter that one process trains with ``--grad-accum 2``, step
for step (the same sequences, in the same pairs), through a resume too, with cached or online
features; the processes share the answering of prompts and write the file one process writes;
processes that did not join one run are refused instead of each training alone; a command that
ends well takes the process group down itself."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import CHAT_WORDS
from tests.training.conftest import run_cli

pytestmark = pytest.mark.single_version  # two processes through torch.distributed: CI runs it on 5.x only

ROOT = Path(__file__).resolve().parents[2]


def launch(*args, processes: int = 2, cpu_flag: bool = True) -> subprocess.CompletedProcess:
    """``hf-speculative ARGS`` in ``processes`` processes under torchrun (the one-process references run in the
    test's own process: ``run_cli``, ~10 s of imports less each)."""
    env = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_USE_CPU", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", COLUMNS="200", NO_COLOR="1")
    if cpu_flag:
        env["ACCELERATE_USE_CPU"] = "1"
    runner = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return subprocess.run([*runner, "-m", "hf_speculative", *map(str, args)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny chat target saved in a folder, and 24 of its answers (22 trained on, 2 held out)."""
    from hf_speculative.training.selfdistill import generate_responses
    from tests.conftest import make_chat_tokenizer

    root = tmp_path_factory.mktemp("distributed")
    torch.manual_seed(0)
    config = __import__("transformers").LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = __import__("transformers").LlamaForCausalLM(config).eval()
    tokenizer = make_chat_tokenizer()
    model.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    rows = [{"id": f"q{i}", "prompt": " ".join(CHAT_WORDS[(i * 3 + j) % len(CHAT_WORDS)] for j in range(6))}
            for i in range(24)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    generate_responses(model, tokenizer, rows, root / "answers.jsonl", max_new_tokens=16, batch_size=8, progress=False)
    return root


def train_args(setup, out, *extra):
    return ["train-eagle", "--target", setup / "target", "--data", setup / "answers.jsonl", "--out", out,
            "--draft-vocab-size", 24, "--eval-every", 4, "--val-prompts", 2, "--threads", 1, "--lr", 1e-2, *extra]


def outcome(folder: Path) -> tuple[dict, dict, list[dict]]:
    weights = load_file(folder / "model.safetensors")
    summary = json.loads((folder / "training_summary.json").read_text())
    log = [json.loads(line) for line in (folder / "train_log.jsonl").read_text().splitlines()]
    for record in [summary["final_validation"], *log]:
        record.pop("seconds")
    summary.pop("seconds")
    return weights, summary, log


# 22 sequences, 2 per optimizer step; or the first 19 examples (18 trained on, as accelerate pads a short last
# batch with repeats on several processes but not on one), 6 batches of 3, 2 per optimizer step. The cached and online
# features' runs stop and resume mid-epoch; the uneven one runs once through. EAGLE-3 only: the processes' split of the
# data, gradients and checkpoints does not depend on the drafter's kind (EAGLE-1's features are
# tests/training/test_online.py's and test_train_cli.py's, in one process).
# (online features in two processes, ~100 s: slow; the cached features' run, resumed, and the uneven one stay fast)
@pytest.mark.parametrize("options,per_epoch,resumed", [
    (["--eagle3"], 11, True),
    (["--eagle3", "--batch-size", 3, "--max-examples", 19], 3, False),
    pytest.param(["--eagle3", "--features", "online"], 11, True, marks=pytest.mark.slow)])
def test_two_processes_train_what_one_trains_with_twice_the_accumulation(tmp_path, setup, options, per_epoch, resumed):
    one, two = tmp_path / "one", tmp_path / "two"
    for epochs in (1.5, 2.5) if resumed else (2.5,):  # the second run resumes the first one's checkpoint, mid-epoch
        run_cli(*train_args(setup, one, *options, "--grad-accum", 2, "--epochs", epochs), ACCELERATE_USE_CPU="1")
        out = ok(launch(*train_args(setup, two, *options, "--grad-accum", 1, "--epochs", epochs), processes=2))
        assert out.count("drafter saved in") == 1  # the main process speaks for the run
        if resumed and epochs == 2.5:
            assert "resumed from" in out
        (w1, s1, log1), (w2, s2, log2) = outcome(one), outcome(two)
        assert s1["optimizer_steps"] == s2["optimizer_steps"] == math.ceil(per_epoch * epochs)
        assert s1 == s2 and log1 == log2  # the same steps, tokens (of every process) and validations
        assert w1.keys() == w2.keys()
        for name in w1:
            torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-6, msg=name)
    assert len({json.dumps(r["val_acc"]) for r in log1}) > 1  # it learnt something: equal is not trivially equal


def test_two_processes_out_of_time_stop_at_the_same_step(tmp_path, setup):
    """``--max-minutes``: the processes agree on the step where time ran out (one stopping alone would wait for the
    others forever at the last validation), then the run validates and writes a checkpoint there."""
    out = tmp_path / "two"
    ok(launch(*train_args(setup, out, "--grad-accum", 1, "--epochs", 1, "--max-minutes", 1e-6), processes=2))
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["stopped_by_max_minutes"] and summary["optimizer_steps"] == 1 and summary["total_steps"] == 11
    assert json.loads((out / "checkpoint" / "progress.json").read_text())["step"] == 1


def test_the_processes_share_the_answers(tmp_path, setup):
    """``self-distill`` in two processes writes the file one process writes, byte for byte; so does
    ``train-eagle --prompts``, whose answers each appear once."""
    common = ["self-distill", "--target", setup / "target", "--prompts", setup / "prompts.jsonl", "--max-new-tokens", 16,
              "--batch-size", 3, "--threads", 1]
    run_cli(*common, "--out", tmp_path / "one.jsonl", ACCELERATE_USE_CPU="1")
    ok(launch(*common, "--out", tmp_path / "two.jsonl", processes=2))
    assert (tmp_path / "two.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()
    assert not list(tmp_path.glob("*.part*"))

    out = tmp_path / "drafter"
    result = ok(launch("train-eagle", "--target", setup / "target", "--prompts", setup / "prompts.jsonl",
                       "--distill-tokens", 16, "--out", out, "--draft-vocab-size", 24, "--grad-accum", 1,
                       "--eval-every", 100, "--val-prompts", 2, "--threads", 1, "--epochs", 1, processes=2))
    rows = [json.loads(line) for line in (out / "self_distill.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(f"q{i}" for i in range(24))  # each once
    assert result.count("drafter saved in") == 1
    assert json.loads((out / "training_summary.json").read_text())["optimizer_steps"] == 11


def test_processes_that_run_apart_are_refused(tmp_path, setup):
    result = launch(*train_args(setup, tmp_path / "o", "--epochs", 1), processes=2, cpu_flag=False)
    assert result.returncode != 0
    assert "2 processes were launched but accelerate runs 1" in result.stderr
    assert "ACCELERATE_USE_CPU=1" in result.stderr
    assert not (tmp_path / "o" / "model.safetensors").exists()


@pytest.mark.parametrize("command, leaves", [(["models", "list"], True), (["models", "fetch", "no-such-model"], False)])
def test_a_command_that_ends_well_takes_its_process_group_down(command, leaves):
    """A command that succeeds waits for the other processes and destroys the process group itself, not
    at interpreter shutdown, where a process that finished first once aborted ("terminate called without
    an active exception"); one that fails leaves it (waiting there could hang) and torchrun stops the rest."""
    code = ("import sys, torch.distributed as dist\n"
            "from hf_speculative.cli.main import main\n"
            "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
            f"sys.argv = ['hf-speculative', *{command!r}]\n"
            "try:\n    main()\n    print('exit', 0)\n"
            "except SystemExit as done:\n    print('exit', done.code or 0)\n"
            "print('group', 'kept' if dist.is_initialized() else 'destroyed')\n")
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    lines = result.stdout.splitlines()
    assert lines[-1] == ("group destroyed" if leaves else "group kept"), result.stdout + result.stderr
    assert (lines[-2] == "exit 0") == leaves, result.stdout + result.stderr
