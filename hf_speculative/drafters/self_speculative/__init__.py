"""Self-speculation: early exit, layer skip, the exit adapter.

Importing this folder loads nothing heavy: its classes load on first use (``PUBLIC``, read by
``hf_speculative.drafters.registry``; ``hfs.EarlyExit`` comes from here).
"""

from ..registry import lazy_attribute

PUBLIC = {"EarlyExit": "strategies", "LayerSkip": "strategies"}  # public name -> the module of this folder that defines it

__all__ = list(PUBLIC)


def __getattr__(name: str):
    return lazy_attribute(__name__, PUBLIC, name)
