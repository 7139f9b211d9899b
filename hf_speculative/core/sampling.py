"""Seeded sampling: one seed, one text, whatever the drafter does.

Sampling draws randomness; plain ``torch.multinomial`` takes it from a stream in the order the draws
happen. A speculative loop draws a varying number of times per step (the draft length follows the
adaptive policy, the machine's load, the thread), so the same ``torch.manual_seed`` would give a
different text on every run. Here the randomness of each output position comes from a generator keyed
by ``(seed, row, position)`` instead, and the draw is the Gumbel-max trick::

    token_t = argmax_x  log p_t(x) + g_t(x),      g_t(x) ~ Gumbel(0, 1) i.i.d., keyed by (seed, row, t)

``p_t`` is the target's processed distribution at position ``t`` (after temperature, top-k, top-p,
repetition penalty...). For each ``t`` the noise ``g_t`` is independent of everything before it and
``argmax(log p + g)`` is an exact draw from ``p``, so the text is an exact sample of the target's
distribution; and it is a fixed function of the seed and the text before ``t``, so any drafter, any
draft length, any tree shape gives the same text: drafts are verified as under greedy decoding, against
the target's seeded choice. A drafter that knows the seed can add the same noise to its own
distribution (its draft is the token the target would pick if ``q == p``), which couples draft and
target (acceptance ``P(argmax(log q + g) = argmax(log p + g))``, close to the rejection sampler's
``1 - TV(p, q)``).

:class:`SeededSampler` is a logits processor appended after transformers' own (warpers included); it
turns the scores into the draw, a point mass (``0`` at the drawn token, ``-inf`` elsewhere), so that
transformers' sampling and assisted loops, and ours, keep exactly that token.

A position whose processed scores leave nothing to draw from (a NaN or ``+inf`` score, or every score ``-inf``: what
``torch.multinomial`` refuses in transformers' own sampling) raises (:func:`refuse_nothing_to_draw`) under either rule,
never a token 0 taken from an argmax over NaN.
"""

from __future__ import annotations

import operator
from typing import NoReturn

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from .processor_list import ProcessorList

MAX_SEED = 2**64 - 1
_MASK64 = 2**64 - 1


def check_seed(seed: object, name: str = "sampling_seed") -> int:
    """``seed`` as an int in ``[0, 2**64)``; raises a `ValueError`/`TypeError` naming ``name`` otherwise."""
    if isinstance(seed, bool):
        raise TypeError(f"{name}={seed!r}: must be an integer from 0 to 2**64 - 1, not a bool.")
    try:
        value = operator.index(seed)
    except TypeError:
        raise TypeError(f"{name}={seed!r}: must be an integer from 0 to 2**64 - 1.") from None
    if not 0 <= value <= MAX_SEED:
        raise ValueError(f"{name}={value}: must be an integer from 0 to 2**64 - 1.")
    return value


def call_seed(seed: object = None) -> int:
    """The seed of one sampling call: ``seed`` when given, else one draw from torch's global generator
    (so ``torch.manual_seed(s)`` before a call fixes its text, and consecutive calls differ)."""
    if seed is not None:
        return check_seed(seed)
    hi, lo = torch.randint(0, 2**32, (2,), dtype=torch.int64).tolist()
    return (hi << 32) | lo


def _mix(x: int) -> int:
    """splitmix64's finalizer: nearby keys ``(seed, row, t)`` give unrelated generator seeds."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_key(seed: int, row: int, position: int) -> int:
    """The generator seed of output ``position`` of batch ``row`` (63 bits: what ``manual_seed`` takes everywhere)."""
    return _mix(_mix(_mix(seed) ^ row) ^ position) >> 1


def refuse_nothing_to_draw() -> NoReturn:
    """Raise what a sampled call raises where the processed scores of the position being drawn hold no distribution."""
    raise RuntimeError(
        "Sampling found nothing to draw from: after the logits processors, the next token's scores hold a NaN or "
        "+inf, or every one is -inf (every probability zero). Check what the call does to the scores: temperature= "
        "(positive and not tiny), top_k= / top_p= / min_p=, suppress_tokens= / bad_words_ids=, a custom "
        "logits_processor= (it must leave at least one finite score), or the model's own logits (NaN from a "
        "float16 overflow: load it in bfloat16 or float32); or decode greedily (do_sample=False). transformers' own "
        "sampling refuses this too (torch.multinomial: 'probability tensor contains either inf, nan or element < 0').")


class SeededSampler(LogitsProcessor):
    """The last logits processor of a seeded sampling call: the scores become the draw.

    Args:
        seed (`int`): the call's seed, ``0 <= seed < 2**64`` (see :func:`call_seed`).
        marks (`bool`): a row with nothing to draw from (NaN or ``+inf`` scores, or all ``-inf``) comes back as NaN
            scores, for the loop that reads the draw to refuse (hf_speculative's loop: ``accept_greedy`` reads it
            with its verdict, no read of the device added); by default (``False``, for transformers' loops, whose
            argmax would take a NaN row's token 0) the sampler refuses it itself, with one read of the device.

    Called with ``input_ids`` `[B, L]` and scores `[B, V]`, it draws position ``L`` of each row from
    ``softmax(scores)`` with that position's own noise and returns the point mass of the draw `[B, V]`; a row with
    nothing to draw from raises (:func:`refuse_nothing_to_draw`; or, ``marks``, is NaN).
    """

    def __init__(self, seed: int, *, marks: bool = False):
        self.seed = check_seed(seed, "seed")
        self.marks = marks

    def noise(self, row: int, position: int, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[vocab]`` float32 Gumbel(0, 1) noise of ``position`` in ``row``; the same on every call."""
        generator = torch.Generator(device=device).manual_seed(position_key(self.seed, row, position))
        uniform = torch.rand(vocab, generator=generator, device=device)  # [0, 1): u == 0 gives -inf, never drawn
        return -torch.log(-torch.log(uniform))

    def noises(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        """``[B, V]`` the noise of each row's next position (position ``L`` of ``input_ids`` `[B, L]`)."""
        position, vocab = input_ids.shape[-1], scores.shape[-1]
        return torch.stack([self.noise(row, position, vocab, scores.device) for row in range(scores.shape[0])])

    def draw(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> tuple[torch.LongTensor, torch.Tensor]:
        """``([B] the drawn tokens, [B] whether each row had a distribution to draw from)``: per row,
        ``argmax(log_softmax(scores) + noise(row, L))``. Both stay on the device."""
        logprobs = torch.log_softmax(scores.float(), dim=-1)  # [B, V]
        # log_softmax turns a row with nothing to draw from (a NaN or +inf score, or all -inf) into NaNs, and max
        # propagates a NaN: the validity comes with the draw's own reduction
        best, drawn = (logprobs + self.noises(input_ids, scores)).max(dim=-1)
        return drawn, ~best.isnan()

    def choose(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.LongTensor:
        """``[B]`` the drawn tokens (see :meth:`draw`; a row with nothing to draw from gets an arbitrary one)."""
        return self.draw(input_ids, scores)[0]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        drawn, valid = self.draw(input_ids, scores)  # [B] each
        out = torch.full_like(scores, float("-inf")).scatter_(-1, drawn[:, None], 0.0)
        if self.marks:
            return out.masked_fill_(~valid[:, None], float("nan"))
        if not bool(valid.all()):
            refuse_nothing_to_draw()
        return out


class RejectionSampler(LogitsProcessor):
    """The last logits processor of a call sampled by the rejection rule (``speculative_sampling="rejection"``).

    It leaves the scores as they are: the loop draws from them (:func:`hf_speculative.core.accept.accept_rejection`),
    and drafters with a distribution draw their tokens from theirs (``draft_chain``). Every draw of the call, the
    drafter's and the target's, comes from ``generator`` (default: torch's global generator, so
    ``torch.manual_seed(s)`` before a call fixes its draws; the text still depends on what was drafted, unlike the
    seeded rule's).
    """

    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def draw(self, probs: torch.Tensor) -> int:
        """One token drawn from ``probs`` `[V]` (non-negative, summing to 1 up to rounding); raises
        (:func:`refuse_nothing_to_draw`) when they hold a NaN or an infinity, or sum to 0."""
        probs = probs.float()
        try:
            return int(torch.multinomial(probs, 1, generator=self.generator))
        except RuntimeError:  # multinomial checks its input (on every device) and says too little
            if bool(torch.isfinite(probs).all()) and float(probs.sum()) > 0:
                raise
            refuse_nothing_to_draw()

    def uniform(self) -> float:
        """One draw from U[0, 1)."""
        return float(torch.rand((), generator=self.generator))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return scores


def split_sampler(processors) -> tuple[LogitsProcessorList, SeededSampler | RejectionSampler | None]:
    """``(the processors before it, the call's sampler)``: drafters warp their own logits with the first part and
    draw with the second (all of ``processors`` and ``None`` for greedy decoding): a :class:`SeededSampler` (the
    seeded rule) or a :class:`RejectionSampler` (the rejection rule)."""
    items = list(processors or [])
    if items and isinstance(items[-1], (SeededSampler, RejectionSampler)):
        return ProcessorList(items[:-1]), items[-1]
    return ProcessorList(items), None


def rejection_sampler(processors) -> RejectionSampler | None:
    """The ``RejectionSampler`` that ends a call's ``processors`` under the rejection rule, else ``None`` (greedy,
    the seeded rule): what the loop verifies with and a tree drafter draws its guesses with."""
    sampler = split_sampler(processors)[1]
    return sampler if isinstance(sampler, RejectionSampler) else None


SAMPLING_MODES = ("seeded", "rejection")


def check_mode(mode: object, seed: object = None) -> str:
    """``speculative_sampling=``'s value checked (``None``: ``"seeded"``); with ``seed``, only the seeded rule."""
    if mode is None:
        return "seeded"
    if mode not in SAMPLING_MODES:
        raise ValueError(f"speculative_sampling={mode!r}: choose 'seeded' (one seed, one text, whatever is drafted) "
                         "or 'rejection' (the classic rule: the highest acceptance; the text depends on the drafts).")
    if mode == "rejection" and seed is not None:
        raise ValueError("sampling_seed= fixes the text of the seeded rule; speculative_sampling='rejection' draws "
                         "from torch's generator: drop sampling_seed= (torch.manual_seed(s) fixes the rejection "
                         "rule's draws) or speculative_sampling='rejection'.")
    return str(mode)


def seeded_processors(processors, generation_config, seed: int | None, mode: str = "seeded",
                      ours: bool = True) -> tuple[LogitsProcessorList, SeededSampler | RejectionSampler | None]:
    """``processors`` (a call's prepared list) ending with a SeededSampler when ``generation_config`` samples:
    the one already there, else one of ``seed`` (``None``: :func:`call_seed`'s draw); with ``mode="rejection"`` a
    :class:`RejectionSampler` instead (``ours=False``, transformers' assisted loop: nothing, it samples). ``ours``:
    hf_speculative's loop reads the draws (the SeededSampler ``marks`` a row with nothing to draw from), else
    transformers' (its own ``_sample`` of a plain seeded call, or its assisted loop: the sampler refuses such a row
    itself). The call's ``generation_config`` (transformers' per-call copy) is then switched to ``do_sample=False``:
    the loops take the sampler's point mass with an argmax, so nothing else draws from torch's generator and a call
    advances it by the one draw of its seed at most, whatever was drafted. Unchanged for greedy decoding.

    Returns ``(processors, sampler)``: the call's sampling rule (the sampler ending the list; ``None``: greedy, or a
    loop of transformers' that draws by its own rule), which the caller keeps as the call's field."""
    # transformers' list, each processor's signature read once (not a helper's call: tests/hf/test_entry_shape.py)
    processors = processors if isinstance(processors, ProcessorList) else ProcessorList(processors or [])
    if not getattr(generation_config, "do_sample", False):
        return processors, (split_sampler(processors)[1] if processors else None)
    if (getattr(generation_config, "num_beams", None) or 1) > 1:
        if seed is None:
            return processors, None  # beam-search sampling draws its beams together: transformers' own draws
        raise ValueError("sampling_seed= fixes the draws of sampling with num_beams=1; beam-search sampling "
                         "(num_beams > 1) draws its beams together: drop sampling_seed= (use torch.manual_seed) "
                         "or num_beams.")
    sampler = split_sampler(processors)[1]  # one the caller put there already
    if mode == "rejection":
        if not ours:
            return processors, None  # transformers' assisted loop samples by its own rejection rule: do_sample stays
        if sampler is None:
            sampler = RejectionSampler()
            processors.append(sampler)
    elif sampler is None:
        sampler = SeededSampler(call_seed(seed), marks=ours)
        processors.append(sampler)
    generation_config.do_sample = False
    return processors, sampler
