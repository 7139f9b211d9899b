"""The team's built-in training prompts (``builtin``), written by the team (never Spec-Bench's questions).

Used to train the drafter shipped for smollm2-135m-instruct (stages 1 and 2 of
``benchmarks/training-history.md``); not part of the package. ``python -m tools.prompts builtin N``
writes them to a file for ``hf-speculative self-distill --prompts FILE``.

The drafter learns best from the target's own answers (its distribution, not a corpus's), so
training starts from prompts in the shape of what users ask: writing, role play, reasoning, maths,
code, extraction, science, humanities, translation, summarization, question answering and RAG.
Open tasks come from templates crossed with topic lists; maths problems are generated with random
numbers; summarization and RAG contexts are paragraphs of Python's own documentation (shipped with
every CPython); translation sources are German manual pages when the machine has them (Debian's
man-db, dpkg and apt ship them), else sentences the team wrote.

``build_prompts(n, seed)`` is deterministic for a given machine (the German manual pages it finds
change the translation prompts); the file it wrote for the shipped drafter is recorded in the
drafter's training config.
"""

from __future__ import annotations

import glob
import gzip
import random
import re
import subprocess
from typing import Iterator

TOPICS = [
    "the history of the bicycle", "how bees communicate", "a city built on water", "the first day at a new job",
    "a lighthouse keeper", "climate change and farming", "learning a second language", "the invention of paper",
    "a robot that learns to paint", "friendship between two neighbours", "the deep ocean", "a mountain village",
    "saving money as a student", "the printing press", "volcanoes", "a detective in a small town",
    "the benefits of walking", "space exploration", "a lost letter", "the life of a tree",
    "public libraries", "a chess tournament", "renewable energy", "the smell of rain", "an old clock shop",
    "the importance of sleep", "a journey by train", "coffee around the world", "a rainy afternoon",
    "the Roman aqueducts", "a marathon runner", "urban gardens", "the human immune system",
    "a team of firefighters", "the moon landing", "a bakery at dawn", "digital privacy", "the Silk Road",
    "a kite festival", "honesty at work", "a musician's first concert", "the water cycle",
    "a small island school", "electric cars", "a museum at night", "the invention of the telephone",
    "teaching children to read", "a desert expedition", "the northern lights", "recycling plastics",
]
WRITING = [
    "Write a short story about {t}.", "Write a blog post about {t}.", "Compose a poem about {t}.",
    "Write a persuasive essay about {t}.", "Draft an email to a friend describing {t}.",
    "Write a product description inspired by {t}.", "Write a speech for a school assembly about {t}.",
    "Write a diary entry about {t}.", "Write a news article about {t}.",
]
ROLEPLAY = [
    "Pretend you are a tour guide. Tell visitors about {t}.",
    "Act as a teacher and explain {t} to a class of ten-year-olds.",
    "You are a radio host. Introduce a segment about {t}.",
    "Imagine you are a scientist giving an interview about {t}.",
    "Role-play a museum curator describing an exhibit on {t}.",
]
STEM = [
    "Explain {s} in simple terms.", "What are the main applications of {s}?", "Describe how {s} works, step by step.",
    "What are common misconceptions about {s}?", "Compare {s} with a related idea and explain the differences.",
]
STEM_SUBJECTS = [
    "photosynthesis", "Newton's laws of motion", "the periodic table", "plate tectonics", "binary numbers",
    "vaccines", "the greenhouse effect", "electric circuits", "DNA replication", "black holes", "supply and demand",
    "compound interest", "sorting algorithms", "the Pythagorean theorem", "probability", "machine learning",
    "the speed of light", "antibiotics", "hash tables", "the internet's packet routing",
    "evolution by natural selection",
    "magnetism", "the human heart", "chemical bonds", "prime numbers", "recursion", "gravity", "sound waves",
]
HUMANITIES = [
    "Discuss the causes and effects of {h}.", "What can we learn today from {h}?", "Summarize the key ideas of {h}.",
    "How did {h} change everyday life?", "Write a short analysis of {h}.",
]
HUMANITIES_SUBJECTS = [
    "the Industrial Revolution", "the Renaissance", "the Enlightenment", "the fall of the Roman Empire",
    "the invention of writing", "the French Revolution", "ancient Greek philosophy", "the age of exploration",
    "the civil rights movement", "impressionist painting", "the history of democracy", "Stoicism",
    "the spread of religions along trade routes", "the Cold War", "the history of money", "Shakespeare's plays",
]
CODING = [
    "Write a Python function that {c}.", "Write a JavaScript function that {c}.", "Explain how to write code that {c}.",
    "Write a Python function that {c}, with a docstring and two tests.", "Write a C function that {c}.",
]
CODING_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the words in a text", "merges two sorted lists", "removes duplicates from a list while keeping order",
    "computes the factorial of a number", "finds the largest element in a list",
    "checks whether a string is a palindrome",
    "converts Celsius to Fahrenheit", "parses a date in the format YYYY-MM-DD", "flattens a nested list",
    "computes the average of a list of numbers", "finds the longest word in a sentence", "implements binary search",
    "counts vowels in a string", "sorts a list of dictionaries by a key", "reads a CSV file and sums a column",
]
REASONING = [
    "If all {a} are {b} and some {b} are {c}, can we conclude that some {a} are {c}? Explain.",
    "A {a} is taller than a {b}, and a {b} is taller than a {c}. Which is the shortest? Explain your reasoning.",
    "There are three boxes labelled {a}, {b} and {c}; all labels are wrong. How can you fix them by opening one box?",
]
NOUNS = ["cats", "teachers", "robots", "painters", "birds", "engineers", "farmers", "doctors", "pilots", "chefs"]
EXTRACTION = [
    "Extract all the names, dates and places from this text: {p}",
    "List the key facts in this text as bullet points: {p}",
    "Return a JSON object with the main entities in this text: {p}",
]
QA = [
    "What is {s}?", "Why is {s} important?", "Who first described {s}, and when?", "How is {s} used today?",
]
SUMMARIZE = [
    "Summarize the following text in a few sentences.\n\n{p}", "Write a one-paragraph summary of this passage:\n\n{p}",
    "Give a short summary of the following documentation:\n\n{p}", "TL;DR of the text below.\n\n{p}",
]
RAG = [
    "Answer the question using only the context.\n\nContext: {p}\n\nQuestion: What is this text mainly about?",
    "Read the context and answer.\n\nContext: {p}\n\nQuestion: What does the text say one should do or avoid?",
    "Context:\n{p}\n\nBased on the context above, list the main terms it defines and explain each briefly.",
    "Use the passage to answer.\n\nPassage: {p}\n\n"
    "Question: Which example does the passage give, and what does it show?",
]
TRANSLATE = [
    "Translate German to English: {g}", "Translate the following German text into English:\n\n{g}",
    "Please translate into English: {g}",
]
GERMAN_FALLBACK = [
    "Das Wetter ist heute sehr schön, und wir gehen im Park spazieren.",
    "Der Zug nach Berlin hat leider eine Verspätung von zwanzig Minuten.",
    "Meine Schwester arbeitet seit drei Jahren als Ärztin in einem kleinen Krankenhaus.",
    "Bitte lesen Sie die Anleitung sorgfältig, bevor Sie das Gerät benutzen.",
    "Die Stadt plant, im nächsten Jahr neue Radwege zu bauen.",
    "Wir haben gestern Abend einen sehr spannenden Film im Kino gesehen.",
]


def python_doc_paragraphs(min_chars: int = 400, max_chars: int = 2400) -> list[str]:
    """Paragraph groups from the Python reference documentation bundled with CPython."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover - stripped Pythons
        return []
    out = []
    for key in sorted(topics):
        text = re.sub(r"\n{3,}", "\n\n", topics[key]).strip()
        chunk = ""
        for para in text.split("\n\n"):
            chunk = f"{chunk}\n\n{para}" if chunk else para
            if len(chunk) >= min_chars:
                out.append(chunk[:max_chars])
                chunk = ""
    return out


def _german_paragraphs(limit: int = 600) -> list[str]:
    """Prose paragraphs of the German manual pages on this machine (empty where there are none)."""
    out: list[str] = []
    for path in sorted(glob.glob("/usr/share/man/de/man[1-8]/*.gz"))[:200]:
        try:
            raw = gzip.open(path, "rt", errors="ignore").read()
            text = subprocess.run(["man", "-l", "-"], input=raw, capture_output=True, text=True, timeout=10,
                                  env={"MANWIDTH": "2000", "PATH": "/usr/bin:/bin"}).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for para in re.split(r"\n\s*\n", text):
            para = " ".join(para.split())
            if 80 <= len(para) <= 600 and para.count(" ") > 10 and not para.startswith("-"):
                out.append(para)
        if len(out) >= limit:
            break
    return out


def _math_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 12)
    name = rng.choice(["Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana", "Ivan", "Jo"])
    item = rng.choice(["apples", "books", "marbles", "stickers", "pencils", "cookies", "stamps", "coins"])
    forms = [
        f"{name} has {a} {item}. She buys {b} more and then gives away {c}. How many {item} does she have now?",
        f"A shop sells {item} at {c} dollars each. {name} buys {b} of them and pays with {a * 10} dollars. "
        f"How much change does {name} get?",
        f"{name} reads {c} pages a day. The book has {a * c + b} pages. How many days does it take to finish the book?",
        f"A train travels {a * 5} km in {c} hours. At the same speed, how far does it travel in {b} hours?",
        f"What is {a} times {b}, plus {c}? Show your steps.",
        f"Solve for x: {c}x + {b} = {c * a + b}.",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
        f"{name} saves {b} dollars every week. How many weeks until {name} has {a * b} dollars?",
    ]
    return rng.choice(forms)


def _generate(rng: random.Random, docs: list[str], german: list[str]) -> Iterator[tuple[str, str]]:
    while True:
        kind = rng.choice(["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
                           "translation", "summarization", "qa", "math_reasoning", "rag", "summarization", "rag"])
        if kind == "writing":
            text = rng.choice(WRITING).format(t=rng.choice(TOPICS))
        elif kind == "roleplay":
            text = rng.choice(ROLEPLAY).format(t=rng.choice(TOPICS))
        elif kind == "reasoning":
            a, b, c = rng.sample(NOUNS, 3)
            text = rng.choice(REASONING).format(a=a, b=b, c=c)
        elif kind in ("math", "math_reasoning"):
            text = _math_problem(rng)
        elif kind == "coding":
            text = rng.choice(CODING).format(c=rng.choice(CODING_TASKS))
        elif kind == "extraction":
            text = rng.choice(EXTRACTION).format(p=rng.choice(docs)[:800] if docs else rng.choice(TOPICS))
        elif kind == "stem":
            text = rng.choice(STEM).format(s=rng.choice(STEM_SUBJECTS))
        elif kind == "humanities":
            text = rng.choice(HUMANITIES).format(h=rng.choice(HUMANITIES_SUBJECTS))
        elif kind == "qa":
            text = rng.choice(QA).format(s=rng.choice(STEM_SUBJECTS + HUMANITIES_SUBJECTS))
        elif kind == "translation":
            text = rng.choice(TRANSLATE).format(g=rng.choice(german or GERMAN_FALLBACK))
        elif kind == "summarization":
            if not docs:
                continue
            text = rng.choice(SUMMARIZE).format(p=rng.choice(docs))
        else:
            if not docs:
                continue
            text = rng.choice(RAG).format(p=rng.choice(docs))
        yield kind, text


def build_prompts(n: int = 2000, seed: int = 0) -> list[dict]:
    """``n`` distinct prompts ``{"id", "category", "prompt"}``, deterministic for ``seed`` on one machine."""
    rng = random.Random(seed)
    docs, german = python_doc_paragraphs(), _german_paragraphs()
    seen: set[str] = set()
    out: list[dict] = []
    for kind, text in _generate(rng, docs, german):
        if text in seen:
            continue
        seen.add(text)
        out.append({"id": f"p{len(out):05d}", "category": kind, "prompt": text})
        if len(out) == n:
            return out
    return out
