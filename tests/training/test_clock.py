"""``TrainClock``: ``--max-minutes`` counts the time a run trained, not a pause (``kill -STOP``) in it; ``--save-minutes``
counts the same time since the last save, and every process agrees on both."""

from __future__ import annotations

import types

import pytest
import torch

from hf_speculative.training import clock as clock_module
from hf_speculative.training.clock import TrainClock, budget_spent, save_due


class FakeTime:
    """Wall and CPU clocks moved by hand: ``run(s)`` computes for s seconds, ``stop(s)`` is stopped for s."""

    def __init__(self, monkeypatch):
        self.wall = self.cpu = 0.0
        monkeypatch.setattr(clock_module.time, "perf_counter", lambda: self.wall)
        monkeypatch.setattr(clock_module.time, "process_time", lambda: self.cpu)

    def run(self, seconds: float) -> None:
        self.wall += seconds
        self.cpu += seconds

    def stop(self, seconds: float) -> None:
        self.wall += seconds


def test_spans_count_whole_and_a_pause_counts_at_most_the_cap(monkeypatch):
    fake = FakeTime(monkeypatch)
    clock = TrainClock(100.0)  # a resumed run: the checkpoint's seconds first
    for _ in range(20):
        fake.run(2.0)
        clock.tick()
    assert clock.seconds == pytest.approx(140.0)
    fake.run(1.0)
    fake.stop(3600.0)  # stopped for an hour in the middle of a step
    fake.run(1.0)
    clock.tick()
    assert 142.0 <= clock.seconds <= 140.0 + 60.0  # the step's 2 s, and no more than the floor of the pause
    fake.run(2.0)
    assert clock.tick() == pytest.approx(clock.seconds)


def test_a_long_span_the_process_computed_counts_whole(monkeypatch):
    """The first validation (no mean yet) and a step slowed by a shared machine: long, but computed, so counted."""
    fake = FakeTime(monkeypatch)
    clock = TrainClock()
    fake.run(600.0)
    assert clock.tick("validation") == pytest.approx(600.0)
    for _ in range(5):
        fake.run(1.0)
        clock.tick()
    fake.run(300.0)  # ten times a step's time and more, all computing
    assert clock.tick() == pytest.approx(905.0)
    fake.run(590.0)  # the next validation, like the first: within its own kind's cap
    fake.stop(10.0)
    assert clock.tick("validation") == pytest.approx(1505.0)


def test_a_wait_on_other_processes_counts_up_to_the_cap(monkeypatch):
    """Blocked on a collective (no CPU): counted up to its kind's usual time, never beyond the span."""
    fake = FakeTime(monkeypatch)
    clock = TrainClock()
    fake.stop(30.0)
    assert clock.tick("validation") == pytest.approx(30.0)
    fake.stop(500.0)
    assert clock.tick("validation") == pytest.approx(330.0)  # 30 s, then 10 x the mean of 30 s


def test_budget_spent_one_process(monkeypatch):
    fake = FakeTime(monkeypatch)
    clock = TrainClock(59.0)
    one = types.SimpleNamespace(num_processes=1)
    assert budget_spent(clock, None, one) is False
    assert budget_spent(clock, 1.0, one) is False
    fake.run(2.0)
    clock.tick()
    assert budget_spent(clock, 1.0, one) is True


def test_a_save_is_due_after_save_minutes_of_training_since_the_last(monkeypatch):
    fake = FakeTime(monkeypatch)
    clock = TrainClock(300.0)  # resumed: the clock's seconds go on from the checkpoint's
    one = types.SimpleNamespace(num_processes=1)
    saved_at = clock.seconds
    assert save_due(clock, saved_at, None, one) is False
    for _ in range(9):
        fake.run(5.0)
        clock.tick()
    fake.stop(3600.0)  # a pause is not training: it counts at most the clock's cap (60 s), not the hour
    clock.tick()
    assert clock.seconds < saved_at + 120 and save_due(clock, saved_at, 2.0, one) is False
    while clock.seconds < saved_at + 120:
        fake.run(10.0)
        clock.tick()
    assert save_due(clock, saved_at, 2.0, one) is True
    assert save_due(clock, clock.seconds, 2.0, one) is False


class TwoProcesses:
    """An accelerator of two processes whose other process says ``other`` (reduce sums the flags)."""

    num_processes, device = 2, torch.device("cpu")

    def __init__(self, other: bool):
        self.other = other

    def reduce(self, value, reduction):
        assert reduction == "sum"
        return value + float(self.other)


@pytest.mark.parametrize("mine, other", [(False, False), (True, False), (False, True), (True, True)])
def test_every_process_saves_and_stops_when_any_one_says_so(monkeypatch, mine, other):
    fake = FakeTime(monkeypatch)
    clock = TrainClock()
    fake.run(90.0 if mine else 30.0)
    clock.tick()
    assert save_due(clock, 0.0, 1.0, TwoProcesses(other)) is (mine or other)
    assert budget_spent(clock, 1.0, TwoProcesses(other)) is (mine or other)


@pytest.mark.parametrize("kwargs", [{"floor": 0}, {"slack": 0.5}])
def test_bad_settings_name_the_fix(kwargs):
    with pytest.raises(ValueError, match="e.g. 60 and 10"):
        TrainClock(**kwargs)
