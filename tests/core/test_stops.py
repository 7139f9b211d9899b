"""``core/stops.py``: the host-side check of a step's new tokens gives the stop the criteria give position by
position, for transformers' own criteria, stop strings, a user's criterion and subclasses; and it asks the
criteria's tensors nothing for EOS and length (counted)."""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)

from hf_speculative import compat
from hf_speculative.core.loop import stop_index
from hf_speculative.core.stops import Stops
from tests.conftest import char_tokenizer


def scan(sequence, start, criteria):
    """The reference: the criteria list asked after every new position."""
    for end in range(start + 1, sequence.shape[1] + 1):
        if compat.stopping_result(criteria(sequence[:, :end], None)):
            return end
    return None


class TokenSeen(StoppingCriteria):
    """A user's criterion: stops once ``token`` has been written anywhere after ``after``."""

    def __init__(self, token: int, after: int):
        self.token, self.after = token, after

    def __call__(self, input_ids, scores, **kwargs):
        return torch.tensor([bool((input_ids[0, self.after:] == self.token).any())])


class EosAfterTwo(EosTokenCriteria):
    """A subclass with its own rule: must be asked, not read as EOS."""

    def __call__(self, input_ids, scores, **kwargs):
        return torch.tensor([input_ids.shape[1] >= 2 and int(input_ids[0, -2]) in self.eos_token_id.tolist()])


def lists():
    tokenizer = char_tokenizer()
    yield StoppingCriteriaList([MaxLengthCriteria(12), EosTokenCriteria(5)])
    yield StoppingCriteriaList([MaxLengthCriteria(9), EosTokenCriteria(torch.tensor([5, 7]))])
    yield StoppingCriteriaList([MaxLengthCriteria(30), EosTokenCriteria(3), TokenSeen(9, after=4)])
    yield StoppingCriteriaList([MaxLengthCriteria(30), EosAfterTwo(5)])
    yield StoppingCriteriaList([MaxLengthCriteria(30), StopStringCriteria(tokenizer, ["&'"])])  # ids 6, 7
    yield StoppingCriteriaList([EosTokenCriteria(5), MaxLengthCriteria(11), MaxLengthCriteria(10)])


@pytest.mark.parametrize("criteria", list(lists()), ids=lambda c: "+".join(type(x).__name__ for x in c))
def test_stops_agree_with_asking_every_position(criteria):
    stops = Stops(criteria)
    tokens = [1, 2, 5, 6, 7, 9, 3, 5, 7, 8]
    for start, k in itertools.product(range(1, 9), range(1, 6)):
        for shift in range(3):  # the same step with the tokens rolled: stops early, late, nowhere
            row = tokens[shift:] + tokens[:shift]
            sequence = torch.tensor([row[: start + k]])
            if sequence.shape[1] < start + k:
                continue
            new = sequence[0, start:].tolist()
            want = scan(sequence, start, criteria)
            assert stops.first(sequence, start, new) == want, (start, new)
            assert stop_index(sequence, start, stops, new) == want


def test_a_spent_clock_stops_at_the_first_new_token():
    criteria = StoppingCriteriaList([MaxLengthCriteria(50), MaxTimeCriteria(0.0, initial_timestamp=time.time() - 1)])
    sequence = torch.tensor([[1, 2, 3, 4, 5]])
    assert Stops(criteria).first(sequence, 2, [3, 4, 5]) == scan(sequence, 2, criteria) == 3


def test_eos_and_length_ask_no_tensor(monkeypatch):
    criteria = StoppingCriteriaList([MaxLengthCriteria(100), EosTokenCriteria(5)])
    stops = Stops(criteria)
    asked = []
    for criterion in criteria:
        monkeypatch.setattr(type(criterion), "__call__", lambda self, *a, **k: asked.append(self) or torch.tensor([0]))
    assert stops.first(torch.tensor([[1, 2, 3, 5]]), 1, [2, 3, 5]) == 4
    assert asked == []


def test_negative_control_a_wrong_eos_set_is_caught():
    """The agreement test above can fail: a Stops whose EOS ids are wrong disagrees with the scan."""
    criteria = StoppingCriteriaList([MaxLengthCriteria(30), EosTokenCriteria(5)])
    stops = Stops(criteria)
    stops.eos = {6}
    sequence = torch.tensor([[1, 2, 5, 6]])
    assert stops.first(sequence, 1, [2, 5, 6]) != scan(sequence, 1, criteria)
