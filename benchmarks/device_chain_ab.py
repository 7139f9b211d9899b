"""Does drafting a fixed chain (or a dynamic tree) on the device (issue 69) cost the CPU anything? An A/B of the
two paths.

    python benchmarks/device_chain_ab.py [--prompts 4] [--new-tokens 64] [--repeats 3] [--out FILE]
    python benchmarks/device_chain_ab.py --tree 32,6,8     # EAGLE-2 trees: nodes, depth, top_k (cost rules on)

The shipped EAGLE-3 for the registry's SmolLM2 (``hfs.optimize_for_cpu``), chains of ``--num-tokens`` at a fixed
budget (``adaptive=False``), greedy, one thread, Spec-Bench first turns (one per category, chat template):
``host`` drafts token by token on the host (``draft_chain``, as before), ``device`` feeds each token back as a tensor
and reads once at the end (``draft_chain_on_device``). Interleaved per prompt and repeat; outputs and drafts checked
identical. With ``--tree``, dynamic trees of that shape under the cost rules (their node count chosen per step, so
only outputs are compared): ``host`` grows them with ``DynamicTree.grow``, ``device`` with
``grow_dynamic_on_device``. Run it alone (check ``uptime``).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_report import ab_parser, report as print_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = ab_parser(__doc__, new_tokens=64)
    parser.add_argument("--num-tokens", type=int, default=5)
    parser.add_argument("--tree", default=None, help="NODES,DEPTH,TOP_K: dynamic trees instead of chains")
    parser.add_argument("--fixed-tree", action="store_true", help="the tree's budget fixed (adaptive=False)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import hf_speculative as hfs
    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.drafters.eagle import drafter as eagle_drafter
    from hf_speculative.registry.models import load_model
    from hf_speculative.tooling.prompting import encode_prompt

    from hf_speculative.core import chain_drafting

    device_length = chain_drafting.device_chain_length
    lengths = {"device": device_length, "host": lambda plan, ctx, limit: None}
    generator = eagle_drafter.EagleCandidateGenerator
    device_tree = generator._device_tree_ok
    tree_paths = {"device": device_tree, "host": lambda self: False}
    tree = None if args.tree is None else hfs.DynamicTree(*(int(x) for x in args.tree.split(",")))
    model, tok = load_model("smollm2-135m-instruct")
    hfs.optimize_for_cpu(model)
    hfs.enable(model)
    options = {"num_tokens": args.num_tokens, "adaptive": False} if tree is None else \
        {"tree": tree, "adaptive": not args.fixed_tree}
    strategy = hfs.Eagle.from_pretrained("smollm2-135m-instruct", target=model, **options)
    prompts = [encode_prompt(tok, p.text, True) for p in load_prompts(per_category=1)[: args.prompts]]

    def run(arm: str, ids: torch.Tensor, n: int):
        chain_drafting.device_chain_length = lengths[arm]
        generator._device_tree_ok = tree_paths[arm]
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, eos_token_id=None, candidate_generator=strategy)
        seconds = time.perf_counter() - start
        stats = hfs.last_stats(model)
        return seconds, out, (stats.drafted_tokens, stats.accepted_tokens, stats.target_forwards)

    report = {"load_before": os.getloadavg()[0], "prompts": len(prompts), "new_tokens": args.new_tokens,
              "repeats": args.repeats, "num_tokens": args.num_tokens, "tree": args.tree,
              "fixed_tree": args.fixed_tree}
    run("host", prompts[0], 8), run("device", prompts[0], 8)  # warm-up
    times: dict[str, list[float]] = {"host": [], "device": []}
    for ids in prompts:
        seen = {}
        for _ in range(args.repeats):
            for arm in times:
                seconds, out, counts = run(arm, ids, args.new_tokens)
                times[arm].append(seconds)
                # trees under the cost rules are sized by measured costs: only their outputs must agree
                seen[arm] = (out.tolist(), counts if tree is None or args.fixed_tree else None)
        assert seen["host"] == seen["device"], "the paths drafted or generated differently"
    chain_drafting.device_chain_length, generator._device_tree_ok = device_length, device_tree
    ratios = [d / h for d, h in zip(times["device"], times["host"])]
    report.update({"median_s": {arm: round(statistics.median(v), 4) for arm, v in times.items()},
                   "device_over_host": round(statistics.median(ratios), 3), "load_after": os.getloadavg()[0]})
    return print_report(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
