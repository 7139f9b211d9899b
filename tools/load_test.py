"""Load test of the demo app: concurrent clients, mixed methods, hostile requests, disconnects.

Run on demand against a running app, or let it start one::

    python -m tools.load_test --launch "python app.py --threads 1 --port 7861" --clients 8 --duration 600
    python -m tools.load_test --url http://127.0.0.1:7860 --server-pid PID --duration 60

``--clients`` threads (each its own gradio_client) send requests until ``--duration`` seconds have
passed: a mix of methods on the app's default model with short ``max_new_tokens``, a fifth of them
hostile (one parameter from the fuzz table, ``tools/app_fuzz.py``), and some abandoned mid-stream
(the client cancels its job, which closes its stream, as a visitor closing the tab). Then two checks:

- **disconnect**: one long generation is started and abandoned mid-stream; the server's CPU use is
  then measured for a few seconds, with no other request running: it must fall back to idle (the
  generation thread stopped).
- **queue bound**: ``--burst`` requests at once: past the queue's bound the server answers "queue
  is full" instead of queueing them all.

Reported (and written as JSON with ``--out``): requests served, errors by kind, hostile requests
refused or answered, peak RSS of the server (and its children), p50/p95 latency of the completed
requests, the CPU after the disconnect, the burst's outcome.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from tools.app_fuzz import form, hostile_cases

# (methods, options) of the normal requests: all run on the default model and its shipped drafters
MIX = [
    (["prompt-lookup"], {}),
    (["prompt-lookup", "hf-prompt-lookup"], {}),
    (["eagle"], {}),
    (["early-exit"], {("early-exit", "exit_layer"): 8}),
    (["early-exit-adapter"], {}),
    (["layer-skip"], {}),
    (["eagle+lookup", "prompt-lookup"], {}),
    (["hf-early-exit"], {}),
    (["prompt-lookup"], {("prompt-lookup", "num_tokens"): 4}),
]
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Repeat this list: apples, pears, plums, apples, pears, plums.",
    "Explain in two sentences what speculative decoding is.",
    "Rewrite: def f(x): return x*2 as a lambda.",
]


class Monitor(threading.Thread):
    """Samples the server's RSS (with its children) and CPU every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.5):
        super().__init__(daemon=True)
        import psutil

        self.process = psutil.Process(pid)
        self.interval = interval
        self.peak_rss = 0
        self.samples: list[tuple[float, float]] = []  # (time, CPU seconds so far)
        self.stopped = threading.Event()

    def _processes(self) -> list[Any]:
        return [self.process, *self.process.children(recursive=True)]

    def cpu_seconds(self) -> float:
        total = 0.0
        for p in self._processes():
            try:
                times = p.cpu_times()
                total += times.user + times.system
            except Exception:  # noqa: BLE001 - a child that just ended
                pass
        return total

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                rss = sum(p.memory_info().rss for p in self._processes())
                self.peak_rss = max(self.peak_rss, rss)
                self.samples.append((time.monotonic(), self.cpu_seconds()))
            except Exception:  # noqa: BLE001 - the server ended
                return
            self.stopped.wait(self.interval)

    def cpu_share(self, seconds: float) -> float:
        """Share of one core the server used over the next ``seconds``."""
        start_t, start_cpu = time.monotonic(), self.cpu_seconds()
        time.sleep(seconds)
        return (self.cpu_seconds() - start_cpu) / (time.monotonic() - start_t)


def _error_kind(message: str) -> str:
    """A message with its varying parts (numbers, quoted values) blanked, cut short: errors by kind."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "…", str(message))
    text = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", text)
    return text[:90]


class Client:
    """One visitor: sends requests in a loop and records each outcome."""

    def __init__(self, url: str, index: int, args: argparse.Namespace, records: list, lock: threading.Lock,
                 deadline: float):
        from gradio_client import Client as GradioClient

        self.client = GradioClient(url, verbose=False)
        self.rng = random.Random(args.seed * 1000 + index)
        self.args, self.records, self.lock, self.deadline = args, records, lock, deadline
        self.hostile = hostile_cases()

    def run(self) -> None:
        while time.monotonic() < self.deadline:
            self.records_append(self.one())

    def records_append(self, record: dict) -> None:
        with self.lock:
            self.records.append(record)

    def one(self) -> dict:
        rng = self.rng
        max_new = rng.choice(self.args.max_new_tokens)
        methods, options = rng.choice(MIX)
        overrides = {_api(m, k): v for (m, k), v in options.items()}
        kind = "normal"
        if rng.random() < self.args.hostile:
            name, value = rng.choice(self.hostile)
            overrides[name] = value
            kind = f"hostile:{name}"
        elif rng.random() < self.args.disconnect:
            kind = "disconnect"
        args = form(overrides, prompt=rng.choice(PROMPTS), methods=methods,
                    max_new_tokens=max_new if kind != "disconnect" else 200)
        start = time.monotonic()
        record: dict[str, Any] = {"kind": kind, "methods": methods, "start": start}
        try:
            job = self.client.submit(*args, api_name="/compare")
            if kind == "disconnect":
                while not job.done() and len(job.outputs()) < 3 and time.monotonic() - start < 120:
                    time.sleep(0.05)
                job.cancel()
                record.update(outcome="disconnected", seconds=time.monotonic() - start)
                return record
            out = job.result(timeout=600)
            record["seconds"] = time.monotonic() - start
            results = out[-1] if isinstance(out, (list, tuple)) else None
            if isinstance(results, dict) and results.get("error"):
                record.update(outcome="refused", error=_error_kind(results["error"]))
            elif isinstance(results, dict) and results.get("methods"):
                failed = [m for m in results["methods"] if m["status"] == "error"]
                record.update(outcome="served", failed_panes=[_error_kind(m["error"]) for m in failed])
            else:
                record.update(outcome="odd", error=_error_kind(repr(out)[:200]))
        except Exception as err:  # noqa: BLE001 - counted by kind
            record.update(outcome="exception", seconds=time.monotonic() - start,
                          error=f"{type(err).__name__}: {_error_kind(err)}")
        return record


def _api(method: str, key: str) -> str:
    from hf_speculative.app.request import api_parameter

    return api_parameter(method, key)


def _wait_for(url: str, timeout: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read(1)
            return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(1)
    raise SystemExit(f"load_test: no app answered at {url} within {timeout:.0f} s")


def disconnect_check(url: str, monitor: Monitor | None, settle: float = 2.0, window: float = 4.0) -> dict:
    """Start one long generation, abandon it mid-stream, then measure the server's CPU."""
    from gradio_client import Client as GradioClient

    client = GradioClient(url, verbose=False)
    before = monitor.cpu_share(window) if monitor else None
    job = client.submit(*form(prompt=PROMPTS[1], methods=["prompt-lookup"], max_new_tokens=400), api_name="/compare")
    start = time.monotonic()
    while len(job.outputs()) < 3 and not job.done() and time.monotonic() - start < 120:
        time.sleep(0.05)
    busy = monitor.cpu_share(1.0) if monitor else None
    job.cancel()
    time.sleep(settle)
    after = monitor.cpu_share(window) if monitor else None
    return {"cpu_idle_before": before, "cpu_while_generating": busy, "cpu_after_disconnect": after,
            "streamed_updates_before_disconnect": len(job.outputs()),
            "back_to_idle": None if after is None else after < max(0.10, 2 * (before or 0))}


def burst_check(url: str, n: int) -> dict:
    """``n`` requests at once: how many were refused with "queue is full"."""
    from gradio_client import Client as GradioClient

    client = GradioClient(url, verbose=False)
    jobs = [client.submit(*form(methods=["prompt-lookup"], max_new_tokens=64), api_name="/compare") for _ in range(n)]
    outcomes: collections.Counter = collections.Counter()
    for job in jobs:
        try:
            job.result(timeout=600)
            outcomes["served"] += 1
        except Exception as err:  # noqa: BLE001
            if "429" in str(err):  # the app's per-client share (hf_speculative/app/queue_share.py): one client here
                outcomes["over the client's share (429)"] += 1
                continue
            outcomes["queue full" if "queue is full" in str(err).lower() else f"{type(err).__name__}: {err}"] += 1
    return dict(outcomes)


def summarise(records: list[dict], wall: float) -> dict:
    done = [r for r in records if r["outcome"] in ("served", "refused")]
    latencies = sorted(r["seconds"] for r in records if r["outcome"] == "served")
    errors = collections.Counter(r["error"] for r in records if r.get("error") and not r["kind"].startswith("hostile"))
    pane_errors = collections.Counter(e for r in records for e in r.get("failed_panes", []))
    hostile = [r for r in records if r["kind"].startswith("hostile")]

    def pct(q: float) -> float | None:
        return round(statistics.quantiles(latencies, n=100)[q - 1], 2) if len(latencies) >= 2 else None

    return {
        "requests": len(records), "served": sum(r["outcome"] == "served" for r in records),
        "refused_with_a_message": sum(r["outcome"] == "refused" for r in records),
        "disconnected": sum(r["outcome"] == "disconnected" for r in records),
        "exceptions": sum(r["outcome"] == "exception" for r in records),
        "completed_per_minute": round(60 * len(done) / wall, 1),
        "hostile": {"sent": len(hostile), "refused": sum(r["outcome"] == "refused" for r in hostile),
                    "served (value accepted as in range)": sum(r["outcome"] == "served" for r in hostile),
                    "exceptions": collections.Counter(r["error"] for r in hostile if r["outcome"] == "exception")},
        "hostile_refusals_by_kind": dict(collections.Counter(
            r["error"] for r in hostile if r["outcome"] == "refused").most_common(25)),
        "errors_of_normal_requests": dict(errors), "failed_panes": dict(pane_errors),
        "latency_s": {"p50": pct(50), "p95": pct(95), "served": len(latencies)},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:7861/")
    parser.add_argument("--launch", help="command that starts the app (its port must match --url)")
    parser.add_argument("--server-pid", type=int, help="PID of a running app (RSS and CPU measured)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--hostile", type=float, default=0.2, help="share of hostile requests")
    parser.add_argument("--disconnect", type=float, default=0.1, help="share of the other requests abandoned")
    parser.add_argument("--max-new-tokens", type=int, nargs="+", default=[8, 12, 16, 24])
    parser.add_argument("--burst", type=int, default=24, help="requests sent at once at the end (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the report as JSON here")
    args = parser.parse_args(argv)

    server = None
    if args.launch:
        server = subprocess.Popen(shlex.split(args.launch), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        args.server_pid = server.pid
    try:
        _wait_for(args.url, 300)
        monitor = Monitor(args.server_pid) if args.server_pid else None
        if monitor:
            monitor.start()
        # one request first: the model loads and warms up before the clock starts
        from gradio_client import Client as GradioClient

        GradioClient(args.url, verbose=False).predict(*form(max_new_tokens=4), api_name="/compare")
        records: list[dict] = []
        lock = threading.Lock()
        start = time.monotonic()
        deadline = start + args.duration
        clients = [Client(args.url, i, args, records, lock, deadline) for i in range(args.clients)]
        threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(30)
            done = len(records)
            print(f"[load_test] {time.monotonic() - start:6.0f} s  {done} requests", file=sys.stderr, flush=True)
        wall = time.monotonic() - start
        report = {"url": args.url, "clients": args.clients, "duration_s": round(wall, 1),
                  "max_new_tokens": args.max_new_tokens, **summarise(records, wall)}
        report["disconnect_check"] = disconnect_check(args.url, monitor)
        if args.burst:
            report["burst"] = {"sent": args.burst, **burst_check(args.url, args.burst)}
        if monitor:
            monitor.stopped.set()
            report["peak_rss_mb"] = round(monitor.peak_rss / 2**20)
        print(json.dumps(report, indent=1, default=str))
        if args.out:
            with open(args.out, "w", encoding="utf-8") as handle:
                json.dump({"report": report, "records": records}, handle, indent=1, default=str)
        return report
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()


if __name__ == "__main__":
    main()
