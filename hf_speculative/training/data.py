"""Training data for hidden-state drafters: token sequences and the target's features over them.

Sources (``read_examples``): a JSONL corpus with a ``text`` field (the loss covers every token), or
self-distillation rows written by :func:`~hf_speculative.training.selfdistill.generate_responses`
(``prompt_tokens`` + ``response_tokens``; the loss covers the answer only, which is where drafting
happens, while the prompt still gives the context).

:class:`FeatureCache` runs the target once over every example and stores, memory-mapped on disk,
what the drafter's training reads: the fused features (EAGLE-3: the outputs of three layers; EAGLE-1:
the final normed hidden state) and the final normed hidden state (the target's distribution at every
position, recomputed from it through the target's lm_head). Features are captured with the same
:class:`~hf_speculative.features.FeatureTap` hooks that inference uses, so training and drafting see
identical inputs. The cache is built in chunks and resumes after an interruption.
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from .. import compat
from ..features import FeatureTap

INDEX = "index.json"


@dataclass
class Example:
    """One training sequence: ``ids`` `[T]` and ``loss_mask`` `[T]` (``loss_mask[q] = 1`` where the
    token after position ``q``, ``ids[q + 1]``, is learnt)."""

    ids: list[int]
    loss_mask: list[int]

    @property
    def prompt_length(self) -> int:
        """Tokens before the first learnt one (the prompt of a self-distillation row)."""
        return next((q + 1 for q, m in enumerate(self.loss_mask) if m), len(self.ids))


def numbered_rows(path: str | Path) -> Iterator[tuple[int, dict]]:
    """``(line number, row)`` for every non-blank line of a JSONL file (numbers from 1, for messages)."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                yield line_no, json.loads(line)


def read_examples(path: str | Path, tokenizer: Any = None, max_length: int = 1024) -> list[Example]:
    """Examples from a JSONL file of self-distillation rows or of ``{"text": ...}`` documents."""
    examples = []
    for line_no, row in numbered_rows(path):
        if "response_tokens" in row:
            prompt, response = list(row["prompt_tokens"]), list(row["response_tokens"])
            ids = (prompt + response)[:max_length]
            mask = ([0] * (len(prompt) - 1) + [1] * len(response) + [0])[:max_length]
        elif "text" in row:
            if tokenizer is None:
                raise ValueError(f"{path}:{line_no}: a text corpus needs the target's tokenizer to be tokenized.")
            ids = tokenizer(row["text"], add_special_tokens=True)["input_ids"][:max_length]
            mask = [1] * (len(ids) - 1) + [0]
        else:
            raise ValueError(f"{path}:{line_no}: expected a 'text' field or self-distillation fields "
                             f"('prompt_tokens', 'response_tokens'); got {sorted(row)}.")
        if len(ids) >= 4 and sum(mask) >= 2:
            examples.append(Example(ids, mask))
    if not examples:
        raise ValueError(f"{path} holds no usable example (each needs at least 4 tokens).")
    return examples


def token_frequencies(examples: Iterable[Example]) -> collections.Counter:
    """How often each token is a learnt next token (what a reduced draft vocabulary must cover)."""
    counts: collections.Counter = collections.Counter()
    for ex in examples:
        counts.update(t for t, m in zip(ex.ids[1:], ex.loss_mask[:-1]) if m)
    return counts


def draft_vocabulary(examples: Iterable[Example], size: int, vocab_size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``size`` most frequent learnt tokens (plus ``always``, e.g. EOS), sorted target ids `[size]`.
    Rarer tokens fill up with the lowest unused ids so that the map is complete."""
    counts = token_frequencies(examples)
    chosen = list(dict.fromkeys([int(t) for t in always if 0 <= int(t) < vocab_size]))
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if token not in chosen and token < vocab_size:
            chosen.append(token)
    taken = set(chosen)
    filler = (t for t in range(vocab_size) if t not in taken)
    while len(chosen) < size:
        chosen.append(next(filler))
    return torch.tensor(sorted(chosen), dtype=torch.long)


class FeatureCache:
    """Memory-mapped target features over a list of examples.

    Files in ``directory``: ``features.f16`` `[N, F]`, ``final.f16`` `[N, H]` (float16), ``top.i32`` `[N]`
    (the target's argmax at every position, what a greedy draft must match), ``index.json``
    (shapes, per-example offsets, how many examples are done, and a description of the source).
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        meta = json.loads((self.directory / INDEX).read_text())
        self.meta = meta
        self.offsets: list[int] = meta["offsets"]
        self.done: int = meta["done"]
        n, f, h = meta["num_tokens"], meta["feature_size"], meta["hidden_size"]
        self.features = np.memmap(self.directory / "features.f16", dtype=np.float16, mode="r", shape=(n, f))
        self.final = np.memmap(self.directory / "final.f16", dtype=np.float16, mode="r", shape=(n, h))
        self.top = np.memmap(self.directory / "top.i32", dtype=np.int32, mode="r", shape=(n,))

    def __len__(self) -> int:
        return self.done

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Features `[T, F]`, final hidden states `[T, H]` (float32) and the target's argmax `[T]` of example ``i``."""
        a, b = self.offsets[i], self.offsets[i + 1]
        return (torch.from_numpy(np.array(self.features[a:b])).float(), torch.from_numpy(np.array(self.final[a:b])).float(),
                torch.from_numpy(np.array(self.top[a:b])).long())

    @staticmethod
    @torch.no_grad()
    def build(directory: str | Path, target: Any, examples: list[Example], layers: list[int], *,
              source: str = "", chunk: int = 16, progress: bool = True) -> "FeatureCache":
        """Run ``target`` over ``examples`` (resuming a partial cache of the same source) and return the cache.

        Args:
            layers (`list[int]`): EAGLE-3's fused layers; empty for EAGLE-1 (features = final hidden).
        """
        from tqdm.auto import tqdm

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        hidden = int(compat.text_config(target.config).hidden_size)
        feature_size = hidden * max(len(layers), 1)
        lengths = [len(ex.ids) for ex in examples]
        offsets = [0] + list(np.cumsum(lengths).tolist())
        meta = {"num_tokens": offsets[-1], "feature_size": feature_size, "hidden_size": hidden, "layers": list(layers),
                "offsets": offsets, "done": 0, "source": source, "num_examples": len(examples)}
        index = directory / INDEX
        if index.exists():
            old = json.loads(index.read_text())
            if {k: old.get(k) for k in ("offsets", "layers", "source")} == {k: meta[k] for k in ("offsets", "layers", "source")}:
                meta["done"] = old["done"]
        mode = "r+" if meta["done"] and (directory / "features.f16").exists() else "w+"
        features = np.memmap(directory / "features.f16", dtype=np.float16, mode=mode, shape=(offsets[-1], feature_size))
        final = np.memmap(directory / "final.f16", dtype=np.float16, mode=mode, shape=(offsets[-1], hidden))
        top = np.memmap(directory / "top.i32", dtype=np.int32, mode=mode, shape=(offsets[-1],))
        device = next(target.parameters()).device
        tap = FeatureTap(target, list(layers))
        final_tap = FeatureTap(target, []) if layers else tap
        bar = tqdm(total=len(examples), initial=meta["done"], desc="target features", disable=not progress)
        try:
            for i in range(meta["done"], len(examples)):
                ids = torch.tensor([examples[i].ids], device=device)
                logits = target(input_ids=ids, use_cache=False).logits[0]  # [T, V]
                feats = tap.take()[0]  # [T, F]
                norm = final_tap.take()[0] if layers else feats  # [T, H]
                a, b = offsets[i], offsets[i + 1]
                features[a:b] = feats.float().cpu().numpy().astype(np.float16)
                final[a:b] = norm.float().cpu().numpy().astype(np.float16)
                top[a:b] = logits.argmax(-1).cpu().numpy().astype(np.int32)
                bar.update(1)
                if (i + 1) % chunk == 0 or i + 1 == len(examples):
                    features.flush()
                    final.flush()
                    top.flush()
                    meta["done"] = i + 1
                    index.write_text(json.dumps(meta))
        finally:
            tap.remove()
            final_tap.remove()
            bar.close()
        del features, final, top
        return FeatureCache(directory)
