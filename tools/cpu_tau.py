"""Issue 72's τ of the trained drafters, the CPU agenda's last step (``python -m tools.cpu_train``, step ``tau``).

Each exported drafter (``WORK/export/KIND``) and the shipped one of its kind run ``benchmarks/tree_tau.py`` at the
issue's budgets (:data:`BUDGETS`: EAGLE as a chain of 5 and a 32-node tree, DFlash the same, Medusa its calibrated
16-node tree), 64 new tokens, on Spec-Bench (10 prompts of each category) and on the corpus's held-out prompts
(``held_out.jsonl``, 10 of each source), into ``WORK/tau/SOURCE-KIND-DATASET.jsonl`` (``--resume``: a run stopped
goes on at its next prompt). The budgets are fixed (``adaptive=False``), so a τ does not depend on the machine's load
and the runs may go on beside other work; the speeds the records also hold do, and are for a quiet run to measure.
Every output is checked token for token against greedy's; :func:`summary` pools each file's τ (tokens over target
forwards) per budget.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hf_speculative.bench.spec_bench import SPEC_BENCH_CATEGORIES  # (imports neither torch nor transformers)
from tools.gpu.train_drafters import DRAFTERS  # the GPU agenda's (stdlib imports only)

BUDGETS = {"eagle": "chain5,32", "dflash": "dflash-chain5,dflash32", "medusa": "medusa16"}
FLAGS = {"eagle": "--drafter", "dflash": "--dflash", "medusa": "--medusa"}  # tree_tau's option for a kind's folder
SPEC_BENCH = ",".join(SPEC_BENCH_CATEGORIES)
HELD_OUT = "held_out.jsonl"  # tools.cpu_train's held-out question file in the corpus
SIZES = {False: {"per_category": 10, "new_tokens": 64}, True: {"per_category": 1, "new_tokens": 8}}  # --tiny's: True
TINY_SPEC_BENCH = "mt-bench,qa"  # short prompts for the tests' tiny target


def categories_of(questions: Path) -> str:
    """The categories of a question file, comma-separated in first-seen order."""
    seen = dict.fromkeys(json.loads(line)["category"] for line in questions.read_text(encoding="utf-8").splitlines()
                         if line.strip())
    return ",".join(seen)


def datasets(corpus: Path, tiny: bool = False) -> dict[str, tuple[Path | None, str]]:
    """``name -> (question file, its categories)``: Spec-Bench (``None``: the package's copy) and, where the corpus
    has its held-out question file, the held-out prompts."""
    found: dict[str, tuple[Path | None, str]] = {"spec_bench": (None, TINY_SPEC_BENCH if tiny else SPEC_BENCH)}
    held = corpus / HELD_OUT
    if held.is_file():
        found["held_out"] = (held, categories_of(held))
    return found


def tau_runs(target: str, work: Path, corpus: Path, *, tiny: bool = False) -> list[tuple[Path, list[str]]]:
    """``(out file, argv)`` of every τ run: each exported kind, trained and (for the registry's target) shipped, on
    each of :func:`datasets`. A tiny target has no shipped drafters: its runs load the exported EAGLE as the
    benchmark's EAGLE drafter, which tree_tau loads whatever the budgets."""
    sizes, runs = SIZES[tiny], []
    for kind in DRAFTERS:
        folder = work / "export" / kind
        if not folder.is_dir():
            continue
        sources = {"trained": folder} if tiny else {"trained": folder, "shipped": None}
        for source, path in sources.items():
            for name, (questions, categories) in datasets(corpus, tiny).items():
                out = work / "tau" / f"{source}-{kind}-{name}.jsonl"
                argv = [sys.executable, "benchmarks/tree_tau.py", "--model", target, "--budgets", BUDGETS[kind],
                        "--categories", categories, "--per-category", str(sizes["per_category"]),
                        "--max-new-tokens", str(sizes["new_tokens"]), "--resume", "--out", str(out)]
                if questions is not None:
                    argv += ["--dataset", str(questions)]
                if path is not None:
                    argv += [FLAGS[kind], str(path)]
                if tiny and kind != "eagle":
                    argv += ["--drafter", str(work / "export" / "eagle")]
                runs.append((out, argv))
    return runs


def pooled(rows: list[dict], budget: str) -> float:
    """τ over ``rows`` for ``budget``: their new tokens over their target forwards."""
    forwards = sum(row["new_tokens"] / row[budget]["tau"] for row in rows)
    return sum(row["new_tokens"] for row in rows) / forwards if forwards else float("nan")


def read(out: Path) -> tuple[list[str], list[dict]]:
    """A τ file's budgets (the kind's) and its prompts' records."""
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines() if line.strip()]
    kind = out.name.split("-")[1]
    return BUDGETS[kind].split(","), rows


def _differing(budgets: list[str], rows: list[dict]) -> int:
    return sum(not all(row[b]["identical"] for b in budgets if b in row) for row in rows)


def differing(out: Path) -> int:
    """How many prompts of a τ file gave a text other than greedy's under some budget (0 for a correct drafter)."""
    return _differing(*read(out))


def summary(work: Path) -> list[str]:
    """One line per τ file: its prompts, each budget's pooled τ, and the outputs identical to greedy's."""
    lines = []
    for out in sorted((work / "tau").glob("*.jsonl")):
        budgets, rows = read(out)
        taus = ", ".join(f"{b} τ {pooled([r for r in rows if b in r], b):.2f}" for b in budgets)
        lines.append(f"{out.stem}: {len(rows)} prompts, {taus}; {len(rows) - _differing(budgets, rows)}/{len(rows)} "
                     "identical to greedy")
    return lines
