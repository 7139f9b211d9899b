"""The trained exit adapter of ``hfs.EarlyExit(exit_layer=k, adapter=...)`` (Kangaroo, Liu et al. 2024).

A plain early exit reads the target's lm_head straight after layer ``k``, which only works on
models trained for it. The adapter is a small trained network between the exit and a head: the
target runs its first ``k`` layers on each drafted token (on its own KV cache, like ``EarlyExit``),
and the adapter turns that token's *exit state* into the next token's logits, attending over the
exit states of the whole context through its own KV cache.

The network is an EAGLE-3-shaped :class:`~hf_speculative.drafters.eagle.model.EagleDraftModel` with
``config.exit_layer = k`` and ``target_layers = [k - 1]`` (one fused feature), so it is trained by
``hf-speculative train-eagle --exit-layer k`` with EAGLE's data, feature cache, loss and loop.

Alignment, one definition for training and drafting (:func:`adapter_features`): the adapter's entry
``t`` reads the token ``x_{t+1}`` and its exit state ``e_{t+1} = norm(h^{(k)}_{t+1})`` (``h^{(k)}``:
output of layer ``k - 1``; ``norm``: the target's final norm), at rotary position ``t``, and predicts
``x_{t+2}``. This is EAGLE's pairing ``(x_{t+1}, f_t)`` with the feature taken one position later, so
EAGLE's loss applies unchanged. Every adapter input is a real exit state (drafted tokens get theirs
from the target's first ``k`` layers), so there is nothing like EAGLE's feature drift to unroll for.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from ... import compat
from ...core.chain_drafting import draft_chain
from ...core.budget import Plan
from ...core.tree import DraftTree
from ...core.costs import draft_price, record_draft_step
from ...core.features import VerifiedFeatures
from ...core.state import all_states, state_of
from ..eagle.model import DraftKVCache, EagleDraftModel
from .drafter import SelfSpeculativeCandidateGenerator


SHIPPED_DIR = Path(__file__).parent / "exit_adapters"


def shipped_adapters() -> list[str]:
    """Targets for which a trained exit adapter ships with the package."""
    from ..checkpoints import shipped_names

    return shipped_names(SHIPPED_DIR)


def adapter_features(exit_states: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """EAGLE-indexed adapter inputs from raw exit states `[B, T, H]` (outputs of layer ``k - 1`` at
    positions ``0..T-1``): entry ``t`` holds ``norm(h_{t+1})``; the last entry (no next position) is zero.
    Returns `[B, T, H]`."""
    shifted = torch.zeros_like(exit_states)
    shifted[:, :-1] = norm(exit_states[:, 1:])
    return shifted


def load_adapter(source: str | os.PathLike | EagleDraftModel, *, sha256: dict[str, str] | None = None) -> EagleDraftModel:
    """An exit adapter from a folder (``train-eagle --exit-layer k`` output), a shipped adapter's name, or
    a loaded network; clear errors for anything else."""
    if isinstance(source, EagleDraftModel):
        net = source  # left as it is (it may be a network in training, validated between steps)
    else:
        from ..eagle import checkpoints

        path = checkpoints.find_folder(
            source, SHIPPED_DIR,
            owner="EarlyExit", argument="adapter",
            missing=f"No exit adapter at {str(source)!r}: give the folder written by `hf-speculative train-eagle --exit-layer K "
            f"--out DIR` (config.json + model.safetensors), or a shipped name {shipped_adapters()}.")
        net = checkpoints.load_drafter(path, sha256=sha256).requires_grad_(False)
    if not net.config.is_exit_adapter:
        raise ValueError("EarlyExit(adapter=...) got an EAGLE drafter, which reads the target's features of the previous "
                         "position, not an exit adapter; use it as hfs.Eagle.from_pretrained(path, target=model), or "
                         "train an adapter with `hf-speculative train-eagle --exit-layer K`.")
    return net


def ready_for(net: EagleDraftModel, target: torch.nn.Module) -> EagleDraftModel:
    """``net`` checked against ``target`` (what it was trained for) and moved to its device and dtype,
    once per pair; an adapter already serving a model elsewhere is not moved from under it."""
    checked = state_of(target).checked
    with state_of(net).lock:  # one adapter, several targets: one check at a time
        if net not in checked:
            net.config.check_target(target)
            param = next(target.parameters())
            mine = next(net.parameters())
            if (mine.device, mine.dtype) != (param.device, param.dtype):
                if any(net in state.checked for state in all_states()):
                    raise ValueError(f"This exit adapter already serves a model on {mine.device} / {mine.dtype}; load a "
                                     f"second EarlyExit(adapter=...) for the model on {param.device} / {param.dtype}.")
                net.to(device=param.device, dtype=param.dtype)
            checked.add(net)
    return net


class ExitAdapterCandidateGenerator(SelfSpeculativeCandidateGenerator):
    """``EarlyExit`` with an adapter: the first ``k`` layers on the target's cache, then the adapter.

    Invariant between forwards (``L`` = verified length): the adapter's cache holds entries
    ``[0, n_true)`` computed from exit states that a target forward produced; ``features.pending``
    holds the raw exit states of positions ``[n_true + 1, L - 1)`` not fed yet. Position ``L - 1``
    (the target's newest token) gets its exit state from the draft's first step.
    """

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self.net: EagleDraftModel = config.adapter_for(ctx.target)
        decoder = compat.decoder_of(ctx.target)
        self.norm = decoder.norm
        self.embed = ctx.target.get_input_embeddings()
        # raw exit states; position 0 is never an adapter input (its token has no predecessor entry)
        self.features = VerifiedFeatures(ctx.target, self.net.config.target_layers, skip_first=True, view=ctx.view)
        self.adapter_cache = DraftKVCache()
        self.n_true = 0
        self._target_ids = self.net.target_ids()  # [V_draft] or None
        # prior price of a draft step: the first k layers and the adapter, as a share of the target's parameters
        self._prior = self.subset.cost_with(sum(p.numel() for p in self.net.parameters()))
        self.stats.extra[config.name]["adapter"] = config.adapter_label

    def _draft_price(self) -> float:
        return draft_price(self.net, self.verify_costs, self.config.draft_cost, self._prior)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary `[V]` (float32) for the last entry of ``hidden`` `[1, T, H]`."""
        return self._to_target_vocab(self.net.draft_logits(hidden[0, -1], None), self._target_ids)

    def _feed(self, input_ids: torch.LongTensor, exit_state: torch.Tensor) -> torch.Tensor:
        """Catch the adapter up on the verified positions, then the newest token with ``exit_state``
        `[H]` (its normed exit state from the draft's first step); the adapter's output `[1, 1, H]`."""
        length = input_ids.shape[1]
        self.adapter_cache.crop(self.n_true)  # drop the entries the last draft wrote
        pending = self.features.pop()  # [1, P, H]
        states = self.norm(pending) if pending is not None else exit_state.new_zeros((1, 0, exit_state.shape[-1]))
        states = torch.cat([states, exit_state[None, None]], dim=1)  # [1, P + 1, H], positions n_true+1 .. L-1
        tokens = input_ids[:, self.n_true + 1 : length]  # [1, P + 1]
        positions = torch.arange(self.n_true, length - 1, device=input_ids.device)[None]
        hidden = self.net(self.embed(tokens), states.to(self.net.fc.weight.dtype), positions, self.adapter_cache, fused=True)
        self.n_true = length - 2  # the newest entry came from a draft step: re-fed next time
        return hidden[:, -1:]

    @torch.no_grad()
    def draft(self, input_ids: torch.LongTensor, plan: Plan) -> DraftTree:
        none = DraftTree.empty(input_ids.device)
        if self.features.lost or self.cache is None or self.stats.target_forwards == 0:
            return none
        subset, device = self.subset, input_ids.device
        position = input_ids.shape[1] - 1
        if self.features.known != position or compat.cache_layer_length(self.cache, subset.layers[0]) != position \
                or not plan.start_chain():
            return none
        fed = 0

        def step(token: int, first: bool = False) -> torch.Tensor:
            nonlocal fed
            start = time.perf_counter()
            exit_state = subset.hidden(token, position + fed, self.cache, device)  # [H]
            if first:
                hidden = self._feed(input_ids, exit_state)
            else:
                ids = torch.tensor([[token]], device=device)
                pos = torch.tensor([[position + fed - 1]], device=device)
                hidden = self.net(self.embed(ids), exit_state[None, None].to(self.net.fc.weight.dtype), pos,
                                  self.adapter_cache, fused=True)
            fed += 1
            logits = self._logits(hidden)
            record_draft_step(self.net, time.perf_counter() - start)
            return logits

        try:
            first = step(int(input_ids[0, -1]), first=True)
            tree = draft_chain(plan, self.ctx, input_ids, first, plan.depth, step)
        finally:
            subset.rollback(self.cache, fed)  # the verified cache is exactly plain decoding's
            self.features.discard()  # the draft's own passes through layer k - 1 are not verified states
            plan.steps = fed
        return tree

    def observe(self, sequence, tree, verdict, scores):
        self.features.follow_tree(sequence.shape[1], tree.size, list(verdict.path))

    def close(self):
        self.features.close()
        self.adapter_cache = DraftKVCache()
        super().close()


def describe(net: EagleDraftModel, source: Any) -> str:
    """How the stats name an adapter: its folder, or what it was trained for."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return f"exit adapter for layer {net.config.exit_layer}" + (f" of {net.config.target}" if net.config.target else "")
