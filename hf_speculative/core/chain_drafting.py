"""Drafting a chain the way the call accepts: the call's processors on the drafter's logits, its sampler's choice.

Draft-model, early-exit, Medusa and MTP drafters grow their chains with :func:`draft_chain`; accept.py holds the rule
that verifies them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .sampling import RejectionSampler
from .tree import DraftTree

if TYPE_CHECKING:
    from .budget import Plan


@dataclasses.dataclass(frozen=True)
class DraftVocab:
    """A drafter whose logits are over its own vocabulary `[V_d]`: ``widen`` makes them the target's `[V]` (a
    reduced vocabulary placed at its target ids, -inf elsewhere; or cut or padded to ``width``), ``target_ids``
    `[V_d]` is the target id of every draft id (``None``: the same ids). A device chain picks its tokens from the
    drafter's own logits, without widening them (:func:`draft_chain_on_device`): the same tokens, since the argmax
    over the widened logits is the argmax over the draft ids mapped, where the map keeps the order of the ids
    (``ordered``; else the chain widens each token's logits first)."""

    widen: Callable[[torch.Tensor], torch.Tensor]
    width: int
    target_ids: torch.Tensor | None = None
    ordered: bool = True  # draft id order is target id order: ties resolve to the same token either way

    @classmethod
    def of(cls, widen: Callable[[torch.Tensor], torch.Tensor], width: int,
           target_ids: torch.Tensor | None) -> DraftVocab:
        """Checks the map's order once (a read): make it once per call, not per chain."""
        ordered = target_ids is None or target_ids.numel() < 2 or bool((target_ids[1:] > target_ids[:-1]).all())
        return cls(widen, width, target_ids, ordered)

    def widened(self, logits: torch.Tensor, step):
        """``logits`` and ``step`` over the target's vocabulary: for the paths that pick tokens from widened logits."""
        return self.widen(logits), (lambda token: self.widen(step(token)))


def draft_chain(plan: Plan, ctx, input_ids: torch.Tensor, logits: torch.Tensor, max_tokens: int, step,
                on_device: bool = False, vocab: DraftVocab | None = None) -> DraftTree:
    """Draft a chain: pick a token from ``logits`` `[V]`, feed it with ``step(token) -> logits``, repeat while
    the loop's ``plan`` says it pays (its chain rule: ``wants`` / ``took``, see core/budget.py). The call's logits
    processors warp the drafter's logits as they warp the target's; the token is their argmax, or under seeded
    sampling the seeded draw from them at that position (the target's draw there if the drafter's distribution
    were the target's).

    Whether to draft a position is asked of ``plan.wants`` before its token is chosen (``plan.took`` sees the
    token, and only decides about the positions after it). Under the rejection rule the token is a draw from the
    drafter's warped distribution ``q`` instead, and the tree keeps ``q`` (``tree.q``, ``[k, V]``) for the rule.
    Returns the chain, ``[k]`` tokens as a one-branch :class:`DraftTree` (empty when nothing paid).

    ``on_device``: ``step`` takes the token as a device tensor ``[]`` too; where the chain's length is fixed before
    it starts (:func:`device_chain_length`), it is drafted by :func:`draft_chain_on_device`, without reading the
    device between tokens. ``vocab``: ``logits`` and ``step``'s are over the drafter's own vocabulary (the tokens
    fed to ``step`` are target ids all the same)."""
    length = device_chain_length(plan, ctx, max_tokens) if on_device else None
    if length is not None:
        return draft_chain_on_device(plan, logits, length, step, vocab)
    if vocab is not None:
        logits, step = vocab.widened(logits, step)
    processors, sampler = ctx.processors, ctx.sampler
    tokens: list[int] = []
    dists: list[torch.Tensor] = []  # under the rejection rule: the q each token was drawn from, [V] each
    sequence = input_ids  # [1, L + drafted]: the context the processors and the sampler's positions read
    while True:
        if processors:
            logits = processors(sequence, logits[None])[0]
        probs = torch.softmax(logits.float(), dim=-1)  # [V]
        top = float(probs.max())
        if math.isnan(top):
            break  # nothing to draw from (NaN or +inf scores, or all -inf): the target's own draw there refuses it
        if not plan.wants(top):
            break  # its expected gain does not pay for verifying it (its drafting is already paid)
        if isinstance(sampler, RejectionSampler):  # the rejection rule: draw from q, keep q for the rule
            token = sampler.draw(probs)
            dists.append(probs)
        else:
            token = int(torch.argmax(logits) if sampler is None else sampler.choose(sequence, logits[None])[0])
        tokens.append(token)
        if not plan.took(float(probs[token]), max_tokens):
            break
        sequence = torch.cat([sequence, sequence.new_tensor([[token]])], dim=-1)
        logits = step(token)
    tree = DraftTree.from_tokens(tokens, input_ids.device)
    return dataclasses.replace(tree, q=torch.stack(dists)) if dists else tree


def device_chain_length(plan: Plan, ctx, max_tokens: int) -> int | None:
    """How long a chain :func:`draft_chain_on_device` may draft this step, or ``None`` where the chain must be
    drafted token by token on the host (:func:`draft_chain`): the call's processors or sampler choose the tokens
    (they read the host's sequence), or the cost rules decide after each token from its confidence. Ask it after
    ``plan.start_chain()`` said yes."""
    if host_chooses(ctx):
        return None
    return plan.fixed_chain(max_tokens)


def host_chooses(ctx) -> bool:
    """Whether the call's tokens are chosen on the host: its processors or sampler read the host's sequence (or a
    node's branch), so a drafter cannot draft on the device alone (chains here, EAGLE's trees)."""
    return ctx.sampler is not None or bool(ctx.processors)


def draft_chain_on_device(plan: Plan, logits: torch.Tensor, length: int, step,
                          vocab: DraftVocab | None = None) -> DraftTree:
    """A greedy chain of ``length`` tokens with no read of the device inside: token ``j`` is the argmax of
    ``logits_j`` `[V]` (as :func:`draft_chain` picks it without processors), fed back to ``step(token) -> logits``
    as a device tensor ``[]``. One read at the end brings the tokens and their confidences to the host, where the
    chain rule sees each confidence as :func:`draft_chain` would have shown it (``plan.took``: a fixed budget keeps
    them all). A token whose distribution is NaN ends the chain before it, as in :func:`draft_chain`.

    With ``vocab`` the logits are the drafter's own `[V_d]`: the argmax is taken there and mapped to its target id
    (:class:`DraftVocab`), and the confidences are the softmax of the drafter's logits, which widening leaves as
    they are (its -inf entries have no probability). Per token: the argmax (and the map), then the drafter; the
    confidences of the whole chain at the end, in one softmax."""
    if vocab is not None and not vocab.ordered:
        (logits, step), vocab = vocab.widened(logits, step), None
    narrow = vocab is not None and vocab.target_ids is None and logits.shape[-1] > vocab.width
    ids_of = None if vocab is None else vocab.target_ids
    rows, tokens = [], []
    for j in range(length):
        if narrow:  # a drafter wider than the target: its extra ids are never the target's
            logits = logits[: vocab.width]
        token = torch.argmax(logits)  # []
        if ids_of is not None:
            token = torch.take(ids_of, token)  # [] (indexing with a tensor [] would read it)
        rows.append(logits)
        tokens.append(token)
        if j + 1 < length:
            logits = step(token)
    if not tokens:
        return DraftTree.empty(logits.device)
    chain = torch.stack(tokens)  # [k] on the device
    return chain_from_read(plan, chain, *chain_readout(chain, torch.stack(rows)).tolist(), length)  # the read


def chain_readout(chain: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """What the host reads of a device chain ``chain`` `[k]`: `[2, k]` (float64) its tokens and each token's
    probability, the softmax's peak of the logits it was chosen from, ``rows`` `[k, V]`."""
    confidences = torch.softmax(rows.float(), dim=-1).amax(dim=-1)  # [k]
    return torch.stack([chain.double(), confidences.double()])


def kept_read(read: list[list[float]], length: int, keep: int | None) -> tuple[list[float], list[float], int]:
    """``(ids, probs, length)`` of a region's chain as this step keeps it, from its read (:func:`chain_readout`'s
    rows as lists): the first ``keep`` of its ``length`` tokens (``None``: all), for :func:`chain_from_read`. A
    call's last steps, with less room, run the region of the others; their cut is made here, on the host (a slice
    of the tensors would be an operation every step)."""
    ids, probs = read
    if keep is None or keep >= length:
        return ids, probs, length
    return ids[:keep], probs[:keep], keep


def chain_from_read(plan: Plan, chain: torch.Tensor, ids: list[float], probs: list[float], length: int,
                    ask: bool = False) -> DraftTree:
    """The chain ``chain`` `[k]` (on the device) as far as the chain rule keeps it, from the tokens ``ids`` and their
    confidences ``probs`` read from it (:func:`chain_readout`): ``plan.took`` sees each confidence as
    :func:`draft_chain` would have shown it; a token with no probability (NaN) ends the chain before it. ``ask``:
    under the cost rules, ``plan.wants`` is asked before each token too, as :func:`draft_chain` asks it (a greedy
    token's confidence is its distribution's peak), so the chain kept is the one the host would have drafted.
    ``ids`` and ``probs`` may be fewer than the chain's tokens (:func:`kept_read`)."""
    kept = 0
    for confidence in probs:
        if math.isnan(confidence) or (ask and not plan.wants(confidence)):
            break
        kept += 1
        if not plan.took(confidence, length):
            break
    if kept == 0:
        return DraftTree.empty(chain.device)
    return DraftTree.chain(chain[:kept])._known_tokens([int(t) for t in ids[:kept]])
