"""Hostile calls to the demo app (issue 67, item 6): bodies too large, a client over its share of the queue,
malformed calls; each refused at the door with a status and a message, within the battery's budgets.

The app is the real one (``build_app``'s Blocks, its queue and the admission it installs), served by gradio's own
ASGI application with what ``launch()`` adds in front of it (the body limit, the exception handlers), but never
launched: every case sends ASGI messages in this process, no server, no socket, no model loaded (a request that gets
past the checks waits in the queue, which no worker reads). The body of a hostile POST is streamed from a generator,
one MB at a time, so that only what the app reads of it is ever in memory.

An HTTP answer of 4xx counts as the refusal, raised as :class:`Answered` (``"413: Request body too large..."``), so
that every case runs through ``test_hostile_folder``'s measure: the expected error whose message names the fix, in
under ``BUDGET_S`` and within ``BUDGET_MB`` of memory growth (resident set, then Python's allocations at their
peak), plus the case's own check (nothing of the body read; another client admitted). The negative controls show
that the measure sees what the limit prevents (gradio alone reads a 200 MB body whole) and that valid calls pass.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

gr = pytest.importorskip("gradio", reason="the demo app needs the `app` extra: pip install -e '.[app]'")

from hf_speculative.app.limits import MAX_BODY_BYTES
from hf_speculative.app.queue_share import DEFAULT_PER_SESSION, default_per_address, queued_events
from tests.app.conftest import compare_args, save_tiny_chat_model
from tests.conftest import CHAT_WORDS
from tests.security.test_hostile_folder import BUDGET_MB, Case, _measure, case_registry, frozen_heap, run

MB = 1 << 20
HOSTILE_BYTES = 200 * MB  # one of the posts whose bursts left ~1 GB behind per burst before the limit
MAX_QUEUE = 16  # build_app's default
PER_ADDRESS = default_per_address(MAX_QUEUE)


class Answered(Exception):
    """The app's answer to a request it refused: ``"STATUS: detail"``."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"{status}: {detail}")
        self.status, self.detail = status, detail


class Body:
    """A request body of ``size`` bytes in chunks of one MB, made as the app asks for them; counts what it gave."""

    def __init__(self, size: int, chunk: int = MB):
        self.size, self.chunk, self.given = size, b"x" * min(chunk, size), 0

    async def receive(self) -> dict:
        if self.given >= self.size:
            return {"type": "http.disconnect"}
        part = self.chunk[: self.size - self.given]
        self.given += len(part)
        return {"type": "http.request", "body": part, "more_body": self.given < self.size}

    @classmethod
    def of(cls, payload: Any) -> Body:
        body = cls.__new__(cls)
        body.chunk = json.dumps(payload).encode()
        body.size, body.given = len(body.chunk), 0
        return body


class AppWorld:
    """The app built once (a tiny chat model's folder as its default model, never loaded) and its ASGI stacks:
    ``asgi`` as ``launch()`` serves it, ``unbounded`` without the body limit (the negative control's)."""

    def __init__(self, root: Path):
        from gradio.routes import App

        from hf_speculative.app.cache import ModelCache
        from hf_speculative.app.calls import exception_handlers
        from hf_speculative.app.limits import middleware
        from hf_speculative.app.ui import build_app

        self.fifos: list[Path] = []  # (the battery's measure asks)
        self.model = save_tiny_chat_model(root / "tiny-chat", CHAT_WORDS)
        self.demo = build_app(ModelCache(device=torch.device("cpu"), warmup=False), default_model=str(self.model))
        # what ui._guard_launch hands launch() as app_kwargs
        self.asgi = App.create_app(self.demo, app_kwargs={"middleware": [middleware(MAX_BODY_BYTES)],
                                                          "exception_handlers": exception_handlers(self.demo)})
        self.unbounded = App.create_app(self.demo)
        self.compare = next(fn for fn in self.demo.fns.values() if fn.api_name == "compare")
        self.loop = asyncio.new_event_loop()  # one loop: the queue's locks belong to the loop that first used them
        self._count = 0

    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def empty_queue(self) -> None:
        """Drop every waiting event: each case starts with the queue empty (nothing runs them)."""
        for line in self.demo._queue.event_queue_per_concurrency_id.values():
            line.queue.clear()

    def post(self, path: str, body: Body, *, declared: int | str | None = None, host: str = "10.0.0.1",
             asgi: Any = None) -> tuple[int, Any]:
        """POST ``body`` to ``path`` from ``host`` (``declared``: its Content-Length, if any); ``(status, JSON)``."""
        headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
        if declared is not None:
            headers.append((b"content-length", str(declared).encode()))
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": headers, "server": ("127.0.0.1", 7860), "client": (host, 40000)}
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        self.loop.run_until_complete((asgi or self.asgi)(scope, body.receive, send))
        status = next(m["status"] for m in sent if m["type"] == "http.response.start")
        text = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return status, json.loads(text) if text else None

    def join(self, session: str, host: str, fn_index: int | None = None) -> tuple[int, Any]:
        """Join the queue for a valid ``/compare`` call (or the handler ``fn_index``) from ``session`` at ``host``."""
        data = compare_args("the cat sat", str(self.model), ["prompt-lookup"], max_new_tokens=4)
        payload = {"data": data, "fn_index": self.compare_index if fn_index is None else fn_index,
                   "session_hash": session}
        body = Body.of(payload)
        return self.post("/gradio_api/queue/join", body, declared=body.size, host=host)

    @property
    def compare_index(self) -> int:
        return next(i for i, fn in self.demo.fns.items() if fn is self.compare)

    def held(self, session: str) -> int:
        return sum(1 for e in queued_events(self.demo._queue) if e.session_hash == session)


def refusing(world: AppWorld, request: Callable[[], tuple[int, Any]]) -> Callable[[], None]:
    """The action of a case: ``request()``, its answer raised as :class:`Answered` when it is a refusal."""
    def action() -> None:
        status, answer = request()
        if status >= 400:
            detail = answer.get("detail") if isinstance(answer, dict) else answer
            raise Answered(status, detail if isinstance(detail, str) else json.dumps(detail))
    return action


CASES, case = case_registry()


JOIN = "/gradio_api/queue/join"


# 1. bodies: 413 before gradio reads any of it
@case("body: a declared Content-Length of 200 MB", "app bodies", Answered,
      r"^413: Request body too large: 209,715,200 bytes; this app takes at most 524,288 bytes .* app\.py --max-body-kb")
def _(w):
    body = Body(HOSTILE_BYTES)
    return refusing(w, lambda: w.post(JOIN, body, declared=HOSTILE_BYTES)), [], lambda: body.given == 0


@case("body: 200 MB sent without a length (chunked)", "app bodies", Answered,
      r"^413: Request body too large: 1,048,576 bytes so far, no length declared; this app takes at most 524,288")
def _(w):
    body = Body(HOSTILE_BYTES)
    return refusing(w, lambda: w.post(JOIN, body)), [], lambda: body.given <= MAX_BODY_BYTES + MB


@case("body: 200 MB behind a Content-Length that is no number", "app bodies", Answered,
      r"^413: Request body too large: .* so far, no length declared")
def _(w):
    body = Body(HOSTILE_BYTES)
    return refusing(w, lambda: w.post(JOIN, body, declared="lots")), [], lambda: body.given <= MAX_BODY_BYTES + MB


# 2. queue shares: one client over its share is refused at once, another still admitted
def other_client_admitted(w: AppWorld, session: str, holds: int) -> Callable[[], bool]:
    """The case's check: ``session`` holds no more than its ``holds`` events, and a new client is admitted."""
    return lambda: w.held(session) == holds and w.join(w.fresh("other"), "10.9.9.9")[0] == 200


@case(f"queue: a session with its {DEFAULT_PER_SESSION} comparisons queued sends another", "queue shares", Answered,
      rf"^429: This session already has {DEFAULT_PER_SESSION} comparisons waiting or running, its share of the queue "
      r"\(2\): wait for one to finish, or stop it")
def _(w):
    w.empty_queue()
    session, host = w.fresh("greedy"), "10.0.0.2"
    assert all(w.join(session, host)[0] == 200 for _ in range(DEFAULT_PER_SESSION)), "its share was not admitted"
    return refusing(w, lambda: w.join(session, host)), [], other_client_admitted(w, session, DEFAULT_PER_SESSION)


@case(f"queue: an address with {PER_ADDRESS} sessions queued makes up another", "queue shares", Answered,
      rf"^429: Your address already has {PER_ADDRESS} comparisons waiting or running, its share of the queue "
      rf"\({PER_ADDRESS}\)")
def _(w):
    w.empty_queue()
    host = "10.0.0.3"
    assert all(w.join(w.fresh("made-up"), host)[0] == 200 for _ in range(PER_ADDRESS)), "its share was not admitted"
    session = w.fresh("made-up")
    return refusing(w, lambda: w.join(session, host)), [], other_client_admitted(w, session, 0)


# 3. malformed calls: a message, not {"error": null} or a bare 500
@case("call: an fn_index no handler has", "malformed calls", Answered,
      r"^400: No event handler has fn_index 999\. This app's API: /compare; call it by name")
def _(w):
    w.empty_queue()
    return refusing(w, lambda: w.join(w.fresh("s"), "10.0.0.4", fn_index=999))


@case("call: an endpoint the app lacks, its name holding ESC", "malformed calls", Answered,
      r"^404: No API endpoint at /gradio_api/call/nope\\x1b\[2J\. This app's API: /compare")
def _(w):
    return refusing(w, lambda: w.post("/gradio_api/call/nope\x1b[2J", Body.of({"data": []})))


@case("call: /compare with 2 of its values", "malformed calls", gr.Error,
      r"The call to /compare sent 2 values; it takes \d+, in this order: prompt, model, .* api_name='/compare'")
def _(w):
    return lambda: w.demo.validate_inputs(w.compare, ["hello", None])


@case("call: a value shaped like a file, its size no number", "malformed calls", gr.Error,
      r"The call to /compare could not be read: .*FileData.* Send plain values")
def _(w):
    values = compare_args("hello", str(w.model), ["prompt-lookup"], max_new_tokens=2)
    values[0] = {"path": "/etc/passwd", "size": "\x1b[2J huge", "meta": {"_type": "gradio.FileData"}}
    return lambda: w.loop.run_until_complete(w.demo.preprocess_data(w.compare, values, None))


@pytest.fixture(scope="module")
def app_world(tmp_path_factory):
    world = AppWorld(tmp_path_factory.mktemp("hostile-app"))
    with frozen_heap():
        yield world
    world.loop.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case, app_world):
    result = run(case, app_world)
    assert result.refused, f"{case.name}: {result.problem}"


# -- negative controls ---------------------------------------------------------------------------------------------
def test_without_the_limit_gradio_reads_the_body_whole_and_the_measure_sees_it(app_world):
    """Gradio alone reads all 200 MB, then refuses the JSON (422): the battery's measure sees the growth the limit
    spares, so its memory budget can fail."""
    body = Body(HOSTILE_BYTES)
    unbounded = Case("no limit", "control", lambda w: refusing(
        w, lambda: w.post(JOIN, body, declared=HOSTILE_BYTES, asgi=w.unbounded)), Answered, "")
    error, _, grown, _ = _measure(unbounded, app_world, traced=True)
    assert isinstance(error, Answered) and error.status == 422, error
    assert body.given == HOSTILE_BYTES and grown > BUDGET_MB, f"read {body.given:,} bytes, grew {grown:.0f} MB"


def test_valid_calls_pass_the_checks(app_world):
    """A body of the limit's size reaches gradio (its own 4xx for what is no JSON, not the limit's 413); a valid call
    joins the queue; a call with all its values is read."""
    status, answer = app_world.post(JOIN, Body(MAX_BODY_BYTES), declared=MAX_BODY_BYTES)
    assert status != 413 and "too large" not in json.dumps(answer)
    app_world.empty_queue()
    assert app_world.join("valid", "10.0.0.5")[0] == 200 and app_world.held("valid") == 1
    values = compare_args("hello", str(app_world.model), ["prompt-lookup"], max_new_tokens=2)
    app_world.demo.validate_inputs(app_world.compare, values)
    read = app_world.loop.run_until_complete(app_world.demo.preprocess_data(app_world.compare, values, None))
    assert read[0] == "hello"
