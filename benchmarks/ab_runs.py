"""What the CPU A/B scripts share (``kernel_weights_ab.py``, ``cpu_attention_ab.py``, ``cpu_attention_fp32_ab.py``,
``catch_up_ab.py``, ``kv_room_ab.py``): the target on the kernel as the peers' kernel engine runs it, the peers
table's prompts, each arm's records per prompt, and the table's figures (tokens/s per category and overall, τ, the
ratio to a baseline arm)."""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from typing import Any, Callable


def kernel_target(name: str, dtype: Any = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of registry model ``name`` in ``dtype`` (default fp32) with ``hfs.optimize_for_cpu(model,
    kernel=True)``, one thread and transformers' grouped-query SDPA, as the peers' kernel engine runs."""
    import torch

    import hf_speculative as hfs

    torch.set_num_threads(1)
    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
    model, tokenizer = hfs.load_model(name, dtype=dtype)
    hfs.optimize_for_cpu(model, kernel=True)
    return model, tokenizer


def peers_prompts(tokenizer: Any, per_category: int) -> tuple[tuple[str, ...], list, list]:
    """The peers table's categories, ``per_category`` Spec-Bench first turns of each, and their token ids (the chat
    template): ``(categories, prompts, encoded)``."""
    from hf_speculative.bench.spec_bench import load_prompts
    from hf_speculative.tooling.prompting import encode_prompt
    from peers.run import CATEGORIES as categories  # (benchmarks/ is the scripts' path)

    prompts = load_prompts(categories=categories, per_category=per_category)
    return categories, prompts, [encode_prompt(tokenizer, p.text, True) for p in prompts]


class Runs:
    """Every timed call of every arm on every prompt: its seconds (medians taken), tokens, target forwards, and how
    many outputs equalled their reference."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, int], list[float]] = defaultdict(list)
        self.tokens: dict[tuple[str, int], int] = {}
        self.forwards: dict[tuple[str, int], int] = {}
        self.identical: dict[str, int] = defaultdict(int)

    def record(self, label: str, prompt: int, done: Any, same: bool) -> None:
        """One timed call (a ``tooling.methods.MethodRun``) of arm ``label`` on prompt ``prompt``."""
        self.seconds[label, prompt].append(done.seconds)
        self.tokens[label, prompt] = done.new_tokens
        self.forwards[label, prompt] = done.target_forwards or done.new_tokens
        self.identical[label] += same

    def median(self, label: str, prompt: int) -> float:
        return statistics.median(self.seconds[label, prompt])

    def rates(self, label: str, prompts: list, categories: tuple[str, ...]) -> list[str]:
        """Tokens/s per category, then overall: the category's tokens over its prompts' median seconds."""
        cells = []
        for category in (*categories, "overall"):
            idx = [i for i, p in enumerate(prompts) if category in ("overall", p.category)]
            cells.append(f"{sum(self.tokens[label, i] for i in idx) / sum(self.median(label, i) for i in idx):.2f}")
        return cells

    def tau(self, label: str, count: int) -> float:
        return sum(self.tokens[label, i] for i in range(count)) / sum(self.forwards[label, i] for i in range(count))

    def ratio(self, label: str, baseline: str, count: int) -> float:
        """``baseline``'s summed median seconds over ``label``'s, on prompts ``0..count-1``."""
        return sum(self.median(baseline, i) for i in range(count)) / sum(self.median(label, i) for i in range(count))

    def table(self, labels: list[str], prompts: list, categories: tuple[str, ...], baseline: Callable[[str], str],
              baseline_name: str, repeats: int) -> list[str]:
        """The markdown table of ``labels``: tokens/s per category and overall, τ, the ratio to ``baseline(label)``'s
        arm (headed ``vs baseline_name``), and how many of the ``len(prompts) * repeats`` outputs were identical."""
        n = len(prompts)
        lines = ["| arm | " + " | ".join(categories) + f" | overall tok/s | τ | vs {baseline_name} | identical |",
                 "|---" * (len(categories) + 5) + "|"]
        for label in labels:
            lines.append(f"| {label} | " + " | ".join(self.rates(label, prompts, categories))
                         + f" | {self.tau(label, n):.2f} | {self.ratio(label, baseline(label), n):.2f}× | "
                         f"{self.identical[label]}/{n * repeats} |")
        return lines
