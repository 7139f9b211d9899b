"""Model cache of the demo app: one target model in memory at a time, plus the draft models it uses.

Loading a model takes seconds and a target of a few hundred MB must not be duplicated per visitor, so
models are loaded once and shared by every request. Switching to another target frees the previous one
(and the draft models loaded for it) before loading the new one, so a small Space never holds two
targets at once.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)

Loader = Callable[..., tuple[Any, Any]]


def default_device() -> torch.device:
    """CUDA when a GPU is visible, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def describe_device(device: torch.device) -> str:
    """A short human readable description of ``device`` for the page, e.g. ``"CPU (2 threads)"``."""
    if device.type == "cuda":
        return f"GPU: {torch.cuda.get_device_name(device)}"
    return f"CPU ({torch.get_num_threads()} thread{'s' if torch.get_num_threads() != 1 else ''})"


@dataclasses.dataclass
class LoadedModel:
    """A target model ready to serve: its registry name or path, the model, its tokenizer, its device."""

    name: str
    model: Any
    tokenizer: Any
    device: torch.device


class ModelCache:
    """Thread-safe cache holding one target model and the draft models loaded for it.

    Args:
        loader (`Callable`, *optional*): ``loader(name, device=...) -> (model, tokenizer)``; defaults to
            :func:`hf_speculative.models.load_model` (registry names, local folders, Hub ids).
        device (`torch.device`, *optional*): where models go; defaults to :func:`default_device`.
        warmup (`bool`): run a tiny generation right after loading a target, so that the first
            visitor's timings do not include one-off start-up costs (kernel selection, allocations).
    """

    def __init__(self, loader: Loader | None = None, device: torch.device | None = None, warmup: bool = True):
        self._loader = loader
        self.device = device or default_device()
        self.warmup = warmup
        self._lock = threading.RLock()
        self._target: LoadedModel | None = None
        self._drafts: dict[str, Any] = {}
        self.loads = 0  # how many targets were loaded (tests check that a second request reuses one)

    # -- public ---------------------------------------------------------------------------------
    @property
    def current(self) -> LoadedModel | None:
        return self._target

    def get(self, name: str) -> LoadedModel:
        """The target ``name``, loaded on first use; any other cached target is freed first."""
        with self._lock:
            if self._target is not None and self._target.name == name:
                return self._target
            self.clear()
            model, tokenizer = self._load(name)
            self._target = LoadedModel(name, model, tokenizer, self.device)
            self.loads += 1
            if self.warmup:
                _warm_up(model, tokenizer)
            return self._target

    def draft(self, name: str) -> Any:
        """The draft model ``name`` (registry name or path), loaded once per cached target."""
        with self._lock:
            if name not in self._drafts:
                # Always a model object of its own, even under the target's name: drafters rightly
                # refuse the target instance itself (its cache would be shared).
                self._drafts[name], _ = self._load(name)
            return self._drafts[name]

    def clear(self) -> None:
        """Drop every cached model and give the memory back (requests still running keep theirs)."""
        with self._lock:
            self._target = None
            self._drafts.clear()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    # -- helpers --------------------------------------------------------------------------------
    def _load(self, name: str) -> tuple[Any, Any]:
        loader = self._loader
        if loader is None:
            from ..models import load_model as loader
        device = None if self.device.type == "cpu" else self.device
        logger.info("loading %s on %s", name, self.device)
        model, tokenizer = loader(name, device=device)
        return model.eval(), tokenizer


def _warm_up(model: Any, tokenizer: Any) -> None:
    """A 2-token greedy generation: the first forwards of a fresh model are much slower than later ones."""
    ids = torch.tensor([[tokenizer.eos_token_id or 0, tokenizer.eos_token_id or 0]], device=model.device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False, pad_token_id=pad)
