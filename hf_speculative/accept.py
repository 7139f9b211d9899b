"""The acceptance rule: which drafted tokens the target keeps, greedy and under sampling.

Every drafter's output is exact because of the rule below and one duty of the drafter; both on one
screen here. ``p``: the target's distribution at a position, after the call's logits processors;
``x``: the drafted token there; ``q``: the distribution ``x`` was drawn from (for a deterministic
draft, such as prompt lookup or a greedy drafter, a point mass on ``x``)::

    greedy:    keep x  iff  x == argmax p;  at the first position not kept emit argmax p
               -> token for token what plain greedy decoding writes
    sampling:  keep x with probability min(1, p(x) / q(x)); otherwise emit a draw from the
               residual  r = max(0, p - q) / sum(max(0, p - q))
               P(emit y) = q(y) min(1, p(y) / q(y)) + P(reject) r(y)
                         = min(p(y), q(y)) + max(0, p(y) - q(y))      [P(reject) = sum max(0, p - q)]
                         = p(y)
               -> every emitted token follows the target's distribution given the text before it
               (Leviathan et al. 2023; Chen et al. 2023)
    after the last kept token of a fully kept draft, the target's own token: argmax p, or a draw from p

    the drafter's duty (sampling): q is really the distribution x was drawn from, and whether a
    position is drafted at all, and its q, depend only on the text before it (earlier drafted
    tokens included), never on the token drawn there.

Chains apply the rule position by position up to the first rejection: transformers' assisted loop
does so with the tokens and processed logits (``q``) that :func:`sample_chain` drafts. Trees apply it
at every node to its children in turn, each rejection replacing ``p`` by the residual, then descend
into the kept child (:func:`accept_sampling`; :func:`accept_greedy` follows the argmax).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .tree import ROOT, DraftTree, Verdict

if TYPE_CHECKING:
    from .drafters.policy import ChainLengthPolicy


# -- drafting a chain for the rule ---------------------------------------------------------------
def sample_chain(policy: ChainLengthPolicy, ctx, input_ids: torch.Tensor, logits: torch.Tensor, max_tokens: int,
                 step) -> tuple[list[int], list[torch.Tensor]]:
    """Draft a chain: pick a token from ``logits`` `[V]`, feed it with ``step(token) -> logits``,
    repeat while ``policy`` says it pays. Greedy takes the argmax; sampling draws from the processed
    distribution, and the processed logits of every drafted token are returned for the rejection
    sampler. Returns (tokens, processed logits `[V]` per token).

    The drafter's duty of the module docstring: whether to draft the next position is asked of
    ``policy.wants`` before its token is drawn (``policy.took`` sees the drawn token, and only decides
    about the positions after it)."""
    processors, do_sample = ctx.logits_processor, ctx.do_sample
    tokens: list[int] = []
    chosen: list[torch.Tensor] = []
    sequence = input_ids
    while True:
        if processors:
            logits = processors(sequence, logits[None])[0]
        probs = torch.softmax(logits, dim=-1)
        if not policy.wants(float(probs.max())):
            break  # its expected gain does not pay for verifying it (its drafting is already paid)
        token = int(torch.multinomial(probs, 1)) if do_sample else int(torch.argmax(logits))
        tokens.append(token)
        chosen.append(logits)
        if not policy.took(float(probs[token]), max_tokens):
            break
        if processors:
            sequence = torch.cat([sequence, sequence.new_tensor([[token]])], dim=-1)
        logits = step(token)
    return tokens, chosen


def chain_candidates(policy: ChainLengthPolicy, tokens: list[int], chosen: list[torch.Tensor], do_sample: bool,
                     steps: int | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Close a chain draft in ``policy`` (``steps`` drafter steps; default one per token) and return it
    as ``propose`` does: tokens `[k]` and, under sampling, their processed logits `[k, V]`; ``(None,
    None)`` for an empty draft."""
    policy.end(len(tokens), steps=steps)
    if not tokens:
        return None, None
    return torch.tensor(tokens, dtype=torch.long), (torch.stack(chosen) if do_sample else None)


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


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def accept_sampling(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator | None = None) -> Verdict:
    """Lossless verification of a tree under sampling: recursive rejection sampling over siblings.

    ``probs`` is ``[1 + n, V]``, the target's distribution at the root (row 0) and after each node.
    At a node with target distribution ``p`` and children ``x_1..x_k``, child ``j`` drawn from ``q_j``
    (``tree.probs[child]``; a point mass on ``x_j`` for a deterministic draft such as a top-k branch)::

        for j = 1..k:
            accept x_j with probability min(1, p(x_j) / q_j(x_j))  -> go down into child j
            else p <- max(0, p - q_j) / sum(max(0, p - q_j))        # the residual
        no child accepted (or none exist): the token is drawn from p

    Each round is one rejection-sampling step whose output, accepted draft or residual sample, is
    distributed exactly as the ``p`` it started from, so by induction over the siblings and down the
    depths every emitted token follows the target's distribution given the text before it (SpecInfer,
    Miao et al. 2023; EAGLE's tree sampling). With point masses, rejecting ``x_j`` just removes it from
    ``p``. Siblings drawn without replacement must carry the distribution they were drawn from given the
    earlier siblings, which is what ``q_j`` means here.
    """
    path, node = [], ROOT
    while True:
        p = probs[node + 1].double()
        for child in tree.children(node):
            token = int(tree.tokens[child])
            q = _draft_distribution(tree, child, p.shape[-1])
            ratio = 0.0 if q[token] <= 0 else min(1.0, float(p[token] / q[token]))
            if float(torch.rand((), generator=generator, dtype=torch.float64)) < ratio:
                break
            residual = (p - q).clamp_min(0)
            if float(residual.sum()) <= 0:  # p == q: the draft was certain to pass; keep p unchanged
                residual = p
            p = residual / residual.sum()
        else:
            return Verdict(tuple(path), _draw(p, generator))
        path.append(child)
        node = child


def _draft_distribution(tree: DraftTree, node: int, vocab: int) -> torch.Tensor:
    """``[V]`` the distribution node ``node`` was drawn from: its row of ``tree.probs``, or a point mass."""
    if tree.probs is not None:
        return tree.probs[node, :vocab].double()
    q = torch.zeros(vocab, dtype=torch.float64, device=tree.tokens.device)
    q[int(tree.tokens[node])] = 1.0
    return q
