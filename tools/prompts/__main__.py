"""``python -m tools.prompts KIND N|A-B --out FILE``: write one of the team's prompt lists as JSONL.

The file holds ``{"id", "category", "prompt"}`` rows, the rows ``--prompts builtin:N`` / ``context:N`` /
``wordnet:N`` gave the training commands before these lists left the package, ids included, so
``hf-speculative self-distill --prompts FILE`` answers exactly the prompts it answered then::

    python -m tools.prompts builtin 900-3000 --out builtin_900_3000.jsonl
    python -m tools.prompts context 0-1600 --passages self_distill_900_3000.jsonl --out ctx_prompts.jsonl
    python -m tools.prompts wordnet 3200 --out wn_prompts.jsonl
    hf-speculative self-distill --target smollm2-135m-instruct --prompts wn_prompts.jsonl --out wn_3200.jsonl

Run it from the repository's root (``tools`` is not installed with the package).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

KINDS = ("builtin", "context", "wordnet")


def parse_range(text: str) -> tuple[int, int]:
    """``"N"`` -> ``(0, N)``, ``"A-B"`` -> ``(A, B)``: the prompts numbered A to B-1 of the list's first B.

    Raises:
        ValueError: not of that form, or ``A >= B``.
    """
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)", text)
    first, last = (int(match.group(1) or 0), int(match.group(2))) if match else (0, 0)
    if first >= last:
        raise ValueError(f"{text!r}: use N (the first N prompts) or A-B (prompts A to B-1), with 0 <= A < B")
    return first, last


def _tokenizer(target: str | None) -> Any:
    """The target's tokenizer, to decode passages stored as token ids (None without ``--target``)."""
    if target is None:
        return None
    from transformers import AutoTokenizer

    from hf_speculative.registry.models import resolve

    return AutoTokenizer.from_pretrained(resolve(target))


def build_rows(kind: str, first: int, last: int, *, seed: int = 0, passages: Sequence[Path] = (),
               target: str | None = None, wordnet_dir: Path | None = None,
               fortune_dir: Path | None = None) -> list[dict]:
    """Rows ``first`` to ``last - 1`` of the ``kind`` list built for ``last`` prompts with ``seed``.

    Raises:
        ValueError: ``passages`` given to a list that reads none, a bad passages file, or a WordNet list
            with fewer distinct prompts than asked for.
        FileNotFoundError: WordNet or the fortune files are missing (the message names the Debian package).
    """
    if passages and kind != "context":
        raise ValueError(f"--passages only feeds the context list; {kind} builds its own texts")
    if kind == "builtin":
        from .builtin import build_prompts

        return build_prompts(last, seed=seed)[first:]
    if kind == "wordnet":
        from .wordnet import build_wordnet_prompts

        return build_wordnet_prompts(last, seed=seed, wordnet_dir=wordnet_dir, fortune_dir=fortune_dir)[first:]
    from .context import build_context_prompts, read_passages

    texts, tokenizer = [], _tokenizer(target) if passages else None
    for path in passages:
        try:
            texts += read_passages(path, tokenizer=tokenizer)
        except (OSError, ValueError) as error:
            raise ValueError(f"--passages {path}: {error}") from None
    return build_context_prompts(last, texts, seed=seed)[first:]


def write_rows(rows: list[dict], out: Path) -> None:
    """``rows`` as JSONL, one object a line (the file is replaced)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.prompts", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=KINDS, help="builtin: the team's templates; context: long-context prompts over "
                   "--passages; wordnet: topic-diverse prompts from Debian's wordnet-base and fortunes")
    p.add_argument("count", help="N (the first N prompts) or A-B (prompts A to B-1, ids kept)")
    p.add_argument("--out", type=Path, required=True, help="JSONL file to write (replaced)")
    p.add_argument("--seed", type=int, default=0, help="the list's random seed (default 0, as the training used)")
    p.add_argument("--passages", type=Path, action="append", default=[],
                   help="context: JSONL of self-distillation answers or {'text': ...} documents; repeatable")
    p.add_argument("--target", help="context: the target (registry name or folder) whose tokenizer decodes "
                   "passages stored as token ids only")
    p.add_argument("--without", action="append", default=[], metavar="CATEGORY",
                   help="leave out the rows of this category after building the list (stage 9: --without qa); "
                   "repeatable")
    p.add_argument("--wordnet-dir", type=Path, help="wordnet: folder of data.noun / index.noun "
                   "(default /usr/share/wordnet)")
    p.add_argument("--fortune-dir", type=Path, help="wordnet: folder of the fortune files "
                   "(default /usr/share/games/fortunes)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        first, last = parse_range(args.count)
    except ValueError as error:
        p.error(str(error))
    try:
        rows = build_rows(args.kind, first, last, seed=args.seed, passages=args.passages, target=args.target,
                          wordnet_dir=args.wordnet_dir, fortune_dir=args.fortune_dir)
    except (OSError, ValueError) as error:
        p.exit(2, f"{p.prog}: error: {error}\n")
    rows = [row for row in rows if row["category"] not in set(args.without)]
    write_rows(rows, args.out)
    print(f"{len(rows)} prompts in {args.out}; answer them with: hf-speculative self-distill --target MODEL "
          f"--prompts {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
