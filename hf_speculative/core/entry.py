"""The one entry into the loop: a speculative ``generate()`` call, one row or a batch, to the ladder.

transformers' ``generate()`` prepares what a decoding loop needs (the logits processors, the stopping criteria with
EOS, the length limit and stop strings, the generation config, the cache, the prompt put into the streamer) and hands
it to a ``custom_generate`` callable: :func:`generate`, bound to the call object the entry built
(``functools.partial(generate, call=call)``; ``hfs.speculative_generate`` calls it directly). It completes the call
with what transformers prepared, opens the drafters, picks the verifier and runs the ladder (core/loop.py)::

    model.generate(...)                   # hf/integration.py: resolve and check, build the Call, enter transformers
      transformers' generate              # prepares processors, criteria, cache
        entry.generate(call=call)         # here: rows, verifier, drafters
          loop.ladder                     # draft, verify, accept, keep, observe, until every row stopped
            loop.verify_step -> rule      # accept.py's rule, chosen once per call

One row on a dynamic cache (the caller's, else a new one) or a static one (``cache_implementation="static"``,
``hfs.enable(model, compile=...)``); several rows (B > 1) on the batch verifier, each with its own drafter.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any

import torch

from .. import compat
from . import kv_cache
from .batch_costs import batch_costs_for
from .batch_verify import BatchVerifier, passed_prefix
from .call import Call, TargetView
from .loop import Row, finish, ladder
from .processor_list import ProcessorList
from .rows import BatchWidth, Outputs, RowSampler, SoloWidth, left_padding, row_view
from .sampling import RejectionSampler
from .static_cache import verifier_for
from .stats import SpeculativeStats
from .verify import DynamicVerifier, prefill_room

_NOT_MODEL_KWARGS = ("inputs_tensor", "assistant_model", "assistant_tokenizer", "tokenizer")


def generate(model: torch.nn.Module, input_ids: torch.LongTensor, logits_processor: Any = None,
             stopping_criteria: Any = None, generation_config: Any = None, synced_gpus: bool = False, *,
             call: Call, **model_kwargs: Any) -> Any:
    """The ``custom_generate`` callable of a speculative call (``call``: its call object, bound by the entry). Under
    sampling ``logits_processor`` ends with the call's sampler and ``call.sampler`` is it, so the loop verifies by the
    call's rule. Returns what ``generate()`` returns: the sequences, or transformers' output object."""
    if synced_gpus:
        if input_ids.shape[0] > 1:
            raise ValueError("Batched speculative decoding does not support synced_gpus=True; drop it.")
        raise ValueError("hf_speculative's loop does not support synced_gpus=True (several GPUs generating in step); "
                         "pass speculative_loop='transformers' for chains.")
    kwargs = dict(model_kwargs)
    for name in _NOT_MODEL_KWARGS:
        kwargs.pop(name, None)
    call.handed_over(generation_config, logits_processor, stopping_criteria, kwargs)
    max_length = call.max_length
    keeps = (getattr(generation_config, "output_scores", None) or False,  # what the output keeps of each position
             getattr(generation_config, "output_logits", None) or False)
    started = time.perf_counter()
    if input_ids.shape[0] > 1:
        rows, verifier, mask, widths, cut_at_stop, fill = _batch(model, call, input_ids,
                                                                 model_kwargs.get("attention_mask"))
        prompt, padding, stops = input_ids, None, call.stopping_criteria
        pending, mask = input_ids[:, verifier.cached:], mask[:, verifier.cached:]  # [B, m]: what its cache lacks
    else:
        rows, verifier, padding, stops = _one_row(model, call, input_ids, model_kwargs.get("attention_mask"),
                                                  max_length)
        cut_at_stop, fill, prompt = True, 0, rows[0].ids
        pending = prompt[:, verifier.length:]  # [1, m]: what its cache lacks
        widths = SoloWidth()
        if isinstance(verifier, DynamicVerifier):  # no draft that would split the first forward (verify.prefill_room)
            widths.first_room = prefill_room(model, pending.shape[1])
        mask = torch.ones_like(pending, dtype=torch.bool)
    outputs = Outputs(len(rows), prompt.shape[1], fill, call.streamer, scores=keeps[0], logits=keeps[1])
    cache = verifier.cache if isinstance(verifier, DynamicVerifier) else None
    try:
        limit = ladder(rows, verifier, pending, mask, stopping_criteria=stops, stats=call.stats,
                       max_length=max_length - (0 if padding is None else padding.shape[1]),
                       max_depth=verifier.budget, widths=widths, outputs=outputs, cut_at_stop=cut_at_stop)
    finally:
        for row in rows:
            row.close()
        verifier.close()
    result = finish(rows, prompt, limit, fill, outputs, call.stats, started)
    if padding is not None and padding.shape[1]:
        result.sequences = torch.cat([padding, result.sequences], dim=-1)
    if not getattr(generation_config, "return_dict_in_generate", None):
        return result.sequences
    return output(result, keeps, cache)


# -- one row ----------------------------------------------------------------------------------------------------------
def _one_row(model: torch.nn.Module, call: Call, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None,
             max_length: int) -> tuple[list[Row], Any, torch.LongTensor, Any]:
    """The row, its verifier (static, or a dynamic cache: the one the caller passed to ``generate()``, whose prompt
    tokens are not computed again, else a new one) and the prompt's left padding ``[1, P]`` (a one-row call may come
    left-padded, e.g. from a pipeline: its tokens are left out of every forward and put back in front of the output,
    which is what their masked attention and transformers' position ids from the mask amount to), and the stopping
    criteria as the loop calls them."""
    pads = 0 if attention_mask is None or bool(attention_mask.all()) else left_padding(attention_mask)[0]
    padding, input_ids = input_ids[:, :pads], input_ids[:, pads:]
    # (call.static: asked for, or the model compiled)
    verifier = verifier_for(model, True, max_length, call.draft_budget, type(call.strategy).__name__) if call.static \
        else None
    if verifier is None:
        given = call.model_kwargs.get(compat.cache_kwarg())
        passed = given if given is not None and (call.cache is given or kv_cache.cache_length(given) > 0) else None
        cached = 0 if passed is None else kv_cache.cache_length(passed)
        if cached >= input_ids.shape[1]:
            raise ValueError(f"The cache passed to generate() already holds {cached} tokens, as many as the prompt "
                             f"({input_ids.shape[1]}); pass a cache of the prompt's first tokens at most.")
        verifier = DynamicVerifier(model, trees=call.trees, cache=passed, cached=cached)
        call.model_kwargs[compat.cache_kwarg()] = verifier.cache
    # under compile the drafters that read the target's states get them from the verifier, not from hooks (the
    # view), and price their drafts at the padded forward's cost (the cost key)
    call.view, call.cost_key, call.prompt_length = verifier.view, verifier.cost_key, input_ids.shape[1]
    try:
        drafter = call.strategy.open(call)
    except BaseException:
        verifier.close()
        raise
    processors, stops = call.logits_processor, call.stopping_criteria
    if pads:  # the processors and criteria see the ids transformers' own loop would: the padding first
        processors, stops = _after(padding, processors), _after(padding, stops)
    return [Row(input_ids, 0, drafter, processors, sampler=call.sampler)], verifier, padding, stops


def _after(padding: torch.LongTensor, function: Any) -> Any:
    """``function(input_ids, scores)`` (logits processors, stopping criteria) called on ``padding`` `[1, P]` followed
    by ``input_ids`` (``None`` stays ``None``)."""
    if not function:
        return function
    return lambda input_ids, scores: function(torch.cat([padding.to(input_ids.device), input_ids], dim=-1), scores)


# -- a batch (B > 1) ----------------------------------------------------------------------------------------------------
def _batch(model: torch.nn.Module, call: Call, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None):
    """Each row with a drafter of its own opened from the call's strategy (its view of the call: its processors, its
    statistics, its columns of the forwards), the batch verifier, the cost model deciding the width, whether rows end
    at their stop (a call with an EOS criterion; else they decode on until the longest has stopped, as transformers'
    batched loop does) and the id that fills finished rows. A cache the caller passed holding the prompts' first
    columns starts the verifier's (read, not filled: ``batch_verify.py``)."""
    batch, length = input_ids.shape
    mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    pads = left_padding(mask)
    has_eos = any(hasattr(c, "eos_token_id") for c in (call.stopping_criteria or []))
    pad = getattr(call.generation_config, "_pad_token_tensor", None)
    pad = int(pad) if pad is not None else getattr(call.generation_config, "pad_token_id", None)
    if has_eos and pad is None:
        raise ValueError("Batched generation with an EOS token needs a pad_token_id for the rows that finish "
                         "first: pass pad_token_id= to generate() (e.g. tokenizer.pad_token_id).")
    processors, sampler = call.processors, call.sampler
    given = call.model_kwargs.get(compat.cache_kwarg())
    cached = passed_prefix(given, batch, length) if given is not None else 0
    if call.cache is not None and cached == 0:
        warnings.warn(f"An empty cache passed to generate() with a batch of {batch} rows is not filled: batched "
                      "speculation keeps a cache of its own (with holes where drafts were rejected), and reads a "
                      "passed cache only for the prompts' first tokens it holds. Pass no cache with a batch, or "
                      "generate one prompt at a time to have it filled.", UserWarning, stacklevel=2)

    def row_processors(row: int, offset: int) -> ProcessorList:
        items = [row_view(p, row, batch) for p in processors]
        if isinstance(sampler, RejectionSampler):  # one generator: each row's draws its own, in turn
            return ProcessorList([*items, sampler])
        return ProcessorList(items if sampler is None else [*items, RowSampler(sampler.seed, row, offset)])

    rows = []
    try:
        for b in range(batch):  # per-row drafter state; its own stats, so its rules never see a batched forward
            own = SpeculativeStats()
            own.extra = call.stats.extra  # drafter details (stats.extra) reach the call's stats; the rows share them
            row_call = call.for_row(row_processors(b, pads[b]), own, TargetView(), length - pads[b])
            rows.append(Row(input_ids[b:b + 1], pads[b], call.strategy.open(row_call), row_processors(b, 0),
                            row_call.view))
        verifier = BatchVerifier(model, batch, (given, mask[:, :cached]) if cached else None)
    except BaseException:
        for row in rows:
            row.close()
        raise
    return rows, verifier, mask, BatchWidth(batch_costs_for(model), batch), has_eos, 0 if pad is None else int(pad)


# -- what generate() returns ----------------------------------------------------------------------------------------
def output(result: Any, keeps: tuple[bool, bool], cache: Any = None) -> Any:
    """transformers' output object of a ``return_dict_in_generate`` call: the sequences, the scores and logits it
    asked to keep (``keeps``: ``output_scores``, ``output_logits``) and the call's dynamic cache (every verified token
    but the last)."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    scores = tuple(result.scores) if keeps[0] else None
    logits = tuple(result.logits) if keeps[1] else None
    fields = {f.name for f in dataclasses.fields(GenerateDecoderOnlyOutput)}
    extra = {name: cache for name in (compat.cache_kwarg(), "past_key_values") if name in fields}
    return GenerateDecoderOnlyOutput(sequences=result.sequences, scores=scores, logits=logits,
                                     **dict(list(extra.items())[:1]))
