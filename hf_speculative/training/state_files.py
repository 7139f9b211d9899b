"""The training state on disk (``OUT/checkpoint``), replaced whole or not at all.

accelerate's ``save_state`` writes its files one by one into the folder it is given; written over the last checkpoint,
a run killed in the middle of a save (a session's end, ``--save-minutes`` makes saves frequent) left a folder of new and
old files with the old ``progress.json``: a resume then loaded weights that did not match its counters, or failed on a
half-written file. So a save goes to ``OUT/checkpoint.incoming``, ``progress.json`` is written there last (the mark of a
complete copy), and the folders are swapped by renames; a run's start finishes a swap that a kill interrupted and
drops an incomplete copy (:func:`recover`), so the checkpoint a resume reads is always one whole save.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .clock import TrainClock, save_due

PROGRESS = "progress.json"  # our counters; in the incoming folder, written last


def incoming_of(state_dir: Path) -> Path:
    return state_dir.with_name(state_dir.name + ".incoming")


def replaced_of(state_dir: Path) -> Path:
    return state_dir.with_name(state_dir.name + ".replaced")


class Saves:
    """A run's saves of its training state: each one whole (:func:`save_state`), with the time trained, and when the
    next is due (``--save-minutes`` of training since the last one, every process agreeing: ``clock.save_due``)."""

    def __init__(self, accelerator, state_dir: Path, clock: TrainClock, save_minutes: float | None):
        self.accelerator, self.state_dir, self.clock, self.save_minutes = accelerator, state_dir, clock, save_minutes
        self.saved_at = clock.seconds  # the clock's seconds at the last save (a resumed run's at its checkpoint)

    def save(self, progress: dict) -> None:
        """``progress`` (the loop's counters) and ``train_seconds`` (what ``--max-minutes`` counts) with accelerate's
        state. Every process calls it."""
        save_state(self.accelerator, self.state_dir, {**progress, "train_seconds": self.clock.seconds})
        self.saved_at = self.clock.seconds

    def due(self) -> bool:
        return save_due(self.clock, self.saved_at, self.save_minutes, self.accelerator)


def save_state(accelerator, state_dir: Path, progress: dict) -> None:
    """accelerate's state of every process and ``progress`` into ``state_dir``, replacing what was there only once
    the new copy is complete. Every process calls it."""
    incoming = incoming_of(state_dir)
    if accelerator.is_main_process and incoming.exists():
        shutil.rmtree(incoming)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(incoming))
    accelerator.wait_for_everyone()  # every process's random states written
    if accelerator.is_main_process:
        (incoming / PROGRESS).write_text(json.dumps(progress))
        promote(state_dir)
    accelerator.wait_for_everyone()  # nobody reads the checkpoint before the swap


def promote(state_dir: Path) -> None:
    """Make a complete ``state_dir.incoming`` the checkpoint (the previous one removed), drop an incomplete one, and
    finish a swap a kill interrupted; idempotent, so it runs at every start too."""
    incoming, replaced = incoming_of(state_dir), replaced_of(state_dir)
    if not (incoming / PROGRESS).is_file():  # no new copy, or a save cut short: the checkpoint stays as it is
        if incoming.exists():
            shutil.rmtree(incoming)
        if replaced.exists() and not state_dir.exists():  # (a copy never leaves this state; kept safe anyway)
            replaced.rename(state_dir)
        elif replaced.exists():
            shutil.rmtree(replaced)
        return
    if state_dir.exists():
        if replaced.exists():
            shutil.rmtree(replaced)
        state_dir.rename(replaced)
    incoming.rename(state_dir)
    if replaced.exists():
        shutil.rmtree(replaced)


def recover(accelerator, state_dir: Path) -> None:
    """At a run's start, before anything reads ``state_dir``: :func:`promote` on the main process. Every process calls
    it."""
    if accelerator.is_main_process:
        promote(state_dir)
    accelerator.wait_for_everyone()
