"""Hostile or careless ``generate()`` calls (issue 67): refused at least as strictly as stock transformers refuses them,
before any forward where the call itself is wrong, with a message that names the fix; silent no-ops warned about.

What stock transformers (4.57.6 and 5.x alike) does with each, on a plain ``model.generate``:

- ``input_ids`` of float, int8, int16, uint8 or bool dtype: a ``RuntimeError`` from the embedding ("Expected tensor for
  argument #1 'indices' to have one of the following scalar types: Long, Int"); int32 works. Prompt lookup copied
  such ids into its drafts before that forward, so ours decoded them (a float tensor of "tokens" came back).
- an ``attention_mask`` of another shape than ``input_ids``: a shape error from inside the forward, or none at all
  (a longer one passes); ours ignored it.
- sampling where the processed scores hold a NaN or +inf, or are all -inf: ``torch.multinomial`` raises ("probability
  tensor contains either inf, nan or element < 0"); ours emitted token 0 under the seeded rule.

Every refusal below must come within ``BUDGET_S``; the inputs' own size must not matter (a meta tensor, which holds no
data and refuses every read of it, stands for a huge one).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

import hf_speculative as hfs
from hf_speculative import compat
from hf_speculative.core.accept import accept_greedy, accept_rejection
from hf_speculative.core.call import Call
from hf_speculative.core.chain_drafting import draft_chain
from hf_speculative.core.rows import RowSampler
from hf_speculative.core.sampling import RejectionSampler, SeededSampler
from hf_speculative.core.tree import DraftTree
from tests.conftest import PROMPT, AdversaryStrategy, build_model, prompt_inputs, sibling_model, stock_generate

BUDGET_S = 1.0  # seconds a refusal may take (as the hostile-folder battery's)
NEW = 8
GREEDY = {"do_sample": False, "max_new_tokens": NEW}
DTYPE_FIX = r"dtype torch\.long .*input_ids\.long\(\)"
MASK_FIX = r"attention_mask has shape .* the same \[batch, length\]"
NOTHING_TO_DRAW = r"Sampling found nothing to draw from: .*temperature=.*logits_processor="

needs_custom_generate = pytest.mark.skipif(
    not compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE,
    reason=f"custom_generate=<callable> needs transformers >= 4.57 ({compat.TRANSFORMERS_VERSION})",
)


@pytest.fixture(scope="module")
def target():
    return hfs.enable(build_model("llama"))


@pytest.fixture(params=["prompt-lookup", "draft-model"])
def drafter(request, target):
    if request.param == "prompt-lookup":
        return hfs.PromptLookup(adaptive=False)
    return hfs.DraftModel(sibling_model(target), adaptive=False)


def batch_inputs() -> dict:
    ids = torch.tensor([PROMPT, PROMPT[::-1]])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def refused(call, error, match):
    start = time.perf_counter()
    with pytest.raises(error, match=match):
        call()
    assert time.perf_counter() - start < BUDGET_S


def ours(caught) -> list[str]:
    """The messages of hf_speculative's warnings among ``caught``."""
    texts = [str(w.message) for w in caught]
    return [t for t in texts if "sampling_seed=" in t or "transformers' own assistant" in t or "streamer=" in t]


class Fill(LogitsProcessor):
    """Replaces every score with ``value``: nothing left to sample from (NaN; -inf: every probability zero)."""

    def __init__(self, value: float, column: int | None = None):
        self.value, self.column = value, column

    def __call__(self, input_ids, scores):
        if self.column is None:
            return torch.full_like(scores, self.value)
        scores = scores.clone()
        scores[:, self.column] = self.value
        return scores


# -- input_ids and attention_mask: refused at the entry, before any forward ----------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8, torch.int16, torch.uint8, torch.bool])
def test_input_ids_of_a_dtype_that_is_not_token_ids(target, drafter, dtype):
    inputs = prompt_inputs()
    refused(lambda: target.generate(input_ids=inputs["input_ids"].to(dtype), attention_mask=inputs["attention_mask"],
                                    candidate_generator=drafter, **GREEDY), ValueError, DTYPE_FIX)


def test_input_ids_of_a_float_dtype_in_a_batch(target):
    inputs = batch_inputs()
    refused(lambda: target.generate(input_ids=inputs["input_ids"].float(), attention_mask=inputs["attention_mask"],
                                    candidate_generator=hfs.PromptLookup(), **GREEDY), ValueError, DTYPE_FIX)


@pytest.mark.parametrize("shape", ["shorter", "longer", "other rows", "1-D"])
def test_attention_mask_of_another_shape(target, drafter, shape):
    ids = prompt_inputs()["input_ids"]
    mask = {"shorter": torch.ones(1, ids.shape[1] - 2), "longer": torch.ones(1, ids.shape[1] + 3),
            "other rows": torch.ones(2, ids.shape[1]), "1-D": torch.ones(ids.shape[1])}[shape].long()
    refused(lambda: target.generate(input_ids=ids, attention_mask=mask, candidate_generator=drafter, **GREEDY),
            ValueError, MASK_FIX)


@pytest.mark.parametrize("mask_rows", [1, 3])
def test_attention_mask_of_another_shape_in_a_batch(target, mask_rows):
    ids = batch_inputs()["input_ids"]
    mask = torch.ones(mask_rows, ids.shape[1], dtype=torch.long)
    refused(lambda: target.generate(input_ids=ids, attention_mask=mask, candidate_generator=hfs.PromptLookup(),
                                    **GREEDY), ValueError, MASK_FIX)


@pytest.mark.parametrize("rows", [1, 2])
def test_huge_inputs_are_refused_without_reading_them(target, rows):
    """Tensors on the meta device have a shape and a dtype and no data: any read of them raises, so the refusals read
    neither, whatever the inputs' size."""
    huge = torch.empty(rows, 10**9, dtype=torch.float32, device="meta")
    refused(lambda: target.generate(input_ids=huge, candidate_generator=hfs.PromptLookup(), **GREEDY),
            ValueError, DTYPE_FIX)
    ids = torch.tensor([PROMPT] * rows)
    mask = torch.empty(rows, 10**9, dtype=torch.long, device="meta")
    refused(lambda: target.generate(input_ids=ids, attention_mask=mask, candidate_generator=hfs.PromptLookup(),
                                    **GREEDY), ValueError, MASK_FIX)


@needs_custom_generate
@pytest.mark.parametrize("case", ["float ids", "int8 ids", "shorter mask", "longer mask"])
def test_inputs_refused_under_custom_generate(case):
    model = build_model("llama")
    ids = prompt_inputs()["input_ids"]
    mask = torch.ones_like(ids)
    if case.endswith("ids"):
        ids = ids.to(torch.float32 if case == "float ids" else torch.int8)
    else:
        mask = torch.ones(1, ids.shape[1] + (-2 if case == "shorter mask" else 3), dtype=torch.long)
    refused(lambda: model.generate(input_ids=ids, attention_mask=mask, custom_generate=hfs.speculative_generate,
                                   candidate_generator=hfs.PromptLookup(), **GREEDY),
            ValueError, DTYPE_FIX if case.endswith("ids") else MASK_FIX)


def test_valid_inputs_still_decode_as_plain_greedy(target):
    """The negative control: int32 ids, a mask of the ids' shape, a left-padded batch: what stock greedy writes."""
    inputs = prompt_inputs()
    ref = stock_generate(target, **inputs, **GREEDY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        as_int32 = target.generate(input_ids=inputs["input_ids"].int(), attention_mask=inputs["attention_mask"],
                                   candidate_generator=hfs.PromptLookup(adaptive=False), **GREEDY)
        with_mask = target.generate(**inputs, candidate_generator=hfs.PromptLookup(adaptive=False), **GREEDY)
        ids = torch.tensor([PROMPT, [0, 0, *PROMPT[2:]]])
        mask = torch.ones_like(ids)
        mask[1, :2] = 0
        batch = target.generate(input_ids=ids, attention_mask=mask, candidate_generator=hfs.PromptLookup(), **GREEDY)
    assert as_int32.tolist() == ref.tolist() == with_mask.tolist()
    assert batch.tolist() == stock_generate(target, input_ids=ids, attention_mask=mask, **GREEDY).tolist()
    assert not ours(caught)


# -- sampling with nothing to draw from ------------------------------------------------------------------------------
@pytest.mark.parametrize("scores", ["-inf", "nan", "one nan", "one +inf"])
@pytest.mark.parametrize("rule", ["seeded", "rejection"])
def test_sampling_with_nothing_to_draw_from(target, drafter, scores, rule):
    """Stock sampling raises (torch.multinomial); ours emitted token 0 under the seeded rule."""
    processor = {"-inf": Fill(float("-inf")), "nan": Fill(float("nan")), "one nan": Fill(float("nan"), column=5),
                 "one +inf": Fill(float("inf"), column=5)}[scores]
    with pytest.raises(RuntimeError, match="probability tensor contains"):
        stock_generate(target, **prompt_inputs(), do_sample=True, max_new_tokens=NEW,
                       logits_processor=LogitsProcessorList([processor]))
    refused(lambda: target.generate(**prompt_inputs(), do_sample=True, max_new_tokens=NEW, candidate_generator=drafter,
                                    logits_processor=LogitsProcessorList([processor]), speculative_sampling=rule),
            RuntimeError, NOTHING_TO_DRAW)


@pytest.mark.parametrize("rule", ["seeded", "rejection"])
def test_sampling_with_nothing_to_draw_from_in_a_batch(target, rule):
    refused(lambda: target.generate(**batch_inputs(), do_sample=True, max_new_tokens=NEW,
                                    candidate_generator=hfs.PromptLookup(), speculative_sampling=rule,
                                    logits_processor=LogitsProcessorList([Fill(float("-inf"))])),
            RuntimeError, NOTHING_TO_DRAW)


@pytest.mark.parametrize("route", ["no drafter, sampling_seed=", "transformers' assisted loop", "custom_generate"])
def test_sampling_with_nothing_to_draw_from_in_transformers_loops(target, route):
    """The seeded rule's sampler in transformers' own loops, whose argmax took a NaN row's token 0."""
    if route == "custom_generate" and not compat.SUPPORTS_CUSTOM_GENERATE_CALLABLE:
        pytest.skip("custom_generate=<callable> needs transformers >= 4.57")
    call = {"do_sample": True, "max_new_tokens": NEW, "logits_processor": LogitsProcessorList([Fill(float("nan"))])}
    if route.startswith("no drafter"):
        call.update(candidate_generator=None, sampling_seed=3)
    elif route.startswith("transformers'"):
        call.update(candidate_generator=hfs.PromptLookup(), speculative_loop="transformers")
    else:
        call.update(custom_generate=hfs.speculative_generate, candidate_generator=hfs.PromptLookup())
        target = build_model("llama")
    refused(lambda: target.generate(**prompt_inputs(), **call), RuntimeError, NOTHING_TO_DRAW)


class OffTheText(LogitsProcessor):
    """Leaves nothing to draw from (every score -inf) after any context that is not a prefix of ``text``: positions the
    call's own text never reaches, which only a rejected draft puts in front of the target."""

    def __init__(self, text: list[int]):
        self.text = text

    def __call__(self, input_ids, scores):
        if input_ids[0].tolist() != self.text[: input_ids.shape[1]]:
            return torch.full_like(scores, float("-inf"))
        return scores


def test_a_position_only_rejected_drafts_reach_is_never_refused(target):
    """The negative control of the sampling check: only a position on the kept text is read. Every draft of the
    adversary is wrong, so the target scores positions after it with nothing to draw from, and drops them."""
    call = {"do_sample": True, "max_new_tokens": NEW, "sampling_seed": 11}
    text = target.generate(**prompt_inputs(), candidate_generator=None, **call)[0].tolist()
    assert text == target.generate(**prompt_inputs(), candidate_generator=None, **call,
                                   logits_processor=LogitsProcessorList([OffTheText(text)]))[0].tolist()
    adversary = AdversaryStrategy(text, vocab_size=target.config.vocab_size)
    out = target.generate(**prompt_inputs(), candidate_generator=adversary, **call,
                          logits_processor=LogitsProcessorList([OffTheText(text)]))
    assert out[0].tolist() == text
    stats = hfs.last_stats(target)
    assert stats.drafted_tokens > 0 and stats.accepted_tokens == 0


def test_the_seeded_sampler_marks_or_refuses_a_row_with_nothing_to_draw_from():
    ids, scores = torch.tensor([PROMPT, PROMPT]), torch.randn(2, 16)
    scores[1] = float("-inf")
    with pytest.raises(RuntimeError, match=NOTHING_TO_DRAW):  # transformers' loops read its draws
        SeededSampler(5)(ids, scores)
    marked = SeededSampler(5, marks=True)(ids, scores)  # ours reads them with its verdict
    assert marked[1].isnan().all() and not marked[0].isnan().any() and (marked[0] == 0).sum() == 1
    assert RowSampler(5, row=1)(ids[:1], scores[1:])[0].isnan().all()
    # where there is something to draw from, the draw is what it was: the argmax of log softmax plus the noise
    noise = torch.stack([SeededSampler(5).noise(row, len(PROMPT), 16) for row in range(2)])
    assert int(marked[0].argmax()) == int((torch.log_softmax(scores[0], -1) + noise[0]).argmax())


def test_the_verdict_reads_the_marks_on_the_kept_path_only():
    tree = DraftTree.from_tokens([7, 9], torch.device("cpu"))  # root -> 7 -> 9
    point = torch.full((16,), float("-inf"))
    kept = [point.clone().index_fill_(0, torch.tensor([t]), 0.0) for t in (7, 4, 1)]  # 7 kept, then 4, not 9
    scores = torch.stack([kept[0], kept[1], torch.full((16,), float("nan"))])  # node 9's row is never reached
    verdict = accept_greedy(tree, scores, drawn=True)
    assert (verdict.path, verdict.next_token) == ((0,), 4)
    with pytest.raises(RuntimeError, match=NOTHING_TO_DRAW):
        accept_greedy(tree, torch.stack([kept[0], torch.full((16,), float("nan")), kept[2]]), drawn=True)
    # greedy decoding reads NaN scores as stock greedy does (argmax), refusing nothing
    assert accept_greedy(tree, torch.full((3, 16), float("nan"))).next_token == 0


def test_the_rejection_rule_never_accepts_a_draft_against_a_target_with_nothing_to_draw_from():
    """min(1, p(x) / q(x)) is 1 for p(x) NaN: the draft would be kept, and the next position drawn as if nothing
    happened."""
    tree = DraftTree.from_tokens([7], torch.device("cpu"))
    tree = dataclasses.replace(tree, q=torch.softmax(torch.randn(1, 16), -1))
    scores = torch.stack([torch.full((16,), float("nan")), torch.randn(16)])  # the root's row: nothing to draw from
    with pytest.raises(RuntimeError, match=NOTHING_TO_DRAW):
        accept_rejection(tree, scores, RejectionSampler(torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("sampler", [SeededSampler(1), RejectionSampler(torch.Generator().manual_seed(0))])
def test_a_drafter_with_nothing_to_draw_from_drafts_nothing(sampler):
    """The call's processors warp a drafter's logits too, and the drafter's distribution is not the target's: where
    it has nothing to draw from it drafts nothing (not token 0, not an error), and the target's own draw decides."""
    drafted = []
    plan = SimpleNamespace(wants=lambda peak: True,
                           took=lambda confidence, limit: drafted.append(1) or len(drafted) < limit)
    ctx = Call(None, None, LogitsProcessorList([Fill(float("-inf")), sampler]))  # its sampler: the list's last
    tree = draft_chain(plan, ctx, torch.tensor([PROMPT]), torch.randn(16), 3, step=lambda token: torch.randn(16))
    assert tree.size == 0


# -- silent no-ops: warned about -------------------------------------------------------------------------------------
def test_sampling_seed_without_sampling_warns(target):
    ref = stock_generate(target, **prompt_inputs(), **GREEDY)
    for drafter in (hfs.PromptLookup(adaptive=False), None):
        start = time.perf_counter()
        with pytest.warns(UserWarning, match=r"sampling_seed=3 .* decodes greedily .* pass do_sample=True"):
            out = target.generate(**prompt_inputs(), candidate_generator=drafter, sampling_seed=3, **GREEDY)
        assert time.perf_counter() - start < BUDGET_S
        assert out.tolist() == ref.tolist()
    with pytest.warns(UserWarning, match=r"sampling_seed=3 .* decodes greedily"):
        target.generate(**batch_inputs(), candidate_generator=hfs.PromptLookup(), sampling_seed=3, **GREEDY)
    with warnings.catch_warnings(record=True) as caught:  # sampling: the seed is used
        warnings.simplefilter("always")
        target.generate(**prompt_inputs(), candidate_generator=hfs.PromptLookup(), sampling_seed=3, do_sample=True,
                        max_new_tokens=NEW)
        target.generate(**prompt_inputs(), candidate_generator=hfs.PromptLookup(), sampling_seed=3,
                        generation_config=GenerationConfig(do_sample=True, max_new_tokens=NEW))
    assert not ours(caught)


@pytest.mark.parametrize("option", ["num_assistant_tokens", "num_assistant_tokens_schedule",
                                    "assistant_confidence_threshold", "max_matching_ngram_size"])
def test_transformers_assistant_options_beside_a_drafter_warn(target, drafter, option):
    value = {"num_assistant_tokens": 3, "num_assistant_tokens_schedule": "heuristic",
             "assistant_confidence_threshold": 0.9, "max_matching_ngram_size": 5}[option]
    ref = stock_generate(target, **prompt_inputs(), **GREEDY)
    fix = {"num_assistant_tokens": "num_tokens=", "num_assistant_tokens_schedule": "adaptive=",
           "assistant_confidence_threshold": "confidence_threshold=", "max_matching_ngram_size": "max_ngram="}[option]
    match = rf"{option}= is an option of transformers' own assistant .* does not read: .* own {fix}"
    with pytest.warns(UserWarning, match=match):
        out = target.generate(**prompt_inputs(), candidate_generator=drafter, **{option: value}, **GREEDY)
    assert out.tolist() == ref.tolist()
    with pytest.warns(UserWarning, match=match):
        target.generate(**prompt_inputs(), candidate_generator=drafter,
                        generation_config=GenerationConfig(**{option: value}, **GREEDY))


def test_num_assistant_tokens_in_a_batch_warns_and_without_a_drafter_does_not(target):
    with pytest.warns(UserWarning, match=r"num_assistant_tokens= .* PromptLookup does not read") as warned:
        target.generate(**batch_inputs(), candidate_generator=hfs.PromptLookup(), num_assistant_tokens=3, **GREEDY)
    assert {w.filename for w in warned if "num_assistant_tokens=" in str(w.message)} == {__file__}  # the user's line
    with warnings.catch_warnings(record=True) as caught:  # no drafter: transformers' own generate, its own business
        warnings.simplefilter("always")
        target.generate(**prompt_inputs(), candidate_generator=None, num_assistant_tokens=3, **GREEDY)
        target.generate(**prompt_inputs(), candidate_generator=hfs.PromptLookup(), **GREEDY)
    assert not ours(caught)


class Recorder:
    def __init__(self):
        self.got, self.ended = [], False

    def put(self, value):
        self.got.append(value.tolist())

    def end(self):
        self.ended = True


@needs_custom_generate
def test_no_ops_under_custom_generate_warn():
    """transformers hands a custom_generate callable no streamer: it streamed the prompt and nothing else."""
    model = build_model("llama")
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    route = {"custom_generate": hfs.speculative_generate, "candidate_generator": hfs.PromptLookup(adaptive=False)}
    streamer = Recorder()
    with pytest.warns(UserWarning, match=r"streamer= is ignored under custom_generate=.* hfs\.enable\(model\)"):
        out = model.generate(**prompt_inputs(), **route, streamer=streamer, **GREEDY)
    assert out.tolist() == ref.tolist() and streamer.got == [[PROMPT]] and not streamer.ended
    with pytest.warns(UserWarning, match=r"sampling_seed=4 .* decodes greedily"):
        model.generate(**prompt_inputs(), **route, sampling_seed=4, **GREEDY)
    with pytest.warns(UserWarning, match=r"num_assistant_tokens= .* does not read:"):
        model.generate(**prompt_inputs(), **route, num_assistant_tokens=3, **GREEDY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert model.generate(**prompt_inputs(), **route, **GREEDY).tolist() == ref.tolist()
        model.generate(**prompt_inputs(), **route, sampling_seed=4, do_sample=True, max_new_tokens=NEW)
    assert not ours(caught)


@pytest.mark.parametrize("kind", ["Eagle", "DFlash", "Medusa"])
def test_a_hub_id_says_drafters_are_not_downloaded(kind, tmp_path, monkeypatch):
    """A new user's first try, ``from_pretrained("owner/name")``: the error says that nothing is downloaded and how to
    get the folder, at once (no network: the test would hang or fail on this offline machine otherwise)."""
    monkeypatch.chdir(tmp_path)  # (no folder of that name here)
    loader = getattr(hfs, kind).from_pretrained
    with pytest.raises(FileNotFoundError, match=r"looks like a Hugging Face Hub id: drafters are never downloaded.*"
                                                r"huggingface-cli download yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"):
        loader("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")


@pytest.mark.parametrize("kind, hint", [("eagle", r"looks like an EAGLE drafter: load it with hfs\.Eagle"),
                                        ("medusa", r"looks like Medusa heads: load them with hfs\.Medusa")])
def test_a_dflash_loader_given_another_drafter_says_what_it_looks_like(kind, hint):
    """The shipped EAGLE and Medusa folders given to DFlash.from_pretrained: the error names the right loader."""
    from hf_speculative.drafters.checkpoints import CheckpointError
    from hf_speculative.drafters.eagle.drafter import PRETRAINED_DIR as EAGLE_DIR
    from hf_speculative.drafters.medusa.drafter import PRETRAINED_DIR as MEDUSA_DIR

    folder = (EAGLE_DIR if kind == "eagle" else MEDUSA_DIR) / "smollm2-135m-instruct"
    with pytest.raises(CheckpointError, match=r"neither transformers' DFlash format.*" + hint):
        hfs.DFlash.from_pretrained(folder)
