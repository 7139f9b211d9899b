"""What the CPU A/B scripts share (``kernel_weights_ab.py``, ``cpu_attention_ab.py``, ``kv_room_ab.py``): the peers
table's prompts, each arm's records per prompt, and the table's figures (tokens/s per category and overall, τ, the
ratio to a baseline arm)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any


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
