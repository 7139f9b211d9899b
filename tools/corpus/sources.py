"""Where candidate prompts come from: the team's lists (``tools.prompts``: WordNet, built-in) and the target's own
messages (Magpie, ``hf_speculative.training.magpie``), each a stream read in its own order.

Every stream is prefix-stable: its first ``n`` candidates are the same whatever is asked later (the lists are built
deterministically for a seed; the Magpie file resumes as one uninterrupted run would have written it), so a corpus
grown later replays the same candidates before it takes new ones.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .files import read_rows, repair_tail


class Exhausted(RuntimeError):
    """A source cannot give another candidate; the message names the source and what to change."""


def candidate(row: dict, source: str) -> dict:
    """A builder's row as the corpus keeps it: ``{"id", "source", "category", "prompt"}``."""
    return {"id": row["id"], "source": source, "category": row.get("category", source), "prompt": row["prompt"]}


class ListSource:
    """The rows of ``build(n)``, a deterministic list whose first rows do not depend on ``n``; rebuilt longer when
    the candidates run out (``need`` more places to fill, plus a margin for the ones dropped)."""

    def __init__(self, name: str, build: Callable[[int], list[dict]]):
        self.name, self.build = name, build
        self.rows: list[dict] = []
        self.position = 0

    def next(self, need: int) -> dict:
        """The next candidate; ``need`` (>= 1): places this source still has to fill, this one included."""
        if self.position == len(self.rows):
            longer = len(self.rows) + need + 16 + need // 20
            try:
                rows = self.build(longer)
            except ValueError as error:  # the WordNet list: "only N distinct prompts can be built ..."
                raise Exhausted(f"the {self.name} list ran out of prompts ({error}): lower its share in --mix, or "
                                "--answers") from None
            if [r["id"] for r in rows[: len(self.rows)]] != [r["id"] for r in self.rows]:
                raise RuntimeError(f"the {self.name} list built for {longer} prompts does not start with the one "
                                   f"built for {len(self.rows)}: its builder must be deterministic for a seed")
            if len(rows) <= len(self.rows):
                raise Exhausted(f"the {self.name} list has only {len(rows)} prompts: lower its share in --mix, or "
                                "--answers")
            self.rows = rows
        self.position += 1
        return candidate(self.rows[self.position - 1], self.name)


class MagpieSource:
    """The messages in ``path`` (``hf_speculative.training.magpie.sample_prompts``' file, in its order); when they run
    out, ``sample(count)`` makes the file hold ``count`` messages (it resumes, so the file stays one run's)."""

    name = "magpie"

    def __init__(self, path: Path, sample: Callable[[int], None]):
        self.path, self.sample = Path(path), sample
        repair_tail(self.path)
        self.rows = read_rows(self.path)
        self.position = 0

    def next(self, need: int) -> dict:
        if self.position == len(self.rows):
            self.sample(len(self.rows) + need + 1 + need // 50)
            self.rows = read_rows(self.path)
            if self.position == len(self.rows):
                raise Exhausted(f"the target wrote no more prompts into {self.path}: lower magpie's share in --mix")
        self.position += 1
        return candidate(self.rows[self.position - 1], self.name)


def wordnet_builder(seed: int, wordnet_dir: Path | None, fortune_dir: Path | None) -> Callable[[int], list[dict]]:
    """``tools.prompts.wordnet``'s list for ``seed`` (Debian's WordNet and fortune files, or the given folders)."""

    def build(n: int) -> list[dict]:
        from tools.prompts import wordnet

        return wordnet.build_wordnet_prompts(n, seed=seed, wordnet_dir=wordnet_dir, fortune_dir=fortune_dir)

    return build


def builtin_builder(seed: int) -> Callable[[int], list[dict]]:
    """``tools.prompts.builtin``'s list for ``seed`` (its German sentences from this machine's manual pages)."""

    def build(n: int) -> list[dict]:
        from tools.prompts import builtin

        return builtin.build_prompts(n, seed=seed)

    return build


def magpie_sampler(path: Path, load: Callable[[], tuple], seed: int, options: dict, *, processes: int = 1,
                   load_args: dict | None = None) -> Callable[[int], None]:
    """``sample(count)``: the target (``load()`` -> ``(model, tokenizer)``, loaded on the first call) writes messages
    into ``path`` until it holds ``count``, with ``options`` (``batch_size``, ``max_new_tokens``, ``min_words``,
    ``temperature``, ``top_p``). Nothing is excluded there: the corpus drops Spec-Bench's questions itself, for
    every source alike, and counts them. ``processes`` > 1: as many one-thread processes sample its batches
    (:mod:`tools.corpus.magpie_processes`; the others load the target with ``load_args``), the same file as one
    one-thread process."""

    def sample(count: int) -> None:
        from hf_speculative.training.magpie import sample_prompts

        if processes > 1:
            from .magpie_processes import sample_in_processes

            sample_in_processes(path, count, processes, load_args or {}, load, seed, options)
            return
        model, tokenizer = load()
        sample_prompts(model, tokenizer, path, count, seed=seed, exclude=(), **options)

    return sample


def magpie_options(batch_size: int = 64, max_new_tokens: int = 96, min_words: int = 4, temperature: float = 1.0,
                   top_p: float = 0.95, progress: bool = True) -> dict:
    """The sampler's settings (``hf-speculative sample-prompts``' defaults); all but ``progress`` shape the corpus."""
    if not temperature > 0 or not 0 < top_p <= 1 or batch_size < 1 or max_new_tokens < 1 or min_words < 0:
        raise ValueError(f"--magpie-temperature {temperature}, --magpie-top-p {top_p}, --magpie-batch-size "
                         f"{batch_size}, --magpie-max-new-tokens {max_new_tokens}, --magpie-min-words {min_words}: "
                         "the temperature must be > 0, top-p in (0, 1], the sizes >= 1 and the words >= 0")
    return {"batch_size": batch_size, "max_new_tokens": max_new_tokens, "min_words": min_words,
            "temperature": temperature, "top_p": top_p, "progress": progress}


def describe(source: str, options: dict | None = None) -> str:
    """One paragraph, in words, of what ``source``'s prompts are (for the corpus's README)."""
    if source == "wordnet":
        return ("topic-diverse prompts from Debian's WordNet (wordnet-base) and fortune files "
                "(`tools/prompts/wordnet.py`): open questions, comparisons, role play, coding and extraction about "
                "WordNet's people, places, events, animals, plants, foods, artifacts and abstract ideas; short "
                "factual questions; German fortunes to translate; longer English fortunes to summarize; "
                "definitions as a RAG context; word problems.")
    if source == "builtin":
        return ("the team's templates (`tools/prompts/builtin.py`): writing, role play, reasoning, STEM and "
                "humanities requests crossed with ~100 hand-picked topics, maths with random numbers, code tasks, "
                "Python's own documentation as the text to summarize, extract from or answer from, German sentences "
                "(this machine's German manual pages, else the team's) to translate.")
    options = options or magpie_options()
    return (f"requests the target wrote itself (Magpie, `hf_speculative/training/magpie.py`): its chat template up "
            f"to a user's turn, sampled at temperature {options['temperature']} and top-p {options['top_p']} in "
            f"batches of {options['batch_size']}; messages cut off by {options['max_new_tokens']} tokens, shorter "
            f"than {options['min_words']} words or repeated are dropped by the sampler before the corpus sees them.")


def summary(rows: list[dict]) -> str:
    """``category: count`` of ``rows``, most frequent first (for the README)."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["category"]] = counts.get(row["category"], 0) + 1
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

