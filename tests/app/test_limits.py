"""The request body limit (issue 67, item 6): a body larger than the app takes gets 413 before gradio reads it.

The middleware is checked alone on ASGI messages (a declared length is refused without calling the app; a body sent
without one is counted chunk by chunk and cut at the limit, the app never getting more), then in front of the served
app: 413 through the real server, a valid call of the largest size still served, and the server's resident memory
after three bursts of four 200 MB posts within 300 MB of where it started (without the limit, ``tools/app_rss.py``
measured about 1 GB more per burst).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from pathlib import Path

import pytest
import torch

from hf_speculative.app.limits import MAX_BODY_BYTES, BodyLimit, largest_valid_call_bytes
from tests.app.conftest import compare_args
from tests.conftest import launch_local

MB = 1024 * 1024


def _run(middleware: BodyLimit, chunks: list[bytes], headers: list[tuple[bytes, bytes]] = (),
         scope_type: str = "http") -> tuple[list[dict], list[dict]]:
    """Drive ``middleware`` with a request whose body arrives as ``chunks``; returns ``(sent, app_received)``: the
    messages sent to the client and those the wrapped app received."""
    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": scope_type, "headers": list(headers)}
    asyncio.run(middleware(scope, receive, send))
    return sent, middleware.app.received


class ReadingApp:
    """An ASGI app that reads the whole body (as FastAPI does for JSON), then answers 200 with its size."""

    def __init__(self):
        self.received: list[dict] = []
        self.called = False

    async def __call__(self, scope, receive, send):
        self.called = True
        size = 0
        while True:
            message = await receive()
            self.received.append(message)
            if message["type"] == "http.disconnect":
                raise ConnectionError("client gone")  # as starlette's ClientDisconnect
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(size).encode()})


def _status(sent: list[dict]) -> int:
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


def _detail(sent: list[dict]) -> str:
    return json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))["detail"]


def test_a_declared_length_over_the_limit_is_refused_without_calling_the_app():
    app = ReadingApp()
    sent, _ = _run(BodyLimit(app, max_bytes=1000), [b"x" * 10], headers=[(b"content-length", b"200000000")])
    assert _status(sent) == 413 and not app.called
    assert "Request body too large: 200,000,000 bytes; this app takes at most 1,000 bytes" in _detail(sent)


def test_a_body_without_a_length_is_cut_at_the_limit_and_never_reaches_the_app_whole():
    app = ReadingApp()
    chunks = [b"x" * 400] * 10  # 4000 bytes, no Content-Length (chunked)
    sent, received = _run(BodyLimit(app, max_bytes=1000), chunks)
    passed = sum(len(m.get("body", b"")) for m in received if m["type"] == "http.request")
    assert passed <= 1000, "the chunk that crossed the limit was not passed on"
    assert received[-1] == {"type": "http.disconnect"}, "the app saw the client as gone"
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"], "the app's own reply dropped"
    assert _status(sent) == 413 and "1,200 bytes so far, no length declared" in _detail(sent)


def test_a_body_within_the_limit_passes_unchanged_and_so_does_other_traffic():
    app = ReadingApp()
    sent, received = _run(BodyLimit(app, max_bytes=1000), [b"x" * 500, b"y" * 500],
                          headers=[(b"content-length", b"1000")])
    assert _status(sent) == 200 and sent[-1]["body"] == b"1000" and len(received) == 2
    for middleware in (BodyLimit(ReadingApp(), max_bytes=None), BodyLimit(ReadingApp(), max_bytes=0)):
        assert _status(_run(middleware, [b"x" * 5000])[0]) == 200, "0 or None: no limit"
    websocket = ReadingApp()  # not HTTP: passed through untouched, whatever its size
    sent, received = _run(BodyLimit(websocket, max_bytes=10), [b"x" * 100], scope_type="websocket")
    assert _status(sent) == 200 and received[0]["body"] == b"x" * 100


def test_the_default_limit_covers_the_largest_valid_call():
    from hf_speculative.app.request import option_slots

    parameters = 8 + len(option_slots())
    assert largest_valid_call_bytes(parameters) < MAX_BODY_BYTES <= 4 * largest_valid_call_bytes(parameters)


def test_build_app_refuses_a_bad_limit():
    from hf_speculative.app.ui import build_app

    for bad in (-1, 1.5, "512k", True):
        with pytest.raises(ValueError, match=r"build_app\(max_body_bytes=.*\): a whole number of bytes >= 0"):
            build_app(max_body_bytes=bad)


@pytest.fixture(scope="module")
def limited_app(tiny_chat_dir):
    """``(url, port)`` of the app with its default body limit."""
    from hf_speculative.app.cache import ModelCache
    from hf_speculative.app.ui import build_app

    demo = build_app(ModelCache(device=torch.device("cpu"), warmup=False), default_model=str(tiny_chat_dir),
                     max_new_tokens_limit=16, default_max_new_tokens=4)
    url, port = launch_local(demo)
    yield url, port
    demo.close()


def _raw_post(port: int, head: bytes, body_chunks, timeout: float = 30) -> bytes:
    """Send ``head`` (request line and headers) then the chunks, stopping when the server closes; the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the body ended
        answer = b""
        try:
            while part := sock.recv(65536):
                answer += part
        except ConnectionResetError:
            pass
        return answer


def _declared_post(port: int, size: int) -> bytes:
    head = (f"POST /gradio_api/queue/join HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()
    return _raw_post(port, head, (b"x" * MB for _ in range(size // MB)))


def test_the_served_app_refuses_big_bodies_declared_or_chunked(limited_app):
    _, port = limited_app
    answer = _declared_post(port, 200 * MB)
    assert answer.startswith(b"HTTP/1.1 413") and b"Request body too large: 209,715,200 bytes" in answer, answer[:300]
    head = (b"POST /gradio_api/queue/join HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * (64 * 1024)
    framed = (b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(32 * 16))  # 32 MB in 64 KB chunks
    answer = _raw_post(port, head, framed)
    assert answer.startswith(b"HTTP/1.1 413") and b"no length declared" in answer, answer[:300]


def test_a_call_of_the_largest_valid_size_is_still_served(limited_app, tiny_chat_dir):
    """A 20,000-character prompt of characters outside the BMP, sent as JSON escapes (12 bytes each): within the
    limit, so the app itself answers (the tiny tokenizer makes too many tokens of it: the app's own message)."""
    import httpx

    url, _ = limited_app
    data = compare_args("😀" * 20_000, str(tiny_chat_dir), ["prompt-lookup"], max_new_tokens=4)
    body = json.dumps({"data": data}, ensure_ascii=True).encode()
    assert len(body) > 240_000
    posted = httpx.post(f"{url}gradio_api/call/compare", content=body,
                        headers={"content-type": "application/json"}, timeout=30)
    assert posted.status_code == 200, posted.text[:300]
    answer = httpx.get(f"{url}gradio_api/call/compare/{posted.json()['event_id']}", timeout=60).text
    assert "The prompt is too long" in answer or "Done:" in answer, answer[-500:]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the resident set from /proc")
def test_three_bursts_of_four_200_mb_posts_leave_the_server_within_300_mb(limited_app):
    """The served app runs in this process: its resident set is this process's (the posts are streamed from a
    generator, the client holding one MB at a time)."""
    _, port = limited_app
    start = _rss_mb()
    for _ in range(3):
        answers: list[bytes] = []
        posts = [threading.Thread(target=lambda out=answers: out.append(_declared_post(port, 200 * MB)))
                 for _ in range(4)]
        for post in posts:
            post.start()
        for post in posts:
            post.join(120)
        assert len(answers) == 4 and all(a.startswith(b"HTTP/1.1 413") for a in answers), [a[:40] for a in answers]
    assert _rss_mb() - start < 300, f"resident set grew {_rss_mb() - start:.0f} MB"


def test_app_py_takes_the_bounds_from_flags_or_the_environment(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("hfs_app_main", Path(__file__).resolve().parents[2] / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    assert app._limits(app._parse_args([])) == {}, "unset: build_app's defaults"
    args = app._parse_args(["--max-body-kb", "64", "--max-per-session", "1", "--max-per-address", "0"])
    assert app._limits(args) == {"max_body_bytes": 65536, "max_per_session": 1, "max_per_address": 0}
    monkeypatch.setenv("HFS_APP_MAX_BODY_KB", "0")  # a Space sets its bounds in the environment
    monkeypatch.setenv("HFS_APP_MAX_PER_SESSION", "3")
    assert app._limits(app._parse_args([])) == {"max_body_bytes": 0, "max_per_session": 3}
