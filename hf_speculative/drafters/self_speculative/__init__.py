"""Self-speculation: early exit, layer skip, the exit adapter."""

from .strategies import EarlyExit, LayerSkip

__all__ = ["EarlyExit", "LayerSkip"]
