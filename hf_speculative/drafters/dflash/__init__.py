"""DFlash block drafters: one drafter forward drafts a whole block from the target's hidden states.

Importing this folder loads nothing heavy: its classes load on first use (``PUBLIC``, read by
``hf_speculative.drafters.registry``; ``hfs.DFlash`` comes from here).
"""

from ..registry import lazy_attribute

PUBLIC = {"DFlash": "drafter"}  # public name -> the module of this folder that defines it

__all__ = list(PUBLIC)


def __getattr__(name: str):
    return lazy_attribute(__name__, PUBLIC, name)
