"""A model's earlier outputs, for SuffixDecoding: a suffix trie over the last ``max_tokens`` tokens it generated
in this process, shared by its calls and threads, optionally kept in a file.

SuffixDecoding's "global tree" (arXiv 2411.04975): requests to one model often repeat each other (an agent's
tool calls, a document edited again and again), so what the model wrote before is a good draft of what it
writes next. Bounded in tokens: the oldest outputs are forgotten (their counts removed from the trie) once the
total passes ``max_tokens``, so the trie never holds more than ``depth * max_tokens`` nodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any, Iterator

from ...core.state import state_of
from ...registry import integrity
from .tree import SuffixTrie, best_speculation

FORMAT = "hf_speculative.suffix_history"
MAX_HISTORY_BYTES = 1 << 30  # a history's trie is kept under this many bytes (estimated): oldest outputs go first
HISTORY_NODE_BYTES = 320  # what one trie node costs, an upper estimate (measured: about 300 bytes in CPython 3.11)
MAX_HISTORY_FILE_BYTES = 64 << 20  # a history file is refused above this size, before it is read


class SuffixHistory:
    """The outputs one model generated, oldest first, in one suffix trie. Thread-safe.

    Two bounds, the oldest outputs forgotten first to keep both: ``max_tokens`` tokens, and a byte budget
    (``max_bytes``, default ``MAX_HISTORY_BYTES``) on the trie's estimated size (``HISTORY_NODE_BYTES`` per node).

    Args:
        depth (`int`): the trie's depth (``SuffixDecoding.max_depth``).
        max_tokens (`int`): tokens kept; older outputs are forgotten.
        path (`str`, *optional*): a JSON file the outputs are loaded from (if it exists) and saved to; a regular
            file of at most ``MAX_HISTORY_FILE_BYTES``.
        max_bytes (`int`, *optional*): the byte budget.
    """

    def __init__(self, depth: int, max_tokens: int, path: str | os.PathLike | None = None,
                 max_bytes: int | None = None):
        self.trie = SuffixTrie(depth)
        self.max_tokens = max_tokens
        self.max_bytes = MAX_HISTORY_BYTES if max_bytes is None else max_bytes
        self.path = None if path is None else Path(path)
        self.outputs: deque[list[int]] = deque()
        self.tokens = 0
        self.lock = threading.Lock()
        if self.path is not None and os.path.lexists(self.path):
            self._load()

    @property
    def bytes(self) -> int:
        """The trie's estimated size: ``HISTORY_NODE_BYTES`` per live node."""
        return self.trie.nodes * HISTORY_NODE_BYTES

    def add(self, output: list[int]) -> None:
        """Remember one output (its last ``max_tokens`` tokens), forget the oldest ones beyond the bound, and
        save the file if there is one."""
        with self.lock:
            if self._insert(output) and self.path is not None:
                self._save()

    def _insert(self, output: list[int]) -> bool:
        # at most the tokens whose nodes fit the byte budget (each adds up to ``depth`` nodes)
        keep = min(self.max_tokens, self.max_bytes // (HISTORY_NODE_BYTES * self.trie.depth))
        output = [int(t) for t in output[-keep:]] if keep else []
        if not output:
            return False
        self.outputs.append(output)
        self.trie.add(output)
        self.tokens += len(output)
        while self.outputs and (self.tokens > self.max_tokens or self.bytes > self.max_bytes):
            oldest = self.outputs.popleft()
            self.trie.remove(oldest)
            self.tokens -= len(oldest)
        return True

    def speculate(self, context: list[int], max_match: int, nodes, depth: int,
                  min_prob: float) -> tuple[int, list[int], list[int], list[float]]:
        """:func:`~hf_speculative.drafters.suffix.tree.best_speculation` over the suffixes of ``context`` (at
        most ``max_match`` long) seen in earlier outputs: ``(match length, tokens, parents, probs)``."""
        with self.lock:
            return best_speculation(self.trie, self.trie.matches(context, max_match), nodes, depth, min_prob)

    # -- the file ------------------------------------------------------------------------------------
    def _save(self) -> None:
        """Write the outputs as JSON, atomically (a reader never sees half a file)."""
        data = {"format": FORMAT, "version": 1, "outputs": list(self.outputs)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as file:
                json.dump(data, file)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def _load(self) -> None:
        what = f"SuffixDecoding(history_file={str(self.path)!r})"
        try:
            data = json.loads(integrity.read_capped(self.path, MAX_HISTORY_FILE_BYTES, what))
        except integrity.FileRefused:
            raise
        except (OSError, ValueError, RecursionError) as error:
            problem = str(error)[:200]
        else:
            outputs = data.get("outputs") if isinstance(data, dict) and data.get("format") == FORMAT else None
            valid = isinstance(outputs, list) and all(
                isinstance(o, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in o)
                for o in outputs)
            problem = None if valid else "not a list of token lists"
        if problem is not None:
            raise ValueError(f"SuffixDecoding(history_file={str(self.path)!r}): cannot read it as a suffix "
                             f"history ({problem}); pass a file written by SuffixDecoding, or a new path.")
        newest, tokens = [], 0
        for output in reversed(outputs):  # only the newest outputs within the bound are indexed
            if tokens >= self.max_tokens:
                break
            newest.append(output)
            tokens += len(output)
        for output in reversed(newest):
            self._insert(output)


@dataclasses.dataclass(eq=False)
class ModelHistories:
    """What SuffixDecoding keeps about a model, in its state (``state_of(model).drafter_state(ModelHistories)``;
    ``hfs.forget(model)`` drops it, and leaves the files as they are).

    Attributes:
        histories (`dict[tuple, SuffixHistory]`): the histories of its outputs, by trie depth, token bound and file
            (:func:`history_for`).
        held (`list`, *optional*): while :func:`outputs_held` runs, the outputs that join those histories when it ends
            (``None`` otherwise).
    """

    histories: dict = dataclasses.field(default_factory=dict)
    held: list | None = None


def history_for(model: Any, depth: int, max_tokens: int, path: str | os.PathLike | None) -> SuffixHistory:
    """The history of ``model``'s outputs for these settings, made (and loaded from ``path``) on first use; one
    per model, trie depth, token bound and file, kept in the model's state (``core.state``) as long as the model
    lives or until ``hfs.forget(model)`` (which leaves files as they are)."""
    key = (depth, max_tokens, None if path is None else os.path.abspath(os.fspath(path)))
    state = state_of(model)
    with state.lock:
        histories = state.drafter_state(ModelHistories).histories
        history = histories.get(key)
        if history is None:
            history = histories[key] = SuffixHistory(depth, max_tokens, path)
        return history


def add_output(model: Any, history: SuffixHistory, output: list[int]) -> None:
    """A call's output joins ``history`` now, or when the :func:`outputs_held` block running on ``model`` ends."""
    state = state_of(model)
    with state.lock:
        own = state.drafter_state(ModelHistories)
        if own.held is not None:
            own.held.append((history, output))
            return
    history.add(output)


@contextlib.contextmanager
def outputs_held(model: Any, keep: bool = True) -> Iterator[None]:
    """Within the block, no call on ``model`` adds its output to the model's SuffixDecoding histories; at its end
    the outputs join them in order (each distinct output once), or are dropped with ``keep=False``.

    For measuring: the repeats of one prompt then draft from the same history (the earlier prompts' outputs,
    never their own previous run, which a repeat would otherwise copy whole: τ 8 on a 128-token answer), and a
    warm-up under ``keep=False`` leaves no trace. A block inside another one changes nothing (the outer one
    holds)."""
    state = state_of(model)
    with state.lock:
        own = state.drafter_state(ModelHistories)
        outer = own.held is not None
        if not outer:
            own.held = []
    if outer:
        yield
        return
    try:
        yield
    finally:
        with state.lock:
            held, own.held = own.held or [], None
        if keep:
            added: set[tuple[int, tuple[int, ...]]] = set()
            for history, output in held:
                key = (id(history), tuple(output))
                if key not in added:
                    added.add(key)
                    history.add(output)
