"""Where a test run's time goes, from the JUnit reports CI's queue keeps beside each group's log
(tools/ci/test_queue.sh writes LOGDIR/NN-tfV-GROUP.xml):

    python -m tools.ci.test_times LOGDIR [--top N] [--by file|test]

prints each group's total, then the files (or tests) that took longest, summed over the groups of both versions, with
how many tests each file holds: the candidates for a cheaper test or the ``slow`` marker.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def case_times(report: Path) -> list[tuple[str, str, float]]:
    """``(file, test, seconds)`` for every test case of one JUnit report (setup and teardown included, as pytest's
    junitxml counts them)."""
    rows = []
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "")
        path = module.replace(".", "/") + ".py" if module else case.get("file", "?")
        rows.append((path, case.get("name", "?"), float(case.get("time", 0.0))))
    return rows


def summarize(logdir: Path, top: int = 30, by: str = "file") -> str:
    reports = sorted(logdir.glob("*.xml"))
    if not reports:
        raise SystemExit(f"{logdir}: no JUnit reports (*.xml); CI's queue writes one per group")
    lines, totals, counts = [], defaultdict(float), defaultdict(int)
    for report in reports:
        rows = case_times(report)
        lines.append(f"{report.stem:<70} {sum(t for _, _, t in rows):8.1f} s  {len(rows):5d} tests")
        parts = report.stem.split("-")  # NN-tfV-GROUP: the version, tf4 or tf5
        version = f"{parts[1]} " if len(parts) > 2 and parts[1].startswith("tf") else ""
        for path, name, seconds in rows:
            key = version + (path if by == "file" else f"{path}::{name}")
            totals[key] += seconds
            counts[key] += 1
    everything = sum(totals.values())
    lines.append(f"{'all groups':<70} {everything:8.1f} s")
    lines.append("")
    for key, seconds in sorted(totals.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"{seconds:8.1f} s {seconds / everything:6.1%} {counts[key]:5d}  {key}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logdir", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--by", choices=("file", "test"), default="file")
    args = parser.parse_args(argv)
    print(summarize(args.logdir, args.top, args.by))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
