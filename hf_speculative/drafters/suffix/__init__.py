"""SuffixDecoding: suffix trees over the prompt and earlier outputs."""

from .drafter import SuffixDecoding

__all__ = ["SuffixDecoding"]
