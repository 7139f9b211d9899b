"""The demo app: greedy and speculative methods side by side, streaming, with live figures.

``build_app()`` builds the Gradio Blocks (``app.py`` at the repository root launches it); the
logic lives in small modules: :mod:`.request` (form checks and method options from the registry),
:mod:`.cache` (one model at a time), :mod:`.session` and :mod:`.streaming` (runs observed through a
streamer), :mod:`.highlight` (draft vs target text), :mod:`.plots`. Importing this package imports
gradio lazily: only :func:`build_app` needs it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_app"]


def build_app(*args: Any, **kwargs: Any) -> Any:
    """See :func:`hf_speculative.app.ui.build_app`."""
    from .ui import build_app as _build_app

    return _build_app(*args, **kwargs)
