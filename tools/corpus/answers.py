"""Stage 2: the target's greedy answers to the prompt list, by ``hf-speculative self-distill``'s own function
(:func:`hf_speculative.training.selfdistill.generate_responses`): batched, appended as each batch finishes, and
resumed by prompt id, so a run stopped anywhere, or asked later for a larger corpus, answers only what is missing.

The held-out prompts are answered first (a few hundred; validation data exists from the first minutes), then the
training prompts in the list's order, ``chunk`` prompts per call so that the manifest is brought up to date
between calls. With ``processes`` > 1 (:func:`answer_in_processes`) each process takes every N-th chunk, each
with its own copy of the target and one thread: on a CPU, batched decoding of a small model is bound by each
core's arithmetic, so two one-thread processes answer nearly twice as fast as one two-thread one. They append
to the same files, a batch's rows in one ``write`` to a file opened for appending, so rows never interleave.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .files import SPLITS, answers_path, prompts_path, read_rows, repair_tail

CHUNK = 2048  # prompts per generate_responses call (two of its default sort windows)


def load_target(target: str, *, cpu_layout: str = "auto", threads: int | None = None, device: str = "cpu",
                dtype: str | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from the registry (name, folder or Hub id), in eval mode, on the CPU path asked for,
    or on ``device``.

    Args:
        cpu_layout (`str`, defaults to `"auto"`): ``"auto"``: ``hfs.optimize_for_cpu(model)`` (hf_speculative's
            CPU kernel and native decoder layers where they run, else the column-major layout, with a warning that
            says why); or one of ``hf_speculative.cpu.layout.LAYOUT_NAMES`` (``"none"``: the model as loaded). On
            another device than the CPU, ``"auto"`` and ``"none"`` leave the model as loaded.
        device (`str`, defaults to `"cpu"`): where the model runs (``"cuda"``, ``"cuda:1"``, ...).
        dtype (`str`, *optional*): ``float32``, ``bfloat16``, ``float16`` or ``auto`` (the checkpoint's); default as
            ``hfs.load_model``: float32 on the CPU, the checkpoint's elsewhere.
    """
    import torch

    from hf_speculative.cpu.layout import LAYOUT_NAMES, apply_layout, optimize_for_cpu
    from hf_speculative.registry.models import load_model

    if cpu_layout != "auto" and cpu_layout not in LAYOUT_NAMES:
        raise ValueError(f"--cpu-layout {cpu_layout}: use auto or one of {', '.join(LAYOUT_NAMES)}")
    on_cpu = torch.device(device).type == "cpu"
    if not on_cpu and cpu_layout not in ("auto", "none"):
        raise ValueError(f"--cpu-layout {cpu_layout} with --device {device}: a CPU layout is for the CPU; leave it "
                         "out (auto) on another device")
    if dtype not in (None, "auto", "float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype {dtype}: use float32, bfloat16, float16 or auto (the checkpoint's)")
    if threads:
        torch.set_num_threads(threads)
    model, tokenizer = load_model(target, device=None if on_cpu else device, dtype=dtype)
    model.eval()
    if not on_cpu:
        return model, tokenizer
    if cpu_layout == "auto":
        optimize_for_cpu(model)
    else:
        apply_layout(model, cpu_layout)
    return model, tokenizer


def repair_answers(path: Path) -> None:
    """Cut a stopped run's unfinished last row of an answers file, saying so (its prompt is answered again)."""
    if repair_tail(path):
        print(f"{path}: cut its last, unfinished row (a stopped run); answering it again", flush=True)


def answer_all(out: Path, model: Any, tokenizer: Any, *, max_new_tokens: int, batch_size: int,
               max_prompt_tokens: int, sort_window: int = 1024, chunk: int = CHUNK, progress: bool = True,
               after_chunk: Callable[[], None] = lambda: None, deadline: float | None = None,
               shard: tuple[int, int] = (0, 1)) -> bool:
    """Answer every prompt of both splits that has no answer yet (held-out first), ``after_chunk()`` after each
    call that wrote answers; ``chunk`` prompts a call (at least two batches). With ``deadline`` (a
    ``time.perf_counter()`` value), no call starts after it. ``shard`` ``(index, count)``: this process answers
    the chunks ``index``, ``index + count``, ... of the held-out then training chunks (the others are another
    process's). Returns whether every prompt of this process's chunks has its answer."""
    from hf_speculative.training.selfdistill import generate_responses

    index, count = shard
    chunk = max(chunk, 2 * batch_size)
    number = -1
    for split in ("held_out", "train"):
        rows, path = read_rows(prompts_path(out, split)), answers_path(out, split)
        if count == 1:  # several processes start together, with whole rows (one write each)
            repair_answers(path)
        done = {row["id"] for row in read_rows(path)}
        for start in range(0, len(rows), chunk):
            number += 1
            part = rows[start: start + chunk]
            if number % count != index or all(row["id"] in done for row in part):
                continue
            if deadline is not None and time.perf_counter() >= deadline:
                return False
            generate_responses(model, tokenizer, part, path, max_new_tokens=max_new_tokens, batch_size=batch_size,
                               max_prompt_tokens=max_prompt_tokens, sort_window=sort_window, progress=progress,
                               label="" if count == 1 else f" (process {index + 1} of {count})")
            done.update(row["id"] for row in part)
            after_chunk()
    return True


def _answer_shard(out: Path, load: dict, answer: dict, shard: tuple[int, int], seconds: float | None) -> bool:
    """A process of :func:`answer_in_processes`: its own target (``load``: :func:`load_target`'s arguments), its
    chunks; ``seconds``: no chunk starts after this long."""
    model, tokenizer = load_target(**load)
    deadline = None if seconds is None else time.perf_counter() + seconds
    return answer_all(out, model, tokenizer, shard=shard, deadline=deadline, **answer)


def answer_in_processes(out: Path, processes: int, load: dict, answer: dict, *, here: Callable[[], tuple[Any, Any]],
                        after_chunk: Callable[[], None], deadline: float | None = None) -> bool:
    """:func:`answer_all` shared by ``processes`` one-thread processes: this one, with the target ``here()``
    returns, and ``processes - 1`` started here, each loading its own by :func:`load_target` (``load``'s
    arguments); each takes every ``processes``-th chunk. ``answer``: :func:`answer_all`'s other keyword
    arguments. The manifest is brought up to date (``after_chunk``) after each of this process's chunks and at
    the end. A failed process is raised once this one has finished its chunks (every answer written is kept;
    the same command goes on).

    Returns whether every prompt has its answer."""
    import multiprocessing

    import torch

    if processes < 2:
        raise ValueError(f"answer_in_processes(processes={processes}): use answer_all for one process")
    seconds = None if deadline is None else max(deadline - time.perf_counter(), 0.0)
    load = {**load, "threads": 1}
    for split in SPLITS:  # before any process appends
        repair_answers(answers_path(out, split))
    context = multiprocessing.get_context("spawn")  # no fork of a process holding a model and OpenMP threads
    with context.Pool(processes - 1) as pool:
        others = [pool.apply_async(_answer_shard, (out, load, answer, (index, processes), seconds))
                  for index in range(1, processes)]
        torch.set_num_threads(1)
        model, tokenizer = here()
        complete = answer_all(out, model, tokenizer, shard=(0, processes), deadline=deadline,
                              after_chunk=after_chunk, **answer)
        for other in others:
            complete = other.get() and complete
    after_chunk()
    return complete


def progress(out: Path) -> dict:
    """What the answer files hold: answers per split and per source, and tokens (prompts', answers', all)."""
    per_split, per_source = dict.fromkeys(SPLITS, 0), {}
    prompt_tokens = response_tokens = 0
    for split in SPLITS:
        seen = set()
        for row in read_rows(answers_path(out, split)):
            if row["id"] in seen:  # never written twice by the resuming writer; counted once if it were
                continue
            seen.add(row["id"])
            per_split[split] += 1
            per_source[row.get("source", "?")] = per_source.get(row.get("source", "?"), 0) + 1
            prompt_tokens += len(row["prompt_tokens"])
            response_tokens += len(row["response_tokens"])
    return {"done": sum(per_split.values()), "by_split": per_split, "by_source": dict(sorted(per_source.items())),
            "tokens": {"prompts": prompt_tokens, "answers": response_tokens, "total": prompt_tokens + response_tokens}}
