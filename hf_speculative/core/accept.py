"""The acceptance rule: which drafted tokens the target keeps.

Every drafter's output is exact because of one rule, on one screen here. ``p``: the target's scores at a
position, after the call's logits processors; ``x``: the drafted token there::

    keep x  iff  x == argmax p;  at the first position not kept emit argmax p
    after the last kept token of a fully kept draft, the target's own token: argmax p
    -> token for token what plain decoding writes, whatever was drafted

Greedy decoding takes ``p`` as the processed logits. Sampling runs the same rule: the call's last
processor is a :class:`~hf_speculative.core.sampling.SeededSampler`, which turns ``p`` into a point mass on
``argmax(log softmax(p) + g_t)`` with Gumbel noise ``g_t`` keyed by (seed, row, position t), an exact draw
from ``softmax(p)`` whatever the text before (the Gumbel-max trick; see :mod:`hf_speculative.core.sampling`).
So the kept text is a sample of the target's distribution and a fixed function of the seed: drafts only
decide how many target forwards it takes. Drafters choose their tokens with :func:`draft_chain`: the
argmax of their own processed logits, or the seeded draw from them (the same noise as the target's,
so a drafter whose ``q`` is close to ``p`` draws the target's token).

Chains apply the rule position by position up to the first mismatch (transformers' assisted loop, or
ours); trees follow the target's token from the root down into the child drafting it
(:func:`accept_greedy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .sampling import split_sampler
from .tree import ROOT, DraftTree, Verdict

if TYPE_CHECKING:
    from .budget import Plan


# -- drafting a chain for the rule ---------------------------------------------------------------
def draft_chain(plan: Plan, ctx, input_ids: torch.Tensor, logits: torch.Tensor, max_tokens: int, step) -> DraftTree:
    """Draft a chain: pick a token from ``logits`` `[V]`, feed it with ``step(token) -> logits``, repeat while
    the loop's ``plan`` says it pays (its chain rule: ``wants`` / ``took``, see core/budget.py). The call's logits
    processors warp the drafter's logits as they warp the target's; the token is their argmax, or under seeded
    sampling the seeded draw from them at that position (the target's draw there if the drafter's distribution
    were the target's).

    Whether to draft a position is asked of ``plan.wants`` before its token is chosen (``plan.took`` sees the
    token, and only decides about the positions after it). Returns the chain, ``[k]`` tokens as a one-branch
    :class:`DraftTree` (empty when nothing paid)."""
    processors, sampler = split_sampler(ctx.logits_processor)
    tokens: list[int] = []
    sequence = input_ids  # [1, L + drafted]: the context the processors and the sampler's positions read
    while True:
        if processors:
            logits = processors(sequence, logits[None])[0]
        probs = torch.softmax(logits.float(), dim=-1)  # [V]
        if not plan.wants(float(probs.max())):
            break  # its expected gain does not pay for verifying it (its drafting is already paid)
        token = int(torch.argmax(logits) if sampler is None else sampler.choose(sequence, logits[None])[0])
        tokens.append(token)
        if not plan.took(float(probs[token]), max_tokens):
            break
        sequence = torch.cat([sequence, sequence.new_tensor([[token]])], dim=-1)
        logits = step(token)
    return DraftTree.from_tokens(tokens, input_ids.device)


# -- the rule on a tree ---------------------------------------------------------------------------
def accept_greedy(tree: DraftTree, scores: torch.Tensor) -> Verdict:
    """Greedy verification of a tree: follow the target's argmax from the root down the tree.

    ``scores`` is ``[1 + n, V]``: row 0 the root's, row ``1 + i`` node ``i``'s. At each step the target's
    token at the current node is its argmax there; the walk goes on into the child drafting that token, if
    any. The kept path is exactly what plain greedy decoding would write, so the output is identical.
    """
    best = scores.argmax(dim=-1).tolist()  # [1 + n]
    children: dict[int, dict[int, int]] = {}
    for node, (parent, token) in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist())):
        children.setdefault(parent, {}).setdefault(token, node)  # first sibling wins a duplicate token
    path, node = [], ROOT
    while best[node + 1] in children.get(node, {}):
        node = children[node][best[node + 1]]
        path.append(node)
    return Verdict(tuple(path), best[node + 1])
