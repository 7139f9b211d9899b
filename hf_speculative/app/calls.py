"""Malformed API calls answered with a message: the app's Blocks (:class:`AppBlocks`).

The ``/compare`` handler checks every value it gets (:func:`~hf_speculative.app.request.parse_request`), but gradio
reads a call before the handler runs, and what it refuses there (too few values; a value shaped like a file that
was never uploaded) it answers with ``{"error": null}``: the exception's text is shown only with
``launch(show_error=True)``, which would show every other exception's text as well. :class:`AppBlocks` turns those
refusals into a ``gr.Error`` whose message says what the call lacks and how to send it, and logs no traceback
for them (a client's mistake, not the server's).
"""

from __future__ import annotations

import inspect
from typing import Any

from ..extras import require
from ..options import escaped
from .queue_share import public_endpoints

gr = require("gradio", "app", "The demo app")

SHOWN_PARAMETERS = 8  # parameter names a message lists before "and N more"


class AppBlocks(gr.Blocks):
    """``gr.Blocks`` whose refusals of a malformed call carry a message (see the module's docstring)."""

    def validate_inputs(self, block_fn: Any, inputs: list[Any]) -> None:
        check_count(block_fn, len(inputs))
        super().validate_inputs(block_fn, inputs)

    async def preprocess_data(self, block_fn: Any, inputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().preprocess_data(block_fn, inputs, *args, **kwargs)
        except gr.Error:
            raise
        except Exception as err:  # gradio's own checks of the values sent (the handler never raises)
            reason = escaped(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__, limit=300)
            raise gr.Error(f"The call to {_endpoint(block_fn)} could not be read: {reason.rstrip('.')}. Send plain "
                           "values (text, numbers, lists of names), as GET /gradio_api/info describes them.",
                           print_exception=False) from err


def exception_handlers(demo: Any) -> dict:
    """FastAPI exception handlers for calls gradio's routes fail on before any handler runs: a call to an endpoint
    name the app does not have (``POST /gradio_api/call/nope``) gets 404 and the list of its endpoints, where gradio
    raises ``FnIndexInferError`` and answers 500 with no text."""
    from fastapi.responses import JSONResponse
    from gradio.route_utils import FnIndexInferError

    async def unknown_endpoint(request: Any, err: Exception) -> Any:
        try:
            check_endpoint(demo, request.url.path)
        except UnknownEndpoint as refused:
            return JSONResponse(status_code=404, content={"detail": str(refused)})
        raise err  # an endpoint the app has, and gradio failed to find it: gradio's own failure

    return {FnIndexInferError: unknown_endpoint}


class UnknownEndpoint(ValueError):
    """A call names an API endpoint the app does not have."""


def check_endpoint(demo: Any, path: str) -> None:
    """Raise :class:`UnknownEndpoint` unless ``path`` (``/gradio_api/call/NAME...``) names a public endpoint."""
    name = path.split("/call/", 1)[-1].removeprefix("v2/").split("/", 1)[0]
    if f"/{name}" not in public_endpoints(demo).split(", "):
        raise UnknownEndpoint(f"No API endpoint at {escaped(path, limit=200)}. This app's API: "
                              f"{public_endpoints(demo)} (GET /gradio_api/info describes it).")


def check_count(block_fn: Any, got: int) -> None:
    """Raise a ``gr.Error`` naming what a call of ``block_fn`` takes when it sent ``got`` values, fewer than its
    inputs."""
    if got >= len(block_fn.inputs):
        return
    names = parameter_names(block_fn)
    listed = ", ".join(names[:SHOWN_PARAMETERS])
    if len(names) > SHOWN_PARAMETERS:
        listed += f" and {len(names) - SHOWN_PARAMETERS} more"
    where = _endpoint(block_fn)
    advice = "." if getattr(block_fn, "api_visibility", "public") != "public" else (
        f" (GET /gradio_api/info lists them all, with their defaults). gradio_client fills in the defaults of the "
        f"ones you do not name: client.predict(prompt=..., api_name='{where}').")
    raise gr.Error(f"The call to {where} sent {got} values; it takes {len(block_fn.inputs)}, in this order: "
                   f"{listed}{advice}", print_exception=False)


def parameter_names(block_fn: Any) -> list[str]:
    """The API's parameter names of ``block_fn`` (its signature's, less the ``gr.Request``)."""
    try:
        parameters = inspect.signature(block_fn.fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.annotation is not gr.Request and p.name != "request"
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _endpoint(block_fn: Any) -> str:
    return f"/{block_fn.api_name}" if block_fn.api_name else f"the page's handler {block_fn.name!r}"
