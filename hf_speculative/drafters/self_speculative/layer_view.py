"""The target run with a subset of its own decoder layers, on the target's own KV cache.

Self-speculative drafters (``hfs.EarlyExit``, ``hfs.LayerSkip``) draft with the target itself minus
some layers. Rather than re-implementing each architecture's forward (embedding scale, rotary
variants, sliding windows, logit soft-capping...), :class:`LayerSubset` builds a *view* of the
model: shallow copies of the causal LM and of its decoder whose ``layers`` list holds only the
chosen layers and whose config copy says how many there are. The parameters, the layer modules and
the cache are the target's own; nothing shared is mutated, so calls on other threads (plain or with
another drafter) see the model unchanged. Each layer keeps its ``layer_idx``, so a drafted token's
keys and values land in the target cache's entry for that layer, and are cropped from exactly
those layers afterwards.

The draft runs one token at a time: the query is the newest position and sees every cached key, so
the only mask ever needed is a sliding window's. We build the masks ourselves, per layer type, from
the cache's sizes of a layer that the view runs (transformers would size them from the first layer
of the *full* model, which the view may skip).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
from typing import Any, Sequence

import torch

from ... import compat
from ...core import kv_cache
from ...core.state import state_of


class UnsupportedModelError(ValueError):
    """The model is not built as ``<causal LM>.<decoder>.layers[i]`` + a final ``norm``."""


@dataclasses.dataclass(eq=False)
class TargetLayers:
    """What self-speculation keeps about a target between calls, in its state
    (``state_of(target).drafter_state(TargetLayers)``; ``hfs.forget(target)`` drops it).

    Attributes:
        views (`dict[tuple[int, ...], LayerSubset]`): the views that run some of its layers, by layer tuple
            (:func:`layer_subset`).
        structure_problem (`str`, *optional*): ``None`` until probed, then ``""`` when layer-by-layer drafting works
            on it, else why not (:func:`check_structure`).
    """

    views: dict = dataclasses.field(default_factory=dict)
    structure_problem: str | None = None


def num_layers(target: torch.nn.Module) -> int:
    decoder = _decoder_or_raise(target)
    return len(decoder.layers)


def _decoder_or_raise(target: torch.nn.Module) -> torch.nn.Module:
    decoder = compat.decoder_of(target)
    name = _child_name(target, decoder) if decoder is not None else None
    if decoder is None or name is None:
        raise UnsupportedModelError(
            f"Self-speculative drafting (hfs.EarlyExit / hfs.LayerSkip) runs the target's decoder layers one by one and "
            f"needs a causal LM whose decoder is a direct child with a `layers` list and a final `norm` (Llama, Qwen2, "
            f"Gemma3, Mistral, Phi3, ... style); {type(target).__name__} is built differently. Use hfs.PromptLookup() "
            f"or hfs.DraftModel(small_model) with this model."
        )
    return decoder


def _child_name(parent: torch.nn.Module, child: torch.nn.Module) -> str | None:
    return next((name for name, module in parent._modules.items() if module is child), None)


def _fresh_hooks(view: torch.nn.Module) -> None:
    """The view must not fire hooks registered on the original module (forward counters, accelerate)."""
    for key, value in list(vars(view).items()):
        if key.startswith("_") and "hooks" in key and isinstance(value, dict):
            setattr(view, key, type(value)() if isinstance(value, collections.OrderedDict) else {})
    vars(view).pop("forward", None)  # an instance-level forward (accelerate) is bound to the original


def layer_types(config: Any) -> list[str]:
    """Attention type of every layer (``"full_attention"`` when the config does not say)."""
    config = compat.text_config(config)
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    kind = "sliding_attention" if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) \
        and type(config).__name__.startswith(("Mistral", "Mixtral")) else "full_attention"
    return [kind] * int(config.num_hidden_layers)


class LayerSubset:
    """``target`` restricted to ``layers`` (ascending indices): one draft step at a time.

    Args:
        target (`PreTrainedModel`): the causal LM (the view shares all its modules).
        layers (`Sequence[int]`): the decoder layers to run, e.g. ``range(8)`` for an early exit
            after layer 8.
    """

    def __init__(self, target: torch.nn.Module, layers):
        decoder = _decoder_or_raise(target)
        total = len(decoder.layers)
        self.layers = sorted(set(int(i) for i in layers))
        if not self.layers or self.layers[0] < 0 or self.layers[-1] >= total:
            raise ValueError(f"layer indices must be in [0, {total}) and not empty, got {list(layers)}")
        self.target = target
        text = compat.text_config(decoder.config)
        all_types = layer_types(text)
        self.types = [all_types[i] for i in self.layers]
        self.mixed = len(set(all_types)) > 1
        self.sliding_window = getattr(text, "sliding_window", None)
        self.dtype = next(target.parameters()).dtype

        inner = copy.copy(decoder)
        _fresh_hooks(inner)
        inner._modules = dict(decoder._modules)
        inner._modules["layers"] = torch.nn.ModuleList([decoder.layers[i] for i in self.layers])
        inner_config = copy.copy(decoder.config)
        inner_config.__dict__["num_hidden_layers"] = len(self.layers)
        if getattr(decoder.config, "layer_types", None):
            inner_config.__dict__["layer_types"] = self.types
        inner.config = inner_config
        outer = copy.copy(target)
        _fresh_hooks(outer)
        outer._modules = dict(target._modules)
        outer._modules[_child_name(target, decoder)] = inner
        self.view = outer
        self.decoder_view = inner
        self._extra = compat.logits_to_keep_kwargs(target, 1)
        self._cache_position = "cache_position" in compat.forward_params(type(target))
        # per layer type, one layer of the view whose cache sizes stand for all of that type
        self._witness = {kind: self.layers[self.types.index(kind)] for kind in set(self.types)}

    @functools.cached_property
    def _parameter_counts(self) -> tuple[int, int, int]:
        """(parameters of the view's layers, of the lm_head, of the full model's layers + lm_head)."""
        decoder = compat.decoder_of(self.target)
        head = self.target.get_output_embeddings()
        per_layer = [sum(p.numel() for p in layer.parameters()) for layer in decoder.layers]
        head_params = head.weight.numel() if head is not None else 0
        return sum(per_layer[i] for i in self.layers), head_params, sum(per_layer) + head_params

    @functools.cached_property
    def cost(self) -> float:
        """Parameters run per token (layers + lm_head), as a fraction of the full model's (computed once:
        the chain policy reads it as its price prior for every drafted token)."""
        mine, head, whole = self._parameter_counts
        return (mine + head) / whole

    def cost_with(self, head_params: int) -> float:
        """As :attr:`cost`, with another head of ``head_params`` parameters instead of the lm_head (an exit adapter)."""
        mine, _, whole = self._parameter_counts
        return (mine + head_params) / whole

    def _mask(self, cache: Any, kind: str, position: int, device: torch.device) -> torch.Tensor | None:
        """Float mask `[1, 1, 1, kv]` for a query at ``position``, or ``None`` when it sees every key."""
        if kind != "sliding_attention" or not self.sliding_window:
            return None
        kv_length, kv_offset = compat.cache_mask_sizes(cache, self._witness[kind], position)
        first_visible = position - self.sliding_window + 1  # a sliding query sees `window` keys, itself included
        positions = torch.arange(kv_offset, kv_offset + kv_length, device=device)
        if int(positions[0]) >= first_visible:
            return None
        blocked = (positions < first_visible)[None, None, None, :]  # [1, 1, 1, kv]
        return torch.zeros(blocked.shape, dtype=self.dtype, device=device).masked_fill(blocked, torch.finfo(self.dtype).min)

    def step(self, token: int, position: int, cache: Any, device: torch.device) -> torch.Tensor:
        """Feed ``token`` at ``position`` through the view; its next-token logits `[V]` (float32).
        Writes one entry to ``cache`` in each of the view's layers (the caller crops them)."""
        out = self.view(**self._inputs(token, position, cache, device), **self._extra)
        return out.logits[0, -1].float()

    def hidden(self, token: int, position: int, cache: Any, device: torch.device) -> torch.Tensor:
        """As :meth:`step`, but the exit state `[H]` (the last layer's output through the model's final
        norm) instead of logits: no lm_head, for an exit adapter to read."""
        return self.decoder_view(**self._inputs(token, position, cache, device)).last_hidden_state[0, -1]

    def _inputs(self, token: int, position: int, cache: Any, device: torch.device) -> dict[str, Any]:
        masks = {kind: self._mask(cache, kind, position, device) for kind in self._witness}
        if self.mixed:
            attention_mask: Any = {kind: masks.get(kind) for kind in ("full_attention", "sliding_attention")}
        else:
            only = next(iter(masks.values()))
            kv_length, _ = compat.cache_mask_sizes(cache, self.layers[0], position)
            attention_mask = only if only is not None else torch.zeros((1, 1, 1, kv_length), dtype=self.dtype, device=device)
        kwargs: dict[str, Any] = {}
        if self._cache_position:
            kwargs["cache_position"] = torch.tensor([position], device=device)
        return dict(input_ids=torch.tensor([[token]], device=device), position_ids=torch.tensor([[position]], device=device),
                    attention_mask=attention_mask, use_cache=True, **{compat.cache_kwarg(): cache}, **kwargs)

    def rollback(self, cache: Any, num_tokens: int) -> None:
        """Remove the last ``num_tokens`` entries the view wrote (its layers only)."""
        for index in self.layers:
            compat.crop_cache_layer(cache, index, num_tokens)


def layer_subset(target: torch.nn.Module, layers: Sequence[int]) -> LayerSubset:
    """The view of ``target`` that runs ``layers``, made once per model and layer set: views hold no
    per-call state, so calls and threads share them (and the measured cost of a drafting step, kept
    per view, carries over between calls)."""
    key = tuple(sorted(set(int(i) for i in layers)))
    state = state_of(target)
    with state.lock:
        views = state.drafter_state(TargetLayers).views
        if key not in views:
            views[key] = LayerSubset(target, key)
        return views[key]


def check_structure(target: torch.nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` unless a view of ``target`` runs exactly its chosen layers.

    Probed once per model: a view with the first layer only must write that layer's cache entry
    and no other (a model whose forward ignores its ``layers`` list would run them all), and a view
    with every layer must give the model's own logits.
    """
    state = state_of(target)
    with state.lock:
        own = state.drafter_state(TargetLayers)
        if own.structure_problem is None:
            own.structure_problem = _probe(target) or ""
        problem = own.structure_problem
    if problem:
        raise UnsupportedModelError(problem)


@torch.no_grad()
def _probe(target: torch.nn.Module) -> str | None:
    decoder = _decoder_or_raise(target)
    device = next(target.parameters()).device
    total = len(decoder.layers)
    ids = [3, 4]
    name = type(target).__name__
    try:
        cache = kv_cache.new_dynamic_cache()
        first = LayerSubset(target, [0])
        for position, token in enumerate(ids):
            first.step(token, position, cache, device)
        written = [compat.cache_layer_length(cache, i) for i in range(total)]
        if written[0] != len(ids) or any(written[1:]):
            return (f"{name}'s forward does not run the layers of its `layers` list as given (cache entries per layer "
                    f"after a one-layer draft: {written}); self-speculative drafting cannot use it. Use hfs.PromptLookup() "
                    f"or hfs.DraftModel(small_model).")
        cache = kv_cache.new_dynamic_cache()
        whole = LayerSubset(target, range(total))
        mine = torch.stack([whole.step(token, position, cache, device) for position, token in enumerate(ids)])
        # (the model's own forward, without firing hooks users put on it: this is not one of their forwards)
        theirs = type(target).forward(target, input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0].float()
        if not torch.allclose(mine, theirs[:, : mine.shape[-1]], atol=1e-3, rtol=1e-3):
            return (f"{name} run layer by layer through hf_speculative's view does not reproduce its own logits (max "
                    f"difference {float((mine - theirs).abs().max()):.3g}); self-speculative drafting is not supported "
                    f"for it. Use hfs.PromptLookup() or hfs.DraftModel(small_model).")
    except UnsupportedModelError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure means the structure is not the expected one
        return (f"{name} cannot be run layer by layer by hf_speculative ({type(error).__name__}: {error}); "
                f"self-speculative drafting is not supported for it. Use hfs.PromptLookup() or hfs.DraftModel(small_model).")
    return None


def sequence_logits(subset: LayerSubset, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits `[T, V]` of the view over a whole sequence `[1, T]`, without any cache (calibration)."""
    with torch.no_grad():
        return subset.view(input_ids=input_ids, use_cache=False).logits[0].float()
