"""``hfs.MagicDec`` on batches: ragged, left-padded rows are token for token transformers' batched greedy (and each
row alone), every row's compressed cache stays the target's own keys and values after every step while rows finish
and leave, and the rows draft together: one forward of the target per draft step for all of them."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core.batch_costs import batch_costs_for
from hf_speculative.drafters.magicdec.group import DraftGroup
from tests.conftest import build_model, stock_generate
from tests.core.test_batch import PROMPTS, _early_token, left_padded, new_tokens, rows_alone
from tests.drafters.magicdec.conftest import CheckedMagicDec, context_free_model, evicting

# ragged rows: one shorter than the cache (it drafts once its text outgrows it), one long, one very short
RAGGED = [PROMPTS[0], PROMPTS[1], PROMPTS[2], [4, 4], (PROMPTS[2] * 3)[:45]]


def cheap(model, magicdec_costs):
    """Fixed batch costs of a memory-bound device, so that the loop's batch width lets drafts through whatever the
    machine's load (core/rows.py's BatchWidth)."""
    batch_costs_for(model).fix(overhead=10.0, per_token=0.01)
    magicdec_costs(model)
    return model


@pytest.fixture
def count_draft_forwards(monkeypatch):
    """The rows drafting in each draft forward of the call."""
    sizes = []
    forward = DraftGroup._forward

    def counting(self, tokens, positions, mask, cache):
        sizes.append(tokens.shape[0])
        return forward(self, tokens, positions, mask, cache)

    monkeypatch.setattr(DraftGroup, "_forward", counting)
    return sizes


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rows_equal_batched_greedy_and_alone(arch, magicdec_costs, count_draft_forwards):
    model = cheap(hfs.enable(build_model(arch, max_positions=512)), magicdec_costs)
    inputs = left_padded(RAGGED)
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=30)
    strategy = CheckedMagicDec(window=6, sinks=2, num_tokens=4, confidence_threshold=0.0, adaptive=False)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=30, candidate_generator=strategy)
    assert out.tolist() == ref.tolist()
    eos = model.generation_config.eos_token_id
    assert new_tokens(out, RAGGED, eos=eos) == rows_alone(model, RAGGED, max_new_tokens=30)
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0 and stats.target_forwards < 30, stats
    assert strategy.checked  # every row's cache was compared with the target's own after every step
    # the rows drafted together: one forward of several rows per draft step, never one per row
    assert max(count_draft_forwards) > 1
    assert len(count_draft_forwards) <= 4 * stats.target_forwards


@pytest.mark.parametrize("columns", [10, 44])  # inside the shorter rows' padding; all but the last column
def test_a_cache_holding_the_prompts_start_fills_the_compressed_caches(columns, magicdec_costs):
    """A cache passed with the batch holding the prompts' first columns (one prefill of a long shared context, many
    calls): each row's compressed cache starts from the keys and values it holds (the row's real columns of it), so
    the rows draft from the first step, every check of the compressed caches against the target's own passes, and
    the text is batched greedy's."""
    from hf_speculative import compat
    from tests.core.test_batch import prefilled_cache

    model = cheap(hfs.enable(build_model("llama", max_positions=512)), magicdec_costs)
    inputs = left_padded(RAGGED)
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=30)
    cache = prefilled_cache(model, inputs, columns)
    strategy = CheckedMagicDec(window=6, sinks=2, num_tokens=4, confidence_threshold=0.0, adaptive=False)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=30, candidate_generator=strategy,
                         **{compat.cache_kwarg(): cache})
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0 and "stopped" not in stats.extra["magicdec"], stats
    assert min(strategy.checked) == min(len(p) for p in RAGGED) + 1  # from the first step on, every row


def test_a_row_that_finishes_leaves_its_group(magicdec_costs):
    model = cheap(hfs.enable(build_model("llama")), magicdec_costs)
    token, row = _early_token(model, PROMPTS)
    inputs = left_padded(PROMPTS)
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=30, eos_token_id=token)
    strategy = CheckedMagicDec(window=4, sinks=2, confidence_threshold=0.0, adaptive=False)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=30, eos_token_id=token,
                         candidate_generator=strategy)
    assert out.tolist() == ref.tolist()
    width = inputs["input_ids"].shape[1]
    finished = out[row, width:].tolist()
    assert token in finished and out.shape[1] > width + finished.index(token) + 1  # the others went on
    assert hfs.last_stats(model).drafted_tokens > 0


@pytest.mark.parametrize("max_new_tokens", [3, 7, 11])
def test_max_new_tokens_inside_accepted_drafts(max_new_tokens, magicdec_costs):
    model = cheap(hfs.enable(context_free_model("qwen2")), magicdec_costs)
    inputs = left_padded(PROMPTS[:3])
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=max_new_tokens)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, candidate_generator=evicting())
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(model)
    assert stats.accepted_tokens == stats.drafted_tokens > 0


def test_seeded_sampling_is_the_plain_seeded_batch(magicdec_costs):
    model = cheap(hfs.enable(build_model("llama", init=0.3)), magicdec_costs)
    inputs = left_padded(PROMPTS)
    kwargs = dict(do_sample=True, temperature=0.8, max_new_tokens=30, sampling_seed=1234)
    plain = model.generate(**inputs, **kwargs, candidate_generator=None)
    out = model.generate(**inputs, **kwargs, candidate_generator=evicting())
    assert out.tolist() == plain.tolist()
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0


def test_rejection_sampling_in_a_batch_runs_and_keeps_the_rows_shapes(magicdec_costs):
    """Under the rejection rule the text depends on the drafts (its distribution is the target's: the chi-square
    tests): here, a batch runs through it with drafts made and rows of the right lengths."""
    model = cheap(hfs.enable(build_model("llama", init=0.3, eos=None)), magicdec_costs)
    inputs = left_padded(PROMPTS)
    torch.manual_seed(3)
    out = model.generate(**inputs, do_sample=True, max_new_tokens=20, speculative_sampling="rejection",
                         candidate_generator=evicting())
    assert out.shape == (len(PROMPTS), inputs["input_ids"].shape[1] + 20)
    assert hfs.last_stats(model).drafted_tokens > 0


def test_calls_on_several_threads_keep_to_their_own_rows(magicdec_costs):
    """Two threads generate on one model at once (a batch and a single row): each call's rows form their own group,
    its hooks read its own thread's forwards, and each gets its greedy text."""
    import threading

    model = cheap(hfs.enable(build_model("qwen2")), magicdec_costs)
    batch, single = left_padded(PROMPTS), left_padded([PROMPTS[2]])
    expected = [stock_generate(model, **inputs, do_sample=False, max_new_tokens=30) for inputs in (batch, single)]
    strategy, results, errors = evicting(), [[], []], []

    def generate(i, inputs):
        try:
            for _ in range(3):
                out = model.generate(**inputs, do_sample=False, max_new_tokens=30, candidate_generator=strategy)
                results[i].append(out.tolist() == expected[i].tolist())
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=generate, args=(i, inputs)) for i, inputs in enumerate((batch, single))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and results == [[True] * 3, [True] * 3]


def test_a_batch_reports_its_compressed_cache_in_the_call_stats(magicdec_costs):
    """The rows' drafter details reach ``hfs.last_stats(model).extra`` (the loop gives the rows the call's dict)."""
    model = cheap(hfs.enable(build_model("llama", max_positions=512)), magicdec_costs)
    strategy = hfs.MagicDec(window=6, sinks=2, num_tokens=4, confidence_threshold=0.0, adaptive=False)
    model.generate(**left_padded(RAGGED), do_sample=False, max_new_tokens=12, candidate_generator=strategy)
    assert "magicdec" in hfs.last_stats(model).extra


def test_tap_ignores_a_forward_of_another_thread_that_sees_its_hooks_without_kwargs():
    """torch adds a hook, then marks it as taking kwargs: a forward on another thread in between calls it as
    ``hook(module, args)`` / ``hook(module, args, output)`` (the CI failure of the test above). The tap's hooks take
    that and record nothing for the other thread."""
    import threading

    from hf_speculative.drafters.magicdec.kv_tap import ForwardTap

    model, seen, errors = build_model("qwen2"), [], []
    tap = ForwardTap(model, seen.append)
    ids = torch.tensor([[1, 2, 3]])

    def other_thread():
        try:
            tap._before(model, (ids,))
            tap._after(model, (ids,), object())
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    try:
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert not errors and not seen
        model(input_ids=ids)  # this thread's forward goes through the registered hooks, with kwargs
        assert len(seen) == 1 and (seen[0].batch, seen[0].width) == (1, 3)
    finally:
        tap.remove()
