"""Where ``model.generate()`` enters our loop.

Every speculative call of an enabled model runs :func:`hf_speculative.core.loop.run` (one row) or
:func:`hf_speculative.core.loop.run_batch` (a batch), entered as transformers' ``custom_generate`` callable
(:func:`tree_generate`, :func:`batch_generate`): ``generate()`` still prepares everything a decoding loop needs
(the logits processors, the stopping criteria with EOS, the length limit and stop strings, the generation config,
the cache, the prompt put into the streamer) and hands it over. What it does not hand a ``custom_generate``
callable, the streamer and the tokenizer, the enabled model's ``generate`` keeps on the call for it.

transformers' own assisted loop stays reachable (``speculative_loop="transformers"``): there our drafters serve
as transformers ``CandidateGenerator`` s (see :mod:`hf_speculative.hf.integration`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .. import compat
from ..core.call import CallContext
from ..drafters.strategy import DraftStrategy
from ..drafters.generator import ExternalCandidateGenerator
from ..core.loop import run
from ..core.rows import left_padding
from ..core.sampling import split_sampler
from ..core.verify import DynamicVerifier
from ..core.static_cache import compiled_mode, static_requested, verifier_for
from .checks import check_batch_strategy, check_strategy, draft_budget, drafts_trees

_NOT_MODEL_KWARGS = ("inputs_tensor", "assistant_model", "assistant_tokenizer", "tokenizer")


def tree_generate(model: torch.nn.Module, input_ids: torch.LongTensor, logits_processor: Any = None,
                  stopping_criteria: Any = None, generation_config: Any = None, synced_gpus: bool = False,
                  **model_kwargs: Any) -> Any:
    """The ``custom_generate`` callable an enabled model's ``generate`` passes for tree strategies."""
    from .integration import active_call

    call = active_call(model)
    if call is None:
        raise RuntimeError("hf_speculative's tree loop runs inside an enabled model's generate(); call "
                           "hfs.enable(model) and pass candidate_generator= instead of custom_generate=.")
    return run_call(model, call, input_ids, logits_processor, stopping_criteria, generation_config, call.streamer,
                    synced_gpus, model_kwargs)


def run_call(model: torch.nn.Module, call: Any, input_ids: torch.LongTensor, logits_processor: Any,
             stopping_criteria: Any, generation_config: Any, streamer: Any, synced_gpus: bool,
             model_kwargs: dict) -> Any:
    """Our loop for one ``generate()`` call of one row: the strategy's per-call drafter, the loop, transformers'
    output. Under sampling ``logits_processor`` already ends with the call's SeededSampler (both routes in, the
    enabled model's ``_get_logits_processor`` and ``speculative_generate``, append it), so the loop verifies
    greedily.

    The verifier is a static one (``cache_implementation="static"``, ``hfs.enable(model, compile=...)``), else a
    dynamic cache: the one the caller passed to ``generate()`` (the call fills it, and prompt tokens it already
    holds are not computed again), else a new one. Self-speculative drafters draft over that cache's layers."""
    pads = _check_inputs(model_kwargs, synced_gpus)
    padding, input_ids = input_ids[:, :pads], input_ids[:, pads:]
    strategy = call.strategy  # a user's raw transformers CandidateGenerator runs too
    max_length = int(generation_config.max_length)
    kwargs = {k: v for k, v in model_kwargs.items() if k not in _NOT_MODEL_KWARGS}
    static = getattr(call, "static", False)
    if static_requested(model, static):
        check_strategy(strategy, compiled=compiled_mode(model) is not None)
    verifier = verifier_for(model, static, max_length, draft_budget(strategy), type(strategy).__name__)
    cached = 0
    if verifier is None:
        given = compat.target_cache(model_kwargs)
        passed = given if given is not None and (getattr(call, "cache", None) is given
                                                 or compat.cache_length(given) > 0) else None
        verifier = DynamicVerifier(model, trees=drafts_trees(strategy), cache=passed)
        cached = 0 if passed is None else compat.cache_length(passed)
        if cached >= input_ids.shape[1]:
            raise ValueError(f"The cache passed to generate() already holds {cached} tokens, as many as the prompt "
                             f"({input_ids.shape[1]}); pass a cache of the prompt's first tokens at most.")
        kwargs[compat.cache_kwarg()] = verifier.cache
    # under compile the drafters that read the target's states get them from the verifier, not from hooks (the
    # view), and price their drafts at the padded forward's cost (the cost key)
    ctx = CallContext(model, generation_config, logits_processor, stopping_criteria, call.stats, model_kwargs=kwargs,
                      view=verifier.view, cost_key=verifier.cost_key, prompt_length=input_ids.shape[1])
    try:
        generator = (strategy.open(ctx) if isinstance(strategy, DraftStrategy)
                     else ExternalCandidateGenerator(ctx, strategy))
    except BaseException:
        verifier.close()
        raise
    call.generator = generator  # closed when the call ends
    call.stopping_criteria = stopping_criteria
    sampler = split_sampler(logits_processor)[1]  # before _after hides the list in a function
    if pads:  # the processors and criteria see the ids transformers' own loop would: the padding first
        stopping_criteria, logits_processor = _after(padding, stopping_criteria), _after(padding, logits_processor)
    try:
        result = run(model, input_ids, generator, stopping_criteria=stopping_criteria,
                     logits_processor=logits_processor, streamer=streamer, stats=call.stats,
                     max_length=max_length - pads, max_depth=verifier.budget, verifier=verifier, cached=cached,
                     sampler=sampler)
    finally:
        dynamic = isinstance(verifier, DynamicVerifier)
        verifier.close()
    if pads:
        result.sequences = torch.cat([padding, result.sequences], dim=-1)
    return _output(result, generation_config, kwargs.get(compat.cache_kwarg()) if dynamic else None)


def _check_inputs(model_kwargs: dict, synced_gpus: bool) -> int:
    """The prompt's left padding (a one-row call may come left-padded, e.g. from a pipeline): its tokens are left
    out of every forward and put back in front of the output, which is what their masked attention and transformers'
    position ids from the mask amount to."""
    if synced_gpus:
        raise ValueError("hf_speculative's loop does not support synced_gpus=True (several GPUs generating in step); "
                         "pass speculative_loop='transformers' for chains.")
    mask = model_kwargs.get("attention_mask")
    if mask is None or bool(mask.all()):
        return 0
    return left_padding(mask)[0]


def _after(padding: torch.LongTensor, function: Any) -> Any:
    """``function(input_ids, scores)`` (logits processors, stopping criteria) called on ``padding`` `[1, P]` followed
    by ``input_ids`` (``None`` stays ``None``)."""
    if not function:
        return function
    return lambda input_ids, scores: function(torch.cat([padding.to(input_ids.device), input_ids], dim=-1), scores)


def _output(result: Any, generation_config: Any, cache: Any = None) -> Any:
    """What ``generate()`` returns: the sequences, or transformers' output object with scores, logits and the
    call's dynamic cache (every verified token but the last)."""
    if not compat.generation_field(generation_config, "return_dict_in_generate", False):
        return result.sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    scores = tuple(result.scores) if compat.generation_field(generation_config, "output_scores", False) else None
    logits = tuple(result.logits) if compat.generation_field(generation_config, "output_logits", False) else None
    fields = {f.name for f in dataclasses.fields(GenerateDecoderOnlyOutput)}
    extra = {name: cache for name in (compat.cache_kwarg(), "past_key_values") if name in fields}
    return GenerateDecoderOnlyOutput(sequences=result.sequences, scores=scores, logits=logits,
                                     **dict(list(extra.items())[:1]))


# -- batches (B > 1): the same loop, several rows ------------------------------------------------------------------
def batch_generate(model: torch.nn.Module, input_ids: torch.LongTensor, logits_processor: Any = None,
                   stopping_criteria: Any = None, generation_config: Any = None, synced_gpus: bool = False,
                   **model_kwargs: Any) -> Any:
    """The ``custom_generate`` callable an enabled model's ``generate`` passes for a batch (B > 1)."""
    from .integration import active_call

    call = active_call(model)
    if call is None:
        raise RuntimeError("hf_speculative's batch loop runs inside an enabled model's generate(); call "
                           "hfs.enable(model) and pass candidate_generator= instead of custom_generate=.")
    return run_batch_call(model, call, input_ids, logits_processor, stopping_criteria, generation_config,
                          call.streamer, synced_gpus, model_kwargs)


def run_batch_call(model: torch.nn.Module, call: Any, input_ids: torch.LongTensor, logits_processor: Any,
                   stopping_criteria: Any, generation_config: Any, streamer: Any, synced_gpus: bool,
                   model_kwargs: dict) -> Any:
    """:func:`hf_speculative.core.loop.run_batch` for one ``generate()`` call of B > 1 rows."""
    from ..core.loop import run_batch

    check_batch_strategy(call.strategy)
    if synced_gpus:
        raise ValueError("Batched speculative decoding does not support synced_gpus=True; drop it.")
    call.stopping_criteria = stopping_criteria
    pad = getattr(generation_config, "_pad_token_tensor", None)
    pad = int(pad) if pad is not None else getattr(generation_config, "pad_token_id", None)
    result = run_batch(model, input_ids, model_kwargs.get("attention_mask"), call.strategy,
                       generation_config=generation_config, stopping_criteria=stopping_criteria,
                       logits_processor=logits_processor, stats=call.stats, pad_token_id=pad, streamer=streamer,
                       output_scores=compat.generation_field(generation_config, "output_scores", False),
                       output_logits=compat.generation_field(generation_config, "output_logits", False))
    return _output(result, generation_config)
