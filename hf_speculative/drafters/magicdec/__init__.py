"""MagicDec: self-speculation over a compressed KV cache (attention sinks and a recent window), for batches at long
contexts.

Importing this folder loads nothing heavy: its classes load on first use (``PUBLIC``, read by
``hf_speculative.drafters.registry``; ``hfs.MagicDec`` comes from here).
"""

from ..registry import lazy_attribute

PUBLIC = {"MagicDec": "strategy"}  # public name -> the module of this folder that defines it

__all__ = list(PUBLIC)


def __getattr__(name: str):
    return lazy_attribute(__name__, PUBLIC, name)
