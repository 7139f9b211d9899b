"""The per-call drafter: what ``strategy.open(ctx)`` returns for one ``generate()`` call, and its shared helpers.

A per-call drafter implements three methods (``draft``, ``observe``, ``close``) and declares its ``sizing``; the
loop decides how much it drafts (core/budget.py). Its base class inherits the adapter that runs it in transformers'
own assisted loop (assisted.py).
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.budget import CHAIN, FIXED, Plan, Sizing
from ..core.call import CallContext
from ..core.tree import DraftTree, Verdict
from .assisted import AssistedLoopAdapter


class SpeculativeCandidateGenerator(AssistedLoopAdapter):
    """A per-call drafter: what ``strategy.open(ctx)`` returns for one ``generate()`` call.

    The protocol, all a drafter implements (hf_speculative's loop calls it; see core/loop.py)::

        sizing                                   # declared in __init__: how it drafts (core/budget.Sizing)
        draft(sequence, plan) -> DraftTree       # a chain is a tree with one branch
        observe(sequence, tree, verdict, scores) # every verified forward, its own draft or not
        close()                                  # once, when the call ends, even on error

    How much to draft is the loop's decision: ``plan`` (a :class:`~hf_speculative.core.budget.Plan`) says how deep
    the draft may go and answers the drafter's questions (its node budget, whether the next token pays, how many
    copied tokens pay); the loop learns from each verdict. A drafter keeps only its own state (caches, indexes,
    features) and measures its own forwards (``record_draft_step``).

    The same object is a transformers ``CandidateGenerator`` (``get_candidates`` / ``update_candidate_strategy``,
    inherited from assisted.py's :class:`~hf_speculative.drafters.assisted.AssistedLoopAdapter`): the adapter through
    which transformers' own assisted loop runs any of our drafters (chains only, as that loop verifies chains).

    Args:
        ctx (`CallContext`): the call this drafter serves.
    """

    sizing: Sizing = FIXED  # a drafter that sizes its drafts by the cost model declares its own in __init__

    def __init__(self, ctx: CallContext):
        self.ctx = ctx
        self.stats = ctx.stats
        self.draft_logits: torch.Tensor | None = None  # [k, V]: logits a user's generator drafted from, if any

    # -- what a drafter implements ----------------------------------------------------------
    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        """This step's draft after ``sequence`` (`[1, L]`, verified), within ``plan`` (at most ``plan.depth`` deep;
        a chain when ``plan.chain_only``). Empty: a plain decoding step."""
        raise NotImplementedError

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        """After every verifying forward: ``sequence`` is the verified text after it (the target's own token
        included), ``tree`` what was verified (this drafter's draft, or another's in ``hfs.Hybrid``), ``verdict``
        its outcome and ``scores`` `[1 + n, V]` the forward's processed target logits. Keep the per-call state in
        step (caches, captured hidden states); the sizing rules learn in the loop."""

    def close(self) -> None:
        """Free per-call resources (hooks, caches). Called once when the call ends, even on error."""

    @property
    def prompt_length(self) -> int | None:
        """The call's prompt length (without padding), once the call started, else ``None``."""
        return self.ctx.prompt_length

    @property
    def after_prefill(self) -> bool:
        """True once the target's forwards are decoding steps (the first one also prefilled the prompt)."""
        return self.stats.target_forwards > 1

    # -- helpers ----------------------------------------------------------------------------
    def _to_target_vocab(self, logits: torch.Tensor, target_ids: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`to_target_vocab` at this call's vocabulary width."""
        return to_target_vocab(logits, self.ctx.vocab_size, target_ids)


def to_target_vocab(logits: torch.Tensor, width: int, target_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Pad (with -inf) or cut a drafter's logits `[k, V_d]` (float32) to the target's width `[k, V]`; with
    ``target_ids`` `[V_d]` (a reduced draft vocabulary: the target id of every draft id), place each
    draft logit at its target id and -inf everywhere else."""
    logits = logits.float()
    if target_ids is not None:
        full = logits.new_full((*logits.shape[:-1], width), float("-inf"))
        full[..., target_ids] = logits
        return full
    if logits.shape[-1] == width:
        return logits
    if logits.shape[-1] > width:
        return logits[..., :width]
    pad = logits.new_full((*logits.shape[:-1], width - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def check_network_once(target: torch.nn.Module, network: torch.nn.Module, check, name: str, field: str) -> None:
    """A strategy's ``validate_target`` for a drafter with its own network: ``check(target)`` (raises where the
    network does not fit the target), then the same device as the target's, once per (target, network) pair (the
    target's state remembers it). ``name`` (e.g. ``"The EAGLE drafter"``) and ``field`` (the strategy's attribute
    holding the network) word the device error."""
    from ..core.state import state_of

    checked = state_of(target).checked
    if network in checked:
        return
    check(target)
    device = next(target.parameters()).device
    if next(network.parameters()).device != device:
        raise ValueError(f"{name} is on {next(network.parameters()).device} and the target on "
                         f"{device}; move it with strategy.{field}.to({str(device)!r}).")
    checked.add(network)


class TreeOrChainCandidateGenerator(SpeculativeCandidateGenerator):
    """A per-call drafter that grows trees with ``tree=`` and whose own chain is one more option of the loop's tree
    budget (``Sizing(..., chain_option=True)``: EAGLE, draft models). Subclasses implement ``_tree(sequence, nodes,
    plan)`` and ``_chain(sequence, plan)``; ``config.tree`` is the strategy's shape (``None``: chains)."""

    @torch.no_grad()
    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        if self.config.tree is not None:
            nodes = plan.tree_nodes()
            if nodes == 0:
                return DraftTree.empty(sequence.device)
            if nodes != CHAIN:
                return self._tree(sequence, nodes, plan)
        return self._chain(sequence, plan)

    def _size_tree_or_chain(self, ctx: CallContext, config: Any) -> int:
        """Set ``self.verify_costs`` and ``self.sizing`` for ``config.tree`` (or chains of ``config.num_tokens``),
        ``config.adaptive``, ``config.confidence_threshold`` and ``self._draft_price``: the confidence rule, the chain
        one more option of the tree budget, one drafter step per tree depth. Returns the tree's nodes (0: chains)."""
        from ..core.tree_shapes import DynamicTree, tree_depth

        nodes = 0 if config.tree is None else (
            config.tree.nodes if isinstance(config.tree, DynamicTree) else config.tree.size)
        self.verify_costs = ctx.verify_costs(max(config.num_tokens, nodes))
        self.sizing = Sizing(self.verify_costs, tokens=config.num_tokens, nodes=nodes, rule="confidence",
                             adaptive=config.adaptive, confidence_threshold=config.confidence_threshold,
                             draft_price=self._draft_price, chain_option=True,
                             draft_steps=None if config.tree is None else (lambda m: tree_depth(config.tree, m)))
        return nodes


class ExternalCandidateGenerator(SpeculativeCandidateGenerator):
    """Adapts a user's raw ``CandidateGenerator`` instance: it gets the same max-length cap,
    stopping cuts and statistics as the built-in drafters."""

    def __init__(self, ctx: CallContext, inner: Any):
        super().__init__(ctx)
        self.inner = inner

    def draft(self, sequence, plan):
        candidates, logits = self.inner.get_candidates(sequence)
        tokens = candidates[0, sequence.shape[1]:][: plan.depth]  # [k]
        self.draft_logits = None if logits is None else logits[0, : tokens.numel()]
        return DraftTree.from_tokens(tokens.tolist(), sequence.device)

    def observe(self, sequence, tree, verdict, scores):
        update = getattr(self.inner, "update_candidate_strategy", None)
        if update is not None:
            try:
                update(sequence, scores[None], verdict.num_accepted)
            except NotImplementedError:  # the abstract base raises before 5.18
                pass


class ExternalStrategy:
    """A user's raw transformers ``CandidateGenerator`` as the call's strategy: the loop opens it like ours
    (``open(call)``), as an :class:`ExternalCandidateGenerator` around the user's instance. Built by the entry for the
    one call that was given it; ``inner`` is the user's object."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name = type(inner).__name__

    def open(self, ctx: CallContext) -> ExternalCandidateGenerator:
        return ExternalCandidateGenerator(ctx, self.inner)
