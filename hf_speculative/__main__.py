"""``python -m hf_speculative`` and the ``hf-speculative`` console script: the command line.

Without the [cli] extra (typer, rich) the command prints the ``pip install`` to run instead of a
traceback.
"""

import sys


def main() -> None:
    """Run :func:`hf_speculative.cli.main.main`, or say which extra to install when typer or rich is missing."""
    try:
        from .cli.main import main as cli_main
    except ImportError as err:
        if 'pip install "hf-speculative[' not in str(err):
            raise
        print(f"hf-speculative: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    cli_main()


if __name__ == "__main__":
    main()
