"""Self-speculative decoding: the target drafts for itself with fewer layers, on its own KV cache.

- ``hfs.EarlyExit(exit_layer=k)``: the first ``k`` layers, then the final norm and lm_head
  (LayerSkip, Elhoushi et al. 2024).
- ``hfs.LayerSkip(skip=[...] | "auto")``: every layer but a skipped set (Draft & Verify, Zhang et
  al. 2023; SWIFT, Xia et al. 2024); ``"auto"`` calibrates the set (see ``layer_calibration``).

These are the strategies (options, checks); the drafting itself is ``layer_drafter``'s, and with a
trained exit adapter ``exit_adapter``'s.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from ... import options
from ...options import CheckedOnAssignment
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..registry import Capabilities, SpecFiles, example_label
from ...core.costs import verify_costs_for
from .calibration import (SkipCalibration, calibrate_layer_skip, cached_calibration, model_fingerprint,
                          remember_calibration)
from .drafter import SelfSpeculativeCandidateGenerator
from .layer_view import check_structure, layer_subset, num_layers
from ...core.policy import check_chain_options


ADAPTER_METHOD = "early-exit-adapter"  # the spec method of an EarlyExit with a trained exit adapter


def _eagle_checkpoints():
    """An exit adapter is an EAGLE network: EAGLE's checkpoint module (imported on use)."""
    from ..eagle import checkpoints

    return checkpoints


# exit_adapter.SHIPPED_DIR, named here without importing that module (it loads the EAGLE network's modelling)
_ADAPTER_FILES = SpecFiles(network="checkpoint", subfolder="exit-adapter", checkpoints=_eagle_checkpoints,
                           shipped_dir=Path(__file__).parent / "exit_adapters")
# They draft with the target's own layers over its dynamic KV cache: chains only, one row, no static cache
SELF_SPECULATION = Capabilities(reads_target="cache")


class _SelfSpeculative(CheckedOnAssignment, DraftStrategy):
    """What EarlyExit and LayerSkip share (each declares itself, and its own fields in its own order)."""
    num_tokens: int
    confidence_threshold: float
    adaptive: bool
    draft_cost: float | None

    def drafted_layers(self, target: torch.nn.Module) -> list[int] | None:
        """The layers a draft runs (``None``: not known before the call calibrates)."""
        raise NotImplementedError

    def validate_target(self, target: torch.nn.Module) -> None:
        check_structure(target)
        layers = self.drafted_layers(target)
        if layers is not None:
            layer_subset(target, layers)

    def open(self, ctx: CallContext) -> "SelfSpeculativeCandidateGenerator":
        return SelfSpeculativeCandidateGenerator(ctx, self)


@dataclasses.dataclass(eq=False)
class EarlyExit(_SelfSpeculative, method="early-exit", variants={ADAPTER_METHOD: _ADAPTER_FILES},
                capabilities=SELF_SPECULATION, examples=("early-exit", "early-exit-adapter"),
                live_fields=("adapter", "adapter_sha256")):
    """Draft with the target's first ``exit_layer`` layers, its final norm and its lm_head, or with a
    trained exit adapter instead of the norm and lm_head.

    Args:
        exit_layer (`int`): layers run by a draft, in ``[1, num_layers)``; models trained for early
            exit (LayerSkip checkpoints) accept far more at shallow exits than others. Taken from the
            adapter when one is given.
        adapter (`str` or `EagleDraftModel`, *optional*): a trained exit adapter (Kangaroo): a folder
            written by ``hf-speculative train-eagle --exit-layer K``, a shipped adapter's name, or a
            loaded network. It reads the exit state of each drafted token and attends over those of
            the context with its own small cache; the target's cache is shared as without it.
        adapter_sha256 (`dict[str, str]`, *optional*): expected digests of the adapter's files.
        num_tokens (`int`, defaults to 8): the longest draft.
        confidence_threshold (`float`, defaults to 0.1): stop after a token the exit gives less than
            this probability (0 disables).
        adaptive (`bool`, defaults to `True`): draft a token only while its calibrated chance of
            acceptance pays for drafting and verifying it (measured costs).
        draft_cost (`float`, *optional*): one drafting step in target forwards; measured by default.
    """

    exit_layer: int | None = None
    num_tokens: int = 8
    confidence_threshold: float = 0.1
    adaptive: bool = True
    draft_cost: float | None = None
    adapter: Any = dataclasses.field(default=None, repr=False)
    adapter_sha256: dict | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        self._adapter_net = None
        # every number is checked before an adapter is loaded: a bad option fails fast, and for free
        check_chain_options(self)
        if self.exit_layer is not None:
            self.exit_layer = options.check_int("EarlyExit", "exit_layer", self.exit_layer, 1, options.MAX_LAYERS - 1)
        if self.adapter is not None:
            from ..eagle.model import EagleDraftModel
            from .exit_adapter import describe, load_adapter

            if not isinstance(self.adapter, (str, os.PathLike, EagleDraftModel)):
                raise options.OptionTypeError(
                    f"EarlyExit(adapter={options.shown(self.adapter)}): must be an adapter's folder, a shipped adapter's "
                    "name or a loaded EagleDraftModel.")
            self._adapter_net = load_adapter(self.adapter, sha256=self.adapter_sha256)
            self.adapter_label = describe(self._adapter_net, self.adapter)
            trained = self._adapter_net.config.exit_layer
            if self.exit_layer is None:
                self.exit_layer = trained
            elif self.exit_layer != trained:
                raise ValueError(f"EarlyExit(exit_layer={self.exit_layer}) with an adapter trained for exit_layer={trained}: "
                                 f"an adapter reads the exit it was trained on; use exit_layer={trained} (or leave it out).")
        if self.exit_layer is None:
            raise ValueError(f"EarlyExit(exit_layer={self.exit_layer!r}): give the number of layers to draft with, >= 1 "
                             "(e.g. hfs.EarlyExit(exit_layer=8)).")

    def drafted_layers(self, target: torch.nn.Module) -> list[int]:
        total = num_layers(target)
        if self.exit_layer >= total:
            raise ValueError(f"EarlyExit(exit_layer={self.exit_layer}) must be below the model's {total} layers "
                             f"(an exit after every layer is the model itself); pick 1..{total - 1}.")
        return list(range(self.exit_layer))

    def adapter_for(self, target: torch.nn.Module):
        """The adapter network, checked against ``target`` and on its device and dtype (``None`` without one)."""
        if self._adapter_net is None:
            return None
        from .exit_adapter import ready_for

        return ready_for(self._adapter_net, target)

    def validate_target(self, target: torch.nn.Module) -> None:
        self.adapter_for(target)  # first: its error names what the adapter was trained for
        super().validate_target(target)

    def open(self, ctx: CallContext) -> "SelfSpeculativeCandidateGenerator":
        if self._adapter_net is None:
            return SelfSpeculativeCandidateGenerator(ctx, self)
        from .exit_adapter import ExitAdapterCandidateGenerator

        return ExitAdapterCandidateGenerator(ctx, self)

    # -- its spec (hf/spec.py) and its examples ----------------------------------------------------------
    def spec_method(self) -> str:
        return ADAPTER_METHOD if self.adapter is not None else type(self).method

    def spec_path(self) -> str | None:
        return str(self.adapter) if isinstance(self.adapter, (str, os.PathLike)) else None

    def spec_network(self) -> Any:
        return self._adapter_net

    @classmethod
    def load_network(cls, method: str, folder: Any, target: torch.nn.Module) -> Any:
        from .exit_adapter import load_adapter

        return load_adapter(folder)

    @classmethod
    def from_spec_options(cls, method: str, options: dict, network: Any = None) -> "EarlyExit":
        return cls(**options) if network is None else cls(adapter=network, **options)

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> "EarlyExit":
        """Chains of 5 at every step from the target's first layer: ``"early-exit"`` through its norm and lm_head,
        ``"early-exit-adapter"`` through a random exit adapter."""
        settings = {"exit_layer": 1, "num_tokens": 5, "confidence_threshold": 0.0, "adaptive": False}
        if example_label(cls, label) == ADAPTER_METHOD:
            from ..eagle.drafter import random_drafter

            settings = {**settings, "adapter": random_drafter(target, exit_layer=1)}
        return cls(**{**settings, **options})


@dataclasses.dataclass(eq=False)
class LayerSkip(_SelfSpeculative, method="layer-skip", capabilities=SELF_SPECULATION,
                examples=("layer-skip", "layer-skip-auto"),
                # a calibration file in a spec: a name inside the model's folder, kept in the package's cache per model
                files=SpecFiles(file_option="calibration_file", saved_name="layer-skip-calibration.json",
                                fingerprint=model_fingerprint)):
    """Draft with the target minus a set of skipped layers.

    Args:
        skip (`list[int]` or `"auto"`, defaults to `"auto"`): layer indices to skip. ``"auto"``
            picks them with a short calibration that maximises the expected speedup (acceptance
            measured against the full model x cost): on ``calibration_file`` if it holds one for
            this model, else on the first ``calibration_tokens`` tokens the first call generates
            (drafting nothing until then: the model's own text is what drafts will be judged on,
            and it agrees with a reduced model far more than a prompt does); the result is cached per model for later calls, saved to
            ``calibration_file`` when given, and reported in ``hfs.last_stats(model).extra``.
            :meth:`calibrate` does the same ahead of time on prompts of your choice.
        calibration_file (`str`, *optional*): JSON file to load the calibration from / save it to.
        calibration_tokens (`int`, defaults to 32): generated tokens the on-the-fly calibration waits for.
        num_tokens, confidence_threshold, adaptive, draft_cost: as for :class:`EarlyExit`.
    """

    skip: Sequence[int] | str = "auto"
    num_tokens: int = 8
    confidence_threshold: float = 0.1
    adaptive: bool = True
    draft_cost: float | None = None
    calibration_file: str | os.PathLike | None = None
    calibration_tokens: int = 32

    def __post_init__(self):
        if isinstance(self.skip, str):
            if self.skip != "auto":
                raise ValueError(f"LayerSkip(skip={options.shown(self.skip)}): give a list of layer indices or 'auto'.")
        else:
            # in range of the model is checked once it is known (drafted_layers); here, any model's
            self.skip = options.check_int_list("LayerSkip", "skip", self.skip, 0, options.MAX_LAYERS - 1,
                                               options.MAX_LAYERS - 1)
            if self.calibration_file is not None:
                raise ValueError("LayerSkip(calibration_file=...) is only read with skip='auto'.")
        self.calibration_file = options.check_optional_path("LayerSkip", "calibration_file", self.calibration_file)
        self.calibration_tokens = options.check_int("LayerSkip", "calibration_tokens", self.calibration_tokens, 4,
                                                    options.MAX_CALIBRATION_TOKENS)
        check_chain_options(self)

    @property
    def auto(self) -> bool:
        return isinstance(self.skip, str)

    def drafted_layers(self, target: torch.nn.Module) -> list[int] | None:
        total = num_layers(target)
        if self.auto:
            plan = self.calibration_for(target)
            return None if plan is None else plan.drafted_layers
        bad = [i for i in self.skip if not 0 <= i < total]
        if bad:
            raise ValueError(f"LayerSkip(skip={list(self.skip)}): {bad} out of range, the model has layers 0..{total - 1}.")
        if len(self.skip) >= total:
            raise ValueError(f"LayerSkip(skip=...) skips all {total} layers; keep at least one.")
        return [i for i in range(total) if i not in set(self.skip)]

    def calibration_for(self, target: torch.nn.Module) -> SkipCalibration | None:
        """The calibration this strategy would use for ``target`` now (``None``: to be measured)."""
        plan = cached_calibration(target)
        if plan is None and self.calibration_file is not None and os.path.exists(self.calibration_file):
            plan = SkipCalibration.load(self.calibration_file)
            plan.check_fits(target)
            remember_calibration(target, plan)
        return plan

    def calibrate(self, target: torch.nn.Module, input_ids: torch.Tensor, from_position: int = 0) -> SkipCalibration:
        """Calibrate the skipped set for ``target`` on ``input_ids`` `[1, T]` or `[T]` now (best: a
        prompt and the model's own greedy answer, with ``from_position`` = the prompt's length),
        cache it for the model and save it to ``calibration_file`` if given."""
        check_structure(target)
        ids = torch.as_tensor(input_ids).reshape(1, -1).to(next(target.parameters()).device)
        plan = calibrate_layer_skip(target, ids, verify_costs_for(target, self.num_tokens), self.num_tokens,
                                    from_position=from_position)
        remember_calibration(target, plan)
        if self.calibration_file is not None:
            plan.save(self.calibration_file)
        return plan

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> "LayerSkip":
        """Chains of 5 at every step: ``"layer-skip"`` without layer 0 (the view then sizes its masks from another
        layer), ``"layer-skip-auto"`` calibrated after the first 4 generated tokens."""
        skip = {"layer-skip": [0], "layer-skip-auto": "auto"}[example_label(cls, label)]
        settings = {"skip": skip, "num_tokens": 5, "confidence_threshold": 0.0, "adaptive": False}
        if skip == "auto":
            settings["calibration_tokens"] = 4
        return cls(**{**settings, **options})
