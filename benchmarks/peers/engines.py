"""What the peers driver asks of an engine, and the driver itself (issue 48): :class:`Run` (one timed generation),
:class:`Engine` (the interface), :func:`interleave` (the order of the timed runs), :func:`record` (a run's JSON row,
``hf-speculative bench``'s for our engines) and :func:`run_all` (the warm-up, the rounds, the median times)."""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

BASELINE = "greedy"


# -- one timed generation ---------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    """One generation of one engine: its output (token ids, or text where the engine gives no ids), its new
    tokens, its wall time, and the speculation figures it reports (``None`` where unknown). ``source`` is the
    :class:`hf_speculative.tooling.methods.MethodRun` of our engines (their rows are ``hf-speculative bench``'s)."""

    method: str
    output: list[int] | str
    new_tokens: int
    seconds: float
    target_forwards: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    extra: dict | None = None
    source: Any = None

    @property
    def tau(self) -> float | None:
        return self.new_tokens / self.target_forwards if self.target_forwards else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted and self.accepted is not None else None


class Engine:
    """What the driver asks of an engine: ``name``, ``label`` and ``weights`` (for the table), ``methods`` (greedy
    first), ``notes`` (what it skipped and why), ``start()``, ``run(index, method, max_new_tokens)``,
    ``method_label(method)``, ``versions()`` and ``close()``."""

    name = ""
    label = ""
    weights = ""

    def __init__(self) -> None:
        self.methods: list[str] = [BASELINE]
        self.notes: list[str] = []
        self.base: dict = {}

    def start(self) -> None:
        pass

    def run(self, index: int, method: str, max_new_tokens: int) -> Run:
        raise NotImplementedError

    def method_label(self, method: str) -> str:
        return method

    def versions(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class WorkerEngine(Engine):
    """An engine that runs in a worker process of its own venv (OpenVINO GenAI, vLLM): one JSON request a line on its
    stdin, one JSON reply a line on its stdout, its stderr in ``self.log``. ``worker`` names it in errors."""

    worker = ""
    log: Path

    def __init__(self) -> None:
        super().__init__()
        self.process: subprocess.Popen | None = None
        self.ready: dict = {}

    def spawn(self, command: list[str], env: dict, cwd: str | None = None) -> None:
        """Start the worker and read its ready line (``{"ready": true, "versions": ..., ...}``)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w", encoding="utf-8") as err:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                            text=True, bufsize=1, env=env, cwd=cwd)
        self.ready = self._read()
        if not self.ready.get("ready"):
            raise RuntimeError(f"the {self.worker} worker did not start: {self.ready} (see {self.log})")

    def _read(self) -> dict:
        assert self.process is not None and self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            tail = self.log.read_text(encoding="utf-8", errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"the {self.worker} worker ended (exit code {self.process.poll()}); its log {self.log} "
                               f"ends:\n{tail}")
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        reply = self._read()
        if not reply.get("ok"):
            raise RuntimeError(f"the {self.worker} worker failed on {request.get('mode')}: {reply.get('error')}")
        return reply

    def versions(self) -> dict:
        return dict(self.ready.get("versions", {}))

    def close(self) -> None:
        if self.process is None:
            return
        try:
            if self.process.poll() is None:
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.process.stdin.flush()
                self.process.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            self.process.kill()
            self.process.wait()
        self.process = None


# -- interleaving -------------------------------------------------------------------------------------
def interleave(engines: list[Engine], prompts: int, repeats: int) -> Iterator[tuple[int, int, Engine, str]]:
    """The order of the timed runs: for each prompt, ``repeats`` rounds of every engine's greedy and methods in turn
    (``(prompt index, round, engine, method)``)."""
    for index in range(prompts):
        for round_ in range(repeats):
            for engine in engines:
                for method in engine.methods:
                    yield index, round_, engine, method


def median_run(runs: list[Run]) -> tuple[Run, float]:
    """The first run (its output and figures) and the median time of ``runs``."""
    return runs[0], statistics.median(r.seconds for r in runs)


def record(engine: Engine, runs: list[Run], prompt: Any, greedy: Run, input_tokens: int) -> dict:
    """The JSON row of ``runs`` (one engine, one prompt, one method): ``hf-speculative bench``'s row (its own
    ``_record`` for our engines), plus ``engine``, the engine's name for the method, and every repeat's time."""
    from hf_speculative.bench.runner import _record

    first, seconds = median_run(runs)
    if first.source is not None and isinstance(greedy.output, list):
        row = _record(first.source, seconds, prompt, greedy.output, engine.base)
    else:
        row = {
            **engine.base,
            "method": first.method,
            "category": prompt.category,
            "question_id": prompt.question_id,
            "new_tokens": first.new_tokens,
            "seconds": seconds,
            "tokens_per_s": first.new_tokens / seconds if seconds > 0 else 0.0,
            "tau": first.tau,
            "acceptance_rate": first.acceptance_rate,
            "target_forwards": first.target_forwards,
            "drafted": first.drafted,
            "accepted": first.accepted,
            "identical_to_greedy": first.output == greedy.output,
            **({"extra": first.extra} if first.extra else {}),
        }
    row["engine"] = engine.name
    row["engine_method"] = engine.method_label(first.method)
    row["input_tokens"] = input_tokens
    if len(runs) > 1:
        row["seconds_all"] = [r.seconds for r in runs]
    return row


def run_all(engines: list[Engine], prompts: list[Any], input_tokens: list[int], *, max_new_tokens: int,
            repeats: int, warmup_tokens: int = 16, on_row: Callable[[dict], None] | None = None,
            progress: Callable[[str], None] | None = None) -> list[dict]:
    """Warm every engine and method up on the first prompt (``warmup_tokens``, untimed), then run
    :func:`interleave`'s order and return the rows (``on_row`` gets each as soon as its prompt is done)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for engine in engines:
        for method in engine.methods:
            engine.run(0, method, min(max_new_tokens, warmup_tokens))
    rows: list[dict] = []
    runs: dict[tuple[str, str], list[Run]] = {}
    total = len(prompts) * repeats * sum(len(e.methods) for e in engines)
    for done, (index, round_, engine, method) in enumerate(interleave(engines, len(prompts), repeats), 1):
        runs.setdefault((engine.name, method), []).append(engine.run(index, method, max_new_tokens))
        if progress is not None:
            progress(f"[{done}/{total}] prompt {index + 1}/{len(prompts)} round {round_ + 1}: {engine.name} {method}")
        if round_ == repeats - 1 and engine is engines[-1] and method == engine.methods[-1]:
            for e in engines:
                greedy = runs[(e.name, BASELINE)][0]
                for m in e.methods:
                    row = record(e, runs[(e.name, m)], prompts[index], greedy, input_tokens[index])
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
            runs.clear()
    return rows
