"""What a token costs around the target's forward: our loop against transformers' greedy and a bare loop of forwards.

    python benchmarks/loop_overhead.py [--prompts 4] [--new-tokens 64] [--repeats 3] [--out FILE]

On the registry's SmolLM2 with ``hfs.optimize_for_cpu`` (the native layers where they run), one thread, per prompt
(Spec-Bench first turns, chat template) and interleaved, each ``--repeats`` times:

- ``forwards``: a bare loop of one-token forwards on a ``DynamicCache`` and an ``argmax``: the floor;
- ``transformers``: transformers' own greedy ``generate`` on the same model (bypassing ``hfs.enable``);
- ``ours``: our loop (``generate`` with ``candidate_generator=``) with a drafter that (almost) never drafts, prompt
  lookup on 16-grams: every step is one target forward of one token plus the loop's own work, as plain decoding.

Per-token milliseconds are the difference between a run of ``--new-tokens`` and a run of one new token (the
prefill), divided by the tokens between; medians over prompts and repeats. Outputs are checked identical. Issue 66's
target: ``ours`` costs no more per token than ``transformers``. Run it alone on a quiet machine (check ``uptime``).
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


def bare_forwards(model, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy by hand: prefill, then one-token forwards on a DynamicCache (no logits processors, no criteria)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    out = [ids]
    step = ids
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(input_ids=step, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            step = logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
            out.append(step)
    return torch.cat(out, dim=-1)


def main(argv: list[str] | None = None) -> int:
    parser = ab_parser(__doc__, new_tokens=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import hf_speculative as hfs
    from hf_speculative.tooling.prompting import encode_prompt
    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.registry.models import load_model

    model, tok = load_model("smollm2-135m-instruct")
    hfs.optimize_for_cpu(model)
    hfs.enable(model)
    stock = type(model).generate  # transformers' own (enable leaves the class alone)
    drafter = hfs.PromptLookup(min_ngram=16, max_ngram=16)
    chosen = load_prompts(per_category=1)[: args.prompts]  # one per category, in file order
    prompts = [encode_prompt(tok, p.text, True) for p in chosen]
    eos = None  # run every call to its length: the same number of tokens for every route

    def run(route: str, ids: torch.Tensor, n: int) -> tuple[float, torch.Tensor]:
        mask = torch.ones_like(ids)
        start = time.perf_counter()
        if route == "forwards":
            out = bare_forwards(model, ids, n)
        elif route == "transformers":
            out = stock(model, input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                        min_new_tokens=n, eos_token_id=eos)
        else:
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                                 min_new_tokens=n, eos_token_id=eos, candidate_generator=drafter)
        return time.perf_counter() - start, out

    routes = ("forwards", "transformers", "ours")
    per_token: dict[str, list[float]] = {r: [] for r in routes}
    run("ours", prompts[0], 8), run("transformers", prompts[0], 8), run("forwards", prompts[0], 8)  # warm-up
    for ids in prompts:
        outputs = {}
        for _ in range(args.repeats):
            for route in routes:
                long, outputs[route] = run(route, ids, args.new_tokens)
                short, _ = run(route, ids, 1)
                per_token[route].append(1000 * (long - short) / (args.new_tokens - 1))
        base = outputs["transformers"]
        for route in routes:
            assert torch.equal(outputs[route][:, : base.shape[1]], base), f"{route} differs from greedy"
    report = {
        "load": os.getloadavg()[0],
        "prompts": len(prompts), "new_tokens": args.new_tokens, "repeats": args.repeats,
        "ms_per_token": {r: round(statistics.median(v), 3) for r, v in per_token.items()},
    }
    ms = report["ms_per_token"]
    report["ours_over_transformers"] = round(ms["ours"] / ms["transformers"], 3)
    report["transformers_over_forwards"] = round(ms["transformers"] / ms["forwards"], 3)
    return print_report(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
