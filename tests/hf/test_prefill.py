"""``hfs.prefill``: the cache of a batch's first columns (one prefill, several calls). It equals one forward of those
columns as transformers' batched ``generate`` runs it, in whatever chunks; calls starting from it are batched greedy's
and leave it as it was; bad arguments are refused before any forward, naming the fix."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_speculative as hfs
from hf_speculative import compat
from tests.conftest import build_model, stock_generate
from tests.core.test_batch import PROMPTS, left_padded, prefilled_cache


@pytest.fixture(scope="module")
def model():
    return hfs.enable(build_model("llama"))


@pytest.mark.parametrize("chunk_tokens", [1, 6, 8192])  # a column at a time (3 rows), two columns, all at once
@pytest.mark.parametrize("columns", [None, 4, 13])
def test_it_is_one_forward_of_the_first_columns_in_any_chunks(model, columns, chunk_tokens):
    inputs = left_padded(PROMPTS[:3])  # widths 14, 8 and 20: the first rows padded
    width = inputs["input_ids"].shape[1]
    cache = hfs.prefill(model, inputs, columns, chunk_tokens=chunk_tokens)
    ref = prefilled_cache(model, inputs, width - 1 if columns is None else columns)
    assert cache.get_seq_length() == ref.get_seq_length() == (width - 1 if columns is None else columns)
    for got, want in zip(compat.cache_tensors(cache), compat.cache_tensors(ref), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_only_the_last_position_s_logits_are_computed(model):
    shapes = []
    hook = model.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.logits.shape)))
    try:
        hfs.prefill(model, left_padded(PROMPTS[:3]), chunk_tokens=30)  # 10 columns a forward
    finally:
        hook.remove()
    assert shapes == [(3, 1, model.config.vocab_size)] * 2


def test_calls_from_it_are_batched_greedy_and_leave_it_as_it_was(model):
    inputs = left_padded(PROMPTS[:3])
    ref = stock_generate(model, **inputs, max_new_tokens=10, do_sample=False, pad_token_id=0)
    cache = hfs.prefill(model, inputs, chunk_tokens=9)
    before = [t.clone() for t in compat.cache_tensors(cache)]
    for drafter in (hfs.PromptLookup(), hfs.PromptLookup(num_tokens=3)):  # (transformers' own greedy fills it)
        out = model.generate(**inputs, max_new_tokens=10, do_sample=False, pad_token_id=0, candidate_generator=drafter,
                             **{compat.cache_kwarg(): cache})
        assert out.tolist() == ref.tolist()
    assert all(torch.equal(a, b) for a, b in zip(compat.cache_tensors(cache), before, strict=True))


def test_one_row_without_a_mask(model):
    ids = torch.tensor([PROMPTS[2]])
    ref = stock_generate(model, input_ids=ids, max_new_tokens=10, do_sample=False)
    cache = hfs.prefill(model, {"input_ids": ids}, 12)
    assert cache.get_seq_length() == 12
    out = model.generate(input_ids=ids, max_new_tokens=10, do_sample=False, candidate_generator=hfs.PromptLookup(),
                         **{compat.cache_kwarg(): copy.deepcopy(cache)})  # a one-row call fills its cache
    assert out.tolist() == ref.tolist()


BATCH = left_padded(PROMPTS[:3])
RIGHT = {"input_ids": BATCH["input_ids"], "attention_mask": BATCH["attention_mask"].flip(-1)}


@pytest.mark.parametrize(("inputs", "kwargs", "error", "message"), [
    (BATCH["input_ids"], {}, TypeError, "inputs is a tokenizer's output"),
    ({"attention_mask": BATCH["attention_mask"]}, {}, TypeError, "inputs is a tokenizer's output"),
    ({"input_ids": BATCH["input_ids"][0]}, {}, ValueError, r"\[batch, length\] tensor"),
    ({"input_ids": BATCH["input_ids"].float()}, {}, ValueError, r"\[batch, length\] tensor"),
    ({"input_ids": BATCH["input_ids"]}, {}, ValueError, "a batch needs its attention_mask"),
    ({**BATCH, "attention_mask": BATCH["attention_mask"][:, 1:]}, {}, ValueError, "must have input_ids' shape"),
    ({"input_ids": torch.tensor([[5]])}, {}, ValueError, "the prompts have one column"),
    (BATCH, {"columns": 20}, ValueError, "a whole number from 1 to 19"),
    (BATCH, {"columns": 0}, ValueError, "a whole number from 1 to 19"),
    (BATCH, {"columns": 2.5}, ValueError, "a whole number from 1 to 19"),
    (BATCH, {"chunk_tokens": 0}, ValueError, "chunk_tokens=0"),
    (RIGHT, {}, ValueError, "needs left-padded prompts.*padding_side = 'left'"),
    ({**BATCH, "attention_mask": BATCH["attention_mask"] * torch.tensor([1, 0] * 10)}, {}, ValueError,
     "needs left-padded prompts"),  # holes
])
def test_bad_arguments_are_refused_before_any_forward(model, inputs, kwargs, error, message):
    forwards = []
    hook = model.register_forward_pre_hook(lambda *args: forwards.append(1))
    try:
        with pytest.raises(error, match=message):
            hfs.prefill(model, inputs, **kwargs)
    finally:
        hook.remove()
    assert not forwards
