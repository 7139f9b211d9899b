"""Is setting transformers' ``TRANSFORMERS_SDPA_FORCE_GQA`` around our forwards worth a process-wide variable?

    python benchmarks/gqa_switch_ab.py [--prompts 4] [--new-tokens 96] [--repeats 3] [--out FILE]

Until issue 68, ``core/sdpa.py`` set the variable around each of our multi-token forwards on a CPU SDPA model (here:
hooks on the target that do the same), so that
transformers' SDPA passed ``enable_gqa=True`` to torch instead of copying a grouped-query model's keys and values per
head (``repeat_kv``). This A/B times prompt lookup (the default drafter) on the registry's SmolLM2 (GQA: 9 query heads,
3 key/value heads), one thread, Spec-Bench first turns (one per category, chat template), with the variable set
around our forwards (``switch``) and never set (``off``), interleaved per prompt and repeat, on two layouts: the
model as loaded (fp32, ``"sdpa"``) and after ``hfs.optimize_for_cpu`` (the CPU route: its own attention for short
forwards, which groups queries itself). Outputs are checked identical. Run it alone (check ``uptime``).
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
VARIABLE = "TRANSFORMERS_SDPA_FORCE_GQA"


class Switch:
    """The old switch, as hooks on the target: the variable set during each multi-token forward (on this thread)."""

    def __init__(self, model):
        self.on, self.forced = False, 0  # forced: the forwards run with the variable set
        model.register_forward_pre_hook(self._before, with_kwargs=True)
        model.register_forward_hook(self._after)

    def _before(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if self.on and ids is not None and ids.shape[1] > 1:
            os.environ[VARIABLE] = "1"
            self.forced += 1

    def _after(self, module, args, output):
        os.environ.pop(VARIABLE, None)


def main(argv: list[str] | None = None) -> int:
    parser = ab_parser(__doc__, new_tokens=96)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.pop(VARIABLE, None)
    import hf_speculative as hfs
    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.registry.models import load_model
    from hf_speculative.tooling.prompting import encode_prompt

    model, tok = load_model("smollm2-135m-instruct")
    hfs.enable(model)
    switch = Switch(model)
    arms = ("switch", "off")

    def use(arm: str) -> None:
        switch.on = arm == "switch"
    chosen = load_prompts(per_category=1)[: args.prompts]
    prompts = [encode_prompt(tok, p.text, True) for p in chosen]
    report = {"load_before": os.getloadavg()[0], "prompts": len(prompts), "new_tokens": args.new_tokens,
              "repeats": args.repeats, "layouts": {}}
    for layout in ("sdpa", "optimize_for_cpu"):
        if layout == "optimize_for_cpu":
            hfs.optimize_for_cpu(model)
        drafter = hfs.PromptLookup()
        times: dict[str, list[float]] = {arm: [] for arm in arms}

        def run(arm: str, ids: torch.Tensor, n: int):
            use(arm)
            start = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=n, candidate_generator=drafter)
            return time.perf_counter() - start, out

        run("switch", prompts[0], 8), run("off", prompts[0], 8)  # warm-up
        for ids in prompts:
            outs = {}
            for _ in range(args.repeats):
                for arm in arms:
                    seconds, outs[arm] = run(arm, ids, args.new_tokens)
                    times[arm].append(seconds)
            assert torch.equal(outs["switch"], outs["off"]), "the switch changed an output"
        medians = {arm: round(statistics.median(v), 4) for arm, v in times.items()}
        # per prompt: off / switch, then the median of those ratios
        ratios = [o / s for o, s in zip(times["off"], times["switch"])]
        report["layouts"][layout] = {"median_s": medians, "off_over_switch": round(statistics.median(ratios), 3),
                                     "forwards_switched": switch.forced}
        switch.forced = 0
    report["load_after"] = os.getloadavg()[0]
    return print_report(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
