"""Batched greedy decoding that stops running each row once it has ended: self-distillation's answers.

transformers' batched ``generate()`` runs every row of a batch until its last row ends: a row that ended keeps
costing its arithmetic, fed padding, for the rest of the batch. On a CPU a decoding step is compute-bound beyond a
few rows (SmolLM2-135M, one thread, AVX2, float32, context 200: 25 ms a step plus 6.1 ms a row), and answers of up
to 192 tokens averaging 139 leave about a quarter of a 16-row batch's row-steps to rows that had ended.
:func:`greedy_rows` drops a row from the batch (its cache rows with ``DynamicCache.batch_select_indices``, its mask
and position) at the step it ends (a large batch, once a 16th of its rows have), so each step runs only the rows
still writing.

Each row's tokens are ``generate(do_sample=False)``'s: the prefill and every step are the forwards transformers'
batched greedy runs (left padding, positions counted from the mask, the last position's logits, their argmax),
restricted to the live rows, and a row's arithmetic does not depend on the other rows of its batch (the CPU path's
decoder layers and products keep each row's own, ``hf_speculative/cpu/layers.py``). What ``generate()`` adds to a
greedy call's scores from the model's generation config (a repetition penalty, banned words, a minimum length...)
is not applied here: :func:`plain_greedy` names such settings, and the caller then runs ``generate()``.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import compat

# rows are dropped once a 16th of the batch has ended (at once below 32 rows): each drop copies the cache, which
# transformers' DynamicCache copies every step anyway (torch.cat), so a large batch on a GPU drops them in groups
DROP_EVERY = 16

# generation-config fields under which transformers' greedy generate() changes the scores before its argmax
# (GenerationMixin._get_logits_processor), each with the test of a value that does
SCORE_SETTINGS = {
    "repetition_penalty": lambda v: v is not None and v != 1.0,
    "no_repeat_ngram_size": lambda v: bool(v),
    "sequence_bias": lambda v: v is not None,
    "bad_words_ids": lambda v: v is not None,
    "min_length": lambda v: bool(v),
    "min_new_tokens": lambda v: bool(v),
    "forced_bos_token_id": lambda v: v is not None,
    "forced_eos_token_id": lambda v: v is not None,
    "suppress_tokens": lambda v: v is not None,
    "begin_suppress_tokens": lambda v: v is not None,
    "exponential_decay_length_penalty": lambda v: v is not None,
    "guidance_scale": lambda v: v is not None and v != 1,
    "watermarking_config": lambda v: v is not None,
    "remove_invalid_values": lambda v: v is True,
    "dola_layers": lambda v: v is not None,
}


def plain_greedy(generation_config: Any) -> list[str]:
    """The settings of ``generation_config`` that make ``generate(do_sample=False)`` more than the argmax of the
    model's logits (empty: :func:`greedy_rows` writes what it writes)."""
    return [name for name, applies in SCORE_SETTINGS.items() if applies(getattr(generation_config, name, None))]


@torch.no_grad()
def greedy_rows(model: Any, input_ids: torch.LongTensor, attention_mask: torch.LongTensor, *, max_new_tokens: int,
                eos_ids: set[int]) -> list[list[int]]:
    """Each row's greedy continuation: its new tokens up to and including its first EOS, or ``max_new_tokens`` of
    them.

    Args:
        model: a decoder-only ``...ForCausalLM`` with a ``DynamicCache``.
        input_ids (`torch.LongTensor` of shape `[B, W]`): the prompts, left-padded.
        attention_mask (`torch.LongTensor` of shape `[B, W]`): 1 on each prompt's tokens, 0 on its padding.
        max_new_tokens (`int`): the most tokens a row writes.
        eos_ids (`set[int]`): the tokens that end a row (written, then the row stops).

    Returns:
        `list[list[int]]`: ``B`` lists of new token ids, in the batch's order.
    """
    from transformers import DynamicCache

    if max_new_tokens < 1:
        raise ValueError(f"greedy_rows(max_new_tokens={max_new_tokens}): a row writes at least one token; pass "
                         "max_new_tokens >= 1")
    mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, W]: as transformers' batched prefill counts them
    cache = DynamicCache()
    forward = {compat.cache_kwarg(): cache, "use_cache": True, **compat.logits_to_keep_kwargs(model, 1)}
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, **forward).logits[:, -1]
    rows = list(range(input_ids.shape[0]))  # the batch rows in the cache, in its order
    ended = [False] * len(rows)  # rows that ended but are still in the cache (fed, their logits unread)
    written: list[list[int]] = [[] for _ in rows]
    step_positions = positions[:, -1:] + 1  # [b, 1]
    while True:
        tokens = logits.float().argmax(-1)  # [b]
        for i, (row, token) in enumerate(zip(rows, tokens.tolist())):
            if not ended[i]:
                written[row].append(token)
                ended[i] = token in eos_ids or len(written[row]) == max_new_tokens
        if all(ended):
            return written
        if sum(ended) >= max(1, len(rows) // DROP_EVERY):  # drop the rows that ended: cache rows, mask, positions
            live = [i for i, done in enumerate(ended) if not done]
            keep = torch.tensor(live, device=tokens.device)
            cache.batch_select_indices(keep)
            mask, step_positions, tokens = mask[keep], step_positions[keep], tokens[keep]
            rows, ended = [rows[i] for i in live], [False] * len(live)
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=-1)  # [b, W + t]
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=step_positions,
                       **forward).logits[:, -1]
        step_positions = step_positions + 1
