"""The request body limit: an ASGI middleware that refuses (HTTP 413) a body larger than the app takes, before
gradio reads any of it.

Without it a client's 200 MB POST to ``/gradio_api/queue/join`` is read whole and parsed as JSON by FastAPI before
any of the app's checks sees it; three bursts of four such posts left the server's resident set about 3 GB above
where it started (``tools/app_rss.py``; the figures are in docs/hosting.md). :class:`BodyLimit` looks at ``Content-Length`` first and answers 413
without reading the body; a body sent without a length (chunked) is counted as it streams through, chunk by chunk,
never buffered here, and cut at the limit: the app then sees the client as gone, and the client gets the 413.

The default, :data:`MAX_BODY_BYTES`, is above what the largest valid ``/compare`` call needs
(:func:`largest_valid_call_bytes`, under 400 kB; a test keeps it so): a prompt of 20,000 characters
(``request.MAX_PROMPT_CHARS``) is at most 240 kB as JSON (12 bytes for a character outside the BMP escaped as
``\\ud83d\\ude00``), each other field at most a name of 200 characters (400 for ``skip``), escaped.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from .request import MAX_NAME_CHARS, MAX_NAMES, MAX_PROMPT_CHARS, MAX_SKIP_CHARS

MAX_BODY_BYTES = 512 * 1024
"""Bytes one HTTP request body may hold (``app.py --max-body-kb``, ``build_app(max_body_bytes=...)``)."""

class BodyTooLarge(ValueError):
    """A request body over the limit (answered with HTTP 413 and the message)."""


Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: an HTTP request whose body is larger than ``max_bytes`` gets 413, the app never its body.

    Args:
        app: the ASGI application wrapped (gradio's FastAPI app).
        max_bytes (`int`, *optional*): the limit; ``None`` or 0 turns the check off (a proxy in front bounds bodies).

    A ``Content-Length`` above the limit is answered at once, without calling the app. Otherwise the body's chunks
    are counted as the app reads them; the one that crosses the limit is not passed on: the app gets
    ``http.disconnect`` instead (as if the client had left) and the client gets the 413, unless the app had already
    started its answer. WebSocket and lifespan traffic pass through untouched.
    """

    def __init__(self, app: Any, max_bytes: int | None = MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.max_bytes:
            await self.app(scope, receive, send)
            return
        try:
            check_size(_content_length(scope), self.max_bytes, declared=True)
        except BodyTooLarge as err:
            await refuse(send, err)
            return
        guard = _CountedBody(receive, send, self.max_bytes)
        try:
            await self.app(scope, guard.receive, guard.send)
        except Exception:
            # a body cut at the limit: the client has its 413 and the app saw a disconnect, which it may raise
            if not guard.exceeded:  # the app's own failure: not ours to hide
                raise


class _CountedBody:
    """The receive and send of one request, counting the body's bytes as they pass."""

    def __init__(self, receive: Receive, send: Send, max_bytes: int):
        self._receive, self._send, self.max_bytes = receive, send, max_bytes
        self.received = 0
        self.exceeded = False
        self.started = False  # the app began its answer (headers sent): too late for a 413

    async def receive(self) -> Message:
        if self.exceeded:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            try:
                check_size(self.received, self.max_bytes, declared=False)
            except BodyTooLarge as err:
                self.exceeded = True
                if not self.started:
                    await self.refuse(err)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self.exceeded:
            return  # the 413 went out, or the client's answer was already under way: the rest is the app's reply
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def refuse(self, err: BodyTooLarge) -> None:
        await refuse(self._send, err)


def check_size(size: int | None, max_bytes: int, *, declared: bool) -> None:
    """Raise :class:`BodyTooLarge` when ``size`` bytes (a declared ``Content-Length``, or the bytes received so far
    of a body sent without one; ``None``: not known yet) exceed ``max_bytes``."""
    if size is None or size <= max_bytes:
        return
    shown = f"{size:,} bytes" if declared else f"{size:,} bytes so far, no length declared"
    raise BodyTooLarge(f"Request body too large: {shown}; this app takes at most {max_bytes:,} bytes per request (a "
                       f"prompt is at most {MAX_PROMPT_CHARS:,} characters). Send a shorter prompt; an operator "
                       "raises the limit with app.py --max-body-kb.")


async def refuse(send: Send, err: BodyTooLarge) -> None:
    """Send the 413 answer: JSON ``{"detail": message}`` (what FastAPI's errors carry), the connection closed."""
    body = json.dumps({"detail": str(err)}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    """The request's declared body size (``None``: none declared, or not a number: then the body is counted)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def largest_valid_call_bytes(parameters: int) -> int:
    """The largest body a valid ``/compare`` call can need, for ``parameters`` API parameters: the longest prompt as
    JSON escapes of characters outside the BMP (12 bytes each), every other value and each of the method names a longest
    name escaped (``\\u00e9``: 6 bytes a character), and gradio's envelope (``fn_index``, ``session_hash``, ...) generously."""
    longest_value = max(MAX_NAME_CHARS, MAX_SKIP_CHARS) * 6
    return MAX_PROMPT_CHARS * 12 + parameters * longest_value + MAX_NAMES * MAX_NAME_CHARS * 6 + 4096


def middleware(max_bytes: int | None) -> Any:
    """:class:`BodyLimit` as a Starlette ``Middleware`` entry (for ``FastAPI(middleware=[...])``)."""
    from starlette.middleware import Middleware

    return Middleware(BodyLimit, max_bytes=max_bytes)
