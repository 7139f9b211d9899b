"""The corpus's mix and filters: which source fills each place of the list, the normalised text prompts are compared
by, the Spec-Bench exclusion and the held-out split.

Pure functions of their arguments (no model, no files but Spec-Bench's questions), so the list a command builds is
the same on every run and every machine that gives the same candidates.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path

SOURCES = ("wordnet", "magpie", "builtin")
DEFAULT_MIX = "wordnet=0.5,magpie=0.3,builtin=0.2"
SHINGLE = 8  # words in a run shared with a Spec-Bench turn that drop a prompt (as `sample-prompts` drops them)
# the reasons a candidate prompt is dropped, in the order they are checked
REASONS = ("spec_bench_question", "spec_bench_8_words", "duplicate", "too_long")


def parse_mix(text: str) -> dict[str, Fraction]:
    """``"wordnet=0.5,magpie=0.3,builtin=0.2"`` (or fractions, ``wordnet=5/7``) -> the shares as exact fractions
    normalised to sum to 1, in ``SOURCES`` order (sources with share 0 left out). Exact, so that the order of the
    places (:func:`seat_sources`) never hangs on a rounding.

    Raises:
        ValueError: an unknown source, a source named twice, a share that is not a number >= 0, or no share > 0.
    """
    shares: dict[str, Fraction] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, eq, value = item.partition("=")
        name = name.strip()
        if name not in SOURCES or not eq or name in shares:
            raise ValueError(f"--mix {text!r}: write SOURCE=SHARE,... with each of {', '.join(SOURCES)} at most once "
                             f"(e.g. {DEFAULT_MIX})")
        try:
            shares[name] = Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            shares[name] = Fraction(-1)
        if shares[name] < 0:
            raise ValueError(f"--mix {text!r}: {name}'s share {value.strip()!r} is not a number >= 0")
    total = sum(shares.values())
    if not total > 0:
        raise ValueError(f"--mix {text!r}: give at least one source a share > 0 (e.g. {DEFAULT_MIX})")
    return {name: shares[name] / total for name in SOURCES if shares.get(name, 0) > 0}


def mix_text(mix: dict[str, Fraction]) -> str:
    """The ``--mix`` that gives ``mix`` exactly (``"wordnet=1/2,magpie=3/10,builtin=1/5"``)."""
    return ",".join(f"{name}={share}" for name, share in mix.items())


def seat_sources(mix: dict[str, Fraction], count: int) -> list[str]:
    """The source of each of the list's first ``count`` places, by Sainte-Laguë's sequential method: place ``k``
    goes to the source with the largest ``share / (2 * places so far + 1)`` (ties to the earlier source in ``mix``).

    The sources interleave (a list stopped anywhere holds the mix), each source's count is within one of
    ``share * count``, and the first ``count`` places of a longer list are this list: a corpus grown from ``count``
    to more answers keeps every place it had.
    """
    seats = dict.fromkeys(mix, 0)
    out = []
    for _ in range(count):
        name = max(mix, key=lambda s: (mix[s] / (2 * seats[s] + 1), -list(mix).index(s)))
        seats[name] += 1
        out.append(name)
    return out


def normalise(text: str) -> str:
    """What prompts are compared by: casefolded, every run of whitespace one space, stripped."""
    return " ".join(text.casefold().split())


def held_out_score(text: str) -> float:
    """A number in [0, 1) fixed by the prompt's normalised text alone (sha256): a prompt is held out when its score
    is below the held-out fraction, so the split survives re-runs, growth and other machines."""
    digest = hashlib.sha256(b"hf_speculative corpus held-out\0" + normalise(text).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_held_out(text: str, fraction: float) -> bool:
    return held_out_score(text) < fraction


class SpecBenchFilter:
    """Says why a prompt may not be trained on: it equals or contains a Spec-Bench question's first turn (normalised
    text), or it shares a run of ``SHINGLE`` words with any turn of a question (what ``hf-speculative
    sample-prompts`` drops by default).

    Args:
        path (`Path`, *optional*): a Spec-Bench ``question.jsonl``; default the one the package ships
            (``hf_speculative.bench.spec_bench.DATASET``, which ``hf-speculative bench`` measures on).
    """

    def __init__(self, path: Path | None = None):
        from hf_speculative.bench.spec_bench import DATASET
        from hf_speculative.training.magpie import shingles

        self.path = Path(path or DATASET)
        rows = [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
        self.questions = sorted({normalise(row["turns"][0]) for row in rows})
        self.shingles = shingles([turn for row in rows for turn in row["turns"]], SHINGLE)
        self._shingles_of = shingles

    def reason(self, text: str) -> str | None:
        """``"spec_bench_question"``, ``"spec_bench_8_words"`` or None (the prompt may be used)."""
        norm = normalise(text)
        if any(question in norm for question in self.questions):
            return "spec_bench_question"
        if self.shingles & self._shingles_of([text], SHINGLE):
            return "spec_bench_8_words"
        return None


def count_by(rows: Iterable[dict], key: str) -> dict[str, int]:
    """How many ``rows`` have each value of ``key``, by value."""
    out: dict[str, int] = {}
    for row in rows:
        out[row[key]] = out.get(row[key], 0) + 1
    return dict(sorted(out.items()))
