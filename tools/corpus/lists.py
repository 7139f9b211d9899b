"""The team's candidate lists (WordNet, built-in) written to files, for a build on a machine that cannot make them.

``tools.prompts.wordnet`` reads Debian's WordNet and fortune files, ``tools.prompts.builtin`` this machine's German
manual pages and its Python's documentation: a lent GPU machine has neither the files nor the same Python. ``python -m
tools.corpus lists --out DIR`` writes, here, the first candidates of each list a build of ``--answers`` would read
(with a margin for the ones it drops) to ``DIR/<source>.jsonl`` and ``DIR/lists.json``; ``build --lists DIR`` there
reads them instead of building the lists, so it fills its places with the candidates a build here would have used
(the Magpie source, the target's own messages, is sampled there as usual).
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
from pathlib import Path

from .files import read_rows, write_rows_atomic, write_text_atomic
from .mix import mix_text, parse_mix

LISTED = ("wordnet", "builtin")  # the sources built from this machine's files; magpie is sampled by the target
META = "lists.json"
MARGIN = 1.5  # candidates written per place of the source: a build drops repeats, Spec-Bench's questions, long ones


def list_path(folder: Path, source: str) -> Path:
    return Path(folder) / f"{source}.jsonl"


def write_lists(folder: Path, *, answers: int, mix: str, seed: int, wordnet_dir: Path | None = None,
                fortune_dir: Path | None = None, margin: float = MARGIN) -> dict:
    """Write the WordNet and built-in lists of ``mix`` for a corpus of ``answers`` into ``folder``: ``margin`` times
    the source's places and 100 more, each list as its builder makes it for ``seed``. Returns ``lists.json``'s
    content (what was written, with each file's sha256)."""
    from .sources import builtin_builder, wordnet_builder

    if answers < 1 or margin < 1:
        raise ValueError(f"--answers {answers}, margin {margin}: the answers must be >= 1 and the margin >= 1")
    shares = parse_mix(mix)
    builders = {"wordnet": wordnet_builder(seed, wordnet_dir, fortune_dir), "builtin": builtin_builder(seed)}
    meta = {"answers": answers, "mix": mix_text(shares), "seed": seed, "margin": margin,
            "wordnet_dir": str(wordnet_dir) if wordnet_dir else None,
            "fortune_dir": str(fortune_dir) if fortune_dir else None,
            "machine": platform.node(), "python": platform.python_version(), "lists": {}}
    for source in LISTED:
        if source not in shares:
            continue
        count = math.ceil(float(shares[source]) * answers * margin) + 100
        rows = builders[source](count)
        path = list_path(folder, source)
        write_rows_atomic(path, rows)
        meta["lists"][source] = {"file": path.name, "rows": len(rows), "sha256": _sha256(path)}
    write_text_atomic(Path(folder) / META, json.dumps(meta, indent=1) + "\n")
    return meta


def read_lists(folder: Path, seed: int, sources: list[str]) -> dict:
    """``lists.json`` of ``folder``, checked: written for ``seed``, holding every one of ``sources`` (of
    :data:`LISTED`) with the sha256 it recorded.

    Raises:
        ValueError: no ``lists.json``, another seed, a list missing or changed since it was written.
    """
    path = Path(folder) / META
    if not path.is_file():
        raise ValueError(f"--lists {folder}: no {META} there; write the lists with python -m tools.corpus lists --out "
                         f"{folder} --answers N (on a machine with Debian's WordNet and fortune files)")
    meta = json.loads(path.read_text(encoding="utf-8"))
    if meta.get("seed") != seed:
        raise ValueError(f"--lists {folder}: written for --seed {meta.get('seed')}, this build has --seed {seed}; "
                         "write them again with this seed")
    for source in sources:
        entry = meta.get("lists", {}).get(source)
        file = list_path(folder, source)
        if entry is None or not file.is_file():
            raise ValueError(f"--lists {folder}: no {source} list there (the --mix it was written for: "
                             f"{meta.get('mix')}); write the lists again with this build's --mix")
        if _sha256(file) != entry["sha256"]:
            raise ValueError(f"{file}: changed since {META} was written (sha256 differs); write the lists again")
    return meta


class ListFile:
    """A builder (``build(n)``, :class:`~tools.corpus.sources.ListSource`'s) that gives the first ``n`` rows of a
    list file; asked for more than the file holds after it gave them all, it raises ``ValueError`` naming the fix."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.rows = read_rows(self.path)
        self.gave_all = False

    def __call__(self, n: int) -> list[dict]:
        if n > len(self.rows) and self.gave_all:
            raise ValueError(f"only {len(self.rows)} prompts in {self.path}; write the lists for more answers, "
                             "python -m tools.corpus lists --answers N")
        self.gave_all = n >= len(self.rows)
        return self.rows[:n]


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
