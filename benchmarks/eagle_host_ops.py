"""Host work of EAGLE's fixed-shape drafting: torch operator calls and tensor reads (``tolist`` / ``item``) per
drafting step and per drafter forward, outside the drafter's compiled forward (on a GPU each is a launch, a copy or a
sync that the forward's CUDA graph does not hide).

    python benchmarks/eagle_host_ops.py            # a 32-node tree (depth 8, top-k 4) and a chain of 8

Counts, not times: runs on any machine, beside other work. Tiny random target and drafter, the fixed-shape path
uncompiled (as the tests run it); what happens inside ``DraftStep.forward`` (one graph replay when compiled) and
inside the target's forward is not counted. A chain's longest draft shrinks by one after each rejected draft (random
drafts: 1-2 tokens a step after the first few), so compare the two by their figures per drafter forward. The reads
are an upper bound of a GPU run's syncs: here every tensor is on the host, so a read of one that a GPU run would keep
on the host as well (made from a Python list for a host decision) is counted too.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


_reads = [0]  # tensor reads outside the drafter's forward


class Counter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            name = str(func.overloadpacket.__name__)
            self.ops[name] += 1
            if name == "_local_scalar_dense":  # int(t), float(t), bool(t), t.item(): a read (a sync on a GPU)
                _reads[0] += 1
        return func(*args, **(kwargs or {}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import hf_speculative as hfs
    from hf_speculative.core import static_cache
    from hf_speculative.drafters.eagle import static_drafting
    from hf_speculative.drafters.eagle.drafter import EagleCandidateGenerator
    from tests.conftest import build_model, prompt_inputs, random_eagle

    counter = Counter()
    forwards = [0]

    def uncounted(fn, drafter=False):
        def run(*a, **k):
            forwards[0] += drafter
            counter.paused += 1
            try:
                return fn(*a, **k)
            finally:
                counter.paused -= 1
        return run

    static_cache.compiled_forward = lambda target, mode: uncounted(target)  # the target's forward: not counted
    static_drafting.compile_step = lambda step, mode: uncounted(step, drafter=True)
    per_step: list[tuple[int, int, int]] = []
    draft = EagleCandidateGenerator.draft

    def counted_draft(self, *a, **k):
        before, reads, ran = sum(counter.ops.values()), _reads[0], forwards[0]
        tree = draft(self, *a, **k)
        per_step.append((sum(counter.ops.values()) - before, _reads[0] - reads, forwards[0] - ran))
        return tree

    EagleCandidateGenerator.draft = counted_draft
    tolist = torch.Tensor.tolist

    def reading(fn):
        def read(self, *a, **k):
            if not counter.paused:
                _reads[0] += 1
            return fn(self, *a, **k)
        return read

    torch.Tensor.tolist = reading(tolist)  # (item() and int() are counted as _local_scalar_dense)
    target = hfs.enable(build_model("llama", layers=4).requires_grad_(False))
    net = random_eagle(target)
    report = {}
    for label, strategy in {
        "tree 32 (depth 8, top-k 4)": hfs.Eagle(net, tree=hfs.DynamicTree(nodes=32, depth=8, top_k=4), adaptive=False),
        "chain of 8": hfs.Eagle(net, num_tokens=8, adaptive=False, confidence_threshold=0.0),
    }.items():
        hfs.enable(target, compile=True)
        per_step.clear()
        counter.ops.clear()
        with counter:
            target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=args.new_tokens, eos_token_id=None,
                            candidate_generator=strategy, cache_implementation="static")
        hfs.enable(target, compile=False)
        steps = per_step[1:]  # the first step also catches up on the prompt
        ops, reads, ran = (sum(column) for column in zip(*steps))
        report[label] = {"steps": len(steps), "drafter_forwards": ran, "ops_per_step": round(ops / len(steps), 1),
                         "reads_per_step": round(reads / len(steps), 1), "ops_per_forward": round(ops / ran, 1),
                         "reads_per_forward": round(reads / ran, 2), "top_ops": counter.ops.most_common(8)}
        print(label, json.dumps(report[label]))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
