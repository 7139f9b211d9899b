"""The demo app's example prompts as a Spec-Bench ``question.jsonl`` (one category per example, named by its label),
so that ``hf-speculative bench --dataset`` runs them like Spec-Bench's questions (issue 72: our prompt lookup against
transformers' on every example the app offers)::

    python benchmarks/app_examples_jsonl.py /tmp/app_examples.jsonl     # prints the --categories to pass
    hf-speculative bench --dataset /tmp/app_examples.jsonl --per-category 0 --categories CATEGORIES \
        --methods prompt-lookup,hf-prompt-lookup --repeats 3
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from hf_speculative.app.examples import EXAMPLES

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python benchmarks/app_examples_jsonl.py OUT.jsonl")
    categories = [re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") for label in EXAMPLES]  # "story-try-sampling"
    lines = [json.dumps({"question_id": 9000 + i, "category": category, "turns": [text]})
             for i, (category, text) in enumerate(zip(categories, EXAMPLES.values()))]
    Path(args[0]).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines)} app examples -> {args[0]}; --categories {','.join(categories)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
