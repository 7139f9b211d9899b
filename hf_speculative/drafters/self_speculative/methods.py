"""Self-speculation's methods of the command line, the benchmark and the app: early exit (with or without a trained
adapter) and layer skip.

How ``METHODS`` and its builds are read and called: :mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

from typing import Any

METHODS = [
    {"name": "early-exit", "order": 70, "label": "Early exit (hfs)",
     "description": "hf_speculative's early exit: the target's first layers draft, on the target's own KV cache.",
     "options": {"exit_layer": 8, "num_tokens": None}, "build": "build_early_exit"},
    {"name": "early-exit-adapter", "order": 80, "label": "Early exit + adapter (hfs)",
     "description": "hf_speculative's early exit with a trained exit adapter (Kangaroo): the target's first layers and "
                    "one small trained layer draft, on the target's own KV cache.",
     "options": {"adapter": None, "num_tokens": None}, "build": "build_early_exit_adapter",
     "source": {"option": "adapter", "what": "exit adapter", "shipped": "shipped",
                "missing": "pass --adapter PATH to one trained with `hf-speculative train-eagle --exit-layer K`."}},
    {"name": "layer-skip", "order": 90, "label": "Layer skip (hfs)",
     "description": "hf_speculative's layer skipping: the target minus a calibrated set of layers drafts, on its own KV "
                    "cache.",
     "options": {"skip": "auto", "calibration_file": None, "num_tokens": None, "adaptive": True},
     "build": "build_layer_skip"},
]


def shipped() -> list[str]:
    """The targets a trained exit adapter ships for."""
    from .exit_adapter import shipped_adapters

    return shipped_adapters()


def build_early_exit(model: Any, tokenizer: Any, call: Any) -> dict:
    from .strategies import EarlyExit

    return {"candidate_generator": EarlyExit(exit_layer=call.option("exit_layer"), **call.length())}  # it checks both


def build_early_exit_adapter(model: Any, tokenizer: Any, call: Any) -> dict:
    from .strategies import EarlyExit

    return call.trained("adapter", cache_key="_exit_adapters",
                        load=lambda source, settings: EarlyExit(adapter=source, **settings))


def build_layer_skip(model: Any, tokenizer: Any, call: Any) -> dict:
    from .strategies import LayerSkip

    skip = call.option("skip")
    if isinstance(skip, str) and skip != "auto":
        try:
            skip = [int(i) for i in skip.replace(" ", "").split(",") if i]
        except ValueError:
            raise ValueError(f"--skip {skip!r}: give 'auto' or comma-separated layer indices, e.g. --skip 4,6,9") from None
    extra = call.length()
    if skip == "auto" and call.option("calibration_file") is not None:
        extra["calibration_file"] = call.option("calibration_file")
    return {"candidate_generator": LayerSkip(skip, adaptive=call.flag("adaptive"), **extra)}
