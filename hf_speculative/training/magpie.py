"""Prompts the target writes itself (Magpie, Xu et al. 2024), for self-distillation.

A chat model fine-tuned on conversations has learned what users ask. Given its chat template up to
the start of a user turn and nothing more, it samples a user's message: a request written the way
people write, on whatever topics its fine-tuning data covered. Those prompts need no corpus and no
internet. (A drafter trained on their answers improves on such requests; on Spec-Bench's human-written
questions it did not: see stage 7 of benchmarks/training-history.md.)

Every batch samples ``batch_size`` messages from the same pre-query text, with the random generator
seeded from ``(seed, batch index)``, so a run is reproducible, and an interrupted one resumes by
sampling its last batch again and writing only the rows it had not written: the file then equals an
uninterrupted run's. A batch's messages depend on the seed and its index alone (:func:`sample_batch`), so other
processes may sample some batches (``sampled=``) and the file is still one process's. Messages cut off by the
length limit, shorter than ``min_words``,
repeated, or sharing a run of ``shingle`` words with an excluded text (the benchmark's questions) are
dropped.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from .. import compat
from .selfdistill import read_jsonl

_MARK = "\u0000QUERY\u0000"


def pre_query_text(tokenizer: Any) -> str:
    """The chat template rendered up to where a user's message starts (the template's default system turn
    included)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("self-written prompts need a chat model: this tokenizer has no chat template (give "
                         "self-distill a prompts file of your own instead)")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    if _MARK not in text:
        raise ValueError("the chat template does not show the user's message verbatim; cannot find where a user "
                         "turn starts")
    return text.split(_MARK, 1)[0]


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def shingles(texts: Iterable[str], size: int) -> set[tuple[str, ...]]:
    """Every run of ``size`` consecutive words of the texts (a text shorter than ``size`` counts whole)."""
    out = set()
    for text in texts:
        words = _words(text)
        out.update(tuple(words[i: i + size]) for i in range(max(len(words) - size + 1, 1)))
    return out


def _batch_seed(seed: int, batch: int) -> int:
    return (seed * 1_000_003 + batch) % (2**63)


def query_inputs(tokenizer: Any, batch_size: int) -> torch.LongTensor:
    """The pre-query text's ids in every row of a batch, ``[batch_size, P]``."""
    prefix = tokenizer(pre_query_text(tokenizer), add_special_tokens=False, return_tensors="pt")["input_ids"]
    return prefix.repeat(batch_size, 1)  # [B, P]: the same pre-query text in every row


def eos_ids_of(model: Any) -> set[int]:
    """The model's EOS ids (where a message ends); raises when its generation config has none."""
    eos_ids = set(compat.eos_token_ids(model.generation_config))
    if not eos_ids:
        raise ValueError("the model's generation_config has no eos_token_id: cannot tell where a message ends")
    return eos_ids


def pad_id_of(model: Any, tokenizer: Any) -> int:
    """The id generate() pads finished rows with (the tokenizer's pad, else the smallest EOS id)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids_of(model))


@torch.no_grad()
def sample_batch(model: Any, input_ids: torch.LongTensor, seed: int, batch: int, *, temperature: float,
                 top_p: float, max_new_tokens: int, pad_id: int) -> list[list[int]]:
    """Batch ``batch``'s sampled continuations of ``input_ids`` (:func:`query_inputs`), ``[B][<= max_new_tokens]``
    token ids: a function of the seed and the batch's index (the same model, dtype and threads give the same ids in
    any process)."""
    torch.manual_seed(_batch_seed(seed, batch))
    input_ids = input_ids.to(next(model.parameters()).device)
    out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                         temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens,
                         pad_token_id=pad_id)
    return out[:, input_ids.shape[1]:].tolist()


SAMPLING = ("batch_size", "temperature", "top_p", "max_new_tokens")  # sample_prompts' options that shape a batch


def batch_sampler(model: Any, tokenizer: Any, seed: int, *, batch_size: int, temperature: float, top_p: float,
                  max_new_tokens: int) -> Callable[[int], list[list[int]]]:
    """``sampled(batch)`` -> :func:`sample_batch` of ``model`` for batch index ``batch``: what :func:`sample_prompts`
    samples in this process (its options :data:`SAMPLING`)."""
    input_ids, pad_id = query_inputs(tokenizer, batch_size), pad_id_of(model, tokenizer)  # [B, P]

    def sampled(batch: int) -> list[list[int]]:
        return sample_batch(model, input_ids, seed, batch, temperature=temperature, top_p=top_p,
                            max_new_tokens=max_new_tokens, pad_id=pad_id)

    return sampled


def first_batch(rows: list[dict]) -> int:
    """The batch a run resumes from: its file's last (sampled again, its written rows skipped), else 0."""
    return max((row["batch"] for row in rows), default=0)


@torch.no_grad()
def sample_prompts(
    model: Any,
    tokenizer: Any,
    out_path: str | Path,
    count: int,
    *,
    seed: int = 0,
    batch_size: int = 64,
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    top_p: float = 0.95,
    min_words: int = 4,
    exclude: Iterable[str] = (),
    shingle: int = 8,
    max_batches: int | None = None,
    progress: bool = True,
    sampled: Callable[[int], list[list[int]]] | None = None,
) -> Path:
    """Append ``{"id", "category": "self-written", "prompt", "batch"}`` rows to ``out_path`` until it holds
    ``count`` prompts.

    Args:
        count (`int`): prompts wanted in the file (rows already there count; resumes).
        seed (`int`, defaults to 0): batch ``b`` samples with the generator seeded from ``(seed, b)``.
        max_new_tokens (`int`, defaults to 96): a message must end within this many tokens; longer ones are
            dropped rather than cut.
        temperature, top_p: the sampling; 1.0 and 0.95 keep the model's own spread of topics.
        exclude (`Iterable[str]`): texts never to train on (the benchmark's questions); a message sharing
            any run of ``shingle`` words with one of them is dropped.
        max_batches (`int`, *optional*): give up with an error after this many batches in one call
            (default: enough for ``count`` prompts if one in ten is kept).
        sampled (*optional*): ``sampled(batch)`` -> that batch's :func:`sample_batch` (e.g. from other processes,
            each with its own copy of the model); default: sampled here.
    """
    if count < 1 or batch_size < 1 or min_words < 0 or shingle < 1:
        raise ValueError(f"sample_prompts(count={count}, batch_size={batch_size}, min_words={min_words}, "
                         f"shingle={shingle}): count, batch size and shingle must be >= 1, min_words >= 0")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    rows = read_jsonl(out_path) if out_path.exists() else []
    written = {row["id"] for row in rows}
    strangers = [i for i in written if not str(i).startswith(f"self-s{seed}-")]
    if strangers:
        raise ValueError(f"{out_path} holds rows that are not this run's (e.g. id {strangers[0]!r}; this run writes "
                         f"self-s{seed}-...): resume with the seed that wrote it, or write to a new file")
    seen = {" ".join(_words(row["prompt"])) for row in rows}
    banned = shingles(exclude, shingle)
    batch = first_batch(rows)
    eos_ids = eos_ids_of(model)
    if sampled is None:
        sampled = batch_sampler(model, tokenizer, seed, batch_size=batch_size, temperature=temperature, top_p=top_p,
                                max_new_tokens=max_new_tokens)
    limit = max_batches if max_batches is not None else 10 * -(-count // batch_size) + 10
    start, tried = time.perf_counter(), 0
    with open(out_path, "a", encoding="utf-8") as f:
        while len(rows) < count:
            if tried >= limit:
                raise RuntimeError(f"only {len(rows)} of {count} prompts after {tried} batches of {batch_size}: the "
                                   "model's messages are mostly cut off, short or repeated (raise max_new_tokens, "
                                   "lower min_words, or use another prompt source)")
            for i, seq in enumerate(sampled(batch)):
                row_id = f"self-s{seed}-b{batch:05d}-{i:03d}"
                if row_id in written:
                    continue  # the last batch of an interrupted run, sampled again
                end = next((j for j, token in enumerate(seq) if token in eos_ids), None)
                if end is None:
                    continue  # cut off by the length limit
                text = tokenizer.decode(seq[:end], skip_special_tokens=True).strip()
                words = _words(text)
                key = " ".join(words)
                if len(words) < min_words or key in seen or banned & shingles([text], shingle):
                    continue
                seen.add(key)
                row = {"id": row_id, "category": "self-written", "prompt": text, "batch": batch}
                rows.append(row)
                f.write(json.dumps(row) + "\n")
                if len(rows) == count:
                    break
            f.flush()
            batch, tried = batch + 1, tried + 1
            if progress:
                rate = tried * batch_size / (time.perf_counter() - start)
                print(f"sample-prompts: {len(rows)}/{count} prompts kept ({rate:.2f} sampled/s)", flush=True)
    return out_path
