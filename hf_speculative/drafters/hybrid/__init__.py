"""Several drafters, one step each, the best draft verified.

Importing this folder loads nothing heavy: its classes load on first use (``PUBLIC``, read by
``hf_speculative.drafters.registry``; ``hfs.Hybrid`` comes from here).
"""

from ..registry import lazy_attribute

PUBLIC = {"Hybrid": "drafter"}  # public name -> the module of this folder that defines it

__all__ = list(PUBLIC)


def __getattr__(name: str):
    return lazy_attribute(__name__, PUBLIC, name)
