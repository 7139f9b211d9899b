"""The hf_speculative demo: greedy and speculative decoding side by side (Gradio).

Run ``python app.py`` (or ``make demo``) and open the printed URL. On Hugging Face Spaces this file
is the ``app_file``; Spaces runs it as ``__main__`` too. Importing it builds nothing: call
:func:`build_app` for the Blocks.
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def build_app(**kwargs: Any) -> Any:
    """The demo's ``gr.Blocks`` (see :func:`hf_speculative.app.ui.build_app` for the arguments)."""
    from hf_speculative.app import build_app as _build_app

    return _build_app(**kwargs)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    # Environment variables for Spaces, where app.py runs without arguments (set them in the Space's settings).
    parser.add_argument("--model", default=os.environ.get("HFS_APP_MODEL"),
                        help="model selected when the page opens (default: the registry's; env HFS_APP_MODEL)")
    parser.add_argument("--threads", type=int, default=_env_int("HFS_APP_THREADS"),
                        help="torch CPU threads (default: torch's own; 1 gives the steadiest timings on small CPUs; "
                        "env HFS_APP_THREADS)")
    parser.add_argument("--max-queue", type=int, default=_env_int("HFS_APP_MAX_QUEUE") or 16,
                        help="requests allowed to wait in the queue (env HFS_APP_MAX_QUEUE)")
    parser.add_argument("--max-per-session", type=int, default=_env_int("HFS_APP_MAX_PER_SESSION"),
                        help="comparisons one session (a page, a gradio_client.Client) may have waiting or running; "
                        "more are refused with HTTP 429 (default 2; 0: no bound; env HFS_APP_MAX_PER_SESSION)")
    parser.add_argument("--max-per-address", type=int, default=_env_int("HFS_APP_MAX_PER_ADDRESS"),
                        help="the same for one IP address (default: half of --max-queue; 0: no bound, behind a proxy "
                        "that hides visitors' addresses; env HFS_APP_MAX_PER_ADDRESS)")
    parser.add_argument("--max-body-kb", type=int, default=_env_int("HFS_APP_MAX_BODY_KB"),
                        help="KiB one HTTP request body may hold; a larger one gets HTTP 413 before it is read "
                        "(default 512; 0: no limit; env HFS_APP_MAX_BODY_KB)")
    parser.add_argument("--allow-local-paths", action="store_true",
                        help="let visitors also type local folders and Hub ids for the model, draft model, EAGLE "
                        "drafter and exit adapter (default: only the registry's models, --model and the shipped "
                        "drafters). For a local run: refused on a Space (SPACE_ID) and with a --host beyond localhost")
    parser.add_argument("--allow-downloads", action="store_true",
                        help="let visitors pick registry models that are not on this server's disk, which it then "
                        "downloads and converts (default: only models already downloaded are served, the others "
                        "shown disabled). Refused on a Space (SPACE_ID)")
    return parser.parse_args(argv)


def _fetch_default(model: str) -> None:
    """The operator's own model, fetched before the app serves (a registry name not on disk yet): the one
    download the app makes without ``--allow-downloads``, at start, never for a visitor."""
    from hf_speculative.registry.models import REGISTRY, fetch, is_cached

    if model in REGISTRY and not is_cached(model):
        print(f"fetching {model} before serving (hf-speculative models fetch {model}) …", flush=True)
        fetch(model)


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    """The per-client and per-request bounds given on the command line (the others keep build_app's defaults)."""
    given = {"max_per_session": args.max_per_session, "max_per_address": args.max_per_address,
             "max_body_bytes": None if args.max_body_kb is None else args.max_body_kb * 1024}
    return {key: value for key, value in given.items() if value is not None}


def main(argv: list[str] | None = None) -> None:
    """Build the app and serve it until interrupted, printing the local URL."""
    args = _parse_args(argv)
    from hf_speculative.app.offer import check_downloads
    from hf_speculative.app.request import check_exposure
    from hf_speculative.registry.models import DEFAULT_MODEL

    try:
        check_exposure(args.allow_local_paths, args.host)
        check_downloads(args.allow_downloads)
    except ValueError as err:
        raise SystemExit(f"app.py: {err}") from None
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    kwargs: dict[str, Any] = {"max_queue": args.max_queue, "allow_local_paths": args.allow_local_paths,
                              "allow_downloads": args.allow_downloads, **_limits(args)}
    if args.model:
        kwargs["default_model"] = args.model
    _fetch_default(args.model or DEFAULT_MODEL)
    demo = build_app(**kwargs)
    _, local_url, _ = demo.launch(server_name=args.host, server_port=args.port, prevent_thread_lock=True)
    print(f"hf_speculative demo running at {local_url}  (Ctrl+C to stop)", flush=True)
    demo.block_thread()


if __name__ == "__main__":
    main()
