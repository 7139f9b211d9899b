"""The demo app's resident memory across bursts of huge request bodies, with and without its body limit.

Starts ``python app.py`` in a subprocess (the real app, its default model; no model loads: every post is refused
before one would), then sends ``--bursts`` bursts of ``--posts`` POSTs at once, each a valid JSON body of ``--mb``
MB (a prompt of that many ``x``), to gradio's queue route, and reads the server's ``VmRSS`` and ``VmHWM`` from
``/proc/<pid>/status`` before the first burst and a few seconds after each. The bodies are streamed from a
generator, so the client itself holds one megabyte at a time. Run it twice, as ``docs/hosting.md`` reports::

    python -m tools.app_rss --max-body-kb 0 --out before.json   # the limit off: the body is read and parsed
    python -m tools.app_rss --out after.json                    # the default limit: 413 before reading

Memory figures only (no timings). Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1024 * 1024
ROUTE = "/gradio_api/queue/join"


def rss_mb(pid: int) -> dict[str, float]:
    """``{"rss": VmRSS, "peak": VmHWM}`` of process ``pid``, in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields["rss" if key == "VmRSS" else "peak"] = round(int(value.split()[0]) / 1024, 1)
    return fields


def body_parts(megabytes: int) -> tuple[int, Iterator[bytes]]:
    """``(length, chunks)`` of a valid queue-join body whose prompt is ``megabytes`` MB of ``x``."""
    head = b'{"data": ["'
    tail = b'"], "fn_index": 0, "session_hash": "rss-probe", "event_data": null, "trigger_id": null}'
    chunk = b"x" * MB

    def chunks() -> Iterator[bytes]:
        yield head
        for _ in range(megabytes):
            yield chunk
        yield tail

    return len(head) + megabytes * MB + len(tail), chunks()


def post(port: int, megabytes: int, outcome: list[str]) -> None:
    """One POST of the body, declared with its ``Content-Length``; appends the status (or how it ended)."""
    length, chunks = body_parts(megabytes)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        connection.putrequest("POST", ROUTE)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(length))
        connection.endheaders()
        for piece in chunks:
            connection.send(piece)
        outcome.append(str(connection.getresponse().status))
    except (BrokenPipeError, ConnectionResetError):  # the server answered (413) and closed before the body ended
        try:
            outcome.append(f"{connection.getresponse().status} (body cut)")
        except (OSError, http.client.HTTPException):
            outcome.append("closed by the server")
    except (OSError, http.client.HTTPException) as err:
        outcome.append(type(err).__name__)
    finally:
        connection.close()


def burst(port: int, posts: int, megabytes: int) -> list[str]:
    """``posts`` POSTs at once; their outcomes."""
    outcome: list[str] = []
    threads = [threading.Thread(target=post, args=(port, megabytes, outcome)) for _ in range(posts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(outcome)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(port: int, extra: list[str]) -> subprocess.Popen:
    """``python app.py`` on ``port``; returns once it answers."""
    command = [sys.executable, str(ROOT / "app.py"), "--port", str(port), "--threads", "1", *extra]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"app.py exited with status {server.returncode}: {' '.join(command)}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/gradio_api/info", timeout=5).read()
            return server
        except OSError:
            time.sleep(1)
    server.kill()
    raise SystemExit("app.py did not answer within 300 s")


def measure(args: argparse.Namespace) -> dict:
    port = free_port()
    extra = [] if args.max_body_kb is None else ["--max-body-kb", str(args.max_body_kb)]
    server = start_app(port, extra)
    try:
        time.sleep(args.settle)
        record = {"app_flags": extra, "posts": args.posts, "mb": args.mb, "start": rss_mb(server.pid), "bursts": []}
        for _ in range(args.bursts):
            outcome = burst(port, args.posts, args.mb)
            time.sleep(args.settle)
            record["bursts"].append({"outcome": outcome, **rss_mb(server.pid)})
        record["growth_mb"] = round(record["bursts"][-1]["rss"] - record["start"]["rss"], 1)
        return record
    finally:
        server.terminate()
        server.wait(30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-body-kb", type=int, default=None,
                        help="passed to app.py (0: no body limit, the state before it existed; default: the app's)")
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--posts", type=int, default=4, help="POSTs at once in a burst")
    parser.add_argument("--mb", type=int, default=200, help="MB of each body")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before each reading")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here (JSON)")
    args = parser.parse_args(argv)
    if not os.path.exists("/proc/self/status"):
        raise SystemExit("tools.app_rss reads /proc: Linux only")
    record = measure(args)
    text = json.dumps(record, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
