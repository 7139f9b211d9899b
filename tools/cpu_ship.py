"""Issue 72's trained drafters into the package, each where its τ earns it (after ``python -m tools.cpu_train``).

    python -m tools.cpu_ship --work ~/training/smollm2 --dry-run   # the comparison, nothing copied
    python -m tools.cpu_ship --work ~/training/smollm2             # ship the ones that beat the shipped drafters

The agenda's ``tau`` step ran each exported drafter (``WORK/export/KIND``) and the shipped one of its kind at the
issue's fixed budgets on Spec-Bench and on the corpus's held-out prompts (:mod:`tools.cpu_tau`). A kind ships when
its trained drafter's pooled τ is at least the shipped one's at every budget on every dataset both ran, and every
output of both was greedy's; then its exported folder replaces ``hf_speculative/drafters/KIND/pretrained/TARGET``
whole (the manifest checked before the copy, the copy made beside the old folder and swapped in), and the package's
manifests are checked. ``--force`` ships a kind whose τ is lower (never one whose output differed from greedy's).
The speeds, the README's "which drafter" table and the app's defaults come after, from a quiet benchmark.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tools.cpu_tau import BUDGETS, pooled, read
from tools.gpu.train_drafters import DRAFTERS

PACKAGE = Path(__file__).resolve().parent.parent / "hf_speculative" / "drafters"


@dataclass(frozen=True)
class Comparison:
    """One budget on one dataset: the trained and the shipped drafter's pooled τ and their outputs unlike greedy's."""

    dataset: str
    budget: str
    trained: float
    shipped: float
    prompts: int
    differing: int  # prompts of either run whose text differed from greedy's

    def line(self) -> str:
        mark = ">=" if self.trained >= self.shipped else "<"
        wrong = f", {self.differing} outputs unlike greedy's" if self.differing else ""
        return (f"{self.dataset} {self.budget}: trained τ {self.trained:.2f} {mark} shipped {self.shipped:.2f} "
                f"({self.prompts} prompts{wrong})")


def comparisons(work: Path, kind: str) -> list[Comparison]:
    """Every (dataset, budget) that both ``WORK/tau/trained-KIND-*.jsonl`` and ``shipped-KIND-*.jsonl`` hold."""
    found = []
    for trained_file in sorted((work / "tau").glob(f"trained-{kind}-*.jsonl")):
        dataset = trained_file.stem.removeprefix(f"trained-{kind}-")
        shipped_file = trained_file.with_name(f"shipped-{kind}-{dataset}.jsonl")
        if not shipped_file.is_file():
            continue
        (budgets, trained), (_, shipped) = read(trained_file), read(shipped_file)
        for budget in budgets:
            mine = [row for row in trained if budget in row]
            theirs = [row for row in shipped if budget in row]
            if not mine or not theirs:
                continue
            wrong = sum(not row[budget]["identical"] for row in mine + theirs)
            found.append(Comparison(dataset, budget, pooled(mine, budget), pooled(theirs, budget), len(mine), wrong))
    return found


def verdict(found: list[Comparison], force: bool = False) -> tuple[bool, str]:
    """``(ship, why)``: at least one comparison, every output greedy's, and (unless ``force``) τ at least the shipped
    drafter's in every one."""
    if not found:
        return False, ("no τ of both the trained and the shipped drafter (python -m tools.cpu_train --work WORK --steps "
                       "tau)")
    wrong = [c for c in found if c.differing]
    if wrong:
        return False, "an output differed from greedy's: " + "; ".join(c.line() for c in wrong)
    lower = [c for c in found if c.trained < c.shipped]
    if lower and not force:
        return False, "lower τ than the shipped drafter: " + "; ".join(c.line() for c in lower)
    return True, ("shipped anyway (--force): " if lower else "τ at least the shipped drafter's everywhere: ") + \
        "; ".join(c.line() for c in found)


def replace_folder(source: Path, dest: Path) -> None:
    """``dest`` becomes a copy of ``source``: copied beside it first, then swapped in, so an interrupted copy never
    leaves a half-written drafter in the package."""
    staging, old = dest.with_name(dest.name + ".incoming"), dest.with_name(dest.name + ".replaced")
    for leftover in (staging, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    shutil.copytree(source, staging)
    if dest.exists():
        dest.rename(old)
    staging.rename(dest)
    if old.exists():
        shutil.rmtree(old)


def ship(work: Path, *, kinds: tuple[str, ...] = DRAFTERS, force: bool = False, dry_run: bool = False,
         package: Path = PACKAGE) -> dict[str, bool]:
    """Ship each of ``kinds`` whose :func:`verdict` says so; returns ``kind -> shipped``."""
    from hf_speculative.drafters.checkpoints import check_manifest

    settings = json.loads((work / "agenda.json").read_text()).get("settings", {})
    target = settings.get("target")
    if not target or settings.get("tiny") or "/" in target:
        raise SystemExit(f"{work}: trained for {target!r}, not a registry model the package ships drafters for")
    shipped = {}
    for kind in kinds:
        exported = work / "export" / kind
        if not exported.is_dir():
            print(f"{kind}: not exported ({exported}); left as it is", flush=True)
            shipped[kind] = False
            continue
        ok, why = verdict(comparisons(work, kind), force)
        print(f"{kind}: {'ship' if ok else 'keep the shipped one'}: {why}", flush=True)
        shipped[kind] = ok
        if not ok or dry_run:
            continue
        check_manifest(exported, full=True, required=True)
        dest = package / kind / "pretrained" / target
        replace_folder(exported, dest)
        check_manifest(dest, full=True, required=True)
        size = sum(f.stat().st_size for f in dest.iterdir()) / 2**20
        print(f"{kind}: {dest} ({size:.1f} MiB)", flush=True)
    return shipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cpu_ship", description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="the agenda's folder (python -m tools.cpu_train)")
    parser.add_argument("--kinds", default=",".join(DRAFTERS), help="which drafters (default %(default)s)")
    parser.add_argument("--force", action="store_true", help="ship a drafter whose τ is lower than the shipped one's")
    parser.add_argument("--dry-run", action="store_true", help="print the comparison, copy nothing")
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if not kinds or any(k not in BUDGETS for k in kinds):
        parser.error(f"--kinds {args.kinds}: some of {', '.join(DRAFTERS)}")
    shipped = ship(args.work.expanduser().resolve(), kinds=kinds, force=args.force, dry_run=args.dry_run)
    if any(shipped.values()) and not args.dry_run:
        from tools.drafter_manifests import main as manifests

        if manifests(["--check"]) != 0:
            return 1
        print("then: the quiet speed runs, the README's which-drafter table, the app's defaults "
              "(docs/recipes/ and benchmarks/training-history.md)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
