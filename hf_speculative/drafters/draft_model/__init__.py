"""A smaller model with the target"s tokenizer drafts."""

from .drafter import DraftModel

__all__ = ["DraftModel"]
