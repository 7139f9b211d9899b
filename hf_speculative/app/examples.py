"""The demo app's example prompts (kept in :mod:`hf_speculative.prompting`, which the command line shares)."""

from __future__ import annotations

from ..prompting import EXAMPLES

__all__ = ["EXAMPLES"]
