"""Several drafters, one step each, the best draft verified."""

from .drafter import Hybrid

__all__ = ["Hybrid"]
