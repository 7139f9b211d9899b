"""What a forward of optimum-intel's ``OVModelForCausalLM`` costs when exported stateless (its KV cache handed in and
out as tensors, so that a speculative loop could cut it after a rejection), beside the stateful IR the peers table
runs in OpenVINO GenAI (the cache kept inside the request): issue 48, item 3b (``hfs.enable()`` on an OV model).

    .venv-ov/bin/python benchmarks/peers/ov_stateless_costs.py --context 512 --tokens 1,2,3,4,6 --repeats 15

Run alone (one thread, a quiet machine). Prints milliseconds per forward (median) at the given context for every
``k`` tokens, and each against the one-token forward; our own figures come from ``benchmarks/verify_costs.py``.
The stateful IR is the peers' export (``openvino_engine.exported``); the stateless one is exported once beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def stateless_ir(name: str, stateful_ir: Path, config: dict) -> Path:
    """The stateless fp32 IR of registry model ``name``, exported once beside the peers' stateful one."""
    from optimum.intel import OVModelForCausalLM

    from openvino_engine import registry_folder

    folder = stateful_ir.with_name(stateful_ir.name + "-stateless")
    if not (folder / "openvino_model.xml").exists():
        model = OVModelForCausalLM.from_pretrained(registry_folder(name), export=True, stateful=False, use_cache=True,
                                                   load_in_8bit=False, ov_config=config)
        model.save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--tokens", default="1,2,3,4,6")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    import numpy as np
    import torch
    from optimum.intel import OVModelForCausalLM

    from openvino_engine import exported
    from openvino_worker import device_properties

    torch.set_num_threads(1)
    config = {**device_properties(1, "f32"), "PERFORMANCE_HINT": "LATENCY"}
    stateful = exported(args.model, Path(sys.executable))
    sizes = [int(k) for k in args.tokens.split(",")]
    for is_stateful, folder in ((False, stateless_ir(args.model, stateful, config)), (True, stateful)):
        model = OVModelForCausalLM.from_pretrained(folder, stateful=is_stateful, use_cache=True, ov_config=config)
        rng = np.random.default_rng(0)
        prompt = torch.tensor(rng.integers(100, 1000, size=(1, args.context)))
        times: dict[int, list[float]] = {k: [] for k in sizes}
        for _ in range(args.repeats + 1):  # the first round warms up
            for k in sizes:  # the sizes take turns, so that a drift of the machine lands on all of them
                past = model(input_ids=prompt, attention_mask=torch.ones_like(prompt)).past_key_values
                ids = torch.tensor(rng.integers(100, 1000, size=(1, k)))
                mask = torch.ones(1, args.context + k, dtype=torch.long)
                start = time.perf_counter()
                model(input_ids=ids, attention_mask=mask, past_key_values=past)
                times[k].append(time.perf_counter() - start)
        ms = {k: 1000 * statistics.median(v[1:]) for k, v in times.items()}
        print(json.dumps({"stateful": is_stateful, "ms": {k: round(v, 2) for k, v in ms.items()},
                          "relative": {k: round(v / ms[sizes[0]], 3) for k, v in ms.items()}}), flush=True)


if __name__ == "__main__":
    main()
