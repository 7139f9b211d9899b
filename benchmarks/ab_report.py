"""What the A/B scripts of this folder share: their common arguments and how they report.

Each A/B times arms interleaved per prompt and repeat on Spec-Bench first turns and prints one JSON report (and
writes it with ``--out``): ``loop_overhead.py``, ``gqa_switch_ab.py``, ``device_chain_ab.py``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def ab_parser(doc: str, *, prompts: int = 4, new_tokens: int = 64, repeats: int = 3) -> argparse.ArgumentParser:
    """The parser of an A/B script (described by the first paragraph of ``doc``) with ``--prompts``,
    ``--new-tokens``, ``--repeats`` and ``--out``; the script adds its own."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=prompts)
    parser.add_argument("--new-tokens", type=int, default=new_tokens)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--out", type=Path, default=None)
    return parser


def report(figures: dict, out: Path | None) -> int:
    """Print ``figures`` as JSON, and write them to ``out`` when given; the script's exit status (0)."""
    text = json.dumps(figures, indent=1)
    print(text)
    if out:
        out.write_text(text + "\n")
    return 0
