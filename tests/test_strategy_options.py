"""A mistyped option of any strategy class names the close match (not dataclasses' bare TypeError)."""

from __future__ import annotations

import dataclasses

import pytest

import hf_speculative as hfs
from hf_speculative.drafters.strategy import DraftStrategy

STRATEGIES = ("PromptLookup", "DraftModel", "Eagle", "EarlyExit", "LayerSkip", "Hybrid", "SuffixDecoding",
              "Lookahead", "Medusa")


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_mistyped_option_names_the_close_match(name):
    cls = getattr(hfs, name)
    assert issubclass(cls, DraftStrategy) and dataclasses.is_dataclass(cls)
    field = next(f.name for f in dataclasses.fields(cls) if f.init and len(f.name) > 4)
    typo = field[:-1]  # "num_tokens" -> "num_token"
    with pytest.raises(TypeError, match=rf"{name}\(\) got an unknown option '{typo}': did you mean '{field}'\?"):
        cls(**{typo: 1})


def test_an_option_with_no_close_match_lists_the_options():
    with pytest.raises(TypeError, match=r"unknown option 'zzz': its options are num_tokens, max_ngram"):
        hfs.PromptLookup(zzz=1)


def test_right_options_still_build_and_copy():
    import pickle

    lookup = hfs.PromptLookup(num_tokens=3, max_ngram=2)
    assert (lookup.num_tokens, lookup.max_ngram) == (3, 2)
    assert pickle.loads(pickle.dumps(lookup)) == lookup
