"""What the CPU kernel's narrower weight copies give: bf16 copies of a bf16 checkpoint's target (exact) and int8
copies of a draft model (approximate drafts, exact output), against fp32 copies of both.

    python benchmarks/kernel_weights_ab.py --model qwen2.5-coder-1.5b-instruct --draft-model qwen2.5-coder-0.5b-instruct
    python benchmarks/kernel_weights_ab.py --dtype bfloat16    # both models in bf16: greedy, drafter exact / int8

On the peers' Spec-Bench prompts (``--per-category`` per category, first turn, chat template), one thread, the kernel
on (``hfs.optimize_for_cpu``): for every prompt, greedy with the target's copies in fp32 and in bf16 (remade between
the arms, outside the timed calls), then the draft model with its drafter's copies exact (bf16) and int8, both on the
bf16 target (one drafter, whose copies are made again before each call, untimed). One untimed warm-up call per arm
on the first prompt, then ``--repeats`` rounds; medians. Every output
is checked against the greedy output of its own round. Prints tokens/s, τ and the ratio to greedy per arm.
``--dtype bfloat16`` loads both models in bf16 (the kernel's bf16 dot products): no fp32-copy arm then.
"""

from __future__ import annotations

import argparse
import os

import torch

from ab_runs import Runs, kernel_target, peers_prompts  # (benchmarks/ is this script's path)


def remake_copies(model: torch.nn.Module, bf16: bool) -> None:
    """The target's kernel copies made again, in bf16 where exact (``bf16``) or fp32."""
    from hf_speculative.cpu.kernel import BlockedWeight, KernelLinear

    os.environ["HFS_KERNEL_BF16"] = "1" if bf16 else "0"
    for module in model.modules():
        if type(module) is KernelLinear:
            module._hfs_blocked = BlockedWeight()
            module._hfs_blocked.get(module.weight)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    import hf_speculative as hfs
    from hf_speculative.tooling.methods import run_method

    dtype = getattr(torch, args.dtype)
    model, tokenizer = kernel_target(args.model, dtype)
    categories, prompts, encoded = peers_prompts(tokenizer, args.per_category)
    from hf_speculative.cpu.layout import follow_layout

    draft, _ = hfs.load_model(args.draft_model, dtype=dtype)  # one drafter: its copies are made again between arms
    arms = [("greedy fp32 copies", "greedy", {}, False), ("greedy bf16 copies", "greedy", {}, True),
            ("draft model, exact drafter", "draft-model", {"kernel_weights": "exact"}, True),
            ("draft model, int8 drafter", "draft-model", {"kernel_weights": "int8"}, True)]
    if dtype == torch.bfloat16:  # a bf16 model's copies are bf16 pairs whatever HFS_KERNEL_BF16 says
        arms = [arm for arm in arms if arm[0] != "greedy fp32 copies"]
    runs = Runs()
    bf16_now = None
    print(f"load at start: {os.getloadavg()}", flush=True)
    for round_ in range(args.repeats + 1):  # round 0 warms every arm up on the first prompt
        for i, ids in enumerate(encoded if round_ else encoded[:1]):
            reference = None
            for label, method, options, bf16 in arms:
                if bf16 != bf16_now:
                    remake_copies(model, bf16)
                    bf16_now = bf16
                if method != "greedy":  # the drafter's copies for this arm, made outside the timed call
                    follow_layout(draft, model, options["kernel_weights"])
                    options = {"draft_model": draft, **options}
                done = run_method(method, model, tokenizer, ids, options=options, max_new_tokens=args.max_new_tokens)
                out = list(done.output_ids)
                reference = out if reference is None else reference
                if round_:
                    runs.record(label, i, done, out == reference)
            if round_:
                print(f"prompt {i} done, load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"load at end: {os.getloadavg()}")
    print("\n".join(runs.table([label for label, *_ in arms], prompts, categories, lambda label: "greedy bf16 copies",
                               "greedy (bf16 copies)", args.repeats)))


if __name__ == "__main__":
    main()
