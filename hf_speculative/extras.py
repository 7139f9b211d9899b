"""Optional pieces of hf_speculative live behind pip extras and load on use.

The core install (``pip install hf-speculative``) needs torch, transformers, safetensors, numpy and
packaging only. Everything else is imported where it is first needed, through :func:`require`, so a
missing extra gives one message that names the command to run instead of a bare ``ModuleNotFoundError``
from deep inside a call.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# extra -> the distributions it adds (setup.cfg's [options.extras_require] says the same; a test keeps them in step)
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("accelerate", "tqdm"),
    "registry": ("gguf", "accelerate", "tqdm"),
    "cli": ("typer", "rich", "tqdm"),
    "kernel": ("ninja",),
    "app": ("gradio", "matplotlib"),
    "openvino": ("openvino-genai", "optimum-intel"),
}


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature``, or raise an ImportError naming ``pip install "hf-speculative[extra]"``.

    Args:
        module: the module to import (``"accelerate"``, ``"gguf"``, ``"matplotlib.figure"``).
        extra: the extra of setup.cfg that installs it (a key of :data:`EXTRAS`).
        feature: what needs it, in words, for the message (``"train-eagle"``, ``"the model registry"``).
    """
    if extra not in EXTRAS:
        raise ValueError(f"Unknown extra {extra!r}: use one of {', '.join(sorted(EXTRAS))}.")
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{feature} needs the optional package {module.split('.')[0]!r}, which is not installed: "
            f'pip install "hf-speculative[{extra}]"'
        ) from err
