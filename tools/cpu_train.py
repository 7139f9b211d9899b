"""Issue 72's CPU agenda in one resumable command: the corpus (``python -m tools.corpus build``, unless it is
complete), the target's features over its training answers computed once (``hf-speculative cache-features``), then
EAGLE-3, DFlash and Medusa trained on them (``--feature-cache``), each within its share of the issue's budget (about
4 hours of this CPU per drafter in all, the features' pass counted a third to each).

    nice -n 19 python -m tools.cpu_train --corpus ~/corpora/smollm2-135m-instruct --work ~/training/smollm2 &
    python -m tools.cpu_train --work ~/training/smollm2 --status

Every step is a ``hf-speculative`` command in ``--processes`` one-thread processes (``torchrun``: on a small target
two such processes train 1.19x faster than one with two threads, ``benchmarks/training-history.md``), its output in
``WORK/logs/STEP.log``. The corpus step first restores a missing ``--corpus`` from the committed parts in
``data/snapshots/corpus-TARGET`` where there are any (``python -m tools.corpus snapshot``: a lost machine took the
corpus with it three times), then builds the issue's corpus (``CORPUS_RECIPE``: 20,000 answers, the mix, 2% held
out, 192 new tokens, in bfloat16 where the CPU multiplies it natively, else float32: ``native_bf16``) into
``--corpus`` when nothing is there, resumes one whose manifest says it is unfinished with the same command (in its own
dtype, but for the answers still to write of a bfloat16 corpus on a CPU that emulates bfloat16: those in float32,
``--answers-dtype``, recorded in its manifest; one of other settings is refused by the build, which names them), and
takes a finished one (or answers made elsewhere, without a manifest) as it is; the trainers under accelerate's bf16
autocast where the CPU has native bf16 products (``--mixed-precision``: AVX-512 BF16 products ran at twice fp32's rate, and a training step is mostly
products; on an AVX2 CPU bf16 is emulated, 5-7x slower, so there they run in float32), the weights, the losses and
the features' pass in float32. The same command goes on after an interruption:
the features' pass and each trainer resume from their files (a trainer's ``--max-minutes`` counts its time over
resumes), and a finished step (recorded in ``WORK/agenda.json`` with its wall time) is skipped. The recipes are those
of the GPU agenda (``tools/gpu/train_drafters.py``): EAGLE-3 with training-time test (``--unroll 7``), fused
low/mid/high features and a draft vocabulary chosen from the data (continued from the shipped drafter,
``--refresh-vocab``); DFlash blocks of 10 reading 5 target layers, 512 anchors, an 8192-token draft vocabulary (here
the loss reads only its rows, ``--loss-vocab draft``, as EAGLE-3's does: the whole 49k vocabulary's product and
cross-entropy were about half of a CPU training step); Medusa-1's 4 heads on the target's lm_head with a calibrated
16-node tree. The export step writes each trained drafter in the shipped format (``WORK/export/KIND``: float16
weights, ``training.json`` with the command, curve and corpus, ``sha256sums.json``; loaded back and checked), ready to
be copied into the package; the last step measures each one's τ against the shipped drafter of its kind at the issue's
budgets, on Spec-Bench and on the held-out prompts (:mod:`tools.cpu_tau`: ``WORK/tau``; fixed budgets, so the figures
do not depend on the machine's load; speeds are for a quiet run). ``python -m tools.cpu_ship`` then copies each
exported drafter whose τ beats the shipped one's into the package.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from tools.gpu.train_drafters import DRAFTERS, HELD_OUT, MIX, NAME, SEED  # the GPU agenda's (stdlib imports only)

STEPS = ("corpus", "features", *DRAFTERS, "export", "tau")
# issue 72's corpus (tools/gpu/train_drafters.py's MIX, HELD_OUT and SEED), in --dtype corpus_dtype()'s
CORPUS_RECIPE = ["--answers", "20000", "--mix", MIX, "--held-out", f"{HELD_OUT:g}", "--seed", str(SEED),
                 "--max-new-tokens", "192"]
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo's flags of native bfloat16 products
HELD_OUT_QUESTIONS, HELD_OUT_PER_CATEGORY = "held_out.jsonl", 10  # the drafters' held-out benchmark (issue 72)
ROOT = Path(__file__).resolve().parents[1]  # the repository: tools.corpus runs from it
SNAPSHOTS = ROOT / "data" / "snapshots"  # committed corpus checkpoints (tools/corpus/snapshot.py): corpus-TARGET
VALIDATIONS = 8  # per training run, the last at its end
SAVE_EVERY_S = 60.0  # how often a running step's wall time is written to the agenda
RECIPES = {
    "eagle": ["--eagle3", "--draft-vocab-size", "8192", "--unroll", "7", "--lr", "3e-4", "--batch-size", "4",
              "--grad-accum", "1", "--val-prompts", "8"],
    "dflash": ["--block-size", "10", "--layers", "2", "--target-layers", "5", "--anchors", "512", "--draft-vocab",
               "8192", "--loss-vocab", "draft", "--save-dtype", "float16", "--batch-size", "4", "--grad-accum", "1",
               "--val-prompts", "8"],
    "medusa": ["--heads", "4", "--layers", "1", "--lm-head", "target", "--tree-nodes", "16", "--batch-size", "4",
               "--grad-accum", "1", "--val-prompts", "4"],
}
# the dry run's (tests/tools/test_cpu_train.py, a tiny target of a 128-token vocabulary)
TINY = {"eagle": ["--eagle3", "--draft-vocab-size", "24", "--unroll", "3", "--lr", "1e-2", "--batch-size", "4",
                  "--grad-accum", "1", "--val-prompts", "1"],
        "dflash": ["--block-size", "4", "--layers", "1", "--target-layers", "3", "--anchors", "8", "--draft-vocab",
                   "24", "--loss-vocab", "draft", "--batch-size", "4", "--grad-accum", "1", "--val-prompts", "1"],
        "medusa": ["--heads", "2", "--tree-nodes", "4", "--batch-size", "4", "--grad-accum", "1", "--val-prompts", "1"]}


def _count_rows(path: Path) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip() and line.endswith("\n"))


def planned_steps(examples: int, batch_size: int, processes: int, epochs: float, val_every: int = 20) -> int:
    """Optimizer steps of a trainer over ``examples`` (every ``val_every``-th held out), ``batch_size`` sequences a
    forward and process, no accumulation: the trainers' own ``total_steps``."""
    train = examples - math.ceil(examples / val_every)
    return max(1, math.ceil(math.ceil(math.ceil(max(train, 1) / batch_size) / processes) * epochs))


class Agenda:
    """``WORK/agenda.json``: the settings of the run and, per step, its wall seconds over resumes and whether it
    finished."""

    def __init__(self, work: Path):
        self.path = work / "agenda.json"
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {"steps": {}}

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)

    def step(self, name: str) -> dict:
        return self.data["steps"].setdefault(name, {"seconds": 0.0, "done": False, "runs": 0})


def corpus_state(corpus: Path) -> str:
    """``"complete"`` (its manifest's answers all written, or answers made elsewhere, without a manifest),
    ``"unfinished"`` (a manifest with answers still to write) or ``"missing"``."""
    data = _manifest(corpus)
    if data is not None:
        done = (data.get("answers") or {}).get("done", 0)
        return "complete" if done >= data.get("answers_asked", math.inf) else "unfinished"
    return "complete" if (corpus / "answers" / "train.jsonl").is_file() else "missing"


def _manifest(corpus: Path) -> dict | None:
    """The corpus's ``MANIFEST.json`` (``tools.corpus``' own reader), or None where there is none."""
    from tools.corpus.manifest import read_manifest

    return read_manifest(corpus)


def native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX: there bfloat16 answers came 1.4x faster
    than float32 and a bf16-autocast training step about 2x); elsewhere (AVX2: an AMD EPYC here) PyTorch's bfloat16
    products are emulated, 5-7x slower than float32's. ``cpuinfo``: ``/proc/cpuinfo``'s text (read when ``None``;
    no file: ``False``)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[-1].split()}
    return any(flag in flags for flag in BF16_FLAGS)


def corpus_dtype(corpus: Path) -> str:
    """The corpus's dtype: an unfinished corpus's own (its manifest's: a build refuses another; its remaining answers
    may come in float32 where bfloat16 is emulated, :func:`corpus_command`), else ``bfloat16`` where the CPU
    multiplies it natively, ``float32`` elsewhere (:func:`native_bf16`)."""
    dtype = ((_manifest(corpus) or {}).get("settings") or {}).get("dtype")
    if dtype:
        return dtype
    return "bfloat16" if native_bf16() else "float32"


def corpus_command(corpus: Path, target: str, processes: int) -> list[str]:
    """The issue's corpus built into ``corpus``, or resumed there (a corpus of other settings is refused by the
    build, naming them), in ``processes`` one-thread processes, in :func:`corpus_dtype`."""
    dtype = corpus_dtype(corpus)
    # a corpus begun in bfloat16 on another machine, resumed here where bfloat16 is emulated: its remaining answers in
    # float32 (the build refuses this until the prompt list is complete, and records which answers came in which)
    switch = ["--answers-dtype", "float32"] if dtype == "bfloat16" and not native_bf16() and \
        corpus_prompts_complete(corpus) else []
    return [sys.executable, "-m", "tools.corpus", "build", "--target", target, "--out", str(corpus), *CORPUS_RECIPE,
            "--dtype", dtype, *switch, "--processes", str(processes), "--threads", "1"]


def corpus_prompts_complete(corpus: Path) -> bool:
    """Whether the corpus's prompt list is complete (its manifest counts as many prompts as answers asked)."""
    data = _manifest(corpus) or {}
    return (data.get("prompts") or {}).get("total", 0) >= data.get("answers_asked", math.inf)


def corpus_folder(args: argparse.Namespace, agenda: Agenda) -> Path:
    """``--corpus``, or the one the agenda's settings were fixed from."""
    if "settings" in agenda.data:
        return Path(agenda.data["settings"]["data"]).parent.parent
    if args.corpus is None:
        raise SystemExit("give --corpus DIR for a new --work folder")
    return Path(args.corpus).expanduser().resolve()


def settings_of(args: argparse.Namespace, agenda: Agenda, *, keep: bool = True) -> dict:
    """The run's data and sizes, fixed at its first start (the features and every trainer must see the same
    examples): the corpus's training answers then, or ``--max-examples``."""
    if "settings" in agenda.data:
        # agendas from before the option: their trainers had not started (the features' pass came first)
        agenda.data["settings"].setdefault("mixed_precision", args.mixed_precision)
        return agenda.data["settings"]
    data = corpus_folder(args, agenda) / "answers" / "train.jsonl"
    if not data.is_file():
        raise SystemExit(f"{data}: no training answers (build the corpus first: the corpus step, or python -m "
                         "tools.corpus build ...)")
    examples = min(_count_rows(data), args.max_examples or sys.maxsize)
    agenda.data["settings"] = {"data": str(data), "max_examples": examples, "max_length": args.max_length,
                               "processes": args.processes, "hours_per_drafter": args.hours_per_drafter,
                               "epochs": {"eagle": args.epochs, "dflash": args.epochs, "medusa": args.epochs},
                               "target": args.target, "tiny": args.tiny, "mixed_precision": args.mixed_precision,
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if keep:
        agenda.save()
    return agenda.data["settings"]


def command(step: str, settings: dict, work: Path, agenda: Agenda) -> list[str]:
    """The ``hf-speculative`` arguments of ``step``."""
    common = ["--target", settings["target"], "--data", settings["data"], "--max-length", str(settings["max_length"]),
              "--max-examples", str(settings["max_examples"]), "--threads", "1"]
    if step == "features":  # by default the layers EAGLE-3 and DFlash read by default
        tiny = ["--layers", "1,2,3"] if settings.get("tiny") else []
        return ["cache-features", *common, *tiny, "--out", str(work / "features")]
    features_minutes = agenda.step("features")["seconds"] / 60
    budget = 60 * settings["hours_per_drafter"] - features_minutes / 3  # the shared pass, a third to each drafter
    recipe = (TINY if settings.get("tiny") else RECIPES)[step]
    if step == "eagle" and settings["target"] == NAME:  # continued from the shipped drafter, its vocabulary chosen again
        recipe = [*recipe, "--init-from", NAME, "--refresh-vocab"]
    batch = int(recipe[recipe.index("--batch-size") + 1])
    epochs = settings["epochs"][step]
    steps = planned_steps(settings["max_examples"], batch, settings["processes"], epochs)
    return [f"train-{step}", *common, *recipe, "--feature-cache", str(work / "features"), "--out", str(work / step),
            "--epochs", f"{epochs:g}", "--eval-every", str(steps // VALIDATIONS + 1),
            "--max-minutes", f"{max(budget, 1.0):.1f}", "--seed", "0"]


def launcher(processes: int) -> list[str]:
    """How each step starts: one process, or ``processes`` one-thread processes under torchrun."""
    if processes == 1:
        return [sys.executable, "-m", "hf_speculative"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            "-m", "hf_speculative"]


def run_step(step: str, settings: dict, work: Path, agenda: Agenda, *, dry_run: bool = False) -> int:
    """Run ``step`` (resuming its files), its wall time added to the agenda; returns its exit code."""
    argv = launcher(settings["processes"]) + command(step, settings, work, agenda)
    # the trainers under accelerate's autocast (bf16 products: 1.6x the fp32 step on this CPU's AVX-512 BF16), the
    # features' pass in float32 (the target's own states)
    precision = settings.get("mixed_precision", "no") if step in DRAFTERS else "no"
    return run_command(step, argv, work, agenda, precision=precision, dry_run=dry_run)


def snapshot_folder(target: str) -> Path:
    """Where the agenda looks for ``target``'s committed corpus checkpoints (``--corpus-snapshots``' default)."""
    return SNAPSHOTS / f"corpus-{Path(target).name}"


def restore_corpus(corpus: Path, snapshots: Path, *, dry_run: bool = False) -> bool:
    """A missing corpus rebuilt from the committed parts in ``snapshots`` (:mod:`tools.corpus.snapshot`), when there
    are any, so that a new machine goes on where the last snapshot ended rather than from nothing; returns whether
    it was (or, in a dry run, would be)."""
    from tools.corpus.snapshot import part_files, restore

    parts = part_files(snapshots)
    if not parts or corpus.exists() and any(corpus.iterdir()):
        return False
    print(f"corpus: restoring {corpus} from {len(parts)} parts in {snapshots}", flush=True)
    if not dry_run:
        done = restore(snapshots, corpus)
        print("corpus: restored " + ", ".join(f"{name} {n} rows" for name, n in done["rows"].items()), flush=True)
    return True


def corpus_step(corpus: Path, target: str, processes: int, work: Path, agenda: Agenda, *,
                dry_run: bool = False, snapshots: Path | None = None) -> int:
    """The corpus step: a missing corpus is first restored from ``snapshots``' committed parts where there are any
    (:func:`restore_corpus`); a complete corpus is taken as it is; else the issue's is built or resumed (the agenda's
    other steps wait for it). A complete one gets its held-out question file (:func:`held_out_questions`). Returns an
    exit code."""
    record, state = agenda.step("corpus"), corpus_state(corpus)
    if snapshots is not None:  # (--status says what a snapshot would add there)
        record["snapshots"] = str(snapshots)
    if state == "missing" and snapshots is not None and restore_corpus(corpus, snapshots, dry_run=dry_run):
        state = corpus_state(corpus)
    if state == "complete":
        print(f"corpus: {corpus} is complete; taken as it is", flush=True)
        if not dry_run:
            record.update(done=True, folder=str(corpus))
            held_out_questions(corpus)
            agenda.save()
        return 0
    record["folder"] = str(corpus)  # (--status reads its progress there while it runs)
    code = run_command("corpus", corpus_command(corpus, target, processes), work, agenda, dry_run=dry_run)
    if not dry_run:
        record["done"] = code == 0 and corpus_state(corpus) == "complete"
        if record["done"]:
            held_out_questions(corpus)
        agenda.save()
    return code


def held_out_questions(corpus: Path) -> Path | None:
    """``corpus/held_out.jsonl``: the first :data:`HELD_OUT_PER_CATEGORY` held-out prompts of each category as a
    Spec-Bench question file (``tools.corpus questions``), the trained drafters' held-out benchmark
    (``--dataset``); written once. ``None`` for a corpus without a held-out split."""
    to = corpus / HELD_OUT_QUESTIONS
    if to.is_file():
        return to
    from tools.corpus.questions import write_questions

    try:
        counts = write_questions(corpus, to, "held_out", HELD_OUT_PER_CATEGORY)
    except ValueError as why:  # no held-out prompt list (answers made elsewhere)
        print(f"corpus: no held-out questions ({why})", flush=True)
        return None
    print(f"corpus: held-out questions in {to} ({', '.join(f'{c} {n}' for c, n in counts.items())})", flush=True)
    return to


def run_command(step: str, argv: list[str], work: Path, agenda: Agenda, *, precision: str = "no",
                dry_run: bool = False) -> int:
    """Run ``argv`` as ``step`` from the repository, its output in ``WORK/logs/STEP.log`` and its wall time added to
    the agenda; returns its exit code."""
    shown = (f"ACCELERATE_MIXED_PRECISION={precision} " if precision != "no" else "") + shlex.join(argv)
    record = agenda.step(step)
    log = work / "logs" / f"{step}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{time.strftime('%H:%M:%S')}] {step}: {shown}", flush=True)
    if dry_run:
        return 0
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               ACCELERATE_MIXED_PRECISION=precision)
    record["runs"] += 1
    record["command"] = shown
    agenda.save()
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"\n# {time.strftime('%Y-%m-%dT%H:%M:%S%z')}: {shown}\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        clock = step_clock(record["seconds"])
        try:
            while True:  # the time so far saved every minute: a run killed outright (SIGKILL) keeps most of it
                try:
                    code = proc.wait(timeout=SAVE_EVERY_S)
                    break
                except subprocess.TimeoutExpired:
                    record["seconds"] = clock.tick()
                    agenda.save()
        finally:  # an interrupted agenda keeps the time its step ran
            if proc.poll() is None:
                proc.terminate()
            record["seconds"] = clock.tick()
            agenda.save()
    record["done"] = code == 0
    record["returncode"] = code
    agenda.save()
    print(f"[{time.strftime('%H:%M:%S')}] {step}: exit {code} after {record['seconds'] / 60:.1f} min in all "
          f"(log {log})", flush=True)
    return code


def step_clock(before: float = 0.0):
    """A step's running time from ``before`` on, its pauses left out (``hf_speculative.training.clock.TrainClock``,
    the trainers' own): the agenda is paused for a timing by stopping its whole process tree (``kill -STOP``, this
    process too), so a wait that returns far later than its ``SAVE_EVERY_S`` timeout was a pause. This process only
    waits (its CPU time in a span is ~0), so with ``slack=1`` every span counts at most ``1.5 x SAVE_EVERY_S``: the
    budgets are of the time the step ran, not of the time it was stopped."""
    from hf_speculative.training.clock import TrainClock

    return TrainClock(before, floor=1.5 * SAVE_EVERY_S, slack=1.0)


def export_drafters(settings: dict, work: Path, agenda: Agenda) -> dict[str, dict]:
    """Every finished drafter (``WORK/KIND``) in the shipped format into ``WORK/export/KIND`` (the GPU agenda's
    export: float16 weights, the registry name as its target, its command, curve, summary and corpus in
    ``training.json``, ``sha256sums.json``; loaded back), recorded in the agenda as the ``export`` step (done once
    all three are). Returns the exported drafters' digests by kind."""
    from tools.gpu.gpu_check import environment
    from tools.gpu.train_drafters import corpus_counts, export

    started = time.perf_counter()
    corpus = corpus_counts(Path(settings["data"]).parent.parent)
    device = {**environment("cpu"), "threads": 1, "processes": settings["processes"]}
    exported = {}
    for kind in DRAFTERS:
        record = agenda.data["steps"].get(kind, {})
        if not record.get("done"):
            print(f"export: {kind} is not trained (yet); left out", flush=True)
            continue
        dest = work / "export" / kind
        exported[kind] = export(kind, work / kind, dest, name=settings["target"], command=record["command"],
                                corpus=corpus, device=device)
        print(f"export: {kind} in {dest}", flush=True)
    record = agenda.step("export")
    record.update(done=len(exported) == len(DRAFTERS), seconds=time.perf_counter() - started, drafters=sorted(exported))
    record["runs"] += 1
    agenda.save()
    return exported


def tau_step(settings: dict, work: Path, corpus: Path, agenda: Agenda, *, dry_run: bool = False) -> int:
    """The τ runs of the exported drafters (:mod:`tools.cpu_tau`), one after the other, each logged as the ``tau``
    step; done once the export is and every run ended with every output equal to greedy's. Returns an exit code."""
    from tools.cpu_tau import differing, summary, tau_runs

    runs = tau_runs(settings["target"], work, corpus, tiny=bool(settings.get("tiny")))
    (work / "tau").mkdir(exist_ok=True)
    codes = [run_command("tau", argv, work, agenda, dry_run=dry_run) for _, argv in runs]
    if dry_run:
        return 0
    wrong = sum(differing(out) for out, _ in runs if out.is_file())
    record = agenda.step("tau")
    record["done"] = bool(runs) and agenda.step("export")["done"] and not any(codes) and wrong == 0
    agenda.save()
    for line in summary(work):
        print(f"tau: {line}", flush=True)
    if wrong:
        print(f"tau: {wrong} prompt(s) gave a text other than greedy's: a drafter or the loop is wrong "
              f"({work / 'tau'})", flush=True)
    return 1 if any(codes) or wrong else 0


def status(work: Path) -> str:
    from hf_speculative.training.data import finished_examples

    agenda = Agenda(work)
    lines = [f"{work}: {json.dumps(agenda.data.get('settings', {}))}"]
    for step in STEPS:
        record = agenda.data["steps"].get(step)
        if record is None:
            lines.append(f"  {step:<8} not started")
            continue
        lines.append(f"  {step:<8} {'done' if record['done'] else 'not finished'}, {record['seconds'] / 60:.1f} min "
                     f"over {record['runs']} run(s)")
        manifest = Path(record.get("folder", "")) / "MANIFEST.json"
        if step == "corpus" and record.get("folder") and manifest.is_file():
            data = json.loads(manifest.read_text())
            done = written = (data.get("answers") or {}).get("done", 0)
            if not record["done"]:  # the manifest counts the chunks finished; the files hold every answer written
                from tools.corpus.answers import progress

                written = progress(Path(record["folder"]))["done"]
            lines.append(f"           {written}/{data.get('answers_asked')} answers in {record['folder']}"
                         + (f" ({done} in finished chunks)" if written != done else ""))
            if record.get("snapshots"):  # what the committed parts lack: a machine lost now would lose it
                from tools.corpus.snapshot import behind

                lag = behind(Path(record["folder"]), Path(record["snapshots"]))
                lines.append(f"           committed parts in {record['snapshots']}: " + (
                    "up to date" if not lag else ", ".join(f"{name} {held}/{rows} rows" for name, (held, rows)
                                                           in lag.items())
                    + f" (python -m tools.corpus snapshot --out {record['folder']} --to {record['snapshots']})"))
        index = Path(work) / "features" / "index.json"
        if step == "features" and index.is_file():  # examples finished: the index's prefix, its runs, the notes
            finished, total = finished_examples(index.parent), json.loads(index.read_text())["num_examples"]
            lines.append(f"           {finished}/{total} examples" + _to_go(finished, total, record))
        if step == "tau":
            from tools.cpu_tau import summary

            lines.extend(f"           {line}" for line in summary(Path(work)))
        progress = Path(work) / step / "checkpoint" / "progress.json"  # the trainers' resume point (STATE)
        if progress.is_file():
            saved = json.loads(progress.read_text())
            lines.append(f"           checkpoint at optimizer step {saved['step']}, "
                         f"{saved.get('train_seconds', 0.0) / 60:.1f} min trained")
        log = Path(work) / step / "train_log.jsonl"
        if log.is_file():
            rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            if rows:
                last = rows[-1]
                keys = ("step", "val_tau", "val_tau_tree", "val_tau_chain", "val_acc", "val_top1")
                lines.append("           last validation: " + ", ".join(f"{k} {last[k]}" for k in keys if k in last))
    return "\n".join(lines)


def _to_go(finished: int, total: int, record: dict) -> str:
    """``", about N min to go"`` at the step's rate so far (its examples over its wall time, resumes included), while it
    runs and has run a minute; else empty."""
    if record["done"] or finished <= 0 or finished >= total or record["seconds"] < 60:
        return ""
    return f", about {(total - finished) * record['seconds'] / finished / 60:.0f} min to go at its rate so far"


def yield_to_foreground(autogroup: Path = Path("/proc/self/autogroup")) -> str:
    """Make ``nice`` hold against the work of other sessions: with Linux's autogroup scheduling (``sched_autogroup``,
    on by default), CPU time is shared first between sessions, and a niced process's own niceness only weighs inside
    its session. Measured here: the agenda under ``nice -n 19``, started from a shell, took half the machine from a
    test queue started in another session. A niced agenda therefore starts a session of its own (``setsid``; it fails
    harmlessly for a session leader) and gives that session's group its niceness (``/proc/self/autogroup``); the
    processes it starts inherit both. Returns what it did, for the log."""
    niceness = os.nice(0)
    if niceness <= 0 or not autogroup.exists():
        return "not niced, or no autogroup scheduling: nothing to do"
    try:
        os.setsid()
    except OSError:  # already a session leader (started by setsid): its group is its own
        pass
    try:
        autogroup.write_text(str(niceness))
    except OSError as error:
        return f"could not set the session's niceness ({error}): other sessions share the CPU with it equally"
    # empty where a cgroup's CPU controller, not the autogroup, schedules the process
    shown = autogroup.read_text().strip() or "scheduled by its cgroup, not an autogroup"
    return f"its session's CPU share niced to {niceness} ({shown})"


def main(argv: list[str] | None = None, *, own_session: bool = False) -> int:
    """The command; ``own_session`` (the command line's run, not the tests' calls): :func:`yield_to_foreground`."""
    parser = argparse.ArgumentParser(prog="python -m tools.cpu_train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folder of the features, the drafters and the logs")
    parser.add_argument("--corpus", type=Path, help="the corpus's folder (python -m tools.corpus build --out): built "
                        "there by the corpus step when it is missing or unfinished; its answers/train.jsonl is read "
                        "as it is once the corpus is complete")
    parser.add_argument("--corpus-snapshots", type=Path, help="committed checkpoints of the corpus (python -m "
                        "tools.corpus snapshot --to): a missing --corpus is restored from them first (default "
                        "data/snapshots/corpus-TARGET in the repository; 'none': never)")
    parser.add_argument("--steps", default=",".join(STEPS), help="steps to run, in order (default %(default)s)")
    parser.add_argument("--processes", type=int, default=2, help="one-thread processes per step (default 2)")
    parser.add_argument("--hours-per-drafter", type=float, default=4.0, help="each drafter's budget, the features' "
                        "pass counted a third to each (default 4)")
    parser.add_argument("--epochs", type=float, default=1.0, help="passes of each trainer over the data (default 1)")
    parser.add_argument("--max-examples", type=int, help="the first N training answers (default all at the start)")
    parser.add_argument("--max-length", type=int, default=1280, help="longest sequence (default 1280: a 1,024-token "
                        "prompt and its 192-token answer whole)")
    parser.add_argument("--target", default=NAME, help="the target (default %(default)s, whose shipped EAGLE drafter "
                        "the EAGLE run continues)")
    parser.add_argument("--mixed-precision", choices=("bf16", "no"), help="the trainers' autocast (accelerate's "
                        "ACCELERATE_MIXED_PRECISION; bf16: bf16 products, float32 weights and losses; default bf16 "
                        "where the CPU multiplies bfloat16 natively, AVX-512 BF16 or AMX, else no), fixed at the "
                        "first start")
    parser.add_argument("--tiny", action="store_true", help="the tests' recipes: small vocabularies and blocks")
    parser.add_argument("--status", action="store_true", help="print where the agenda stands and stop")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    if args.mixed_precision is None:
        args.mixed_precision = "bf16" if native_bf16() else "no"
    work = args.work.expanduser().resolve()
    if args.status:
        print(status(work))
        return 0
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown or args.processes < 1 or not args.hours_per_drafter > 0 or not args.epochs > 0:
        parser.error(f"--steps {args.steps} (of {', '.join(STEPS)}), --processes {args.processes} (>= 1), "
                     f"--hours-per-drafter {args.hours_per_drafter} and --epochs {args.epochs} (> 0)")
    work.mkdir(parents=True, exist_ok=True)
    if own_session and not args.dry_run:
        print(f"agenda: {yield_to_foreground()}", flush=True)
    agenda = Agenda(work)
    corpus = corpus_folder(args, agenda)
    settings = None
    for step in steps:
        if agenda.step(step)["done"]:
            print(f"{step}: done already ({agenda.step(step)['seconds'] / 60:.1f} min)", flush=True)
            continue
        if step == "corpus":
            snapshots = None if str(args.corpus_snapshots) == "none" else \
                (args.corpus_snapshots or snapshot_folder(args.target))
            if corpus_step(corpus, args.target, args.processes, work, agenda, dry_run=args.dry_run,
                           snapshots=snapshots) != 0:
                return 1
            continue
        if corpus_state(corpus) != "complete":
            print(f"{step}: waits for the corpus ({corpus}: the corpus step)", flush=True)
            return 0 if args.dry_run else 1
        if settings is None:  # fixed at the first step after the corpus
            settings = settings_of(args, agenda, keep=not args.dry_run)
        if step != "features" and not agenda.step("features")["done"] and not args.dry_run:
            print(f"{step}: waits for the features' pass", flush=True)
            return 1
        if step == "export":  # in this process: no trainer runs
            if not args.dry_run:
                export_drafters(settings, work, agenda)
            continue
        if step == "tau":
            if tau_step(settings, work, corpus, agenda, dry_run=args.dry_run) != 0:
                return 1
            continue
        if run_step(step, settings, work, agenda, dry_run=args.dry_run) != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(own_session=True))
