"""The target's own messages (Magpie) sampled by several one-thread processes, the file still one process's.

``hf_speculative.training.magpie.sample_prompts`` writes a file in batch order, each batch's messages a function of
the seed and the batch's index alone (``sample_batch``). With ``N`` processes, this one samples batches
``0, N, 2N, ...`` (from the batch a run resumes at) and filters every batch in order as before; helper ``k`` (started
here, its own copy of the target, one thread) samples batches ``k, k + N, ...`` into ``raw/magpie.part<k>.jsonl``
(one ``{"batch", "sequences"}`` row a batch, one write each), at most ``AHEAD`` of its batches beyond the one this
process is filtering, and is stopped once the file holds its messages. The messages kept, and the file, are the
same as one one-thread process writes. The part files are scratch: removed before the helpers start and after they
stop.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

AHEAD = 2  # batches a helper samples beyond the one being filtered (each is wasted if the file fills first)
POLL_S = 0.05


def part_path(path: Path, k: int) -> Path:
    return Path(path).with_name(f"{Path(path).stem}.part{k}.jsonl")


def _helper(load: dict, path: str, k: int, processes: int, start: int, seed: int, options: dict, current: Any,
            stop: Any, parent: int) -> None:
    """Helper ``k``: batches ``b >= start`` with ``b % processes == k``, each at most ``AHEAD * processes`` past
    ``current`` (the batch the main process filters), until ``stop`` is set or process ``parent`` is gone (killed
    outright, it stops nothing itself)."""
    import torch

    from hf_speculative.training.magpie import SAMPLING, batch_sampler
    from tools.corpus.answers import load_target

    torch.set_num_threads(1)
    model, tokenizer = load_target(**load, threads=1)
    sampled = batch_sampler(model, tokenizer, seed, **{key: options[key] for key in SAMPLING})
    batch = start + (k - start) % processes
    fd = os.open(part_path(Path(path), k), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while not stop.is_set() and os.getppid() == parent:
            if batch > current.value + AHEAD * processes:
                time.sleep(POLL_S)
                continue
            data = (json.dumps({"batch": batch, "sequences": sampled(batch)}) + "\n").encode()
            while data:  # one row a write; a short write goes on where it stopped
                data = data[os.write(fd, data):]
            batch += processes
    finally:
        os.close(fd)


class Parts:
    """``sampled(batch)`` for ``sample_prompts``: batches ``b % processes == 0`` sampled by ``here(b)``, the others
    read from their helper's part file as it writes them (a helper that died is raised with its exit code)."""

    def __init__(self, path: Path, processes: int, here: Any, helpers: list, current: Any):
        self.path, self.processes, self.here, self.helpers, self.current = Path(path), processes, here, helpers, current
        self.read: dict[int, list[list[int]]] = {}
        self.offsets = [0] * processes

    def __call__(self, batch: int) -> list[list[int]]:
        self.current.value = batch
        k = batch % self.processes
        if k == 0:
            return self.here(batch)
        while batch not in self.read:
            if not self._read(k):
                helper = self.helpers[k - 1]
                if not helper.is_alive() and not self._read(k):
                    raise RuntimeError(f"magpie: helper process {k} stopped (exit code {helper.exitcode}) before "
                                       f"batch {batch}; its error is printed above. Run the same command again: the "
                                       "messages written are kept")
                time.sleep(POLL_S)
        return self.read.pop(batch)

    def _read(self, k: int) -> bool:
        """Read helper ``k``'s whole new rows; whether there were any."""
        path = part_path(self.path, k)
        if not path.exists():
            return False
        with open(path, "rb") as f:
            f.seek(self.offsets[k])
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]
        self.offsets[k] += len(whole)
        for line in whole.splitlines():
            row = json.loads(line)
            self.read[row["batch"]] = row["sequences"]
        return bool(whole)


def sample_in_processes(path: Path, count: int, processes: int, load: dict, here: Any, seed: int,
                        options: dict) -> None:
    """``sample_prompts(..., path, count, seed=seed, **options)`` with ``processes - 1`` helpers started here (each
    loading its target with :func:`~tools.corpus.answers.load_target`'s ``load`` arguments, one thread); ``here()``
    -> ``(model, tokenizer)``, this process's target, run with one thread."""
    import torch

    from hf_speculative.training.magpie import SAMPLING, batch_sampler, first_batch, read_jsonl, sample_prompts

    if processes < 2:
        raise ValueError(f"sample_in_processes(processes={processes}): use sample_prompts for one process")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    model, tokenizer = here()
    start = first_batch(read_jsonl(path) if path.exists() else [])
    mine = batch_sampler(model, tokenizer, seed, **{key: options[key] for key in SAMPLING})
    for k in range(1, processes):
        part_path(path, k).unlink(missing_ok=True)
    context = multiprocessing.get_context("spawn")  # no fork of a process holding a model and OpenMP threads
    current, stop = context.Value("q", start), context.Event()
    helpers = [context.Process(target=_helper, args=(load, str(path), k, processes, start, seed, options, current,
                                                     stop, os.getpid()), daemon=True) for k in range(1, processes)]
    for helper in helpers:
        helper.start()
    try:
        sample_prompts(model, tokenizer, path, count, seed=seed, exclude=(),
                       sampled=Parts(path, processes, mine, helpers, current), **options)
    finally:
        stop.set()
        for helper in helpers:  # a batch it is still sampling is not needed
            helper.terminate()
            helper.join()
        for k in range(1, processes):
            part_path(path, k).unlink(missing_ok=True)
