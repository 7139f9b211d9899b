"""Host work of EAGLE's fixed-shape drafting: torch operator calls and tensor reads (``tolist`` / ``item``) per
drafting step and per drafter forward, outside the drafter's compiled forward (on a GPU each is a launch, a copy or a
sync that the forward's CUDA graph does not hide).

    python benchmarks/eagle_host_ops.py            # a 32-node tree (depth 8, top-k 4) and a chain of 8

Counts, not times: runs on any machine, beside other work. Two cases of ``host_ops.py`` (which counts every
drafter and the loop, and keeps them under a budget): ``eagle-tree-32@compiled`` and ``eagle-chain-8@compiled``, a
tiny random target and drafter, the fixed-shape path uncompiled (as the tests run it); what happens inside
``DraftStep.forward`` (one graph replay when compiled) and inside the target's forward is not counted. Here the
figures are the drafting glue alone (``host_ops.py``'s ``glue`` column: the drafter's ``draft`` and ``observe``,
the loop's own work left out). A chain's longest draft shrinks by one after each rejected draft (random drafts: 1-2
tokens a step after the first few), so compare the two by their figures per drafter forward. The reads are an upper
bound of a GPU run's syncs: here every tensor is on the host, so a read of one that a GPU run would keep on the
host as well (made from a Python list for a host decision) is counted too.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))

import host_ops
from host_ops_counter import READ

CASES = {"tree 32 (depth 8, top-k 4)": "eagle-tree-32@compiled", "chain of 8": "eagle-chain-8@compiled"}


def glue_ops(counter: host_ops.HostOps) -> collections.Counter:
    """The drafting glue's operations over the steady steps, by operator."""
    ops: collections.Counter = collections.Counter()
    for step in counter.steady():
        for (category, _site, op), n in step.sites.items():
            if category == "glue" and op != READ:
                ops[op] += n
    return ops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    report = {}
    for label, case in CASES.items():
        figures, counter = host_ops.count_case(case, args.new_tokens)
        steps, forwards = figures["steps"], figures["net_calls"]
        report[label] = {"steps": steps, "drafter_forwards": round(forwards * steps),
                         "ops_per_step": figures["glue"], "reads_per_step": figures["glue_reads"],
                         "ops_per_forward": round(figures["glue"] / forwards, 1),
                         "reads_per_forward": round(figures["glue_reads"] / forwards, 2),
                         "top_ops": glue_ops(counter).most_common(8)}
        print(label, json.dumps(report[label]))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
