"""The table of ``sampling_tau.py``'s grid files: pooled τ of each drafter under each rule, by temperature, with the
rejection rule's change over the seeded rule and a 95% interval for it (a bootstrap over prompts: both rules ran on
the same prompts and seeds, so prompts are resampled in pairs).

    python benchmarks/sampling_tau_table.py benchmarks/results/issue45_grid_T0.7.jsonl \\
        benchmarks/results/issue45_grid_T1.0.jsonl [--categories] [--resamples 2000]

τ is pooled as ``sampling_tau.py`` pools it: all new tokens over all target forwards, every seed of every prompt.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict

RULES = ("seeded", "rejection")


def read_rows(paths: list[str]) -> list[dict]:
    """Every row of ``paths`` that holds counts, in file order (a prompt written twice counts once: the last row)."""
    rows: dict[tuple, dict] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    if row.get("counts"):
                        rows[row["temperature"], row["max_new_tokens"], row["question_id"]] = row
    return list(rows.values())


def pooled(rows: list[dict], arm: str) -> tuple[int, int]:
    """``(new tokens, target forwards)`` of ``arm`` (``"method/rule"``) summed over ``rows`` and their seeds."""
    new = forwards = 0
    for row in rows:
        for counts in row["counts"].get(arm, []):
            new, forwards = new + counts[0], forwards + counts[1]
    return new, forwards


def tau(rows: list[dict], arm: str) -> float:
    new, forwards = pooled(rows, arm)
    return new / forwards if forwards else float("nan")


def change_interval(rows: list[dict], method: str, resamples: int, seed: int = 0) -> tuple[float, float]:
    """A 95% percentile interval of τ(rejection) / τ(seeded) - 1, resampling prompts with replacement."""
    per_prompt = [(pooled([r], f"{method}/seeded"), pooled([r], f"{method}/rejection")) for r in rows
                  if r["counts"].get(f"{method}/seeded") and r["counts"].get(f"{method}/rejection")]
    if not per_prompt:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    changes = []
    for _ in range(resamples):
        sample = [per_prompt[rng.randrange(len(per_prompt))] for _ in per_prompt]
        s_new, s_fw = (sum(x[0][i] for x in sample) for i in (0, 1))
        r_new, r_fw = (sum(x[1][i] for x in sample) for i in (0, 1))
        changes.append((r_new / r_fw) / (s_new / s_fw) - 1.0)
    changes.sort()
    return changes[int(0.025 * (resamples - 1))], changes[int(0.975 * (resamples - 1))]


def methods_of(rows: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        for arm in row["counts"]:
            seen.setdefault(arm.split("/")[0], None)
    return list(seen)


def table(rows: list[dict], resamples: int) -> list[str]:
    """Markdown lines: one row per method, a column group per temperature."""
    temps = sorted({row["temperature"] for row in rows})
    by_temp = {t: [row for row in rows if row["temperature"] == t] for t in temps}
    head = "| drafter | " + " | ".join(f"T = {t} seeded | T = {t} rejection (change, 95% interval)" for t in temps)
    lines = [head + " |", "|---" * (1 + 2 * len(temps)) + "|"]
    for method in methods_of(rows):
        cells = []
        for t in temps:
            seeded, rejection = tau(by_temp[t], f"{method}/seeded"), tau(by_temp[t], f"{method}/rejection")
            low, high = change_interval(by_temp[t], method, resamples)
            cells += [f"{seeded:.3f}", f"{rejection:.3f} ({rejection / seeded - 1:+.1%}, {low:+.1%} to {high:+.1%})"]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    counts = ", ".join(f"T = {t}: {len(by_temp[t])} prompts "
                       f"({', '.join(f'{c} {n}' for c, n in sorted(category_counts(by_temp[t]).items()))})"
                       for t in temps)
    return lines + ["", counts]


def category_counts(rows: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for row in rows:
        counts[row["category"]] += 1
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--categories", action="store_true", help="also one table per category")
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args(argv)
    rows = read_rows(args.files)
    print("\n".join(table(rows, args.resamples)))
    if args.categories:
        for category in sorted(category_counts(rows)):
            print(f"\n{category}\n")
            print("\n".join(table([r for r in rows if r["category"] == category], args.resamples)[:-2]))


if __name__ == "__main__":
    main()
