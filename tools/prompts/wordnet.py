"""Topic-diverse training prompts (``wordnet``) from the machine's WordNet and fortune files (never Spec-Bench's
questions).

Used to train the drafter shipped for smollm2-135m-instruct (stages 5, 6 and 8 of
``benchmarks/training-history.md``); not part of the package. ``python -m tools.prompts wordnet N`` writes
them to a file for ``hf-speculative self-distill --prompts FILE``.

The team's built-in lists (`builtin.py`, `context.py`) fill a few dozen templates from lists
of ~100 topics, so a drafter trained on their answers reaches 65% first-guess agreement on held-out
answers of the same kind but ~30% on Spec-Bench: it never saw most of what people ask about. This
list draws its subjects from WordNet instead (Debian's ``wordnet-base``: of its 82k noun senses,
the ~7.7k named people, places and events and the ~20k senses of nouns found in WordNet's tagged
corpus), and its German sentences, quotes and stories from the ``fortune`` files (Debian's
``fortunes``, ``fortunes-de``):

- open questions (writing, roleplay, explanations, comparisons, coding, extraction) about a sense
  chosen by its WordNet category (a recipe for a food, a travel post for a place, a biography for a
  person, how an artifact works, ...);
- ``qa``: short factual questions about named people, places, events and word meanings;
- ``translation``: German fortunes (proverbs, quotes, anecdotes) to translate;
- ``summarization``: longer English fortunes (stories, news items, literature);
- ``rag``: definitions written as an encyclopedia context, one of which answers the question;
- ``math_reasoning``: word problems about WordNet's foods and artifacts.

``build_wordnet_prompts(n, seed)`` is deterministic for given files and seed.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .builtin import TRANSLATE

WORDNET_DIR = Path("/usr/share/wordnet")
FORTUNE_DIR = Path("/usr/share/games/fortunes")

# WordNet lexicographer files (lexnames(5WN)) -> the kind of subject
PERSON, LOCATION, EVENT, ANIMAL, PLANT, FOOD, ARTIFACT = 18, 15, 11, 5, 20, 13, 6
ABSTRACT = {4, 7, 9, 10, 12, 16, 19, 22, 26}  # act, attribute, cognition, communication, feeling, motive, ...

OPEN = {
    PERSON: ["Write a short biography of {x}.", "What is {x} best known for, and why does it matter today?",
             "Pretend you are {x}. Describe an ordinary day in your life.", "Who was {x}? Answer in a paragraph."],
    LOCATION: ["Write a travel blog post about a trip to {x}, with must-see places and local customs.",
               "Describe the geography, history and economy of {x}.", "What is {x} famous for?"],
    EVENT: ["Explain the causes and consequences of the {x}.", "Write a short history lesson about the {x}."],
    ANIMAL: ["Describe the {x}: where it lives, what it eats and how it behaves.",
             "Write a children's story about a {x} who makes a new friend.",
             "What are five surprising facts about the {x}?"],
    PLANT: ["How do you grow {x} at home? Give step-by-step advice.", "Describe {x} and how people use it."],
    FOOD: ["Give a simple recipe that uses {x}, with ingredients and steps.",
           "Write a restaurant review of a dish made with {x}.",
           "Is {x} healthy? Explain its nutrition and how to eat it."],
    ARTIFACT: ["How does a {x} work? Explain it to a beginner.", "Write a product description for a modern {x}.",
               "Describe the history of the {x} and how it changed over time.",
               "What should I check before buying a {x}?"],
}
ABSTRACT_OPEN = [
    "What is {x}? Explain it with an everyday example.", "Write a persuasive essay about the importance of {x}.",
    "How does {x} affect people's lives? Give three examples.", "Write a short poem about {x}.",
    "Explain {x} to a ten-year-old.", "Write a blog post with practical tips about {x}.",
]
COMPARE = ["What is the difference between {x} and {y}?",
           "Compare {x} and {y}: how are they alike and how do they differ?",
           "Write a dialogue between two friends arguing whether {x} or {y} matters more."]
ROLEPLAY = ["Pretend you are a {x}. What advice would you give to someone starting out in your job?",
            "Imagine you are a {x} being interviewed. Describe the hardest part of your work.",
            "Write a diary entry of a {x} after a long and difficult day."]
CODING = ["Write a Python class that represents a {x}, with a constructor, two useful methods and a docstring.",
          "Write a Python function that takes a list of {x} records as dictionaries and returns them sorted by name.",
          "Design a small SQL table for storing information about each {x}, and write a query that counts them."]
EXTRACTION = ["Extract the key terms from the following definitions and explain each in one sentence:\n\n{d}",
              "Read the text and list every thing it describes, one per line, with its category.\n\n{d}"]
QA = {
    PERSON: ["Who was {x}?", "What is {x} known for?", "When did {x} live?"],
    LOCATION: ["Where is {x}?", "What country is {x} in?", "What is {x} known for?"],
    EVENT: ["What was the {x}?", "When did the {x} happen?"],
}
WORD_QA = ["What does the word '{x}' mean?", "Use the word '{x}' in three different sentences.", "What is a {x}?"]
SUMMARIZE = ["Summarize: {d}", "Summarize the following text in two sentences.\n\n{d}",
             "{d}\n\nWhat is the main point of the text above?", "Give a one-paragraph summary of this text:\n\n{d}"]
RAG = ["Answer the question using the context.\n\nContext: {c}\n\nQuestion: {q}",
       "{c}\n\nBased on the passage above, answer: {q}",
       "Use the information below to answer the question.\n\n{c}\n\n{q}"]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena", "Mateo", "Nia"]


@dataclass(frozen=True)
class Sense:
    word: str  # the sense's first lemma, underscores as spaces
    gloss: str  # the definition, without the example sentences
    lexfile: int  # WordNet category (PERSON, LOCATION, ...)
    named: bool  # an instance: a named person, place or event


def read_wordnet(directory: Path = WORDNET_DIR, common_only: bool = True) -> list[Sense]:
    """Noun senses of WordNet's ``data.noun``: every named instance, and the common nouns that occur in
    WordNet's tagged corpus (``index.noun`` tag count > 0, so subjects people actually write about)."""
    data, index = Path(directory, "data.noun"), Path(directory, "index.noun")
    if not data.is_file() or not index.is_file():
        raise FileNotFoundError(f"WordNet not found at {directory}: these prompts are built from Debian's "
                                "wordnet-base package (`apt-get install wordnet-base`), or pass wordnet_dir "
                                "(--wordnet-dir) with the folder that holds it")
    familiar = set()
    for line in index.open(encoding="utf-8", errors="ignore"):
        if line.startswith(" "):
            continue  # the license header
        parts = line.split()
        ptr_count = int(parts[3])
        tagged = int(parts[5 + ptr_count])
        if tagged > 0:
            familiar.update(parts[6 + ptr_count :])
    senses = []
    for line in data.open(encoding="utf-8", errors="ignore"):
        if line.startswith(" ") or "|" not in line:
            continue
        head, gloss = line.split("|", 1)
        parts = head.split()
        named = "@i" in parts
        if common_only and not named and parts[0] not in familiar:
            continue
        word = parts[4].replace("_", " ")
        word = re.sub(r"\(\w+\)$", "", word)  # adjective markers such as "(a)"
        gloss = gloss.split(";")[0].strip().strip('"').strip()
        if len(word) > 2 and gloss:
            senses.append(Sense(word, gloss, int(parts[1]), named))
    return senses


def read_fortunes(directory: Path = FORTUNE_DIR, min_chars: int = 40, max_chars: int = 1600) -> list[str]:
    """The entries of every fortune file in ``directory`` (not recursive), whitespace folded."""
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"fortune files not found at {directory}: these prompts are built from Debian's "
                                "fortunes package (`apt-get install fortunes fortunes-de`), or pass fortune_dir "
                                "(--fortune-dir) with the folder that holds them")
    out = []
    for path in sorted(Path(directory).iterdir()):
        if path.suffix or not path.is_file() or "art" in path.name:  # .dat/.u8 indexes, ASCII art
            continue
        for entry in path.read_text(encoding="utf-8", errors="ignore").split("\n%\n"):
            text = " ".join(entry.split())
            if min_chars <= len(text) <= max_chars and sum(c.isalpha() for c in text) > 0.6 * len(text):
                out.append(text)
    return out


def _definition(s: Sense) -> str:
    return f"{s.word[0].upper()}{s.word[1:]}: {s.gloss}."


def _generate(rng: random.Random, senses: list[Sense], english: list[str],
              german: list[str]) -> Iterator[tuple[str, str]]:
    """Endless ``(category, prompt)`` pairs; a kind whose pool is empty (a small WordNet) yields nothing."""
    by_file: dict[int, list[Sense]] = {}
    for s in senses:
        by_file.setdefault(s.lexfile, []).append(s)
    named = {k: [s for s in by_file.get(k, []) if s.named] for k in (PERSON, LOCATION, EVENT)}
    common = [s for s in senses if not s.named]
    jobs = [s for s in by_file.get(PERSON, []) if not s.named]
    things = [s for s in common if s.lexfile in (ARTIFACT, FOOD)]
    pairs = [k for k in [ARTIFACT, FOOD, ANIMAL, *sorted(ABSTRACT)] if len(by_file.get(k, [])) >= 2]
    long_english = [t for t in english if len(t) >= 300]
    kinds = (["open"] * 20 + ["compare"] * 3 + ["roleplay"] * 3 + ["coding"] * 3 + ["extraction"] * 2 + ["qa"] * 12
             + ["translation"] * 10 + ["summarization"] * 10 + ["rag"] * 10 + ["math_reasoning"] * 5)
    while True:
        kind = rng.choice(kinds)
        if kind == "open":
            s = rng.choice(senses)
            forms = OPEN.get(s.lexfile, ABSTRACT_OPEN)
            if s.named and s.lexfile not in (PERSON, LOCATION, EVENT):
                forms = ["What is {x}? Describe it in a paragraph."]
            yield "writing", rng.choice(forms).format(x=s.word)
        elif kind == "compare" and pairs:
            x, y = rng.sample(by_file[rng.choice(pairs)], 2)
            if x.word != y.word:  # two senses of one word
                yield "reasoning", rng.choice(COMPARE).format(x=x.word, y=y.word)
        elif kind == "roleplay" and jobs:
            yield "roleplay", rng.choice(ROLEPLAY).format(x=rng.choice(jobs).word)
        elif kind == "coding" and things:
            yield "coding", rng.choice(CODING).format(x=rng.choice(things).word)
        elif kind == "extraction" and len(common) >= 6:
            yield "extraction", rng.choice(EXTRACTION).format(d=" ".join(_definition(s) for s in rng.sample(common, 6)))
        elif kind == "qa":
            k = rng.choice([k for k in (PERSON, LOCATION, EVENT) if named[k]] + [None])
            if k is None:
                yield "qa", rng.choice(WORD_QA).format(x=rng.choice(common or senses).word)
            else:
                yield "qa", rng.choice(QA[k]).format(x=rng.choice(named[k]).word)
        elif kind == "translation" and german:
            yield "translation", rng.choice(TRANSLATE).format(g=rng.choice(german))
        elif kind == "summarization" and long_english:
            yield "summarization", rng.choice(SUMMARIZE).format(d=rng.choice(long_english))
        elif kind == "rag" and len(senses) >= 5:
            pool = rng.sample(senses, 5)
            answer = pool[0]
            rng.shuffle(pool)
            context = " ".join(_definition(s) for s in pool)
            question = (f"Who was {answer.word}?" if answer.lexfile == PERSON and answer.named
                        else f"What is {answer.word}?")
            yield "rag", rng.choice(RAG).format(c=context, q=question)
        elif kind == "math_reasoning" and things:
            a, b, c = rng.randint(2, 40), rng.randint(2, 25), rng.randint(2, 12)
            name, item = rng.choice(NAMES), rng.choice(things).word
            yield "math_reasoning", rng.choice([
                f"{name} buys {b} of the item '{item}' at {c} dollars each and pays with {a * 10} dollars. "
                "How much change is left?",
                f"A store had {a * b} units of '{item}'. It sold {b} units a day for {c} days. How many are left?",
                f"{name} needs {a} units of '{item}' for each of {b} guests, and they come in packs of {c}. "
                "How many packs are needed?",
            ])


def build_wordnet_prompts(n: int, seed: int = 0, wordnet_dir: Path | None = None,
                          fortune_dir: Path | None = None) -> list[dict]:
    """``n`` distinct prompts ``{"id", "category", "prompt"}`` (ids ``w00000``...), deterministic for ``seed``.

    Args:
        wordnet_dir, fortune_dir (`Path`, *optional*): default ``/usr/share/wordnet`` and
            ``/usr/share/games/fortunes`` (German entries from its ``de`` folder when present).

    Raises:
        FileNotFoundError: WordNet or the fortune files are missing (the message names the package).
        ValueError: the files hold fewer than ``n`` distinct prompts.
    """
    wordnet_dir = WORDNET_DIR if wordnet_dir is None else Path(wordnet_dir)
    fortune_dir = FORTUNE_DIR if fortune_dir is None else Path(fortune_dir)
    senses = read_wordnet(wordnet_dir)
    if not senses:
        raise ValueError(f"no usable noun senses in {wordnet_dir}/data.noun")
    english = read_fortunes(fortune_dir)
    german = read_fortunes(fortune_dir / "de", max_chars=400) if (fortune_dir / "de").is_dir() else []
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[dict] = []
    repeats = 0
    for kind, text in _generate(rng, senses, english, german):
        if text in seen:
            repeats += 1
            if repeats > 10_000:  # that many repeats in a row: the pools are exhausted, not unlucky
                raise ValueError(f"only {len(out)} distinct prompts can be built from {wordnet_dir} and "
                                 f"{fortune_dir}; ask for fewer")
            continue
        repeats = 0
        seen.add(text)
        out.append({"id": f"w{len(out):05d}", "category": kind, "prompt": text})
        if len(out) == n:
            break
    return out
