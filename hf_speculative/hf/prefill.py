"""``hfs.prefill``: the cache of a batch's first columns, for several calls on the same long prompts.

At long contexts the prompts' forward is most of a call's time (8 rows of 4,096 tokens: about 240 s of a 64-token
call's 255-280 s on a laptop-class CPU). A batched ``generate()`` starts from a cache holding the prompts' first
columns and reads it without filling it (``core/batch_verify.py``: ``passed_prefix``), so one prefill serves every
call after it: other seeds, drafters, settings.

    cache = hfs.prefill(model, inputs)   # every column but the last
    out = model.generate(**inputs, cache=cache, candidate_generator=hfs.MagicDec())   # (past_key_values= on 4.x)

The forward runs as transformers' batched ``generate`` runs its prefill (positions from the padding mask), in chunks
of at most ``chunk_tokens`` tokens of the batch, with only the last position's logits (a batch's whole logits would
be ``B x T x V`` floats: 25 GB at 16 x 8,000 x 49,152).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .. import compat
from ..core.rows import left_padding

CHUNK_TOKENS = 8192  # tokens of the batch a chunk runs: a few hundred MB of activations for a 1-2B model in float32


def prefill(model: torch.nn.Module, inputs: Mapping[str, Any], columns: int | None = None, *,
            chunk_tokens: int = CHUNK_TOKENS) -> Any:
    """A ``DynamicCache`` holding the keys and values of ``inputs``' first ``columns`` columns.

    Args:
        model (`PreTrainedModel`): the target (enabled or not).
        inputs (`Mapping`): ``input_ids`` ``[B, T]`` (left-padded for a batch) and, for a batch, its
            ``attention_mask`` ``[B, T]`` (a tokenizer's output, as passed to ``generate()``).
        columns (`int`, *optional*, defaults to ``T - 1``): how many columns to prefill, ``1 <= columns < T``: a call
            starting from the cache runs the columns after them (at least one: its first token's logits).
        chunk_tokens (`int`, defaults to 8192): the most tokens of the batch one forward runs (``rows x columns``).

    Returns:
        `DynamicCache`: pass it to ``generate()`` with the same ``inputs`` (``cache=`` on transformers 5.24+,
        ``past_key_values=`` before). A batched call reads it and leaves it as it was; a one-row call fills it, as
        transformers does (pass a ``copy.deepcopy`` to reuse it).
    """
    from transformers import DynamicCache

    ids, mask = _checked(inputs, columns, chunk_tokens)
    columns = ids.shape[1] - 1 if columns is None else columns
    device = model.get_input_embeddings().weight.device
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, T]: as transformers' batched prefill counts them
    chunk = max(1, chunk_tokens // ids.shape[0])
    cache = DynamicCache()
    keep = compat.logits_to_keep_kwargs(model, 1)
    with torch.no_grad():  # (not inference_mode: its tensors could not be written in place by a call outside it)
        for at in range(0, columns, chunk):
            end = min(columns, at + chunk)
            model(input_ids=ids[:, at:end], attention_mask=mask[:, :end], position_ids=positions[:, at:end],
                  use_cache=True, **{compat.cache_kwarg(): cache}, **keep)
    return cache


def _checked(inputs: Mapping[str, Any], columns: int | None, chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` as 2-D integer tensors; raises, naming the fix, for arguments ``prefill``
    cannot use (before any forward)."""
    if not isinstance(inputs, Mapping) or "input_ids" not in inputs:
        raise TypeError(f"hfs.prefill(model, inputs): inputs is a tokenizer's output (a mapping with input_ids and, "
                        f"for a batch, attention_mask), not {type(inputs).__name__}; e.g. "
                        "hfs.prefill(model, tok(prompts, return_tensors='pt', padding=True)).")
    ids = inputs["input_ids"]
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point:
        raise ValueError("hfs.prefill: input_ids must be a [batch, length] tensor of token ids, as "
                         "tok(prompts, return_tensors='pt', padding=True) gives.")
    mask = inputs.get("attention_mask")
    if mask is None:
        if ids.shape[0] > 1:
            raise ValueError("hfs.prefill: a batch needs its attention_mask (the padding of each row); pass the "
                             "tokenizer's whole output, e.g. tok(prompts, return_tensors='pt', padding=True).")
        mask = torch.ones_like(ids)
    elif not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"hfs.prefill: attention_mask {shape} must have input_ids' shape {tuple(ids.shape)}.")
    width = ids.shape[1]
    if width < 2:
        raise ValueError("hfs.prefill: the prompts have one column; a call starting from a cache needs at least one "
                         "column after it. Nothing to prefill: call generate() without a cache.")
    if columns is not None and (isinstance(columns, bool) or not isinstance(columns, int) or
                                not 1 <= columns < width):
        raise ValueError(f"hfs.prefill(columns={columns!r}): a whole number from 1 to {width - 1} (the prompts have "
                         f"{width} columns; a call starting from the cache needs at least its last one), or None for "
                         f"{width - 1}.")
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"hfs.prefill(chunk_tokens={chunk_tokens!r}): a whole number of tokens >= 1, e.g. 8192.")
    left_padding(mask)  # raises, naming the fix, for right padding, holes or a row of padding only
    return ids, mask
