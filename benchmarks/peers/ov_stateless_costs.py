"""What a forward of optimum-intel's ``OVModelForCausalLM`` costs when exported stateless (its KV cache handed in and
out as tensors, so that a speculative loop could cut it after a rejection), beside the same IR run stateful (the cache
kept inside the request, as OpenVINO GenAI runs it): issue 48, item 3b (``hfs.enable()`` on an OV model).

    .venv-ov/bin/python benchmarks/peers/ov_stateless_costs.py --context 512 --tokens 1,2,3,4,6 --repeats 15

Run alone (one thread, a quiet machine). Prints milliseconds per forward (median) at the given context for every
``k`` tokens, and each against the one-token forward; our own figures come from ``benchmarks/verify_costs.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--tokens", default="1,2,3,4,6")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--cache", default=str(Path.home() / ".cache/hf_speculative/peers/openvino"))
    args = parser.parse_args()

    import numpy as np
    import torch
    from optimum.intel import OVModelForCausalLM

    from hf_speculative.registry.models import fetch

    torch.set_num_threads(1)
    source = fetch(args.model)
    config = {"INFERENCE_NUM_THREADS": 1, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    results = {}
    for stateful in (False, True):
        folder = Path(args.cache) / f"{args.model}-fp32-{'stateful' if stateful else 'stateless'}"
        if not (folder / "openvino_model.xml").exists():
            model = OVModelForCausalLM.from_pretrained(source, export=True, stateful=stateful, use_cache=True,
                                                       load_in_8bit=False, ov_config=config)
            model.save_pretrained(folder)
        model = OVModelForCausalLM.from_pretrained(folder, stateful=stateful, use_cache=True, ov_config=config)
        sizes = [int(k) for k in args.tokens.split(",")]
        rng = np.random.default_rng(0)
        prompt = torch.tensor(rng.integers(100, 1000, size=(1, args.context)))
        times = {k: [] for k in sizes}
        for _ in range(args.repeats + 1):  # the first round warms up
            for k in sizes:  # the sizes take turns, so that a drift of the machine lands on all of them
                out = model(input_ids=prompt, attention_mask=torch.ones_like(prompt))
                past = out.past_key_values
                ids = torch.tensor(rng.integers(100, 1000, size=(1, k)))
                mask = torch.ones(1, args.context + k, dtype=torch.long)
                start = time.perf_counter()
                model(input_ids=ids, attention_mask=mask, past_key_values=past)
                times[k].append(time.perf_counter() - start)
        ms = {k: 1000 * statistics.median(v[1:]) for k, v in times.items()}
        results["stateful" if stateful else "stateless"] = {
            "ms": {k: round(v, 2) for k, v in ms.items()},
            "relative": {k: round(v / ms[sizes[0]], 3) for k, v in ms.items()}}
        print(json.dumps({"stateful": stateful, **results["stateful" if stateful else "stateless"]}), flush=True)


if __name__ == "__main__":
    main()
