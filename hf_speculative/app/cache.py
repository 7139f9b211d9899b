"""Model cache of the demo app: one target model in memory at a time, plus the draft models it uses.

Loading a model takes seconds and a target of a few hundred MB must not be duplicated per visitor, so
models are loaded once and shared by every request. Switching to another target loads the new one
first and only then frees the previous one (and the draft models loaded for it): a switch that fails
(a model that does not load) keeps the loaded model serving. The price is memory: during a switch both
targets are in memory, so a host must have room for the two largest models it offers (a Space offering
only one model never switches). Once the switch is done, the old target is freed.

LayerSkip's ``'auto'`` calibration is kept per model under the package's cache, named after the
model's fingerprint (:meth:`ModelCache.calibration_file`): a remote caller never names that file.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)

Loader = Callable[..., tuple[Any, Any]]
RETRY_AFTER_S = 300.0
"""A model that failed to load is not tried again for this long (its error is raised again at once)."""


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
            :func:`hf_speculative.registry.models.load_model` (registry names, local folders, Hub ids).
        device (`torch.device`, *optional*): where models go; defaults to :func:`default_device`.
        warmup (`bool`): run a tiny generation right after loading a target, so that the first
            visitor's timings do not include one-off start-up costs (kernel selection, allocations).
        calibration_dir (`str` or `Path`, *optional*): where LayerSkip calibrations are kept, one file
            per model fingerprint (default: ``<package cache>/calibrations/layer-skip``).
    """

    def __init__(self, loader: Loader | None = None, device: torch.device | None = None, warmup: bool = True,
                 calibration_dir: str | Path | None = None):
        self._loader = loader
        self.device = device or default_device()
        self.warmup = warmup
        self._calibration_dir = None if calibration_dir is None else Path(calibration_dir)
        self._lock = threading.RLock()
        self._target: LoadedModel | None = None
        self._drafts: dict[str, Any] = {}
        self._failed: dict[str, tuple[float, BaseException]] = {}  # name -> (when, error) of a failed load
        self.loads = 0  # how many targets were loaded (tests check that a second request reuses one)

    # -- public ---------------------------------------------------------------------------------
    @property
    def current(self) -> LoadedModel | None:
        return self._target

    def get(self, name: str) -> LoadedModel:
        """The target ``name``, loaded on first use. Another cached target is freed once ``name`` has
        loaded (and warmed up); if loading fails, the error is raised and the cached target stays."""
        with self._lock:
            if self._target is not None and self._target.name == name:
                return self._target
            model, tokenizer = self._load(name)
            if self.warmup:
                _warm_up(model, tokenizer)
            self.clear()
            self._target = LoadedModel(name, model, tokenizer, self.device)
            self.loads += 1
            return self._target

    def draft(self, name: str) -> Any:
        """The draft model ``name`` (registry name or path), loaded once per cached target."""
        with self._lock:
            if name not in self._drafts:
                # Always a model object of its own, even under the target's name: drafters rightly
                # refuse the target instance itself (its cache would be shared).
                self._drafts[name], _ = self._load(name)
            return self._drafts[name]

    def calibration_file(self, loaded: LoadedModel) -> Path:
        """Where LayerSkip keeps its ``'auto'`` calibration for ``loaded``: a file under the package's cache
        named after the model's fingerprint (:func:`~hf_speculative.drafters.self_speculative.calibration.model_fingerprint`).
        A file there that does not hold a calibration for this model is removed (calibrated again)."""
        from ..drafters.self_speculative.calibration import SkipCalibration, model_fingerprint

        with self._lock:
            folder = self._calibration_dir
            if folder is None:
                from ..registry.models import cache_dir

                folder = cache_dir() / "calibrations" / "layer-skip"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{model_fingerprint(loaded.model)}.json"
            if path.exists():
                try:
                    SkipCalibration.load(path).check_fits(loaded.model)
                except ValueError:
                    logger.warning("removing an unreadable LayerSkip calibration: %s", path)
                    path.unlink(missing_ok=True)
            return path

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
        """Load ``name``; a load that failed less than :data:`RETRY_AFTER_S` ago fails again at once with the same
        error (a model that cannot be fetched or converted is not tried again by every visitor who picks it)."""
        failed = self._failed.get(name)
        if failed is not None and time.monotonic() - failed[0] < RETRY_AFTER_S:
            ago = time.monotonic() - failed[0]
            raise RuntimeError(f"{str(failed[1]).rstrip('.') or type(failed[1]).__name__} (this load failed {ago:.0f} s "
                               f"ago; it is tried again {RETRY_AFTER_S / 60:g} minutes after a failure)") from failed[1]
        loader = self._loader
        if loader is None:
            from ..registry.models import load_model as loader
        device = None if self.device.type == "cpu" else self.device
        logger.info("loading %s on %s", name, self.device)
        try:
            model, tokenizer = loader(name, device=device)
        except Exception as err:
            self._failed[name] = (time.monotonic(), err)
            raise
        self._failed.pop(name, None)
        return model.eval(), tokenizer


def _warm_up(model: Any, tokenizer: Any) -> None:
    """A 2-token greedy generation: the first forwards of a fresh model are much slower than later ones."""
    ids = torch.tensor([[tokenizer.eos_token_id or 0, tokenizer.eos_token_id or 0]], device=model.device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False, pad_token_id=pad)
