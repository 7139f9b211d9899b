"""Lookahead decoding: Jacobi iterations and an n-gram pool."""

from .drafter import Lookahead

__all__ = ["Lookahead"]
