"""Stage 1: the corpus's prompt list, filled place by place from the sources in the mix's proportions.

Place ``k`` belongs to the source :func:`~tools.corpus.mix.seat_sources` gives it; that source's next candidate
takes it unless it equals or contains a Spec-Bench question (or shares 8 words with one), repeats a prompt already
in the list (normalised text), or is longer than the answers may start from; dropped candidates are counted by
reason. The process is sequential and every source is prefix-stable, so a list built for ``n`` prompts is the
start of the one built for more: a run that grows the corpus replays the places it has (checking each against
the files) and fills only the new ones. Each prompt goes to ``prompts/held_out.jsonl`` or ``prompts/train.jsonl``
by the hash of its normalised text (:func:`~tools.corpus.mix.is_held_out`).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from .files import SPLITS, prompts_path, read_prompts, write_rows_atomic
from .mix import REASONS, SpecBenchFilter, is_held_out, normalise, seat_sources


def empty_stats(places: list[str], mix: dict[str, Fraction]) -> dict[str, dict]:
    """Per source: its share, the places it is asked to fill, candidates read, kept, and drops by reason."""
    return {name: {"share": round(float(share), 6), "asked": places.count(name), "candidates": 0, "kept": 0,
                   "dropped": dict.fromkeys(REASONS, 0)} for name, share in mix.items()}


def build_prompt_list(out: Path, count: int, mix: dict[str, Fraction], sources: dict, *, spec_bench: SpecBenchFilter,
                      length: Callable[[str], int], max_prompt_tokens: int) -> tuple[list[dict], dict[str, dict]]:
    """The list of ``count`` prompts (the corpus's existing ones first, unchanged) and the per-source counts.

    Args:
        sources (`dict`): a stream per source of ``mix`` (``next(need) -> candidate row``; :mod:`tools.corpus.sources`).
        length (`Callable[[str], int]`): tokens of a prompt as the target reads it (its chat template applied).

    Raises:
        ValueError: the corpus holds more than ``count`` prompts (a corpus only grows), or its files disagree with
            what the sources give now (another seed, mix or machine built them).
        tools.corpus.sources.Exhausted: a source ran out of candidates.
    """
    existing = check_growth(out, count)
    places = seat_sources(mix, count)
    left = {name: places.count(name) for name in mix}
    stats = empty_stats(places, mix)
    seen: set[str] = set()
    rows: list[dict] = []
    for seat, name in enumerate(places):
        have = existing[seat] if seat < len(existing) else None
        if have is not None and have["source"] != name:
            raise ValueError(f"{out}: place {seat} holds a {have['source']} prompt where --mix gives it to {name}: "
                             "the corpus was built with another mix; use the manifest's settings or a new --out")
        while True:
            row = sources[name].next(left[name])
            stats[name]["candidates"] += 1
            if have is not None and row["id"] == have["id"]:
                row = have  # the file's row, as it was written
                break
            reason = _drop_reason(row["prompt"], spec_bench, seen, length, max_prompt_tokens)
            if reason is None:
                if have is not None:
                    raise ValueError(f"{out}: place {seat} holds {have['id']}, but {name} now gives {row['id']} there: "
                                     "the candidates differ from the ones this corpus was built from (another seed, "
                                     "other WordNet or fortune files, another machine's manual pages); grow it where "
                                     "it was built, or build into a new --out")
                row = {**row, "seat": seat}
                break
            stats[name]["dropped"][reason] += 1
        seen.add(normalise(row["prompt"]))
        left[name] -= 1
        stats[name]["kept"] += 1
        rows.append(row)
    return rows, stats


def check_growth(out: Path, count: int) -> list[dict]:
    """The corpus's prompts, refused when they are more than ``count`` (a corpus only grows)."""
    existing = read_prompts(out)
    if len(existing) > count:
        raise ValueError(f"{out} holds {len(existing)} prompts already, more than the {count} asked for: a corpus only "
                         f"grows; ask for --answers {len(existing)} or more (or build a smaller one into a new --out)")
    return existing


def _drop_reason(prompt: str, spec_bench: SpecBenchFilter, seen: set[str], length: Callable[[str], int],
                 max_prompt_tokens: int) -> str | None:
    """Why a candidate may not take a place (the first of :data:`~tools.corpus.mix.REASONS` that applies), or None."""
    reason = spec_bench.reason(prompt)
    if reason is not None:
        return reason
    if normalise(prompt) in seen:
        return "duplicate"
    if length(prompt) > max_prompt_tokens:
        return "too_long"
    return None


def write_prompt_files(out: Path, rows: list[dict], held_out: float) -> dict[str, int]:
    """``rows`` into the two split files (replaced whole, atomically; the existing rows are their start).
    Returns the prompts per split."""
    split = {name: [] for name in SPLITS}
    for row in rows:
        split["held_out" if is_held_out(row["prompt"], held_out) else "train"].append(row)
    for name, part in split.items():
        write_rows_atomic(prompts_path(out, name), part)
    return {name: len(part) for name, part in split.items()}


def prompt_length(tokenizer) -> Callable[[str], int]:
    """Tokens of a prompt with the target's chat template, as ``self-distill`` counts them for --max-prompt-tokens."""
    from hf_speculative.training.selfdistill import chat_text

    def length(prompt: str) -> int:
        return len(tokenizer(chat_text(tokenizer, prompt), add_special_tokens=False)["input_ids"])

    return length
