"""``python -m tools.cpu_train``: issue 72's CPU agenda on a tiny target, in one process: the shared features' pass,
then EAGLE, DFlash and Medusa trained on it, each a drafter that drafts exactly, exported in the shipped format; the
same command goes on after a stop, skipping what is done, with each trainer's budget less its share of the features'
time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import hf_speculative as hfs
from hf_speculative.drafters.checkpoints import check_manifest
from hf_speculative.training.selfdistill import generate_responses
from tests.training.conftest import assert_drafts_exactly, write_prompts
from tests.training.test_dflash_training import deep_chat_checkpoint  # noqa: F401 (a fixture)
from tools.cpu_tau import differing, summary, tau_runs
from tools.cpu_train import corpus_dtype, main, native_bf16, planned_steps, status, yield_to_foreground


@pytest.fixture(autouse=True)
def no_committed_snapshots(tmp_path, monkeypatch):
    """The repository's committed corpus checkpoints (data/snapshots) stay out of these tests' agendas: a test
    naming the issue's target would otherwise restore the real corpus."""
    from tools import cpu_train

    monkeypatch.setattr(cpu_train, "SNAPSHOTS", tmp_path / "no-snapshots")


@pytest.fixture
def corpus(tmp_path, deep_chat_checkpoint):  # noqa: F811
    model, tokenizer = hfs.load_model(str(deep_chat_checkpoint))
    rows = [json.loads(line) for line in write_prompts(tmp_path / "prompts.jsonl").read_text().splitlines()]
    generate_responses(model, tokenizer, rows, tmp_path / "corpus" / "answers" / "train.jsonl", max_new_tokens=12,
                       batch_size=8, progress=False)
    return tmp_path / "corpus"


# the whole agenda end to end (184 s in CI's run of 2026-12-02): slow; its commands, budgets, status and resumption are the
# fast tests below, each trainer's run end to end is tests/training's
@pytest.mark.slow
@pytest.mark.single_version  # the agenda's order, budgets and resumption; each trainer runs on both versions already
def test_the_agenda_trains_three_drafters_and_goes_on_after_a_stop(tmp_path, deep_chat_checkpoint, corpus,  # noqa: F811
                                                                   capsys):
    work = tmp_path / "work"
    args = ["--work", str(work), "--target", str(deep_chat_checkpoint), "--tiny", "--processes", "1"]
    with pytest.raises(SystemExit, match="give --corpus DIR for a new --work folder"):
        main(args)
    assert main([*args, "--corpus", str(corpus), "--steps", "corpus,features,eagle", "--max-examples", "20"]) == 0
    assert f"corpus: {corpus} is complete; taken as it is" in capsys.readouterr().out  # answers made elsewhere
    agenda = json.loads((work / "agenda.json").read_text())
    assert agenda["steps"]["corpus"]["done"] and agenda["steps"]["corpus"]["runs"] == 0
    assert agenda["settings"]["max_examples"] == 20 and agenda["settings"]["data"].endswith("answers/train.jsonl")
    assert agenda["steps"]["features"]["done"] and agenda["steps"]["eagle"]["done"]
    assert (work / "features" / "index.json").is_file() and not (work / "eagle" / "cache").exists()
    features_minutes = agenda["steps"]["features"]["seconds"] / 60
    assert f"--max-minutes {60 * 4.0 - features_minutes / 3:.1f}" in agenda["steps"]["eagle"]["command"]
    assert "--max-examples 20" in agenda["steps"]["eagle"]["command"]
    # the trainers under bf16 autocast where the CPU multiplies bfloat16 natively (else float32), the features'
    # pass in float32
    precision = "bf16" if native_bf16() else "no"
    assert agenda["settings"]["mixed_precision"] == precision
    assert agenda["steps"]["eagle"]["command"].startswith("ACCELERATE_MIXED_PRECISION=bf16 ") == (precision == "bf16")
    assert "MIXED_PRECISION" not in agenda["steps"]["features"]["command"]

    assert main(args) == 0  # the same command, all steps: the done ones skipped, the settings kept
    printed = capsys.readouterr().out
    assert "features: done already" in printed and "eagle: done already" in printed
    agenda = json.loads((work / "agenda.json").read_text())
    assert all(agenda["steps"][step]["done"] for step in ("features", "eagle", "dflash", "medusa", "export", "tau"))
    assert agenda["steps"]["features"]["runs"] == 1 and agenda["steps"]["dflash"]["runs"] == 1
    shown = status(work)
    assert "last validation: step" in shown and "checkpoint at optimizer step 5," in shown  # where a resume starts
    assert "20/20 examples" in shown  # the features' pass

    model, tokenizer = hfs.load_model(str(deep_chat_checkpoint))
    hfs.enable(model)
    for drafter in (hfs.Eagle.from_pretrained(work / "eagle", target=model, adaptive=False, confidence_threshold=0.0),
                    hfs.DFlash.from_pretrained(work / "dflash", target=model, adaptive=False,
                                               confidence_threshold=0.0),
                    hfs.Medusa.from_pretrained(work / "medusa", target=model, tree="calibrated", adaptive=False,
                                               confidence_threshold=0.0)):
        assert_drafts_exactly(model, tokenizer, drafter)
    for kind in ("eagle", "dflash", "medusa"):  # the shipped format: float16, its manifest, the run's record
        exported = work / "export" / kind
        check_manifest(exported, full=True, required=True)
        meta = json.loads((exported / "training.json").read_text())
        assert meta["command"] == agenda["steps"][kind]["command"] and meta["stored_dtype"] == "float16"
        assert json.loads((work / kind / "training.json").read_text())["mixed_precision"] == precision
        assert meta["train_log"] and meta["device"]["device"] == "cpu"
        assert {tensor.dtype for tensor in load_file(exported / "model.safetensors").values()
                if tensor.is_floating_point()} == {torch.float16}
    # the last step: each exported drafter's tau at the issue's budgets (the tiny sizes), every text greedy's
    for kind, budgets in (("eagle", ["chain5", "32"]), ("dflash", ["dflash-chain5", "dflash32"]),
                          ("medusa", ["medusa16"])):
        rows = [json.loads(line) for line in (work / "tau" / f"trained-{kind}-spec_bench.jsonl").read_text().splitlines()]
        assert sorted(row["category"] for row in rows) == ["mt-bench", "qa"]
        assert all(row[b]["identical"] and row[b]["tau"] >= 1.0 for row in rows for b in budgets)
    assert sorted(path.name for path in (work / "tau").glob("*.jsonl")) == [
        f"trained-{kind}-spec_bench.jsonl" for kind in ("dflash", "eagle", "medusa")]  # a tiny target ships none
    assert "trained-eagle-spec_bench: 2 prompts, chain5 τ" in status(work)


@pytest.mark.parametrize("target, precision", [("smollm2-135m-instruct", "bf16"), ("some/other-model", "no")])
def test_each_trainers_command_gets_its_budget_less_a_third_of_the_features_pass(tmp_path, capsys, target, precision):
    """What the slow end-to-end run above checks of the commands, without running them: the agenda's settings, each
    trainer's budget (4 hours less a third of the features' pass), its data and cache, the shipped drafter continued on
    the default target only, and accelerate's mixed precision for the trainers alone."""
    work, corpus = tmp_path / "work", tmp_path / "corpus"
    (corpus / "answers").mkdir(parents=True)
    (corpus / "answers" / "train.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(90)))
    work.mkdir()
    agenda = {"steps": {"corpus": {"seconds": 0.0, "done": True, "runs": 0},
                        "features": {"seconds": 1800.0, "done": True, "runs": 1}}}
    (work / "agenda.json").write_text(json.dumps(agenda))
    args = ["--work", str(work), "--corpus", str(corpus), "--target", target, "--max-examples", "60",
            "--mixed-precision", precision, "--steps", "eagle,dflash,medusa", "--dry-run"]
    assert main(args) == 0
    lines = {line.split("] ", 1)[1].split(":", 1)[0]: line.split(": ", 1)[1]
             for line in capsys.readouterr().out.splitlines() if line.startswith("[")}
    assert sorted(lines) == ["dflash", "eagle", "medusa"]
    for step, shown in lines.items():
        assert shown.startswith("ACCELERATE_MIXED_PRECISION=bf16 ") == (precision == "bf16"), shown
        assert f"train-{step} --target {target} " in shown and "--max-examples 60 " in shown
        assert f"--data {corpus / 'answers' / 'train.jsonl'} " in shown
        assert f"--feature-cache {work / 'features'} " in shown and f"--out {work / step} " in shown
        assert "--max-minutes 230.0 " in shown  # 240 less 30 / 3
    assert ("--init-from smollm2-135m-instruct --refresh-vocab" in lines["eagle"]) == (target != "some/other-model")
    assert not json.loads((work / "agenda.json").read_text()).get("settings")  # a dry run keeps nothing


def test_the_status_counts_the_features_finished_by_every_process(tmp_path):
    """A running pass: the index's finished prefix and runs, and the runs its processes noted since."""
    from hf_speculative.training.data import finished_examples

    (tmp_path / "index.json").write_text(json.dumps({"done": 3, "finished": [[5, 7]], "num_examples": 10}))
    (tmp_path / "finished.1.json").write_text(json.dumps([[5, 6], [9, 10]]))
    assert finished_examples(tmp_path) == 3 + 2 + 1  # 0-2, 5-6, 9 (5 counted once)
    (tmp_path / "finished.0.json").write_text("[[3, 4")  # being replaced while read: skipped
    assert finished_examples(tmp_path) == 6


def test_the_status_says_how_long_the_features_pass_has_to_go(tmp_path):
    work = tmp_path / "work"
    (work / "features").mkdir(parents=True)
    (work / "features" / "index.json").write_text(json.dumps({"done": 250, "num_examples": 1000}))
    steps = {"features": {"done": False, "seconds": 600.0, "runs": 2}}
    (work / "agenda.json").write_text(json.dumps({"settings": {}, "steps": steps}))
    assert "250/1000 examples, about 30 min to go at its rate so far" in status(work)  # 250 in 10 min
    steps["features"]["seconds"] = 30.0  # too early to say
    (work / "agenda.json").write_text(json.dumps({"settings": {}, "steps": steps}))
    assert "250/1000 examples\n" in status(work) + "\n" and "to go" not in status(work)


def test_planned_steps_are_the_trainers():
    assert planned_steps(20, 4, 1, 1.0) == 5  # 19 trained (one in 20 held out), 4 a step
    assert planned_steps(20_000, 4, 2, 1.0) == 2375
    assert planned_steps(20, 4, 2, 2.0) == 6


def test_the_corpus_step_builds_or_resumes_the_issues_corpus_first(tmp_path, monkeypatch, capsys):
    """With no corpus, or an unfinished one, the corpus step runs the issue's build (its recipe, one-thread
    processes, from the repository) and the other steps wait for it; once its manifest says it is complete, the
    settings are fixed from its training answers and the features' pass starts. A complete corpus is taken as it is."""
    import sys

    from tools import cpu_train

    corpus, work = tmp_path / "corpus", tmp_path / "work"
    args = ["--work", str(work), "--corpus", str(corpus), "--processes", "2"]
    monkeypatch.setattr(cpu_train, "native_bf16", lambda cpuinfo=None: True)  # as on an AVX-512 BF16 CPU
    assert main([*args, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    shown = (f"corpus: {sys.executable} -m tools.corpus build --target smollm2-135m-instruct --out {corpus} "
             "--answers 20000 --mix wordnet=0.5,magpie=0.3,builtin=0.2 --held-out 0.02 --seed 0 --max-new-tokens 192 "
             "--dtype bfloat16 --processes 2 --threads 1")
    assert shown in printed and f"features: waits for the corpus ({corpus}: the corpus step)" in printed
    assert cpu_train.corpus_state(corpus) == "missing" and not (work / "agenda.json").exists()

    # the build stands in: it writes a manifest; the first run stops unfinished (3 of 4 answers), the second ends it
    build = ("import json, pathlib, sys\n"
             f"out = pathlib.Path({str(corpus)!r}); (out / 'answers').mkdir(parents=True, exist_ok=True)\n"
             "runs = len(list(out.glob('run*')))\n"
             "(out / f'run{runs}').touch()\n"
             "rows = ''.join(json.dumps({'id': i, 'prompt_tokens': [1], 'response_tokens': [2]}) + '\\n' "
             "for i in range(3 + runs))\n"
             "(out / 'answers' / 'train.jsonl').write_text(rows)\n"
             "(out / 'MANIFEST.json').write_text(json.dumps({'answers_asked': 4, 'answers': {'done': 3 + runs}}))\n"
             "print('built', sys.argv[1:])\n")
    monkeypatch.setattr(cpu_train, "corpus_command",
                        lambda folder, target, processes: [sys.executable, "-c", build, str(folder), str(processes)])
    started = []
    monkeypatch.setattr(cpu_train, "run_step", lambda step, *a, **k: started.append(step) or 0)
    assert main([*args, "--steps", "corpus,features"]) == 1  # unfinished: the features wait
    assert cpu_train.corpus_state(corpus) == "unfinished" and not started
    agenda = json.loads((work / "agenda.json").read_text())
    assert not agenda["steps"]["corpus"]["done"] and "settings" not in agenda
    assert "built" in (work / "logs" / "corpus.log").read_text() and "3/4 answers in" in status(work)
    with open(corpus / "answers" / "train.jsonl", "a") as f:  # written since the manifest's last count (a chunk on)
        f.write(json.dumps({"id": 9, "prompt_tokens": [1], "response_tokens": [2]}) + "\n")
    assert f"4/4 answers in {corpus} (3 in finished chunks)" in status(work)
    assert main([*args, "--steps", "corpus,features"]) == 0  # resumed to the end; then the features' pass
    agenda = json.loads((work / "agenda.json").read_text())
    assert agenda["steps"]["corpus"]["done"] and agenda["steps"]["corpus"]["runs"] == 2 and started == ["features"]
    assert agenda["settings"]["max_examples"] == 4 and agenda["settings"]["data"] == str(corpus / "answers" /
                                                                                         "train.jsonl")
    assert "4/4 answers in" in status(work)
    assert main(["--work", str(work), "--steps", "corpus"]) == 0  # done: skipped, the corpus from the settings
    assert "corpus: done already" in capsys.readouterr().out


def test_a_running_step_writes_its_time_so_far(tmp_path, monkeypatch):
    """The agenda holds a running step's wall time while it runs (a run killed outright keeps most of it), and the
    whole of it after."""
    import sys
    import threading
    import time

    from tools import cpu_train

    monkeypatch.setattr(cpu_train, "SAVE_EVERY_S", 0.1)
    release = tmp_path / "release"  # the step runs until the test has seen its time written
    code = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.02)"
    monkeypatch.setattr(cpu_train, "launcher", lambda processes: [sys.executable, "-c", code])
    agenda = cpu_train.Agenda(tmp_path)
    settings = {"target": "t", "data": "d.jsonl", "max_length": 8, "max_examples": 4, "processes": 1}
    worker = threading.Thread(target=cpu_train.run_step, args=("features", settings, tmp_path, agenda))
    worker.start()
    try:
        deadline = time.monotonic() + 60
        seen = 0.0
        while time.monotonic() < deadline and seen <= 0.2:
            if (tmp_path / "agenda.json").is_file():
                seen = json.loads((tmp_path / "agenda.json").read_text())["steps"]["features"]["seconds"]
            time.sleep(0.05)
        assert seen > 0.2 and not json.loads((tmp_path / "agenda.json").read_text())["steps"]["features"]["done"]
    finally:
        release.touch()
        worker.join(60)
    record = json.loads((tmp_path / "agenda.json").read_text())["steps"]["features"]
    assert record["done"] and record["runs"] == 1 and record["seconds"] >= seen


def test_a_complete_corpus_gets_its_held_out_question_file_once(tmp_path, capsys):
    """The held-out prompts, the first ten of each category, as a Spec-Bench question file beside the corpus (the
    trained drafters' held-out benchmark); written once; a corpus without a held-out list says so and goes on."""
    from hf_speculative.bench.spec_bench import load_prompts
    from tools.cpu_train import held_out_questions

    corpus = tmp_path / "corpus"
    (corpus / "prompts").mkdir(parents=True)
    rows = [{"id": f"w{i}", "source": "wordnet", "category": "writing" if i % 3 else "qa", "prompt": f"Prompt {i}?"}
            for i in range(40)]
    (corpus / "prompts" / "held_out.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = held_out_questions(corpus)
    assert path == corpus / "held_out.jsonl" and "(qa 10, writing 10)" in capsys.readouterr().out
    prompts = load_prompts(path)
    assert len(prompts) == 20 and {p.category for p in prompts} == {"writing", "qa"}
    path.write_text(path.read_text().splitlines(keepends=True)[0])
    assert held_out_questions(corpus) == path and len(load_prompts(path)) == 1  # written once: kept as it is
    assert held_out_questions(tmp_path / "other") is None
    assert "no held-out questions" in capsys.readouterr().out


def test_a_paused_step_counts_the_time_it_ran(monkeypatch):
    """A span between two ticks far longer than the wait (the agenda stopped with ``kill -STOP`` for a timing) counts
    as one wait; ordinary spans count whole."""
    from tools import cpu_train

    now = [100.0]
    monkeypatch.setattr(cpu_train.time, "perf_counter", lambda: now[0])
    assert cpu_train.SAVE_EVERY_S == 60.0
    clock = cpu_train.step_clock()
    now[0] += 61.0
    assert clock.tick() == 61.0
    now[0] += 4000.0  # stopped for an hour
    assert clock.tick() == 61.0 + 90.0
    now[0] += 30.0  # the last, short span (the run ended)
    assert clock.tick() == 181.0
    now[0] += 4000.0  # stopped again: the same cap, whatever the spans before
    assert clock.tick() == 181.0 + 90.0
    resumed = cpu_train.step_clock(271.0)  # the agenda's record of the runs before
    now[0] += 30.0
    assert resumed.tick() == 301.0


def test_bfloat16_only_where_the_cpu_multiplies_it_and_a_corpus_keeps_its_own(tmp_path, monkeypatch):
    """The corpus's dtype and the trainers' autocast follow the CPU's native bf16 products (AVX-512 BF16, AMX):
    elsewhere bf16 is emulated, several times slower than float32; an unfinished corpus is resumed in its own."""
    from tools import cpu_train

    intel = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\n"
    amd = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma sha_ni\n"
    assert native_bf16(intel) and native_bf16(intel.replace("avx512_bf16", "amx_bf16"))
    assert not native_bf16(amd) and not native_bf16("") and not native_bf16(intel.replace("flags", "bugs"))
    for native, dtype in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(cpu_train, "native_bf16", lambda cpuinfo=None, native=native: native)
        assert corpus_dtype(tmp_path / "new") == dtype
        assert f"--dtype {dtype} " in " ".join(cpu_train.corpus_command(tmp_path / "new", "m", 2))
        assert main(["--work", str(tmp_path / f"w{native}"), "--corpus", str(tmp_path / "new"), "--dry-run"]) == 0
        assert not (tmp_path / f"w{native}" / "agenda.json").exists()
    started = tmp_path / "started"  # begun in bfloat16 on another CPU: resumed in bfloat16 here
    started.mkdir()
    (started / "MANIFEST.json").write_text(json.dumps({"settings": {"dtype": "bfloat16"}, "answers_asked": 4}))
    assert corpus_dtype(started) == "bfloat16"
    # here bfloat16 is emulated (the loop left native_bf16 False): the messages still in bfloat16, but once the prompt
    # list is complete the remaining answers in float32 (the build records the switch)
    assert "--answers-dtype" not in cpu_train.corpus_command(started, "m", 2)
    (started / "MANIFEST.json").write_text(json.dumps({"settings": {"dtype": "bfloat16"}, "answers_asked": 4,
                                                       "prompts": {"total": 4}}))
    shown = " ".join(cpu_train.corpus_command(started, "m", 2))
    assert "--dtype bfloat16 --answers-dtype float32 " in shown
    monkeypatch.setattr(cpu_train, "native_bf16", lambda cpuinfo=None: True)
    assert "--answers-dtype" not in cpu_train.corpus_command(started, "m", 2)


def test_the_tau_runs_compare_each_trained_drafter_with_the_shipped_one(tmp_path):
    """For the registry's target: each exported kind, trained and shipped, on Spec-Bench and the held-out prompts
    (their own categories), at the issue's budgets and sizes; kinds not exported are left out."""
    work, corpus = tmp_path / "work", tmp_path / "corpus"
    for kind in ("eagle", "medusa"):
        (work / "export" / kind).mkdir(parents=True)
    corpus.mkdir()
    (corpus / "held_out.jsonl").write_text("".join(json.dumps({"question_id": i, "category": c, "turns": ["q"]}) + "\n"
                                                   for i, c in enumerate(["wordnet", "magpie", "wordnet", "builtin"])))
    runs = {out.name: argv for out, argv in tau_runs("smollm2-135m-instruct", work, corpus)}
    assert sorted(runs) == sorted(f"{source}-{kind}-{data}.jsonl" for source in ("trained", "shipped")
                                  for kind in ("eagle", "medusa") for data in ("spec_bench", "held_out"))
    eagle = runs["trained-eagle-held_out.jsonl"]
    assert eagle[eagle.index("--drafter") + 1] == str(work / "export" / "eagle")
    assert eagle[eagle.index("--categories") + 1] == "wordnet,magpie,builtin"
    assert eagle[eagle.index("--dataset") + 1] == str(corpus / "held_out.jsonl")
    assert eagle[eagle.index("--budgets") + 1] == "chain5,32" and "--resume" in eagle
    assert [eagle[eagle.index(flag) + 1] for flag in ("--per-category", "--max-new-tokens")] == ["10", "64"]
    medusa = runs["trained-medusa-spec_bench.jsonl"]
    assert medusa[medusa.index("--medusa") + 1] == str(work / "export" / "medusa") and "--dataset" not in medusa
    assert medusa[medusa.index("--budgets") + 1] == "medusa16"
    shipped = runs["shipped-medusa-spec_bench.jsonl"]
    assert "--medusa" not in shipped and "--drafter" not in shipped  # tree_tau's defaults: the shipped drafters


def test_a_tau_file_with_a_text_other_than_greedys_is_counted(tmp_path):
    (tmp_path / "tau").mkdir()
    rows = [{"category": "qa", "question_id": i, "new_tokens": 60,
             "chain5": {"tau": 2.0, "identical": True}, "32": {"tau": 3.0, "identical": i != 1}} for i in range(3)]
    out = tmp_path / "tau" / "trained-eagle-spec_bench.jsonl"
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert differing(out) == 1
    line = "trained-eagle-spec_bench: 3 prompts, chain5 τ 2.00, 32 τ 3.00; 2/3 identical to greedy"
    assert summary(tmp_path) == [line]


def test_a_niced_agenda_gives_its_niceness_to_a_session_of_its_own(tmp_path, monkeypatch):
    """Under autogroup scheduling a niced process only yields inside its session: the agenda starts its own and
    writes its niceness to the session's group; not niced, it touches nothing."""
    group = tmp_path / "autogroup"
    group.write_text("/autogroup-7 nice 0\n")
    sessions = []
    monkeypatch.setattr(os, "setsid", lambda: sessions.append(1))
    monkeypatch.setattr(os, "nice", lambda increment: 0)
    assert "nothing to do" in yield_to_foreground(group) and not sessions
    assert group.read_text() == "/autogroup-7 nice 0\n"
    monkeypatch.setattr(os, "nice", lambda increment: 19)
    assert "niced to 19" in yield_to_foreground(group) and sessions == [1]
    assert group.read_text() == "19"
    assert "nothing to do" in yield_to_foreground(tmp_path / "no-such-file")  # no autogroup scheduling


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroup scheduling (Linux only)")
def test_on_linux_the_session_and_its_group_are_new_and_niced():
    """A niced process that calls it (as the command line does) is in another autogroup than its parent, niced."""
    code = "from tools.cpu_train import yield_to_foreground as y; print(y()); print(open('/proc/self/autogroup').read())"
    done = subprocess.run(["nice", "-n", "19", sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True, cwd=Path(__file__).resolve().parents[2])
    told, group = done.stdout.splitlines()[:2]
    if told.startswith("could not set"):  # a container that does not let a process set its group's niceness
        pytest.skip(told)
    assert "niced to 19" in told and group.endswith("nice 19"), done.stdout
    # not this process's group; a process in the root group (no session of its own since boot, as CI's runner was:
    # its file reads empty) is in none
    ours = Path("/proc/self/autogroup").read_text().split()
    assert group.split()[0] != (ours[0] if ours else "the root group"), (group, ours)


def test_a_missing_corpus_is_restored_from_its_committed_snapshot_first(tmp_path, monkeypatch, capsys):
    """On a new machine the corpus step rebuilds the corpus from the committed parts (tools/corpus/snapshot.py) and
    resumes the build from there, rather than from nothing; a corpus already there is never overwritten, and
    ``--corpus-snapshots none`` leaves the parts alone."""
    from tools import cpu_train
    from tools.corpus.snapshot import snapshot

    made, corpus, work = tmp_path / "made", tmp_path / "corpus", tmp_path / "work"
    (made / "answers").mkdir(parents=True)
    row = {"prompt_tokens": [1], "response_tokens": [2]}
    (made / "answers" / "train.jsonl").write_text("".join(json.dumps({"id": i, **row}) + "\n" for i in range(3)))
    (made / "MANIFEST.json").write_text(json.dumps({"answers_asked": 4, "answers": {"done": 3}}))
    monkeypatch.setattr(cpu_train, "SNAPSHOTS", tmp_path / "snapshots")
    assert snapshot(made, cpu_train.snapshot_folder("smollm2-135m-instruct")).name == "part-0001.jsonl.xz"
    commands = []
    monkeypatch.setattr(cpu_train, "run_command", lambda step, argv, *a, **k: commands.append(argv) or 0)
    args = ["--work", str(work), "--corpus", str(corpus), "--steps", "corpus"]

    assert main([*args, "--corpus-snapshots", "none"]) == 0  # parts not read: the build starts from nothing
    assert cpu_train.corpus_state(corpus) == "missing" and len(commands) == 1
    assert main([*args, "--dry-run"]) == 0  # the dry run says so and writes nothing
    assert "corpus: restoring" in capsys.readouterr().out and not corpus.exists()
    assert main(args) == 0
    assert "restored answers/train.jsonl 3 rows" in capsys.readouterr().out
    assert (corpus / "answers" / "train.jsonl").read_bytes() == (made / "answers" / "train.jsonl").read_bytes()
    assert cpu_train.corpus_state(corpus) == "unfinished" and len(commands) == 3  # then the build resumes it
    parts = cpu_train.snapshot_folder("smollm2-135m-instruct")
    assert f"committed parts in {parts}: up to date" in status(work)
    with open(corpus / "answers" / "train.jsonl", "a") as f:  # the build went on: --status says what is uncommitted
        f.write(json.dumps({"id": 3, **row}) + "\n")
    assert (f"committed parts in {parts}: answers/train.jsonl 3/4 rows (python -m tools.corpus snapshot --out "
            f"{corpus} --to {parts})") in status(work)
    (corpus / "answers" / "train.jsonl").write_text("")  # a corpus there is the build's to resume, not overwritten
    (corpus / "MANIFEST.json").unlink()
    assert main(args) == 0 and (corpus / "answers" / "train.jsonl").read_text() == ""
