"""EAGLE: one trained layer drafts from the target's own hidden states (EAGLE-1/2/3), chains and trees.

Importing this folder loads nothing heavy: its classes load on first use (``PUBLIC``, read by
``hf_speculative.drafters.registry``; ``hfs.Eagle`` comes from here).
"""

from ..registry import lazy_attribute

PUBLIC = {"Eagle": "drafter"}  # public name -> the module of this folder that defines it

__all__ = list(PUBLIC)


def __getattr__(name: str):
    return lazy_attribute(__name__, PUBLIC, name)
