"""Drafting with the target's own multi-token-prediction (MTP) layers (DeepSeek-V3, GLM-4.5), transformers'
``MtpModel``: chains and Medusa-like trees in hf_speculative's loop.

Importing this folder loads nothing heavy: its classes load on first use (``PUBLIC``, read by
``hf_speculative.drafters.registry``; ``hfs.MTP`` comes from here).
"""

from ..registry import lazy_attribute

PUBLIC = {"MTP": "drafter"}  # public name -> the module of this folder that defines it

__all__ = list(PUBLIC)


def __getattr__(name: str):
    return lazy_attribute(__name__, PUBLIC, name)
