"""Where ``model.generate()`` enters our loop.

Chains keep transformers' assisted loop; a call whose strategy drafts trees (``tree=``) runs
:func:`hf_speculative.core.loop.run` instead, entered as transformers' ``custom_generate`` callable
(:func:`tree_generate`): ``generate()`` still prepares everything a decoding loop needs (the logits
processors, the stopping criteria with EOS, the length limit and stop strings, the generation config,
the prompt put into the streamer) and hands it over. What it does not hand a ``custom_generate`` callable,
the streamer and the tokenizer, the enabled model's ``generate`` keeps on the call for it.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import compat
from ..drafters.base import CallContext, DraftStrategy, ExternalCandidateGenerator
from ..core.chains import ChainDrafter
from ..core.costs import padded_verification
from ..core.features import states_feed
from ..core.loop import run
from ..core.static_cache import verifier_for

_NOT_MODEL_KWARGS = ("inputs_tensor", "assistant_model", "assistant_tokenizer", "tokenizer")


def runs_in_our_loop(strategy: Any) -> bool:
    """Whether a call with ``strategy`` is verified by our loop: strategies with a draft tree (``tree=``). Calls on
    a static cache (``cache_implementation="static"``, a model enabled with ``compile=``) run in it too."""
    return getattr(strategy, "tree", None) is not None


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
    """Our loop for one ``generate()`` call: the strategy's per-call drafter, the loop, transformers' output.
    Under sampling ``logits_processor`` already ends with the call's SeededSampler (both routes in, the enabled
    model's ``_get_logits_processor`` and ``speculative_generate``, append it), so the loop verifies greedily."""
    _check_inputs(model_kwargs, synced_gpus)
    ctx = CallContext(model, generation_config, logits_processor, stopping_criteria, call.stats,
                      model_kwargs={k: v for k, v in model_kwargs.items() if k not in _NOT_MODEL_KWARGS})
    strategy = call.strategy  # a user's raw transformers CandidateGenerator runs too (static caches route chains here)
    max_length = int(generation_config.max_length)
    verifier = verifier_for(model, strategy, getattr(call, "static", False), max_length)
    try:
        # under compile the drafters that read the target's states get them from the verifier, not from hooks
        # ... and price their drafts at the padded forward's cost
        with states_feed(None if verifier is None else verifier.feed), \
                padded_verification(None if verifier is None else verifier.cost_key):
            generator = (strategy.open(ctx) if isinstance(strategy, DraftStrategy)
                         else ExternalCandidateGenerator(ctx, strategy))
    except BaseException:
        if verifier is not None:
            verifier.close()
        raise
    call.generator = generator  # closed when the call ends
    call.stopping_criteria = stopping_criteria
    try:
        result = run(model, input_ids, ChainDrafter(generator), stopping_criteria=stopping_criteria,
                     logits_processor=logits_processor, streamer=streamer, stats=call.stats, max_length=max_length,
                     max_depth=64 if verifier is None else verifier.budget, verifier=verifier)
    finally:
        if verifier is not None:
            verifier.close()
    return _output(result, generation_config)


def _check_inputs(model_kwargs: dict, synced_gpus: bool) -> None:
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ValueError("Draft trees run on unpadded input: this call's attention_mask masks some prompt tokens; "
                         "pass the prompt without padding, or use chains (tree=None).")
    if synced_gpus:
        raise ValueError("Draft trees do not support synced_gpus=True (several GPUs generating in step); use chains "
                         "(tree=None).")


def _output(result: Any, generation_config: Any) -> Any:
    """What ``generate()`` returns: the sequences, or transformers' output object with scores and logits."""
    if not compat.generation_field(generation_config, "return_dict_in_generate", False):
        return result.sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    scores = tuple(result.scores) if compat.generation_field(generation_config, "output_scores", False) else None
    logits = tuple(result.logits) if compat.generation_field(generation_config, "output_logits", False) else None
    return GenerateDecoderOnlyOutput(sequences=result.sequences, scores=scores, logits=logits)


# -- batches (B > 1): batch_loop.py ------------------------------------------------------------------
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
    """:func:`hf_speculative.core.batch_loop.run_batch` for one ``generate()`` call of B > 1 rows."""
    from ..core.batch_loop import check_batch_strategy, run_batch

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
