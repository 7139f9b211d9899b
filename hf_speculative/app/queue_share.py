"""Each client's share of the app's queue: one client cannot fill every slot and lock the others out.

Gradio's queue holds ``max_queue`` requests in all (``demo.queue(max_size=...)``), whoever sent them: a script that
posts 20 comparisons at once would fill it, and every other visitor would be told "Queue is full" until the script's
requests had run. :class:`QueueShare` wraps the queue's admission (``Queue.push``): a comparison is refused at once,
with HTTP 429 and a message, when its client already has its share waiting or running. A client is counted two ways:

- its **session** (gradio's ``session_hash``: one per open page, one per ``gradio_client.Client``): at most
  ``per_session`` comparisons, 2 by default (the page sends one at a time);
- its **address** (the connection's IP, as uvicorn reports it: behind a proxy, the ``X-Forwarded-For`` address
  when the proxy is trusted, ``FORWARDED_ALLOW_IPS``): at most ``per_address``, half the queue by default, so
  that a client making up a new session for every request still leaves the other half to everyone else.

The same wrapper answers a call to a handler that does not exist (an ``fn_index`` out of range) with HTTP 400 and a
message, where gradio raises a ``KeyError`` and answers 500.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

DEFAULT_PER_SESSION = 2


class ShareExceeded(ValueError):
    """A client asked for more of the queue than its share (answered with HTTP 429 and the message)."""


class UnknownHandler(ValueError):
    """A call names an ``fn_index`` that no handler has (answered with HTTP 400 and the message)."""


def default_per_address(max_queue: int) -> int:
    """Half the queue (at least :data:`DEFAULT_PER_SESSION`): one address never holds more."""
    return max(DEFAULT_PER_SESSION, max_queue // 2)


@dataclasses.dataclass(frozen=True)
class QueueShare:
    """The share of the queue one client may hold, for the handler ``api_name``.

    Attributes:
        api_name (`str`): the handler whose calls are counted and bounded (the page's helpers are never queued
            behind a run, so they are not).
        per_session (`int`): comparisons one session may have waiting or running (0: no bound).
        per_address (`int`): comparisons one IP address may have waiting or running (0: no bound, for a server
            behind a proxy that hides visitors' addresses).
    """

    api_name: str = "compare"
    per_session: int = DEFAULT_PER_SESSION
    per_address: int = 8

    def __post_init__(self) -> None:
        for name in ("per_session", "per_address"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"QueueShare({name}={value!r}): a whole number >= 0 (0: no bound).")

    def install(self, demo: Any) -> None:
        """Wrap ``demo``'s queue admission (call after ``demo.queue(...)``)."""
        queue = demo._queue
        admit = queue.push
        lock = asyncio.Lock()  # the count and the event's arrival in the queue, one request at a time

        async def push(body: Any, request: Any, username: Any) -> Any:
            try:
                check_handler(demo, body)
            except UnknownHandler as err:
                return False, str(err), "error"
            fn = demo.fns.get(body.fn_index)
            if fn is None or fn.api_name != self.api_name:
                return await admit(body, request, username)
            async with lock:
                try:
                    self.check(queued_events(queue), body.session_hash, address_of(request))
                except ShareExceeded as err:
                    from fastapi import HTTPException

                    raise HTTPException(status_code=429, detail=str(err)) from None
                return await admit(body, request, username)

        queue.push = push

    def check(self, events: list[Any], session: str | None, address: str | None) -> None:
        """Raise :class:`ShareExceeded` when a new call from ``session`` at ``address`` would exceed its share,
        given the queue's ``events`` (waiting and running)."""
        mine = [e for e in events if getattr(e.fn, "api_name", None) == self.api_name]
        if self.per_session and session is not None:
            held = sum(1 for e in mine if e.session_hash == session)
            if held >= self.per_session:
                raise ShareExceeded(f"This session already has {held} comparisons waiting or running, its share of "
                                    f"the queue ({self.per_session}): wait for one to finish, or stop it, before "
                                    "sending another.")
        if self.per_address and address is not None:
            held = sum(1 for e in mine if address_of(e.request) == address)
            if held >= self.per_address:
                raise ShareExceeded(f"Your address already has {held} comparisons waiting or running, its share of "
                                    f"the queue ({self.per_address}): wait for one to finish before sending another.")


def queued_events(queue: Any) -> list[Any]:
    """The events of gradio's ``queue`` that wait for a worker or run on one."""
    waiting = [event for line in queue.event_queue_per_concurrency_id.values() for event in line.queue]
    running = [event for job in queue.active_jobs if job for event in job]
    return waiting + running


def address_of(request: Any) -> str | None:
    """The client's IP address of a ``fastapi.Request`` (``None`` when unknown)."""
    client = getattr(request, "client", None)
    return getattr(client, "host", None)


def check_handler(demo: Any, body: Any) -> None:
    """Raise :class:`UnknownHandler` when the call's ``fn_index`` names no handler of ``demo``."""
    index = body.fn_index
    if index is not None and index not in demo.fns:
        raise UnknownHandler(f"No event handler has fn_index {index!r}. This app's API: {public_endpoints(demo)}; "
                             "call it by name (gradio_client: predict(..., api_name='/compare'); HTTP: POST "
                             "/gradio_api/call/compare).")


def public_endpoints(demo: Any) -> str:
    """The app's public API endpoints, ``"/compare"``."""
    named = sorted(f"/{fn.api_name}" for fn in demo.fns.values()
                   if fn.api_name and getattr(fn, "api_visibility", "public") == "public")
    return ", ".join(named) or "none"
