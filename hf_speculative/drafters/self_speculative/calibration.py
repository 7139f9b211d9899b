"""Choosing which layers ``hfs.LayerSkip("auto")`` skips: a short search that maximises the
expected speedup, measured on real text against the full model.

1. One forward of the full model over the calibration text gives its greedy choice at every
   position and every layer's hidden states (agreement is counted on the generated part). A layer that barely turns the residual stream
   (``1 - cos(h_in, h_out)``, the block influence of ShortGPT, Men et al. 2024) is cheap to skip;
   the layers are ranked by it (the last layer, whose output is the final norm's input, is kept).
2. Skipping the ``m`` least influential layers, for growing ``m``: one forward of the reduced
   model over the same text measures ``a``, how often it picks the full model's token (the
   acceptance rate of a greedy draft, token by token, on this text); its cost ``c`` is the share
   of the parameters it runs (layers + lm_head). The expected speedup of drafting ``k`` tokens
   is ``(1 + a + ... + a^k) / (k c + v(k))`` with ``v(k)`` the measured cost of verifying ``k``
   tokens (in one-token forwards). The set with the best speedup wins; the scan stops once the
   speedup has fallen for three sizes in a row.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import torch

from ...core.state import state_of
from .layer_view import LayerSubset, num_layers, sequence_logits

FORMAT = "hf_speculative.layer_skip/1"


@dataclasses.dataclass
class SkipCalibration:
    """The result of a LayerSkip calibration (saved as a small JSON file).

    Attributes:
        skip (`list[int]`): the skipped layers.
        num_layers (`int`): layers of the model it was measured on.
        model (`str`): that model's ``name_or_path`` (informative).
        agreement (`float`): share of positions where the reduced model picks the full model's token.
        draft_cost (`float`): parameters run per draft token, as a share of a full forward.
        expected_speedup (`float`): the search's objective for the chosen set.
        tokens / seconds: size of the calibration text and the time the search took.
        candidates (`list[dict]`): every set tried (``skipped``, ``agreement``, ``speedup``).
    """

    skip: list[int]
    num_layers: int
    model: str = ""
    agreement: float = 0.0
    draft_cost: float = 1.0
    expected_speedup: float = 1.0
    tokens: int = 0
    seconds: float = 0.0
    candidates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # where this object came from ("calibrated" or "file"); not saved
    source: str = dataclasses.field(default="calibrated", compare=False, repr=False)

    def __post_init__(self):
        if self.num_layers < 2 or any(not 0 <= i < self.num_layers for i in self.skip) or len(self.skip) >= self.num_layers:
            raise ValueError(f"invalid LayerSkip calibration: skip={self.skip} for {self.num_layers} layers")
        self.skip = sorted(int(i) for i in self.skip)

    @property
    def drafted_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if i not in set(self.skip)]

    def check_fits(self, target: torch.nn.Module) -> None:
        total = num_layers(target)
        if total != self.num_layers:
            raise ValueError(f"This LayerSkip calibration was made for a {self.num_layers}-layer model ({self.model!r}); "
                             f"the target has {total} layers. Delete the calibration file or pass another one.")

    def save(self, path: str | os.PathLike) -> None:
        data = {"format": FORMAT, **dataclasses.asdict(self)}
        data.pop("source")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SkipCalibration":
        from ...registry.integrity import MAX_JSON_BYTES, read_capped

        try:  # a regular file of at most MAX_JSON_BYTES (FileRefused, a ValueError, names the option otherwise)
            text = read_capped(path, MAX_JSON_BYTES, f"LayerSkip(calibration_file={os.fspath(path)!r})")
        except OSError as error:
            raise ValueError(f"{os.fspath(path)!r} is not a readable LayerSkip calibration ({error}); delete it to "
                             "calibrate again, or pass skip=[...] explicitly.") from error
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
                raise ValueError(f"format is not {FORMAT!r}")
            data.pop("source", None)
            return cls(**data, source="file")
        except (ValueError, TypeError, RecursionError) as error:
            raise ValueError(f"{os.fspath(path)!r} is not a readable LayerSkip calibration ({error}); delete it to "
                             "calibrate again, or pass skip=[...] explicitly.") from error


@dataclasses.dataclass(eq=False)
class HeldCalibration:
    """The calibration of ``LayerSkip("auto")`` kept for a target in this process, in its state
    (``state_of(target).drafter_state(HeldCalibration)``; ``hfs.forget(target)`` drops it)."""

    plan: SkipCalibration | None = None


def cached_calibration(target: torch.nn.Module) -> SkipCalibration | None:
    """The calibration made or loaded for ``target`` in this process (``None``: none yet)."""
    return state_of(target).drafter_state(HeldCalibration).plan


def remember_calibration(target: torch.nn.Module, plan: SkipCalibration) -> None:
    state_of(target).drafter_state(HeldCalibration).plan = plan


def model_fingerprint(target: torch.nn.Module, sample: int = 1024) -> str:
    """A short hex name for ``target``'s identity, to keep its calibration under (the demo app keeps
    LayerSkip's ``'auto'`` calibration at ``<package cache>/calibrations/layer-skip/<fingerprint>.json``).

    sha256 of the model's class, its config (without paths and versions) and every parameter's name,
    shape, dtype and first and last ``sample`` values: the same checkpoint loaded anywhere gives the same
    name, another checkpoint or architecture another one. It names a cache entry, it is not an integrity
    check (a change in the middle of a tensor is not seen; a calibration only affects speed, never the
    output, which the target verifies)."""
    import hashlib

    digest = hashlib.sha256(type(target).__name__.encode())
    config = getattr(target, "config", None)
    if config is not None:
        settings = {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
        digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for name, param in target.named_parameters():
        flat = param.detach().reshape(-1)
        ends = flat if flat.numel() <= 2 * sample else torch.cat([flat[:sample], flat[-sample:]])
        digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}".encode())
        digest.update(ends.float().cpu().numpy().tobytes())
    return digest.hexdigest()[:32]


def expected_speedup(agreement: float, draft_cost: float, verify_ratio, max_draft: int) -> float:
    """Best ``(1 + a + ... + a^k) / (k c + v(k))`` over ``k`` in ``[0, max_draft]``."""
    best, gain, term = 1.0, 1.0, 1.0
    for k in range(1, max_draft + 1):
        term *= agreement
        gain += term
        best = max(best, gain / (k * draft_cost + verify_ratio(k)))
    return best


def block_influence(hidden_states) -> torch.Tensor:
    """``1 - cos(input, output)`` of every layer but the last, averaged over positions (the first
    position, an attention sink with outsized activations, left out when there are others)."""
    start = 1 if hidden_states[0].shape[1] > 1 else 0
    scores = []
    for before, after in zip(hidden_states[:-2], hidden_states[1:-1]):
        cos = torch.nn.functional.cosine_similarity(before[0, start:].float(), after[0, start:].float(), dim=-1)
        scores.append(float(1.0 - cos.mean()))
    return torch.tensor(scores)


@torch.no_grad()
def calibrate_layer_skip(target: torch.nn.Module, input_ids: torch.Tensor, verify_costs, max_draft: int,
                         from_position: int = 0) -> SkipCalibration:
    """Search the skipped set for ``target`` on ``input_ids`` `[1, T]` (see the module docstring);
    agreement is counted on the predictions of tokens ``from_position`` onwards (the model's own
    generated text agrees far more than a user's prompt: 0.92 against 0.66 for one layer of
    SmolLM2-135M, so the on-the-fly calibration measures on what the call generated)."""
    start = time.perf_counter()
    total = num_layers(target)
    # the model's own forward without firing users' hooks on it (forward counters: not a decoding forward)
    out = type(target).forward(target, input_ids=input_ids, output_hidden_states=True, use_cache=False)
    first = min(max(from_position - 1, 0), input_ids.shape[1] - 1)  # logits at q - 1 predict token q
    reference = out.logits[0, first:].argmax(-1)  # [T'] the full model's greedy choices
    ranking = block_influence(out.hidden_states).argsort().tolist()  # least influential first; last layer kept
    best: dict[str, Any] = {"skipped": [], "agreement": 1.0, "speedup": 1.0, "cost": 1.0}
    candidates, falling, previous = [], 0, 0.0
    for m in range(1, total):
        skipped = sorted(ranking[:m])
        subset = LayerSubset(target, [i for i in range(total) if i not in set(skipped)])
        agreement = float((sequence_logits(subset, input_ids)[first:].argmax(-1) == reference).float().mean())
        cost = subset.cost
        speedup = expected_speedup(agreement, cost, verify_costs.ratio, max_draft)
        entry = {"skipped": skipped, "agreement": round(agreement, 4), "cost": round(cost, 4), "speedup": round(speedup, 4)}
        candidates.append(entry)
        if speedup > best["speedup"] or not best["skipped"]:
            best = entry
        falling = falling + 1 if speedup < previous else 0
        previous = speedup
        if falling >= 3 or m >= len(ranking):
            break
    return SkipCalibration(
        skip=best["skipped"], num_layers=total, model=str(getattr(target, "name_or_path", "") or type(target).__name__),
        agreement=best["agreement"], draft_cost=best["cost"], expected_speedup=best["speedup"],
        tokens=int(reference.shape[0]), seconds=time.perf_counter() - start, candidates=candidates,
    )
