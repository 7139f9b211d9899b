"""Batches (B > 1, hf_speculative/core/batch_loop.py): every row token for token what transformers' own batched
greedy ``generate`` writes for the same left-padded batch, and what the row writes alone.

The references are stock ``generate`` (``type(model).generate``). Float noise: transformers' left-padded batch
and our ``[B, 1 + n]`` forwards add the same real keys in different kernels; on these fp32 tiny models no
row has met a near-tie, so the comparisons are exact (no tolerance rule is needed here).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import warnings

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList

import hf_speculative as hfs
from hf_speculative.core.batch_costs import BatchCostModel, batch_costs_for, forget_batch_costs
from hf_speculative.core.batch_verify import BatchVerifier
from hf_speculative.core import kv_room
from tests.conftest import ARCHS, _plain_copy, build_model, char_tokenizer, sibling_model, stock_generate
from tests.drafters.mtp.conftest import needs_mtp  # transformers 4.x has no MtpModel: hfs.MTP refuses there

PROMPTS = [
    [3, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7],
    [3, 4, 5, 6, 7, 5, 6, 7],
    [3, 9, 10, 11, 9, 10, 11, 9, 10, 11, 12, 13, 14, 9, 10, 11, 9, 10, 11, 9],
    [4, 4],
]
BATCH_DRAFTERS = ("prompt-lookup", "prompt-lookup-adaptive", "lookup-tree", "draft-model", "draft-model-copy", "eagle",
                  "eagle-tree")


def left_padded(prompts, pad: int = 0) -> dict:
    """``input_ids`` / ``attention_mask`` ``[B, L]``, padded on the left as transformers' tokenizers do."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return {"input_ids": ids, "attention_mask": mask}


def batch_drafter(name: str, target):
    if name == "prompt-lookup":
        return hfs.PromptLookup(adaptive=False)
    if name == "prompt-lookup-adaptive":
        return hfs.PromptLookup()
    if name == "lookup-tree":
        return hfs.PromptLookup(tree=hfs.DynamicTree(nodes=8, depth=4, top_k=3), adaptive=False)
    if name == "draft-model":
        return hfs.DraftModel(sibling_model(target), adaptive=False)
    if name == "draft-model-copy":
        return hfs.DraftModel(_plain_copy(target), confidence_threshold=0.0, adaptive=False)
    if name in ("eagle", "eagle-tree"):
        from tests.conftest import random_eagle

        tree = hfs.DynamicTree(nodes=8, depth=4, top_k=3) if name == "eagle-tree" else None
        return hfs.Eagle(random_eagle(target, version=3), tree=tree, num_tokens=4, confidence_threshold=0.0,
                         adaptive=False)
    raise ValueError(name)


@pytest.fixture
def cheap_batches():
    """Fixed batch costs of a memory-bound device (GPU-like: a forward costs about the same whatever its token
    count), so that drafts pay at every batch size of these tests whatever the machine's load."""
    fixed = []

    def apply(target):
        batch_costs_for(target).fix(overhead=10.0, per_token=0.01)
        fixed.append(target)
        return target

    yield apply
    for target in fixed:
        forget_batch_costs(target)


def rows_alone(model, prompts, **kwargs) -> list[list[int]]:
    """Each prompt generated alone (no padding) by stock greedy: its new tokens."""
    return [stock_generate(model, **left_padded([p]), do_sample=False, **kwargs)[0, len(p):].tolist() for p in prompts]


def new_tokens(out, prompts, pad: int = 0, eos=None) -> list[list[int]]:
    """Each row's new tokens, without the filling after its EOS."""
    width = max(len(p) for p in prompts)
    rows = []
    for row in out[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]
        rows.append(row)
    return rows


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", BATCH_DRAFTERS)
def test_rows_equal_batched_greedy_and_alone(arch, name, cheap_batches):
    model = cheap_batches(hfs.enable(build_model(arch)))
    inputs = left_padded(PROMPTS)
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=40)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=40, candidate_generator=batch_drafter(name, model))
    stats = hfs.last_stats(model)
    assert out.tolist() == ref.tolist()
    eos = model.generation_config.eos_token_id
    assert new_tokens(out, PROMPTS, eos=eos) == rows_alone(model, PROMPTS, max_new_tokens=40)
    assert stats.drafted_tokens > 0, stats
    if name not in ("draft-model", "eagle", "eagle-tree"):  # (the sibling model, a random EAGLE: mostly wrong)
        assert stats.target_forwards < 40, stats
    if name == "draft-model-copy":
        assert stats.accepted_tokens == stats.drafted_tokens, stats


def test_rows_of_very_different_lengths(cheap_batches):
    model = cheap_batches(hfs.enable(build_model("llama", eos=None)))
    long = (PROMPTS[0] * 4)[:50]
    prompts = [[7], long, [3, 4]]
    inputs = left_padded(prompts)
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=30)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=30,
                         candidate_generator=hfs.PromptLookup(adaptive=False))
    assert out.tolist() == ref.tolist()
    assert new_tokens(out, prompts) == rows_alone(model, prompts, max_new_tokens=30)
    assert hfs.last_stats(model).accepted_tokens > 0


def _early_token(model, prompts, max_new_tokens=30):
    """A token that one row's greedy text writes early and the other rows do not write at all."""
    free = stock_generate(model, **left_padded(prompts), do_sample=False, max_new_tokens=max_new_tokens,
                          eos_token_id=None)[:, max(len(p) for p in prompts):].tolist()
    for row, text in enumerate(free):
        others = {t for i, other in enumerate(free) if i != row for t in other}
        for position, token in enumerate(text[2:12], start=2):
            if token not in others and token not in text[:position] and token != 0:
                return token, row
    raise AssertionError(f"no token of one row only in {free}")


@pytest.mark.parametrize("arch", ARCHS)
def test_a_row_hits_eos_while_others_go_on(arch, cheap_batches):
    model = cheap_batches(hfs.enable(build_model(arch)))
    token, row = _early_token(model, PROMPTS)
    inputs = left_padded(PROMPTS)
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=30, eos_token_id=token)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=30, eos_token_id=token,
                         candidate_generator=hfs.PromptLookup(adaptive=False))
    assert out.tolist() == ref.tolist()
    width = inputs["input_ids"].shape[1]
    finished = out[row, width:].tolist()
    assert token in finished
    end = finished.index(token) + 1
    assert finished[end:] == [0] * (len(finished) - end)  # filled with pad_token_id
    assert out.shape[1] > width + end  # the others went on


@pytest.mark.parametrize("arch", ARCHS)
def test_a_row_hits_a_stop_string_while_others_go_on(arch, cheap_batches):
    model = cheap_batches(hfs.enable(build_model(arch)))
    tokenizer = char_tokenizer()
    token, row = _early_token(model, PROMPTS)
    stop = tokenizer.decode([token])
    inputs = left_padded(PROMPTS)
    kwargs = dict(do_sample=False, max_new_tokens=30, stop_strings=[stop], tokenizer=tokenizer)
    ref = stock_generate(model, **inputs, **kwargs)
    out = model.generate(**inputs, **kwargs, candidate_generator=hfs.PromptLookup(adaptive=False))
    assert out.tolist() == ref.tolist()
    assert token in out[row, inputs["input_ids"].shape[1]:].tolist()


@pytest.mark.parametrize("max_new_tokens", [3, 7, 11])
def test_max_new_tokens_inside_a_draft(max_new_tokens, cheap_batches):
    """A copy of the target drafts 6 tokens that are always accepted: the length limit falls inside drafts."""
    model = cheap_batches(hfs.enable(build_model("qwen2")))
    inputs = left_padded(PROMPTS[:3])
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=max_new_tokens)
    drafter = hfs.DraftModel(_plain_copy(model), num_tokens=6, confidence_threshold=0.0, adaptive=False)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, candidate_generator=drafter)
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.accepted_tokens == stats.drafted_tokens > 0


def test_finished_rows_leave_the_batch_and_holes_are_repacked(cheap_batches, monkeypatch):
    model = cheap_batches(hfs.enable(build_model("llama")))
    token, row = _early_token(model, PROMPTS)
    sizes, compactions = [], []
    forward, compact = BatchVerifier.forward, BatchVerifier.compact

    def counting_forward(self, pending, pending_mask, trees):
        sizes.append(pending.shape[0])
        return forward(self, pending, pending_mask, trees)

    def counting_compact(self):
        compactions.append(self.slots.shape[1])
        return compact(self)

    monkeypatch.setattr(BatchVerifier, "forward", counting_forward)
    monkeypatch.setattr(BatchVerifier, "compact", counting_compact)
    inputs = left_padded([[7], *PROMPTS])  # one very short row: its left padding is a quarter of the slots
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=40, eos_token_id=token)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=40, eos_token_id=token,
                         candidate_generator=hfs.PromptLookup(adaptive=False))
    assert out.tolist() == ref.tolist()
    assert sizes[0] == 5 and min(sizes) < 5
    assert compactions


def test_seeded_sampling_per_row_is_the_plain_seeded_batch(cheap_batches):
    """Under sampling each row draws its own seeded noise (seed, row, position): the batch is the plain seeded
    batch (no drafter), whatever each drafter proposed."""
    model = cheap_batches(hfs.enable(build_model("llama")))
    inputs = left_padded(PROMPTS)
    kwargs = dict(do_sample=True, temperature=0.8, max_new_tokens=30, sampling_seed=1234)
    plain = model.generate(**inputs, **kwargs, candidate_generator=None)
    for name in ("prompt-lookup", "draft-model-copy", "lookup-tree", "eagle", "eagle-tree"):
        out = model.generate(**inputs, **kwargs, candidate_generator=batch_drafter(name, model))
        assert out.tolist() == plain.tolist()
        stats = hfs.last_stats(model)
        assert stats.drafted_tokens > 0
        if name == "draft-model-copy":  # the drafter draws with its row's noise too: the target's own draws
            assert stats.accepted_tokens == stats.drafted_tokens, stats
    assert model.generate(**inputs, **{**kwargs, "sampling_seed": 99},
                          candidate_generator=hfs.PromptLookup()).tolist() != plain.tolist()
    # the rows are not copies of one another's draws: row 0 alone is not row 0 of a batch of identical rows
    same = left_padded([PROMPTS[0]] * 3)
    out = model.generate(**same, **kwargs, candidate_generator=hfs.PromptLookup(adaptive=False))
    assert len({tuple(r) for r in out.tolist()}) > 1


def test_pipeline_with_batch_size(cheap_batches):
    from transformers import pipeline

    model = cheap_batches(hfs.enable(build_model("llama")))
    tokenizer = char_tokenizer()
    tokenizer.padding_side = "left"
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer, batch_size=3)
    texts = [tokenizer.decode(p) for p in PROMPTS] + [tokenizer.decode(PROMPTS[0][:5])]
    plain = pipe(texts, max_new_tokens=20, do_sample=False, candidate_generator=None)
    calls = []
    import hf_speculative.hf.integration as integration

    original = integration.is_batched

    def spying(inputs):
        calls.append(original(inputs))
        return calls[-1]

    integration.is_batched, saved = spying, original
    try:
        out = pipe(texts, max_new_tokens=20, do_sample=False, candidate_generator=hfs.PromptLookup(adaptive=False))
        assert out == plain
        assert any(calls)
        # the model's default drafter, from its generation config
        calls.clear()
        model.generation_config.candidate_generator = hfs.PromptLookup(adaptive=False)
        assert pipe(texts, max_new_tokens=20, do_sample=False) == plain
        assert any(calls) and hfs.last_stats(model).method == "prompt-lookup"
    finally:
        integration.is_batched = saved
        model.generation_config.candidate_generator = None


@pytest.mark.skipif(not hfs.compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE, reason="custom_generate callables: >= 4.57")
def test_custom_generate_route_batches(cheap_batches):
    model = cheap_batches(build_model("llama"))
    inputs = left_padded(PROMPTS)
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=20)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=20, custom_generate=hfs.speculative_generate,
                         candidate_generator=hfs.PromptLookup(adaptive=False))
    assert out.tolist() == ref.tolist()


# -- the cost model -------------------------------------------------------------------------------
def test_cost_model_falls_back_to_plain_decoding_at_large_batches():
    costs = BatchCostModel()
    costs.fix(overhead=10.0, per_token=1.0)  # a CPU-like device: 10 tokens' worth of fixed cost per forward
    good = 0.8
    assert costs.plan([good], [1.0], 8) > 0
    widths = [costs.plan([good] * b, [1.0] * b, 8) for b in (1, 2, 4, 8, 16, 32, 64)]
    assert widths == sorted(widths, reverse=True) and widths[0] > 0 and widths[-1] == 0, widths
    # rows that rarely draft pull the width down too
    assert costs.plan([good] * 4, [0.05] * 4, 8) < costs.plan([good] * 4, [1.0] * 4, 8)


def test_batch_of_many_rows_decodes_plainly_by_itself():
    model = hfs.enable(build_model("llama", eos=None))
    batch_costs_for(model).fix(overhead=10.0, per_token=1.0)
    try:
        many = left_padded([PROMPTS[i % 4] for i in range(32)])
        ref = stock_generate(model, **many, do_sample=False, max_new_tokens=12)
        out = model.generate(**many, do_sample=False, max_new_tokens=12, candidate_generator=hfs.PromptLookup())
        assert out.tolist() == ref.tolist()
        assert hfs.last_stats(model).drafted_tokens == 0
        few = left_padded(PROMPTS[:2])
        model.generate(**few, do_sample=False, max_new_tokens=12, candidate_generator=hfs.PromptLookup(adaptive=False))
        assert hfs.last_stats(model).drafted_tokens > 0
    finally:
        forget_batch_costs(model)


def test_cost_model_measures_and_extrapolates():
    costs = BatchCostModel()
    for batch, width, seconds in ((1, 1, 1.0), (1, 5, 1.4), (8, 1, 1.8), (8, 5, 5.0)):
        costs.observe(batch, width, seconds * 1.5)  # the first timing of a shape is often inflated
        costs.observe(batch, width, seconds)
    assert costs.measured(8, 5) and not costs.measured(16, 1)
    assert costs.ratio(1, 4) == pytest.approx(1.4) and costs.ratio(8, 4) == pytest.approx(5.0 / 1.8)
    assert costs.ratio(16, 4) > costs.ratio(8, 4)  # from the line through the measurements
    assert costs.seconds(16, 1) > costs.seconds(8, 1)
    with pytest.raises(ValueError, match=r"per_token > 0"):
        costs.fix(overhead=1.0, per_token=0.0)
    # measured on a compute-bound device (seconds grow with every token): no draft pays at B = 8, one does at B = 1
    bound = BatchCostModel()
    for batch, width in ((1, 1), (1, 3), (8, 1), (8, 3)):
        for _ in range(2):
            bound.observe(batch, width, 0.02 + 0.01 * batch * width)
    assert bound.plan([0.7] * 8, [1.0] * 8, 8) == 0
    assert bound.plan([0.7], [1.0], 8) > 0


# -- clear errors ---------------------------------------------------------------------------------
@pytest.fixture
def llama():
    return hfs.enable(build_model("llama"))


@pytest.mark.parametrize("strategy", ["early-exit", "hybrid", "raw"])
def test_other_drafters_are_refused_for_batches(llama, strategy):
    from tests.conftest import OracleCandidateGenerator

    drafter = {"early-exit": lambda: hfs.EarlyExit(exit_layer=1),
               "hybrid": lambda: hfs.Hybrid(hfs.PromptLookup(), hfs.PromptLookup(max_ngram=2)),
               "raw": lambda: OracleCandidateGenerator([1, 2, 3])}[strategy]()
    with pytest.raises(ValueError, match=r"Batched speculative decoding \(batch size > 1\) supports .*hfs.PromptLookup"):
        llama.generate(**left_padded(PROMPTS[:2]), max_new_tokens=4, candidate_generator=drafter)


def test_medusa_is_refused_for_batches(llama):
    from tests.drafters.medusa.conftest import random_heads

    with pytest.raises(ValueError, match=r"and hfs.Eagle\(...\), not 'medusa"):
        llama.generate(**left_padded(PROMPTS[:2]), max_new_tokens=4, candidate_generator=hfs.Medusa(random_heads(llama)))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["eagle", "eagle-tree"])
def test_each_eagle_row_reads_its_own_rows_states(arch, name, cheap_batches, monkeypatch):
    """Every row's EAGLE drafter is fed, position for position, the target states of its own row decoded alone (no
    padding, no other row, none of the nodes it did not keep): what it drafts is what it would draft alone."""
    from hf_speculative.drafters.eagle.drafter import EagleCandidateGenerator
    from hf_speculative.core.features import tapped_features

    model = cheap_batches(hfs.enable(build_model(arch)))
    fed = []
    catch_up = EagleCandidateGenerator._catch_up

    def recording(self, input_ids, **options):
        fed.append((input_ids.clone(), self.n_true, self.features.pending.clone()))
        return catch_up(self, input_ids, **options)

    monkeypatch.setattr(EagleCandidateGenerator, "_catch_up", recording)
    strategy = batch_drafter(name, model)
    model.generate(**left_padded(PROMPTS), do_sample=False, max_new_tokens=30, candidate_generator=strategy)
    assert len(fed) > len(PROMPTS) * 3 and {ids[0, 0].item() for ids, _, _ in fed} >= {3, 4}  # all rows drafted
    layers = strategy.drafter.config.target_layers
    for ids, start, pending in fed:
        alone = tapped_features(model, layers, ids)  # [1, L, F]: the row's text, no padding, no cache
        assert pending.shape[1] == ids.shape[1] - 1 - start
        torch.testing.assert_close(pending, alone[:, start: ids.shape[1] - 1], atol=1e-4, rtol=1e-4)


def test_batches_leave_the_one_row_verify_costs_alone(cheap_batches):
    """A row's drafter would time the whole batch's forward: those timings must not enter the target's shared
    one-row cost model, which B = 1 calls decide by (a row's own stats count no target forward, so its drafter
    never takes a forward for a measured verification)."""
    from hf_speculative.core.costs import verify_costs_for

    model = cheap_batches(hfs.enable(build_model("llama")))
    shared = verify_costs_for(model, hfs.PromptLookup().longest_chain())  # the cost model prompt lookup learns in
    before = (list(shared._seconds), list(shared._timings))
    model.generate(**left_padded(PROMPTS), do_sample=False, max_new_tokens=20, candidate_generator=hfs.PromptLookup())
    assert hfs.last_stats(model).drafted_tokens > 0
    assert (shared._seconds, shared._timings) == before
    one = left_padded(PROMPTS[:1])
    model.generate(**one, do_sample=False, max_new_tokens=20, candidate_generator=hfs.PromptLookup())
    assert shared._timings != before[1]  # one-row calls still measure


def test_a_refused_default_says_where_it_comes_from(llama):
    with pytest.raises(ValueError, match=r"supports .*hfs.PromptLookup.*the GenerationConfig passed to generate\(\)"):
        llama.generate(**left_padded(PROMPTS[:2]),
                       generation_config=GenerationConfig(max_new_tokens=4,
                                                          candidate_generator=hfs.EarlyExit(exit_layer=1)))


def test_right_padding_is_refused(llama):
    ids = torch.tensor([[3, 5, 6, 0], [3, 5, 6, 7]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match=r"needs left-padded prompts.*padding_side = 'left'"):
        llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, candidate_generator=hfs.PromptLookup())


def test_a_static_cache_is_refused_for_batches(llama):
    inputs = left_padded(PROMPTS[:2])
    with pytest.raises(ValueError, match=r"runs on the dynamic cache: drop cache_implementation='static'"):
        llama.generate(**inputs, max_new_tokens=4, cache_implementation="static",
                       candidate_generator=hfs.PromptLookup())
    out = llama.generate(**inputs, max_new_tokens=4, return_dict_in_generate=True,
                         candidate_generator=hfs.PromptLookup())
    assert out.sequences.shape == (2, inputs["input_ids"].shape[1] + 4) and out.scores is None


def prefilled_cache(model, inputs: dict, columns: int):
    """A ``DynamicCache`` of the left-padded prompts' first ``columns``, as transformers' batched ``generate`` fills
    it (positions from the padding mask)."""
    from transformers import DynamicCache

    from hf_speculative import compat

    cache = DynamicCache()
    mask = inputs["attention_mask"][:, :columns]
    with torch.no_grad():
        model(input_ids=inputs["input_ids"][:, :columns], attention_mask=mask,
              position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True, **{compat.cache_kwarg(): cache})
    return cache


def prefix_drafter(name: str, target):
    """:func:`batch_drafter`, and the other drafters that take batches (MagicDec: its own tests)."""
    if name == "dflash":
        from hf_speculative.drafters.dflash.drafter import random_network

        return hfs.DFlash(random_network(target), num_tokens=4, confidence_threshold=0.0, adaptive=False)
    if name == "mtp":
        from hf_speculative.drafters.mtp.modules import random_modules

        return hfs.MTP(random_modules(target, 2, scale=0.3), num_tokens=3, confidence_threshold=0.0, adaptive=False)
    return batch_drafter(name, target)


@pytest.mark.parametrize("columns", [3, 13])  # inside one row's padding; all but the last column
@pytest.mark.parametrize("name", [*BATCH_DRAFTERS, "dflash", pytest.param("mtp", marks=needs_mtp)])
def test_a_cache_holding_the_prompts_start_is_read_not_filled(name, columns, cheap_batches):
    """A cache the caller passes holding the left-padded prompts' first columns: the batch starts from it (the first
    forward runs the columns after them), every row is batched greedy's, and the cache is left as it was, so that
    the next call starts from it too (one prefill of a shared context, several calls)."""
    from hf_speculative import compat

    model = cheap_batches(hfs.enable(build_model("llama")))
    inputs = left_padded(PROMPTS[:3])  # widths 14, 8 and 20: rows 0 and 1 padded
    ref = stock_generate(model, **inputs, max_new_tokens=10, do_sample=False, pad_token_id=0)
    cache = prefilled_cache(model, inputs, columns)
    before = [t.clone() for t in compat.cache_tensors(cache)]
    widths = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                           with_kwargs=True)
    try:
        for _ in range(2):
            out = model.generate(**inputs, max_new_tokens=10, do_sample=False, pad_token_id=0,
                                 candidate_generator=prefix_drafter(name, model), **{compat.cache_kwarg(): cache})
            assert out.tolist() == ref.tolist()
            assert widths[0] == inputs["input_ids"].shape[1] - columns  # the prompts' columns after the cache's
            widths.clear()
    finally:
        hook.remove()
    assert all(torch.equal(a, b) for a, b in zip(compat.cache_tensors(cache), before))
    assert kv_cache_length(cache) == columns
    # EAGLE, DFlash and MTP read the target's states of every token they draft after, and the cache's tokens had
    # their forward before the call: rows whose real tokens it held draft nothing (exact all the same), others go on
    assert hfs.last_stats(model).drafted_tokens > 0 or (name in ("eagle", "eagle-tree", "dflash", "mtp")
                                                        and columns > 12)


def kv_cache_length(cache) -> int:
    from hf_speculative.core import kv_cache

    return kv_cache.cache_length(cache)


def test_an_empty_cache_passed_with_a_batch_is_not_filled_and_said_so(llama):
    from transformers import DynamicCache

    from hf_speculative import compat

    inputs = left_padded(PROMPTS[:2])
    ref = stock_generate(llama, **inputs, max_new_tokens=6, do_sample=False, pad_token_id=0)
    cache = DynamicCache()
    with pytest.warns(UserWarning, match=r"An empty cache passed to generate\(\) with a batch of 2 rows is not "
                                         r"filled: .*Pass no cache with a batch, or generate one prompt at a time"):
        out = llama.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=0,
                             candidate_generator=hfs.PromptLookup(), **{compat.cache_kwarg(): cache})
    assert out.tolist() == ref.tolist() and kv_cache_length(cache) == 0
    with warnings.catch_warnings():  # the controls: no cache, or a prefilled one, no warning
        warnings.simplefilter("error")
        llama.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=0,
                       candidate_generator=hfs.PromptLookup())
        llama.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=0,
                       candidate_generator=hfs.PromptLookup(),
                       **{compat.cache_kwarg(): prefilled_cache(llama, inputs, 4)})


def test_a_cache_the_batch_cannot_start_from_is_refused_naming_the_fix(llama):
    from transformers import DynamicCache

    from hf_speculative import compat

    inputs = left_padded(PROMPTS[:2])
    width = inputs["input_ids"].shape[1]
    kw = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0, "candidate_generator": hfs.PromptLookup()}
    with pytest.raises(ValueError, match=rf"already holds {width} tokens, as many as the prompts' {width} columns "
                                         r".*pass a cache of the prompts' first columns at most"):
        llama.generate(**inputs, **kw, **{compat.cache_kwarg(): prefilled_cache(llama, inputs, width)})
    other = prefilled_cache(llama, left_padded(PROMPTS[:3]), 4)  # three rows for a batch of two
    with pytest.raises(ValueError, match=r"holds \(3, .*\) in layer 0, not the batch's 2 rows of the prompts' first 4 "
                                         r"columns: prefill it with the same left-padded input_ids\[:, :4\]"):
        llama.generate(**inputs, **kw, **{compat.cache_kwarg(): other})
    gemma = build_model("gemma3")  # two sliding-window layers: a cache built from its config drops old positions
    cache = DynamicCache(config=gemma.config)
    with torch.no_grad():
        gemma(input_ids=inputs["input_ids"][:, :5], attention_mask=inputs["attention_mask"][:, :5], use_cache=True,
              **{compat.cache_kwarg(): cache})
    with pytest.raises(ValueError, match=r"has 2 sliding-window layers, which drop old positions; .*prefill a "
                                         r"DynamicCache\(\) made without the model's config"):
        llama.generate(**inputs, **kw, **{compat.cache_kwarg(): cache})


class Recording:
    """A streamer that keeps what it is given (transformers' TextStreamer refuses batches itself)."""

    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("stop", ["eos", "length"])
@pytest.mark.parametrize("name", ["prompt-lookup", "draft-model-copy"])
def test_streamers_get_what_batched_greedy_gives_them(arch, stop, name, cheap_batches, monkeypatch):
    """The prompt, then one column of B tokens per position (finished rows: pad_token_id), then end(): the very
    calls transformers' batched greedy makes, though rows accept several tokens per forward."""
    model = cheap_batches(hfs.enable(build_model(arch)))
    inputs = left_padded(PROMPTS)
    kwargs = dict(do_sample=False, max_new_tokens=30, pad_token_id=0)
    if stop == "eos":
        kwargs["eos_token_id"] = _early_token(model, PROMPTS)[0]
    expected, got = Recording(), Recording()
    ref = stock_generate(model, **inputs, **kwargs, streamer=expected)
    forwards, at = [], []
    original = BatchVerifier.forward
    monkeypatch.setattr(BatchVerifier, "forward", lambda self, *a: forwards.append(1) or original(self, *a))
    monkeypatch.setattr(got, "put", lambda value: (at.append(len(forwards)), got.puts.append(value.tolist())))
    out = model.generate(**inputs, **kwargs, streamer=got, candidate_generator=batch_drafter(name, model))
    assert out.tolist() == ref.tolist()
    assert hfs.last_stats(model).accepted_tokens > 0
    assert got.puts == expected.puts and got.ended == expected.ended == 1
    assert len(got.puts) == 1 + out.shape[1] - inputs["input_ids"].shape[1]
    assert at[1] <= 2 and at[len(at) // 2] < len(forwards)  # streamed as they come, not at the end


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["prompt-lookup", "draft-model-copy"])
def test_scores_and_logits_are_batched_greedy_s(arch, name, cheap_batches):
    """output_scores / output_logits: per new position a [B, V] tensor equal to transformers' batched greedy's
    (float noise aside) while the row runs; -inf once it has finished (transformers computes rows it then throws
    away). compute_transition_scores works on them."""
    model = cheap_batches(hfs.enable(build_model(arch)))
    token, row = _early_token(model, PROMPTS)
    inputs = left_padded(PROMPTS)
    kwargs = dict(do_sample=False, max_new_tokens=30, pad_token_id=0, eos_token_id=token, return_dict_in_generate=True,
                  output_scores=True, output_logits=True, repetition_penalty=1.3)
    ref = stock_generate(model, **inputs, **kwargs)
    out = model.generate(**inputs, **kwargs, candidate_generator=batch_drafter(name, model))
    assert out.sequences.tolist() == ref.sequences.tolist()
    if name == "draft-model-copy":  # (several tokens a forward)
        assert hfs.last_stats(model).accepted_tokens > 10
    width = inputs["input_ids"].shape[1]
    assert len(out.scores) == len(out.logits) == len(ref.scores) == out.sequences.shape[1] - width
    new = out.sequences[:, width:]
    for t in range(len(out.scores)):
        for b in range(len(PROMPTS)):
            running = token not in new[b, :t].tolist()  # the row's EOS came after position t (or at it)
            if running:
                torch.testing.assert_close(out.scores[t][b], ref.scores[t][b], atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(out.logits[t][b], ref.logits[t][b], atol=1e-4, rtol=1e-4)
            else:
                assert torch.isinf(out.scores[t][b]).all() and torch.isinf(out.logits[t][b]).all()
    assert any(token not in r for r in new.tolist()) and token in new[row].tolist()  # one row stopped early
    transition = model.compute_transition_scores(out.sequences, out.scores)  # [B, new]
    expected = model.compute_transition_scores(ref.sequences, ref.scores)
    live = new != 0
    torch.testing.assert_close(transition[live], expected[live], atol=1e-4, rtol=1e-4)


def test_logits_processors_see_the_padded_rows(cheap_batches):
    """A repetition penalty reads each row as transformers' batch does (its padding included)."""
    model = cheap_batches(hfs.enable(build_model("gemma3")))
    inputs = left_padded(PROMPTS)
    kwargs = dict(do_sample=False, max_new_tokens=25, repetition_penalty=1.3, no_repeat_ngram_size=4)
    ref = stock_generate(model, **inputs, **kwargs)
    out = model.generate(**inputs, **kwargs, candidate_generator=hfs.PromptLookup(adaptive=False),
                         logits_processor=LogitsProcessorList())
    assert out.tolist() == ref.tolist()


# -- the real model --------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
def test_real_model_batch(integration, request):
    model, shared = integration
    hfs.enable(model)
    tokenizer = copy.deepcopy(shared)  # (the session's tokenizer stays as other tests expect it)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # (smollm2's tokenizer on transformers 4.x has none)
        tokenizer.pad_token = tokenizer.eos_token
    texts = ["Summarize: the cat sat on the mat. The cat sat on the mat because the mat was warm.",
             "def add(a, b):\n    return a + b\n\ndef sub(a, b):",
             "Translate to French: good morning",
             "List three colors."]
    messages = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                              add_generation_prompt=True) for t in texts]
    inputs = tokenizer(messages, return_tensors="pt", padding=True)
    kwargs = dict(do_sample=False, max_new_tokens=48, pad_token_id=tokenizer.pad_token_id)
    ref = stock_generate(model, **inputs, **kwargs)
    batch_costs_for(model).fix(overhead=10.0, per_token=0.01)  # every step drafts the drafter's whole width
    request.addfinalizer(lambda: forget_batch_costs(model))
    eagle = hfs.Eagle.from_pretrained("smollm2-135m-instruct", target=model)
    for drafter in (hfs.PromptLookup(), hfs.PromptLookup(tree=hfs.DynamicTree(nodes=8, depth=4)),
                    dataclasses.replace(eagle, adaptive=False),
                    dataclasses.replace(eagle, tree=hfs.DynamicTree(nodes=16, depth=5, top_k=4), adaptive=False)):
        out = model.generate(**inputs, **kwargs, candidate_generator=drafter)
        assert out.tolist() == ref.tolist()
        if isinstance(drafter, hfs.Eagle) and drafter.tree is not None:
            # each row's drafter, fed its own row's states, keeps what it keeps alone (chains read them alike)
            batched = hfs.last_stats(model).accepted_tokens
            alone = 0
            for message in messages:
                model.generate(**tokenizer([message], return_tensors="pt"), **kwargs, candidate_generator=drafter)
                alone += hfs.last_stats(model).accepted_tokens
            assert alone > 20 and batched >= 0.8 * alone, (batched, alone)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["eagle", "prompt-lookup"])
def test_the_prompts_prefill_under_the_models_own_masks(arch, name, cheap_batches, monkeypatch):
    """The first forward carries no draft nodes, even where prompt lookup finds matches in these prompts, and takes
    the 2-D padding mask, from which the model builds its own masks as transformers' batched greedy prefills (our 4-D
    mask forced SDPA's masked path, 25% slower at 4 rows of 2,048 tokens); every later forward takes our 4-D masks of
    holes and trees, and the drafter drafts there. The rows stay batched greedy's."""
    model = cheap_batches(hfs.enable(build_model(arch)))
    inputs = left_padded(PROMPTS)
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=24)
    masks = []
    original = type(model).forward

    def recording(self, *args, **kwargs):
        mask = kwargs.get("attention_mask")
        masks.append(None if mask is None else next(iter(mask.values())).dim() if isinstance(mask, dict) else mask.dim())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", recording)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=24, candidate_generator=batch_drafter(name, model))
    monkeypatch.undo()
    assert out.tolist() == ref.tolist()
    assert masks[0] == 2 and set(masks[1:]) == {4}, masks
    assert hfs.last_stats(model).drafted_tokens > 0


@pytest.mark.parametrize("name", ["prompt-lookup", "eagle"])
def test_later_forwards_write_the_cache_in_place(name, cheap_batches, monkeypatch):
    """After the prefill, every forward writes its slots into room the cache's layers keep (kv_room), instead of
    transformers' ``torch.cat`` of the whole cache: the keys' storage stays put from step to step except when the room
    fills or the rows' holes are re-packed, and the rows stay batched greedy's."""
    monkeypatch.setattr(kv_room, "COPY_BELOW_BYTES", 0)  # the tiny model's cache would be appended by copying
    model = cheap_batches(hfs.enable(build_model("llama")))
    inputs = left_padded(PROMPTS)
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=40)
    stores, forward = [], BatchVerifier.forward

    def recording(self, pending, pending_mask, trees):
        logits = forward(self, pending, pending_mask, trees)
        layer = self.cache.layers[0]
        stores.append((type(layer).__name__, layer.keys.untyped_storage().data_ptr()))
        return logits

    monkeypatch.setattr(BatchVerifier, "forward", recording)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=40, candidate_generator=batch_drafter(name, model))
    monkeypatch.undo()
    assert out.tolist() == ref.tolist()
    assert len(stores) > 4 and {kind for kind, _ in stores} == {"RoomyDynamicLayer"}, stores
    moved = sum(a != b for (_, a), (_, b) in itertools.pairwise(stores[1:]))
    # the first write after the prefill makes the room; then only a full room or a re-pack of holes moves it
    assert moved * 4 <= len(stores), stores
