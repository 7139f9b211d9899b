"""Training time for ``--max-minutes``, a pause left out.

A long run on a shared machine is paused for a while (``kill -STOP`` on its processes while something is timed
alone, a laptop's sleep), and a budget in wall time would lose that whole pause. The loops tick a
:class:`TrainClock` after every batch and after every validation; a span far longer than its kind usually takes
(``slack`` x its running mean, and at least ``floor`` seconds) counts only what the process computed in it (its CPU
time): a stopped process computes nothing, a slow one (a validation of many prompts, a machine shared with other
work) still counts what it ran. The CPU training agenda (``tools/cpu_train.py``) counts its steps with one too.
"""

from __future__ import annotations

import time

import torch


class TrainClock:
    """Seconds trained over every run of one ``--out``: ``before`` (the checkpoint's) plus this run's spans.

    ``tick(kind)`` ends the span since the previous tick, of kind ``"step"`` (a batch) or ``"validation"``, and
    returns the total. A span counts whole up to ``max(floor, slack x mean of its kind)``; past that, the larger of
    that cap and the process's CPU time in it (a pause: ~0; busy work: itself)."""

    def __init__(self, before: float = 0.0, *, floor: float = 60.0, slack: float = 10.0):
        if floor <= 0 or slack < 1:
            raise ValueError(f"TrainClock(floor={floor!r}, slack={slack!r}): floor > 0 and slack >= 1, e.g. 60 and 10.")
        self.seconds, self.floor, self.slack = float(before), floor, slack
        self._mean: dict[str, float] = {}
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def tick(self, kind: str = "step") -> float:
        wall, cpu = time.perf_counter(), time.process_time()
        span, computed = wall - self._wall, cpu - self._cpu
        self._wall, self._cpu = wall, cpu
        mean = self._mean.get(kind)
        cap = self.floor if mean is None else max(self.floor, self.slack * mean)
        counted = span if span <= cap else max(cap, min(span, computed))
        self._mean[kind] = counted if mean is None else 0.9 * mean + 0.1 * counted
        self.seconds += counted
        return self.seconds


def budget_spent(clock: TrainClock, max_minutes: float | None, accelerator) -> bool:
    """Whether ``--max-minutes`` is spent, agreed by every process (the clocks of processes differ a little, and one
    stopping alone would leave the others waiting at their next collective)."""
    if max_minutes is None:
        return False
    return agreed(clock.seconds > 60 * max_minutes, accelerator)


def save_due(clock: TrainClock, saved_at: float, save_minutes: float | None, accelerator) -> bool:
    """Whether ``--save-minutes`` of training time passed since the training state was last saved (``saved_at``,
    the clock's seconds then), agreed by every process: a run killed between two validations (a session's end, a
    lost machine) then resumes at most that much training behind, where it had resumed at the last validation."""
    if save_minutes is None:
        return False
    return agreed(clock.seconds - saved_at >= 60 * save_minutes, accelerator)


def agreed(flag: bool, accelerator) -> bool:
    """``flag`` of any process, for every process (one that saves or stops alone leaves the others waiting)."""
    if accelerator.num_processes > 1:
        flag = bool(accelerator.reduce(torch.tensor(float(flag), device=accelerator.device), "sum"))
    return flag
