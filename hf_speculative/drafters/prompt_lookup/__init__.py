"""Prompt lookup (n-gram matching in the context), chains and trees."""

from .drafter import PromptLookup

__all__ = ["PromptLookup"]
