"""Long-context and short-fact training prompts (``context``), written by the team (never Spec-Bench's questions).

Used to train the drafter shipped for smollm2-135m-instruct (stage 3 of ``benchmarks/training-history.md``;
stages 9 and 10 tried it again); not part of the package. ``python -m tools.prompts context N --passages FILE``
writes them to a file for ``hf-speculative self-distill --prompts FILE``.

The first built-in prompt list (`builtin.py`) kept summarization and RAG contexts short (one
paragraph of Python's documentation), so a drafter trained on it never saw the target copy and
condense from a 500-1000 token document, which is what summarization and retrieval-augmented
answers are made of, and its draft vocabulary missed the words of news and encyclopedic prose.
This list fills that gap from *passages*: any text given (``--passages FILE``), typically
the target's own earlier answers (articles, blog posts, essays and explanations it wrote to the
first list), plus paragraphs of Python's documentation:

- ``summarization``: passages joined into a 1200-3600 character document;
- ``rag``: the passage that answered a question, shuffled among distractor passages, then the
  question itself (the answer is mostly copied from the context);
- ``extraction``: a long document and an instruction to pull facts out of it;
- ``qa``: short factual questions crossed from team-written lists.

``build_context_prompts(n, passages, seed)`` is deterministic for given passages and seed.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Iterator

from hf_speculative.training.data import numbered_rows

from .builtin import python_doc_paragraphs

SUMMARIZE = [
    "Summarize: {d}", "Summarize the following article.\n\n{d}", "Write a short summary of this document:\n\n{d}",
    "{d}\n\nSummarize the text above in three sentences.", "Give the main points of the following text.\n\n{d}",
    "Summarize this for a busy reader:\n{d}",
]
EXTRACT = [
    "Extract every name, number and place mentioned in this text:\n\n{d}",
    "List the five most important facts from the following text as bullet points.\n\n{d}",
    "Read the text and write down each claim it makes, one per line.\n\n{d}",
]
RAG_GENERIC = [
    "What is the main idea of these passages?", "Which details do the passages give? List them.",
    "According to the text, why does this matter?", "What does the text say happened first?",
]
PEOPLE = [
    "Marie Curie", "Isaac Newton", "Ada Lovelace", "Leonardo da Vinci", "Albert Einstein", "Charles Darwin",
    "Nelson Mandela", "Mahatma Gandhi", "Wolfgang Amadeus Mozart", "William Shakespeare", "Jane Austen",
    "Galileo Galilei", "Nikola Tesla", "Frida Kahlo", "Abraham Lincoln", "Cleopatra", "Confucius",
    "Alan Turing", "Rosalind Franklin", "Ludwig van Beethoven", "Pablo Picasso", "Queen Victoria",
    "Napoleon Bonaparte", "Martin Luther King Jr.", "Johannes Gutenberg", "Florence Nightingale",
]
PERSON_Q = [
    "Who was {x}?", "When was {x} born?", "What is {x} best known for?", "Where did {x} live?",
    "Why is {x} famous?", "What did {x} discover or create?",
]
COUNTRIES = [
    "France", "Japan", "Brazil", "Kenya", "Canada", "Australia", "India", "Egypt", "Norway", "Mexico", "Italy",
    "Argentina", "South Korea", "Germany", "Spain", "Vietnam", "Peru", "Morocco", "Sweden", "New Zealand",
    "Turkey", "Indonesia", "Chile", "Ireland", "Nigeria", "Portugal", "Thailand", "Greece", "Poland", "Iceland",
]
COUNTRY_Q = [
    "What is the capital of {x}?", "What language is spoken in {x}?", "What currency does {x} use?",
    "How many people live in {x}?", "What is {x} famous for?", "Which countries border {x}?",
    "When did {x} become independent?", "What is the largest city in {x}?",
]
THINGS = [
    "the telephone", "the light bulb", "penicillin", "the World Wide Web", "the steam engine", "the airplane",
    "the printing press", "the radio", "the bicycle", "the television", "the vaccine for polio", "the compass",
    "the microscope", "the theory of relativity", "the Eiffel Tower", "the Great Wall of China", "the Olympic Games",
    "the Nobel Prize", "the United Nations", "the Mona Lisa", "the first moon landing", "the Panama Canal",
]
THING_Q = [
    "Who invented {x}?", "When was {x} created?", "Where is {x}?", "Why was {x} important?",
    "How did {x} change the world?", "Who built {x}?",
]
NATURE = [
    "the longest river in the world", "the tallest mountain on Earth", "the largest ocean", "the hottest planet",
    "the biggest desert", "the smallest country", "the fastest land animal", "the largest mammal",
    "the deepest lake", "the most spoken language", "the closest star to Earth", "the largest organ of the body",
]
NATURE_Q = ["What is {x}?", "Which is {x}, and why?", "Tell me about {x}."]


NOT_PROSE = {"math", "math_reasoning", "reasoning", "coding", "translation"}


def read_passages(path: str | Path, tokenizer: Any = None, min_chars: int = 200) -> list[dict]:
    """``{"text", "question"}`` passages from a JSONL file: self-distillation rows (the answer is the
    passage, its prompt the question it answers; answers without a ``response`` field are decoded
    from ``response_tokens`` with ``tokenizer``) or ``{"text": ...}`` documents (no question).

    Rows whose ``category`` is not prose (maths, code, translations) and degenerate texts (fewer than
    40% distinct words: a small model's answers sometimes loop) are left out."""
    out = []
    for line_no, row in numbered_rows(path):
        if row.get("category") in NOT_PROSE:
            continue
        if "response" in row:
            text, question = row["response"], row.get("prompt")
        elif "response_tokens" in row:
            if tokenizer is None:
                raise ValueError(f"{path}:{line_no}: self-distillation rows without 'response' need the target's "
                                 "tokenizer to be decoded (give --target MODEL).")
            text, question = tokenizer.decode(row["response_tokens"], skip_special_tokens=True), row.get("prompt")
        elif "text" in row:
            text, question = row["text"], None
        else:
            raise ValueError(f"{path}:{line_no}: expected 'text', 'response' or 'response_tokens'; got {sorted(row)}.")
        text, words = text.strip(), text.split()
        if len(text) >= min_chars and len(set(words)) >= 0.4 * len(words):
            out.append({"text": text, "question": question if question and len(question) < 300 else None})
    return out


def _document(rng: random.Random, pick: Any, low: int = 1200, high: int = 3600) -> str:
    goal, parts = rng.randint(low, high), []
    while sum(len(p) for p in parts) < goal:
        parts.append(pick())
    return "\n\n".join(parts)[:high]


def _generate(rng: random.Random, passages: list[dict], docs: list[str]) -> Iterator[tuple[str, str]]:
    texts = [p["text"] for p in passages]
    answered = [p for p in passages if p["question"]]
    pool = bool(texts or docs)

    def pick() -> str:  # passages three times as often as documentation (prose is what users summarize)
        return rng.choice(texts if texts and (not docs or rng.random() < 0.75) else docs)

    while True:
        kind = rng.choice(["summarization", "summarization", "rag", "rag", "extraction", "qa", "qa"])
        if kind == "summarization" and pool:
            text = rng.choice(SUMMARIZE).format(d=_document(rng, pick))
        elif kind == "extraction" and pool:
            text = rng.choice(EXTRACT).format(d=_document(rng, pick, 800, 2500))
        elif kind == "rag" and pool:
            source = rng.choice(answered) if answered else None
            context = [pick() for _ in range(rng.randint(0 if source else 1, 3))]
            if source:
                context.insert(rng.randint(0, len(context)), source["text"])
            question = source["question"] if source else rng.choice(RAG_GENERIC)
            text = "\n".join(context)[:3600] + "\n" + question
        else:
            kind = "qa"
            lists = [(PERSON_Q, PEOPLE), (COUNTRY_Q, COUNTRIES), (THING_Q, THINGS), (NATURE_Q, NATURE)]
            templates, items = rng.choice(lists)
            text = rng.choice(templates).format(x=rng.choice(items))
            text = text[0].upper() + text[1:]
        yield kind, text


def build_context_prompts(n: int, passages: list[dict] | None = None, seed: int = 0) -> list[dict]:
    """``n`` distinct prompts ``{"id", "category", "prompt"}`` (ids ``c00000``...), fewer if the lists
    run out (short facts only, when there are no passages and no Python documentation)."""
    rng = random.Random(seed)
    docs = python_doc_paragraphs()
    seen: set[str] = set()
    out: list[dict] = []
    misses = 0
    for kind, text in _generate(rng, list(passages or []), docs):
        if text in seen:
            misses += 1
            if misses > 50 * n:
                break
            continue
        seen.add(text)
        out.append({"id": f"c{len(out):05d}", "category": kind, "prompt": text})
        if len(out) == n:
            break
    return out
