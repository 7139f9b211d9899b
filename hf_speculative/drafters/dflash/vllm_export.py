"""A DFlash drafter as vLLM serves it (``hf-speculative export-dflash --format vllm``).

vLLM (0.32, ``DFlashQwen3ForCausalLM``) reads z-lab's format, with three differences from our folders:

* it loads every ``*.safetensors`` file of the folder, so our ``draft_vocab.safetensors`` (``d2t`` alone) fails the
  load ("There is no module or parameter named 'draft_id_to_target_id'"). vLLM has a draft vocabulary of its own:
  ``draft_vocab_size`` in config.json, ``d2t`` beside the weights, and the drafter's *own* ``lm_head.weight`` of
  ``draft_vocab_size`` rows (without one it shares the target's whole head). The export writes exactly that: the
  target's lm_head rows of the draft ids (in the target's dtype, so the draft logits are the ones our drafter
  computes), or, with ``full_vocab=True``, no draft vocabulary at all (vLLM then drafts over every token);
* it reads a layer's causality from ``dflash_config.causal`` (or a top-level ``is_causal``), not from z-lab's
  ``dflash_config.is_causal``: the export writes both;
* it embeds the window with the target's embedding table, unscaled, and ignores ``input_embedding_scale``; its V1
  model runner (the only one on a CPU: V2 needs Triton) refuses drafters that mix sliding and full layers. Such
  drafters are refused here, before anything is written.

The window vLLM runs is the anchor and ``num_speculative_tokens`` mask tokens; ours is the whole block
(``block_size - 1`` masks). With bidirectional layers the drafts agree exactly at ``num_speculative_tokens =
block_size - 1``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...options import escaped
from .. import checkpoints as files
from .. import vllm_support
from .checkpoints import CheckpointError, load_checkpoint, read_draft_vocab, zlab_config
from .config import DFlashConfig


def check_vllm_runs(config: DFlashConfig, target: Any = None) -> None:
    """Refuse a drafter vLLM would run differently from ours, or not at all (see the module docstring)."""
    if config.embed_scale is not None and config.embed_scale != 1.0:
        raise CheckpointError(
            f"This DFlash drafter embeds its window as a raw lookup times {config.embed_scale} "
            "(input_embedding_scale); vLLM's DFlash embeds it unscaled and would draft other tokens. It has no vLLM "
            "form: run it with hf_speculative's generate().")
    scale = getattr(target.get_input_embeddings(), "embed_scale", None) if target is not None else None
    if config.embed_scale is None and scale is not None and float(torch.as_tensor(scale).float()) != 1.0:
        raise CheckpointError(
            f"This DFlash drafter embeds its window with the target's embedding module, which scales by "
            f"{float(torch.as_tensor(scale).float()):.4g} (as Gemma's do); vLLM's DFlash looks the table up unscaled "
            "and would draft other tokens. It has no vLLM form: run it with hf_speculative's generate().")
    types = set(config.layer_types or ())
    if len(types) > 1:
        raise CheckpointError(
            f"This DFlash drafter mixes sliding and full attention layers ({config.layer_types}); vLLM "
            f"{vllm_support.VLLM_CHECKED} runs those only on its V2 model runner, which needs Triton (a GPU), and "
            "refuses them on a CPU. Train a drafter whose layers are all of one kind.")


def vllm_folder(config: DFlashConfig, state: dict[str, torch.Tensor], draft_ids: torch.Tensor | None,
                head: torch.Tensor | None) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(config.json dict, tensors)`` of vLLM's DFlash folder. ``draft_ids`` `[N]`: the draft vocabulary's target
    ids (``None``: the whole vocabulary); ``head`` `[V, H]`: the target's lm_head weight, needed with ``draft_ids``."""
    dtype = next(iter(state.values())).dtype
    cfg = zlab_config(config, dtype)
    cfg["dflash_config"]["causal"] = config.causal  # what vLLM reads (z-lab's is_causal is kept for the others)
    cfg["is_causal"] = config.causal
    tensors = dict(state)
    if draft_ids is not None:
        ids = draft_ids.long()
        cfg["draft_vocab_size"] = int(ids.numel())
        tensors["d2t"] = ids - torch.arange(ids.numel())  # target id = draft id + d2t[draft id]
        tensors["lm_head.weight"] = head[ids].contiguous()
    return cfg, tensors


def export_vllm(source: str | Path, out_dir: str | Path, *, target: Any = None, full_vocab: bool = False) -> Path:
    """Write the DFlash drafter folder ``source`` as vLLM serves it into ``out_dir`` (see the module docstring).

    ``target``: the target model (its lm_head rows make the draft vocabulary's head; it is checked against the
    drafter). Without it a drafter with a draft vocabulary needs ``full_vocab=True``. Everything is checked before
    anything is written; returns the folder."""
    directory = files.checkpoint_dir(source)
    config, state, _ = load_checkpoint(directory, target_config=None if target is None else target.config)
    architectures = vllm_support.target_architectures(None if target is None else target.config)
    if target is not None and not architectures:  # a model built from a config records none: its class is one
        architectures = [type(target).__name__]
    vllm_support.check_reads_hidden_states("DFlash", architectures)
    check_vllm_runs(config, target)
    draft_ids = None if full_vocab else read_draft_vocab(directory)
    head = None
    if draft_ids is not None:
        if target is None:
            raise CheckpointError(
                f"{escaped(directory)} drafts over a draft vocabulary of {draft_ids.numel()} tokens, which vLLM reads "
                "as the drafter's own lm_head of those rows of the target's: give the target (--target NAME) to "
                "take them from, or --full-vocab to draft over the whole vocabulary in vLLM.")
        head = target.get_output_embeddings().weight.detach().cpu()
        if int(draft_ids.max()) >= head.shape[0]:
            raise CheckpointError(f"{escaped(directory)}: its draft vocabulary names target id {int(draft_ids.max())}, "
                                  f"outside the target's {head.shape[0]} tokens. Use the drafter's target.")
    vllm_support.check_out_folder(out_dir)
    cfg, tensors = vllm_folder(config, state, draft_ids, head)
    return files.write_folder(out_dir, cfg, tensors)
