"""The acceptance rules: which drafted tokens the target keeps.

Every drafter's output is exact because of the rule here: greedy decoding and the seeded rule share one
(:func:`accept_greedy`), sampling by the rejection rule has its own (:func:`accept_rejection`, at the end);
:func:`accept` picks the call's. ``p``: the target's scores at a
position, after the call's logits processors; ``x``: the drafted token there::

    keep x  iff  x == argmax p;  at the first position not kept emit argmax p
    after the last kept token of a fully kept draft, the target's own token: argmax p
    -> token for token what plain decoding writes, whatever was drafted

Greedy decoding takes ``p`` as the processed logits. Sampling runs the same rule: the call's last
processor is a :class:`~hf_speculative.core.sampling.SeededSampler`, which turns ``p`` into a point mass on
``argmax(log softmax(p) + g_t)`` with Gumbel noise ``g_t`` keyed by (seed, row, position t), an exact draw
from ``softmax(p)`` whatever the text before (the Gumbel-max trick; see :mod:`hf_speculative.core.sampling`).
So the kept text is a sample of the target's distribution and a fixed function of the seed: drafts only
decide how many target forwards it takes. Drafters choose their tokens with chain_drafting.py's
:func:`~hf_speculative.core.chain_drafting.draft_chain`: the argmax of their own processed logits, or the seeded draw
from them (the same noise as the target's,
so a drafter whose ``q`` is close to ``p`` draws the target's token).

Chains apply the rule position by position up to the first mismatch (transformers' assisted loop, or
ours); trees follow the target's token from the root down into the child drafting it
(:func:`accept_greedy`).

With ``speculative_sampling="rejection"`` the call's last processor is a ``RejectionSampler`` instead: a drafted
token ``x`` drawn from the drafter's ``q`` is kept with probability ``min(1, p(x) / q(x))``, else the target draws
from the normalised residual ``max(0, p - q)`` (a deterministic guess: kept with probability ``p(x)``); the text
is an exact sample of the target's distribution that depends on the drafts, with the highest acceptance a single
draft can have, ``1 - TV(p, q)``.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch

from .sampling import RejectionSampler, SeededSampler, refuse_nothing_to_draw
from .tree import ROOT, DraftTree, Verdict


# -- the rule on a tree ---------------------------------------------------------------------------
def accept_greedy(tree: DraftTree, scores: torch.Tensor, drawn: bool = False) -> Verdict:
    """Greedy verification of a tree: follow the target's argmax from the root down the tree.

    ``scores`` is ``[1 + n, V]``: row 0 the root's, row ``1 + i`` node ``i``'s. At each step the target's
    token at the current node is its argmax there; the walk goes on into the child drafting that token, if
    any. The kept path is exactly what plain greedy decoding would write, so the output is identical.
    ``drawn``: the scores are a :class:`~hf_speculative.core.sampling.SeededSampler`'s draws, whose NaN rows had
    nothing to draw from; reaching one raises (:func:`~hf_speculative.core.sampling.refuse_nothing_to_draw`; a row
    off the kept path is never read, as plain sampling would never have reached it).
    """
    best = scores.argmax(dim=-1)  # [1 + n]
    if drawn:  # the marks come back in the verdict's own read of the device
        best = torch.where(scores[:, 0].isnan(), -1, best)
    best = best.tolist()
    children: dict[int, dict[int, int]] = {}
    for node, (parent, token) in enumerate(zip(tree.parent_list(), tree.token_list())):  # (read once per tree)
        children.setdefault(parent, {}).setdefault(token, node)  # first sibling wins a duplicate token
    path, node = [], ROOT
    while best[node + 1] in children.get(node, {}):
        node = children[node][best[node + 1]]
        path.append(node)
    if best[node + 1] < 0:
        refuse_nothing_to_draw()
    return Verdict(tuple(path), best[node + 1])


# -- the rejection rule ---------------------------------------------------------------------------
def accept_rejection(tree: DraftTree, scores: torch.Tensor, sampler: RejectionSampler) -> Verdict:
    """The rejection rule (speculative sampling; SpecInfer's multi-candidate form for trees).

    ``scores`` `[1 + n, V]` are the target's processed scores (row 0 the root's, ``1 + i`` node ``i``'s), so
    ``p = softmax(scores[node])`` is the target's distribution after ``node``. From the root down, the node's
    children are tried in order, each against the current ``p``::

        child x drawn from q (tree.q):  accept with prob min(1, p(x) / q(x));  else p <- max(0, p - q) / Z
        child x a point mass:           accept with prob p(x)               ;  else p <- p with p(x) = 0, / Z
        accepted: go down into x (a fresh p: the target's after x); no child left: emit a draw from p

    Each try is an exact decomposition of ``p``: P(emit y) = P(accept x) [y = x] + P(reject) * residual(y) = p(y)
    (for the q case Leviathan et al. 2023, Thm. 1; for a point mass q = delta_x and the same algebra). Siblings with
    a q are drawn from it given the siblings before them: independently (the same q each), or without replacement
    (each its own q without the ones before: recursive rejection sampling, Jeon et al. 2024); the tree records, per
    node, the q it was drawn from. Deterministic siblings (top-k ranks, copied text) are point masses (a one-hot q
    row is the same thing), tried without replacement. A draw never depends on a later sibling, so trying them in
    order is exact; a point mass already rejected at a node has ``p = 0`` there, so a repeated one is never accepted.
    """
    parents, tokens = tree.parent_list(), tree.token_list()
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    path, node = [], ROOT
    while True:
        p = torch.softmax(scores[node + 1].double(), dim=-1)  # [V]: the target's distribution after `node`
        for child in children.get(node, []):
            x = tokens[child]
            q = None if tree.q is None else tree.q[child].double().to(p.device)
            px = float(p[x])
            if math.isnan(px):  # softmax of scores with nothing to draw from is all NaN; min(1, NaN / q) is 1
                refuse_nothing_to_draw()
            accept_x = px if q is None else min(1.0, px / max(float(q[x]), 1e-300))
            if sampler.uniform() < accept_x:
                break
            p = _residual(p, q, x)
        else:
            return Verdict(tuple(path), sampler.draw(p))
        path.append(child)
        node = child


def _residual(p: torch.Tensor, q: torch.Tensor | None, x: int) -> torch.Tensor:
    """What the target draws from after rejecting ``x``: ``max(0, p - q)`` normalised (``q`` ``None``, a point mass
    at ``x``: ``p`` without ``x``, normalised). Both vanish only when ``p`` was ``q`` up to rounding, where no
    rejection happens; then ``p`` itself."""
    residual = p.clone()
    if q is None:
        residual[x] = 0.0
    else:
        residual = torch.clamp(residual - q, min=0.0)
    total = float(residual.sum())
    return p if total <= 0.0 else residual / total


def accept(tree: DraftTree, scores: torch.Tensor, sampler=None) -> Verdict:
    """The call's rule: :func:`accept_rejection` when its sampler is a ``RejectionSampler``, else
    :func:`accept_greedy` (greedy decoding, and the seeded rule: its scores are the seeded draw already)."""
    if isinstance(sampler, RejectionSampler):
        return accept_rejection(tree, scores, sampler)
    return accept_greedy(tree, scores, drawn=isinstance(sampler, SeededSampler))


def rule_for(sampler=None) -> Callable[[DraftTree, torch.Tensor], Verdict]:
    """The call's rule as one function ``rule(tree, scores) -> Verdict``, chosen once when the call starts (the loop
    calls it without a dispatch per step): what :func:`accept` does for ``sampler``."""
    if isinstance(sampler, RejectionSampler):
        return functools.partial(accept_rejection, sampler=sampler)
    if isinstance(sampler, SeededSampler):
        return functools.partial(accept_greedy, drawn=True)
    return accept_greedy
