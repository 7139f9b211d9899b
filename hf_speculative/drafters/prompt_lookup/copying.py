"""How far a copy reaches: the alignment that prompt lookup drafts from, and how long its draft may be.

A match is an *alignment*: position ``start`` of the text is proposed as the next token, because the ``m`` tokens
before ``start`` equal the last ``m`` tokens of the text. The n-gram index finds alignments of ``m >= n`` for a
short suffix n-gram; once a copy is under way (the answer repeats a sentence of the context) the alignment that
drafted the previous step usually goes on matching, token after token, and its ``m`` grows with every accepted
token. ``m`` is the evidence: a copy that has matched 30 tokens is far likelier to match the next one than a
3-gram that happened to recur. So:

- the candidate alignments are the index's (the most recent occurrence of the longest suffix n-gram) and the
  previous step's, carried on by the tokens verified since (:class:`CopyTracker`); the one that matches further
  back wins (:func:`match_length`, counted up to :data:`MAX_MATCH`);
- the cost rule keys its acceptance estimate by ``m``'s bucket (:func:`copy_key`: 1, 2, 3, then 4-7, 8-15, 16-31,
  32+), so long copies learn their own, higher rate; a key's estimate starts at the rule of succession for its
  bucket (:func:`copy_prior`: after ``m`` matching tokens the next one matches with probability about
  ``m / (m + 1)``), never below the general prior;
- the draft may reach as far ahead as the copy has matched behind (:func:`copy_reach`: at least ``num_tokens``, at
  most ``copy_tokens``): a copy whose drafts are wholly accepted doubles its reach every step (10, 21, 43, 64
  tokens), a rejection starts the next match short again. Within that reach the cost rule picks the length, token
  ``j`` of the draft weighed at the acceptance measured for copies of ``m + j`` matched tokens (``copy_keys``);
- a copy that runs into the end of the text goes on with its own tokens (:func:`copied`: the text repeats itself
  with that period).
"""

from __future__ import annotations

from ...core.policy import PRIOR_RATE

MAX_MATCH = 64  # tokens compared backwards at most: buckets stop at 32, reaches at 64


def match_length(tokens: list[int], start: int, limit: int = MAX_MATCH) -> int:
    """How many tokens before ``start`` equal the last tokens of ``tokens`` (at most ``limit``): the number of
    ``i >= 1`` with ``tokens[start - i] == tokens[-i]`` for every ``i`` up to it."""
    end, m = len(tokens), 0
    while m < limit and m < start and tokens[start - 1 - m] == tokens[end - 1 - m]:
        m += 1
    return m


def copy_key(m: int) -> int:
    """The acceptance key of an alignment that matched ``m`` tokens: ``m`` up to 3, then its power-of-two bucket
    (4, 8, 16, 32)."""
    if m <= 3:
        return m
    return min(1 << (m.bit_length() - 1), 32)


def copy_keys(m: int, length: int) -> list[int]:
    """The keys of the ``length`` tokens a copy that matched ``m`` tokens drafts: token ``j`` is drafted once the
    ``j`` before it were accepted, after ``m + j`` matching tokens."""
    return [copy_key(min(m + j, MAX_MATCH)) for j in range(length)]


def copy_prior(key: int) -> float:
    """The per-token acceptance assumed for a key before any of its drafts was verified: ``key / (key + 1)``
    (the rule of succession after ``key`` matches), at least :data:`~hf_speculative.core.policy.PRIOR_RATE`."""
    return max(PRIOR_RATE, key / (key + 1))


def copy_reach(m: int, num_tokens: int, copy_tokens: int) -> int:
    """The longest draft of an alignment that matched ``m`` tokens: ``m``, within ``[num_tokens, copy_tokens]``."""
    return max(num_tokens, min(m, copy_tokens))


def copied(tokens: list[int], start: int, k: int) -> list[int]:
    """The ``k`` tokens the alignment at ``start`` proposes: ``tokens[start:]``, and where that runs into the end of
    the text, the copy's own tokens again (the alignment says the text repeats itself ``len(tokens) - start`` tokens
    later: a list, a table row or a loop goes on with its period)."""
    out = tokens[start: start + k]
    shift = len(tokens) - start
    while len(out) < k:
        out.append(out[len(out) - shift])
    return out


class CopyTracker:
    """The previous step's alignment, carried forward: after drafting from ``start`` at text length ``length``, the
    same copy continues at ``start + (L - length)`` once the text has length ``L`` (it is then a candidate only if
    it still matches: every verified token since followed the source)."""

    def __init__(self):
        self.start: int | None = None
        self.length = 0

    def candidate(self, tokens: list[int]) -> tuple[int, int] | None:
        """``(start, m)``: the carried alignment's next position in ``tokens`` (the verified text) and how far back it
        matches, when every token verified since the draft followed the source; else ``None``."""
        if self.start is None:
            return None
        since = len(tokens) - self.length
        start = self.start + since
        if since < 0 or start >= len(tokens):
            return None
        m = match_length(tokens, start)
        return (start, m) if m >= min(since + 1, MAX_MATCH) else None

    def drafted_from(self, start: int, length: int) -> None:
        """Remember the alignment this step chose (``start``) for a text of ``length`` tokens."""
        self.start, self.length = start, length


def best_alignment(tokens: list[int], lookup: tuple[int, int] | None,
                   carried: tuple[int, int] | None) -> tuple[int, int] | None:
    """``(start, m)`` of the candidate that matches furthest back (the carried copy on a tie), or ``None``.

    ``lookup``: the index's ``(n, start)``; ``carried``: :meth:`CopyTracker.candidate`'s ``(start, m)``."""
    if lookup is None:
        return carried
    found = (lookup[1], match_length(tokens, lookup[1]))
    return carried if carried is not None and carried[1] >= found[1] else found
