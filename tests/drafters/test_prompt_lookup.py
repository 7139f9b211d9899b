"""``NgramIndex`` and the prompt-lookup generator, driven directly (no model needed)."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

import hf_speculative as hfs
from hf_speculative.core.call import CallContext
from hf_speculative.drafters.prompt_lookup.drafter import NgramIndex


class CountingDict(dict):
    """A dict that counts its insertions and look-ups."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sets = 0
        self.gets = 0

    def __setitem__(self, key, value):
        self.sets += 1
        super().__setitem__(key, value)

    def get(self, key, default=None):
        self.gets += 1
        return super().get(key, default)


def index_of(tokens, min_n=1, max_n=3) -> NgramIndex:
    index = NgramIndex(min_n, max_n)
    index.extend(list(tokens))
    return index


def continuation(index: NgramIndex, length: int = 3):
    match = index.lookup()
    if match is None:
        return None
    n, start = match
    return n, index.tokens[start: start + length]


# -- NgramIndex --------------------------------------------------------------------------------
def test_longest_ngram_wins_over_a_more_recent_shorter_one():
    # suffix (1, 2, 3): the trigram occurred once, long ago (followed by 10); the unigram (3)
    # occurred more recently (followed by 11). The trigram is the better evidence.
    index = index_of([1, 2, 3, 10, 4, 3, 11, 1, 2, 3])
    assert continuation(index) == (3, [10, 4, 3])


def test_most_recent_occurrence_wins():
    # (1, 2) occurs twice before the suffix: followed by 10, then by 11. Take the most recent.
    index = index_of([1, 2, 10, 1, 2, 11, 1, 2])
    assert continuation(index, 1) == (2, [11])
    # and transformers' first-occurrence rule would have proposed 10: the two orders differ here
    assert index.tokens[2] == 10


def test_overlapping_repeats():
    # a run of one token: the suffix (7, 7, 7) also ends one position earlier, overlapping itself
    assert continuation(index_of([5, 7, 7, 7, 7])) == (3, [7])
    # a period-2 text: (1, 2, 1) ended at 3, overlapping the suffix; its continuation is 2, 1
    assert continuation(index_of([1, 2, 1, 2, 1])) == (3, [2, 1])


def test_no_match_and_min_ngram():
    assert index_of([1, 2, 3]).lookup() is None  # the suffix itself is not a match
    assert index_of([]).lookup() is None
    index = index_of([5, 6, 9, 6], min_n=2, max_n=3)  # only (6,) recurs, shorter than min_n
    assert index.lookup() is None
    assert continuation(index_of([5, 6, 9, 6], min_n=1, max_n=3), 1) == (1, [9])


def test_max_ngram_bounds_the_match():
    index = index_of([1, 2, 3, 4, 9, 1, 2, 3, 4], min_n=1, max_n=2)
    assert continuation(index, 1) == (2, [9])


@pytest.mark.parametrize("chunks", [[9], [1] * 9, [2, 3, 4], [5, 1, 3]])
def test_incremental_extend_equals_one_extend(chunks):
    tokens = [1, 2, 1, 2, 3, 1, 2, 3, 1]
    whole = index_of(tokens)
    pieces = NgramIndex(1, 3)
    position = 0
    for size in chunks:
        pieces.extend(tokens[position: position + size])
        position += size
        # at every point, the incremental index answers like one built from scratch
        assert pieces.lookup() == index_of(tokens[:position]).lookup()
    assert pieces._last_end == whole._last_end and pieces.tokens == whole.tokens


@pytest.mark.parametrize("min_n,max_n", [(1, 3), (2, 4), (1, 1)])
def test_cost_per_step_does_not_grow_with_the_context(min_n, max_n):
    """Counted in dict operations, not time: appending t tokens inserts at most t * (number of
    n-gram sizes) entries, and a look-up does at most one get per size, whatever the context length."""
    sizes = max_n - min_n + 1
    torch.manual_seed(0)
    counts = {}
    for context in (50, 5000):
        index = NgramIndex(min_n, max_n)
        index._last_end = CountingDict()
        index.extend(torch.randint(0, 20, (context,)).tolist())
        per_step = []
        for new in ([3], [4, 5], [6, 7, 8, 9], [1]):
            before_sets, before_gets = index._last_end.sets, index._last_end.gets
            index.extend(new)
            index.lookup()
            sets, gets = index._last_end.sets - before_sets, index._last_end.gets - before_gets
            assert sets <= len(new) * sizes
            assert gets <= sizes
            per_step.append((sets, gets))
        counts[context] = per_step
    assert [s for s, _ in counts[50]] == [s for s, _ in counts[5000]]


# -- the generator -----------------------------------------------------------------------------
class FakeClock:
    """Replaces the wall clock of the base generator, so that the verify cost it measures is the
    one the test chooses (``1 + 0.3 k`` time units for a forward verifying ``k`` draft tokens)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    import hf_speculative.drafters.assisted as base

    fake = FakeClock()
    monkeypatch.setattr(base, "time", fake)
    return fake


def open_generator(strategy: hfs.PromptLookup, max_length: int = 100_000):
    ctx = CallContext(target=None, generation_config=GenerationConfig(do_sample=False, max_length=max_length),
                      logits_processor=None, stopping_criteria=None, stats=hfs.SpeculativeStats())
    return strategy.open(ctx)


def drive(generator, text: list[int], target_token, steps: int, clock=None, cost_per_token: float = 0.3,
          with_available: bool = False):
    """Plays the assisted loop: ``target_token(text, draft)`` is what the target would produce at each
    position. Checks every draft against the index. Returns the draft length of every step (and,
    with ``with_available``, the length of the continuation that the match offered)."""
    lengths, available = [], []
    for _ in range(steps):
        candidates, logits = generator.get_candidates(torch.tensor([text]))
        assert logits is None and candidates[0, : len(text)].tolist() == text
        draft = candidates[0, len(text):].tolist()
        match = generator.index.lookup()
        if draft:  # the continuation of an alignment at least as long as the longest n-gram match
            assert copies(text, draft, match[0]), (text, draft, match)
        lengths.append(len(draft))
        available.append(0 if match is None else len(text) - match[1])
        if clock is not None:
            clock.now += 1.0 + cost_per_token * len(draft)
        accepted = []
        for token in draft:
            if token != target_token(text + accepted, draft):
                break
            accepted.append(token)
        text = text + accepted + [target_token(text + accepted, draft)]
        generator.update_candidate_strategy(torch.tensor([text]), torch.empty(0), len(accepted))
    return (lengths, available) if with_available else lengths


def copies(text: list[int], draft: list[int], n: int) -> bool:
    """Whether ``draft`` is what followed an earlier occurrence of the last ``n`` tokens of ``text`` (where the copy
    runs into the end of the text, what it copied goes on: ``text + draft`` repeats itself from ``start`` on)."""
    whole = text + draft
    return any(text[start - n: start] == text[len(text) - n:] and draft == whole[start: start + len(draft)]
               for start in range(n, len(text)))


PERIOD = [1, 2, 3, 4]


def periodic(text, draft):
    return PERIOD[len(text) % 4]


def periodic_with_fresh_tokens(text, draft):
    """The period, but every 7th position a token never seen before (after it, no match: the loop
    also measures forwards without a draft, the base of the verify-cost ratio)."""
    return 100 + len(text) if len(text) % 7 == 0 else PERIOD[len(text) % 4]


def contrarian(text, draft):
    """Always a token of the text (so look-ups keep matching) but never the drafted one."""
    return 1 + (text[-1] % 4) if not draft else 1 + (draft[0] + 1) % 4


def test_index_grows_only_by_new_tokens():
    generator = open_generator(hfs.PromptLookup(adaptive=False))
    generator.index._last_end = CountingDict()
    text = PERIOD * 50
    drive(generator, text, periodic, steps=20)
    total = len(generator.index.tokens)
    assert generator.index.tokens == (PERIOD * 1000)[:total]
    assert generator.index._last_end.sets <= total * 3


def test_fixed_length_drafts_num_tokens_whenever_there_is_a_match():
    generator = open_generator(hfs.PromptLookup(num_tokens=3, adaptive=False))
    lengths, available = drive(generator, PERIOD * 3, contrarian, 30, with_available=True)
    assert all(available)  # contrarian keeps the text made of 1..4: a match every step
    # num_tokens at every match, also where the source runs into the end of the text (the copy goes on with its
    # period) and whatever was rejected before (fixed means fixed)
    assert lengths == [3] * 30


def test_adaptive_backs_off_to_no_drafts_when_matches_keep_being_rejected(clock):
    generator = open_generator(hfs.PromptLookup(num_tokens=6))
    lengths = drive(generator, PERIOD * 3, contrarian, 60, clock)
    assert lengths[0] > 0, "with the optimistic prior the first match is drafted"
    # backed off: only one-token probes, now and then (each match-length bucket's estimate forgives on its own, and
    # the text of 1..4 keeps matching 1 to 8+ tokens back)
    assert max(lengths[-30:]) <= 1 and sum(lengths[-30:]) <= 6, lengths
    assert generator.stats.drafted_tokens == sum(lengths) and generator.stats.accepted_tokens == 0


def test_adaptive_drafts_long_when_matches_are_accepted(clock):
    generator = open_generator(hfs.PromptLookup(num_tokens=6))
    lengths = drive(generator, PERIOD * 3, periodic, 30, clock)
    assert all(k > 0 for k in lengths)
    assert sum(lengths[-10:]) / 10 >= 3, lengths
    assert generator.stats.accepted_tokens == generator.stats.drafted_tokens


def test_adaptive_does_not_draft_when_verifying_is_too_expensive(clock):
    """Matches that are always right do not pay if a verified token costs more than a forward."""
    generator = open_generator(hfs.PromptLookup(num_tokens=6))
    lengths = drive(generator, PERIOD * 3, periodic_with_fresh_tokens, 60, clock, cost_per_token=1.5)
    assert lengths[0] > 0  # the prior is optimistic
    assert sum(1 for k in lengths[-30:] if k) <= 2, lengths
    cheap = drive(open_generator(hfs.PromptLookup(num_tokens=6)), PERIOD * 3, periodic_with_fresh_tokens, 60,
                  clock, cost_per_token=0.1)
    assert sum(1 for k in cheap[-30:] if k) >= 15, cheap  # the same text with cheap verification does draft


def test_draft_never_runs_past_max_length():
    ctx = CallContext(target=None, generation_config=GenerationConfig(do_sample=False, max_length=15),
                      logits_processor=None, stopping_criteria=None, stats=hfs.SpeculativeStats())
    generator = hfs.PromptLookup(num_tokens=10, adaptive=False).open(ctx)
    for length in range(8, 15):
        candidates, _ = generator.get_candidates(torch.tensor([(PERIOD * 4)[:length]]))
        assert candidates.shape[1] <= 14  # room for the target's own token
