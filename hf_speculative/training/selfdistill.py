"""Self-distillation data: the target's own greedy answers to a prompt list.

An EAGLE drafter predicts the target's next features and tokens, so the best training text is what
the target itself writes. Answers are generated in batches (left padding, prompts sorted by length
so that batches pad little, each row run only until it ends: :mod:`~hf_speculative.training.batch_greedy`) and
appended to a JSONL file as they finish, so an interrupted run resumes where it stopped. Prompts are sorted
within windows of the list, not across all of it, so that a run stopped early holds a fair sample of the list
instead of its shortest prompts only.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterable

import torch

from .. import compat
from .batch_greedy import greedy_rows, plain_greedy
from .data import numbered_rows


def chat_text(tokenizer: Any, prompt: str) -> str:
    """The prompt as the model sees it: its chat template when it has one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return prompt


def read_jsonl(path: str | Path) -> list[dict]:
    return [row for _, row in numbered_rows(path)]


@torch.no_grad()
def generate_responses(
    model: Any,
    tokenizer: Any,
    prompts: Iterable[dict],
    out_path: str | Path,
    *,
    max_new_tokens: int = 256,
    batch_size: int = 16,
    max_prompt_tokens: int = 1024,
    sort_window: int = 1024,
    progress: bool = True,
    shard: tuple[int, int] = (0, 1),
    label: str = "",
) -> Path:
    """Append ``{"id", "category", "prompt", "text", "response", "prompt_tokens", "response_tokens"}`` rows to
    ``out_path`` for every prompt whose id is not there yet.

    ``text`` is the full chat-formatted prompt followed by the answer; ``prompt_tokens`` /
    ``response_tokens`` are the token ids of the two parts (the answer includes its EOS when the
    model stopped), so training never re-tokenizes and the split is exact.

    Args:
        sort_window (`int`, defaults to 1024): prompts are taken ``sort_window`` at a time in the list's
            order, and sorted by length inside each window for batching; 0 sorts the whole list.
        shard (`tuple[int, int]`, defaults to `(0, 1)`): ``(index, count)``: with ``count > 1`` this process
            answers every ``count``-th batch from the ``index``-th, of the batches one process would make of
            the prompts not in ``out_path``, into its own part file (:func:`part_path`), for
            :func:`merge_parts` to append to ``out_path`` once every process is done.
        label (`str`, defaults to `""`): added to the progress lines (which process writes them).

    A batch's rows are appended in one ``write`` to the file opened for appending, so processes that answer
    different prompts into the same file never interleave their rows.
    """
    index, count = shard
    if batch_size < 1 or sort_window < 0 or not 0 <= index < count:
        raise ValueError(f"generate_responses(batch_size={batch_size}, sort_window={sort_window}, shard={shard}): the "
                         "batch size must be >= 1, the window >= 0 (0: the whole list) and 0 <= index < count.")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = {row["id"] for row in read_jsonl(out_path)} if out_path.exists() else set()
    todo = []
    for row in prompts:
        if row["id"] in done:
            continue
        ids = tokenizer(chat_text(tokenizer, row["prompt"]), add_special_tokens=False)["input_ids"]
        if len(ids) <= max_prompt_tokens:
            todo.append((row, ids))
    window = sort_window or max(len(todo), 1)
    todo = [item for w in range(0, len(todo), window)
            for item in sorted(todo[w: w + window], key=lambda item: len(item[1]))]
    if count > 1:  # the batches of one process, dealt out; positions say where each row goes back
        target = part_path(out_path, index, count)
        mine = {row["id"] for row in read_jsonl(target)} if target.exists() else set()
        todo = [(dict(row, _position=p), ids) for b in range(index * batch_size, len(todo), count * batch_size)
                for p, (row, ids) in enumerate(todo[b : b + batch_size], start=b) if row["id"] not in mine]
        done, out_path = done | mine, target
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = set(compat.eos_token_ids(model.generation_config))
    scored = plain_greedy(model.generation_config)
    device = next(model.parameters()).device
    start, written = time.perf_counter(), 0
    if count > 1:
        label = label or f" (process {index + 1} of {count})"
    with open(out_path, "ab", buffering=0) as f:
        for b in range(0, len(todo), batch_size):
            batch = todo[b : b + batch_size]
            input_ids, mask = left_padded([ids for _, ids in batch], pad_id)
            width = input_ids.shape[1]
            if scored:  # the generation config changes greedy's scores: transformers' own loop applies it
                out = model.generate(
                    input_ids=input_ids.to(device), attention_mask=mask.to(device), do_sample=False,
                    max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                )
                answers = out[:, width:].tolist()
            else:  # the same tokens, each row run only until it ends
                answers = greedy_rows(model, input_ids.to(device), mask.to(device), max_new_tokens=max_new_tokens,
                                      eos_ids=eos_ids)
            lines = []
            for (row, ids), seq in zip(batch, answers):
                response = []
                for token in seq:
                    response.append(token)
                    if token in eos_ids:
                        break
                text = tokenizer.decode(ids + response)
                answer = tokenizer.decode(response, skip_special_tokens=True)
                lines.append(json.dumps({**row, "text": text, "response": answer, "prompt_tokens": ids,
                                         "response_tokens": response}) + "\n")
            _append(f.fileno(), "".join(lines).encode("utf-8"))
            written += len(lines)
            if progress:
                rate = written / (time.perf_counter() - start)
                print(f"self-distill{label}: {len(done) + written}/{len(done) + len(todo)} answers ({rate:.2f}/s)",
                      flush=True)
    return out_path


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    """The prompts' ids as one batch: ``input_ids`` padded on the left with ``pad_id`` and its ``attention_mask``,
    both `[B, T]` (``T`` the longest prompt)."""
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [B, T] left-padded
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, ids in enumerate(prompts):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        mask[i, width - len(ids) :] = 1
    return input_ids, mask


def _append(fd: int, data: bytes) -> None:
    """``data`` at the end of the file ``fd`` (opened for appending) in one ``write``; the rest, should a write
    take only part of it (a full disk, a signal), in further ones."""
    while data:
        data = data[os.write(fd, data):]


def part_path(out_path: str | Path, index: int, count: int) -> Path:
    """Where process ``index`` of ``count`` writes its answers before they are merged into ``out_path``."""
    out_path = Path(out_path)
    return out_path.with_name(f"{out_path.name}.part{index}-of-{count}")


def merge_parts(out_path: str | Path, count: int) -> int:
    """Append the rows of the ``count`` part files to ``out_path`` in the order one process would have
    written them (skipping ids already there, so an interrupted merge can run again), then delete
    the parts. Returns the rows appended."""
    out_path = Path(out_path)
    parts = [part_path(out_path, i, count) for i in range(count)]
    rows = sorted((row for part in parts if part.exists() for row in read_jsonl(part)), key=lambda r: r["_position"])
    done = {row["id"] for row in read_jsonl(out_path)} if out_path.exists() else set()
    added = 0
    with open(out_path, "a", encoding="utf-8") as f:
        for row in rows:
            if row["id"] not in done:
                row.pop("_position")
                f.write(json.dumps(row) + "\n")
                done.add(row["id"])
                added += 1
    for part in parts:
        part.unlink(missing_ok=True)
    return added
