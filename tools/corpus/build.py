"""The corpus's one command, as functions: :func:`build` (prompts, then answers, each stage resuming) and
:func:`status`."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .answers import answer_all, answer_in_processes, load_target, progress
from .files import magpie_path, prompts_path, read_prompts, read_rows, sole_writer
from .manifest import (
    check_settings,
    command_line,
    read_manifest,
    recreate_command,
    target_identity,
    versions,
    write_manifest,
)
from .mix import DEFAULT_MIX, SpecBenchFilter, mix_text, parse_mix, seat_sources
from .prompts import build_prompt_list, check_growth, prompt_length, write_prompt_files
from .sources import ListSource, MagpieSource, builtin_builder, magpie_options, magpie_sampler, wordnet_builder

REPO = Path(__file__).resolve().parents[2]


def check_out(out: Path | str) -> Path:
    """``out`` as an absolute path, refused inside this repository's checkout (a corpus is data, kept outside it)."""
    path = Path(out).expanduser().resolve()
    if path == REPO or REPO in path.parents:
        raise ValueError(f"--out {out} is inside the repository ({REPO}): a corpus is gigabytes of data, not code, "
                         f"and is kept outside the checkout; give a folder outside it, e.g. --out "
                         f"{Path.home() / 'corpora' / path.name}")
    return path


class Target:
    """The target, loaded once and only when needed: its tokenizer alone for the prompt list (lengths), the model
    for the Magpie source and the answers (on ``device``, in ``dtype``: :func:`~tools.corpus.answers.load_target`)."""

    def __init__(self, name: str, cpu_layout: str, threads: int | None, device: str = "cpu",
                 dtype: str | None = None):
        self.name, self.cpu_layout, self.threads, self.device, self.dtype = name, cpu_layout, threads, device, dtype
        self.model: Any = None
        self._tokenizer: Any = None

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            from hf_speculative.registry.models import resolve

            self._tokenizer = AutoTokenizer.from_pretrained(resolve(self.name))
        return self._tokenizer

    def load(self) -> tuple[Any, Any]:
        if self.model is None:
            self.model, self._tokenizer = load_target(self.name, cpu_layout=self.cpu_layout, threads=self.threads,
                                                      device=self.device, dtype=self.dtype)
        return self.model, self._tokenizer

    def load_args(self) -> dict:
        """:func:`~tools.corpus.answers.load_target`'s arguments for another process's copy (its threads its own)."""
        return {"target": self.name, "cpu_layout": self.cpu_layout, "device": self.device, "dtype": self.dtype}


def _check_numbers(answers: int, held_out: float, max_new_tokens: int, max_prompt_tokens: int,
                   batch_size: int) -> None:
    if answers < 1 or max_new_tokens < 1 or max_prompt_tokens < 1 or batch_size < 1 or not 0 <= held_out < 1:
        raise ValueError(f"--answers {answers}, --max-new-tokens {max_new_tokens}, --max-prompt-tokens "
                         f"{max_prompt_tokens}, --batch-size {batch_size}: each must be >= 1; --held-out {held_out} "
                         "must be in [0, 1)")


def _spec_bench_record(spec: SpecBenchFilter) -> dict:
    path = spec.path.resolve()
    return {"path": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
            "sha256": hashlib.sha256(spec.path.read_bytes()).hexdigest(), "questions": len(spec.questions)}


def build(target: str, out: Path | str, *, answers: int = 20_000, mix: str = DEFAULT_MIX, held_out: float = 0.02,
          seed: int = 0, max_new_tokens: int = 192, max_prompt_tokens: int = 1024, batch_size: int = 16,
          threads: int | None = None, cpu_layout: str = "auto", prompts_only: bool = False,
          wordnet_dir: Path | None = None, fortune_dir: Path | None = None, magpie: dict | None = None,
          spec_bench: Path | None = None, argv: list[str] | None = None, progress_output: bool = True,
          device: str = "cpu", dtype: str | None = None, lists: Path | None = None, max_minutes: float | None = None,
          sort_window: int = 1024, processes: int = 1, answers_dtype: str | None = None) -> dict:
    """Build, resume or grow the corpus in ``out`` to ``answers`` answers; returns its manifest.

    Stage 1 writes the prompt list (``prompts/*.jsonl``; :mod:`tools.corpus.prompts`), stage 2 the answers
    (``answers/*.jsonl``; :mod:`tools.corpus.answers`); ``MANIFEST.json`` and ``README.md`` are brought up to date
    after each. Arguments as ``python -m tools.corpus build``'s options; ``magpie``: the sampler's options
    (:func:`tools.corpus.sources.magpie_options`); ``spec_bench``: the questions never to train on (default the
    package's Spec-Bench); ``lists``: a folder of ``python -m tools.corpus lists`` (:mod:`tools.corpus.lists`) whose
    WordNet and built-in lists are read instead of built here; ``max_minutes``: no chunk of answers starts after this
    many minutes of the build (the same command resumes); ``sort_window``: prompts answered are sorted by length
    within windows of this many (0: each chunk of answers whole); ``processes``: one-thread processes sampling the
    target's own messages and answering side by side on the CPU, each with its own copy of the target
    (:mod:`tools.corpus.magpie_processes`, :func:`~tools.corpus.answers.answer_in_processes`); ``answers_dtype``:
    this run's target in another dtype than the corpus's ``dtype`` (its setting, still checked), for the answers
    still to write once the prompt list is complete (a corpus begun in bfloat16 resumed on a CPU that only emulates
    it, 5-7x slower than float32); recorded in the manifest's run with the answers there at its start.

    Raises:
        ValueError: ``out`` inside the repository, bad numbers or mix, settings other than the corpus's, a
            smaller corpus than it holds, or another build writing ``out``. tools.corpus.sources.Exhausted: a
            source ran out of prompts.
    """
    started = time.perf_counter()
    out = check_out(out)
    _check_numbers(answers, held_out, max_new_tokens, max_prompt_tokens, batch_size)
    if processes < 1 or processes > 1 and (device != "cpu" or threads not in (None, 1)):
        raise ValueError(f"--processes {processes} with --device {device} --threads {threads}: give 1 or more "
                         "processes; several are for the CPU, each with one thread (leave --threads out)")
    if max_minutes is not None and not max_minutes > 0 or sort_window < 0:
        raise ValueError(f"--max-minutes {max_minutes}, --sort-window {sort_window}: the minutes must be > 0 and the "
                         "window >= 0 (0: each chunk of answers sorted whole)")
    shares = parse_mix(mix)
    listed = None
    if lists is not None:
        from .lists import LISTED, read_lists

        listed = read_lists(Path(lists), seed, [name for name in LISTED if name in shares])
    options = magpie_options(**{**(magpie or {}), "progress": progress_output})
    settings = {"target": target, "mix": mix_text(shares), "held_out": held_out, "seed": seed,
                "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
                "magpie": {k: v for k, v in options.items() if k != "progress"} if "magpie" in shares else None,
                "wordnet_dir": str(wordnet_dir) if wordnet_dir and "wordnet" in shares else None,
                "fortune_dir": str(fortune_dir) if fortune_dir and "wordnet" in shares else None,
                # the target's dtype shapes every message and answer: one corpus, one dtype (a run's answers in
                # another, --answers-dtype, are recorded in its run)
                "dtype": dtype or ("float32" if device == "cpu" else "auto")}
    with sole_writer(out):
        check_settings(out, settings)
        check_growth(out, answers)
        if answers_dtype is not None and answers_dtype != settings["dtype"] and not _prompts_complete(out, answers):
            raise ValueError(f"--answers-dtype {answers_dtype}: the prompt list of {out} is not complete (the target's "
                             f"own messages are sampled in the corpus's --dtype {settings['dtype']}); resume without "
                             "--answers-dtype until the answers begin")
        run = Target(target, cpu_layout, threads, device, answers_dtype or dtype)
        return _build(out, settings, answers, run, SpecBenchFilter(spec_bench),
                      batch_size=batch_size, prompts_only=prompts_only, wordnet_dir=wordnet_dir,
                      fortune_dir=fortune_dir, magpie=options, argv=argv, progress_output=progress_output,
                      lists=(Path(lists), listed) if listed is not None else None,
                      deadline=started + 60 * max_minutes if max_minutes else None, sort_window=sort_window,
                      processes=processes)


def _prompts_complete(out: Path, answers: int) -> bool:
    """Whether ``out``'s prompt list holds the ``answers`` prompts asked (stage 1 done: only answers are left)."""
    return sum(len(read_rows(prompts_path(out, split))) for split in ("train", "held_out")) >= answers


def _build(out: Path, settings: dict, answers: int, run: Target, spec: SpecBenchFilter, *, batch_size: int,
           prompts_only: bool, wordnet_dir: Path | None, fortune_dir: Path | None, magpie: dict,
           argv: list[str] | None, progress_output: bool, lists: tuple[Path, dict] | None = None,
           deadline: float | None = None, sort_window: int = 1024, processes: int = 1) -> dict:
    """:func:`build` once its arguments are checked, holding ``out``'s lock; ``lists``: the folder of the lists to
    read and its checked ``lists.json``; ``deadline``: a ``time.perf_counter()`` after which no answers start."""
    shares, seed = parse_mix(settings["mix"]), settings["seed"]
    max_new_tokens, max_prompt_tokens = settings["max_new_tokens"], settings["max_prompt_tokens"]
    manifest = read_manifest(out) or {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": []}
    manifest.update(settings=settings, command=command_line(argv if argv is not None else []),
                    recreate=recreate_command(settings, out, answers), answers_asked=answers,
                    target=target_identity(run.name), spec_bench=_spec_bench_record(spec), versions=versions())
    record = {"command": manifest["command"], "answers_asked": answers, "batch_size": batch_size,
              "threads": run.threads, "cpu_layout": run.cpu_layout}
    if processes > 1:
        record["processes"] = processes
    if run.device != "cpu" or run.dtype is not None:
        record.update(device=run.device, dtype=run.dtype)
    if run.dtype is not None and run.dtype != settings["dtype"]:  # which answers came in which dtype
        record["answers_at_start"] = progress(out)["done"]
    if lists is not None:  # where the WordNet and built-in candidates were written, and which files
        record["lists"] = {key: lists[1][key] for key in ("machine", "python", "wordnet_dir", "fortune_dir", "lists")}
    manifest["runs"].append(record)
    _refresh(out, manifest)

    say = print if progress_output else (lambda *a, **k: None)
    say(f"corpus: prompts for {answers} answers in {out}/prompts ...", flush=True)

    def listed(name: str, build: Callable[[int], list[dict]]) -> ListSource:
        if lists is None:
            return ListSource(name, build)
        from .lists import ListFile, list_path

        return ListSource(name, ListFile(list_path(lists[0], name)))

    sources = {"wordnet": lambda: listed("wordnet", wordnet_builder(seed, wordnet_dir, fortune_dir)),
               "builtin": lambda: listed("builtin", builtin_builder(seed)),
               "magpie": lambda: MagpieSource(magpie_path(out), magpie_sampler(
                   magpie_path(out), run.load, seed, magpie, processes=processes, load_args=run.load_args()))}
    rows, stats = build_prompt_list(out, answers, shares, {name: sources[name]() for name in shares},
                                    spec_bench=spec, length=prompt_length(run.tokenizer()),
                                    max_prompt_tokens=max_prompt_tokens)
    write_prompt_files(out, rows, settings["held_out"])
    manifest["sources"] = stats
    _refresh(out, manifest)
    say(f"corpus: {len(rows)} prompts ({manifest['prompts']['held_out']} held out); dropped: " + "; ".join(
        f"{name} {sum(s['dropped'].values())}" for name, s in stats.items()), flush=True)
    if prompts_only:
        return manifest

    answer = {"max_new_tokens": max_new_tokens, "batch_size": batch_size, "max_prompt_tokens": max_prompt_tokens,
              "sort_window": sort_window, "progress": progress_output}
    if processes > 1:
        complete = answer_in_processes(out, processes, run.load_args(), answer, here=run.load, deadline=deadline,
                                       after_chunk=lambda: _refresh(out, manifest))
    else:
        model, tokenizer = run.load()
        complete = answer_all(out, model, tokenizer, after_chunk=lambda: _refresh(out, manifest), deadline=deadline,
                              **answer)
    manifest["runs"][-1]["answers_done"] = progress(out)["done"]
    if not complete:
        manifest["runs"][-1]["stopped_by_max_minutes"] = True
    _refresh(out, manifest)
    say(f"corpus: {manifest['answers']['done']}/{answers} answers in {out}/answers"
        + ("" if complete else " (stopped by --max-minutes: the same command goes on)"), flush=True)
    return manifest


def _refresh(out: Path, manifest: dict) -> None:
    """Recount the prompts and answers from the files, and rewrite the manifest and README. A registry target's
    weights' sha256 is taken once its cache has it: on a new machine the target is converted at its first load, after
    the build began."""
    target = manifest.get("target") or {}
    if target.get("registry") and not target.get("weights_sha256"):
        manifest["target"] = target_identity(target["name"])
    manifest["prompts"] = {split: len(read_rows(prompts_path(out, split))) for split in ("train", "held_out")}
    manifest["prompts"]["total"] = sum(manifest["prompts"].values())
    manifest["answers"] = progress(out)
    write_manifest(out, manifest)


def status(out: Path | str) -> str:
    """Progress of the corpus in ``out``: answers done of those asked, per source and per split, and tokens.

    Raises:
        FileNotFoundError: no corpus there (no ``MANIFEST.json``).
    """
    out = Path(out).expanduser()
    manifest = read_manifest(out)
    if manifest is None:
        raise FileNotFoundError(f"no corpus in {out} (no MANIFEST.json): build one with python -m tools.corpus build "
                                f"--target MODEL --out {out}")
    asked, now = manifest["answers_asked"], progress(out)
    mix = parse_mix(manifest["settings"]["mix"])
    places = seat_sources(mix, asked)
    prompts = read_prompts(out)
    lines = [f"{out}: {now['done']}/{asked} answers ({now['done'] / asked:.1%}); {len(prompts)}/{asked} prompts built",
             f"target {manifest['target']['name']} ({manifest['target'].get('weights_sha256') or '?'})"]
    for name, share in mix.items():
        lines.append(f"  {name:<8} {now['by_source'].get(name, 0):>7}/{places.count(name)} answers  "
                     f"({float(share):.0%} of the mix; {sum(row['source'] == name for row in prompts)} prompts built)")
    held = sum(1 for _ in read_rows(prompts_path(out, "held_out")))
    lines.append(f"  held out {now['by_split']['held_out']}/{held} answered; training "
                 f"{now['by_split']['train']}/{len(prompts) - held}")
    lines.append(f"  tokens: {now['tokens']['answers']} in answers, {now['tokens']['total']} with their prompts")
    return "\n".join(lines)
