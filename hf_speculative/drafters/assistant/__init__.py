"""Gemma-4 assistants (transformers' ``Gemma4AssistantForCausalLM``) drafting chains and trees on their target's
hidden state and shared K/V.

Importing this folder loads nothing heavy: its classes load on first use (``PUBLIC``, read by
``hf_speculative.drafters.registry``; ``hfs.Assistant`` comes from here).
"""

from ..registry import lazy_attribute

PUBLIC = {"Assistant": "drafter"}  # public name -> the module of this folder that defines it

__all__ = list(PUBLIC)


def __getattr__(name: str):
    return lazy_attribute(__name__, PUBLIC, name)
