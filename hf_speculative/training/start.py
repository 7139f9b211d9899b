"""Where training starts: a new drafter shaped for the target (optionally warm-started from its
last layer), or an existing drafter continued (``--init-from``), checked to be the kind of network
the run trains before anything slow happens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .. import compat
from ..drafters.eagle.config import EagleConfig
from ..drafters.eagle.model import EagleDraftModel
from .config import TrainConfig
from .data import draft_vocabulary


def initial_network(cfg: TrainConfig, target: Any, train_examples: list) -> tuple[EagleDraftModel, bool]:
    """The network training starts from, and whether it was warm-started: the drafter named by
    ``cfg.init_from`` (continued training), else a new one shaped for ``target`` (its draft
    vocabulary the most frequent tokens of ``train_examples``), started from the target's last
    layer where ``cfg.init_from_target`` allows."""
    check_draft_vocab_size(cfg, target.config)
    if cfg.init_from is not None:
        net = _continued(cfg, target)
        if cfg.refresh_vocab:
            eos = compat.eos_token_ids(target.generation_config)
            refresh_vocabulary(net, draft_vocabulary(train_examples, cfg.draft_vocab_size, net.config.vocab_size, eos),
                               target.get_output_embeddings().weight)
        return net, True
    adapter = {}
    if cfg.exit_layer is not None:
        depth = int(compat.text_config(target.config).num_hidden_layers)
        if cfg.exit_layer >= depth:
            raise ValueError(f"--exit-layer {cfg.exit_layer}: the target has {depth} layers; an exit must come before the "
                             f"last (1..{depth - 1}).")
        adapter = {"target_layers": [cfg.exit_layer - 1], "exit_layer": cfg.exit_layer}
    eagle_cfg = EagleConfig.for_target(target.config, version=cfg.version,
                                       draft_vocab_size=cfg.draft_vocab_size if cfg.eagle3 else None, target=cfg.target,
                                       **adapter)
    net = EagleDraftModel(eagle_cfg)
    draft_ids = None
    if eagle_cfg.reduced_vocab:
        eos = compat.eos_token_ids(target.generation_config)
        draft_ids = draft_vocabulary(train_examples, eagle_cfg.draft_vocab_size, eagle_cfg.vocab_size, eos)
        _set_vocabulary(net, draft_ids)
    return net, cfg.init_from_target and init_from_target(net, target, draft_ids)


def check_draft_vocab_size(cfg: TrainConfig, target_config: Any) -> None:
    """Raise ``ValueError`` naming the fix when the draft vocabulary ``cfg`` chooses (EAGLE-3's and an exit
    adapter's, or ``refresh_vocab``'s) is larger than the vocabulary of the target of ``target_config`` (a
    transformers config), of which it is a subset: else the run would fail only once the network is built."""
    chooses = cfg.eagle3 and (cfg.init_from is None or cfg.refresh_vocab)
    vocab_size = int(compat.text_config(target_config).vocab_size)
    if chooses and cfg.draft_vocab_size > vocab_size:
        raise ValueError(f"--draft-vocab-size {cfg.draft_vocab_size}: the target's vocabulary has only {vocab_size:,} "
                         f"tokens, and the draft vocabulary is chosen among them; give at most --draft-vocab-size "
                         f"{vocab_size} (all of them), or fewer: the most frequent tokens (8192 for a 49k vocabulary).")


def init_source(cfg: TrainConfig) -> Path:
    """The folder of ``cfg.init_from``: a folder, or a shipped drafter (exit adapter with ``exit_layer``).

    Raises:
        FileNotFoundError: neither exists (the message lists the shipped names).
    """
    from ..drafters.eagle import checkpoints
    from ..drafters.eagle.drafter import PRETRAINED_DIR
    from ..drafters.self_speculative.exit_adapter import SHIPPED_DIR

    shipped = PRETRAINED_DIR if cfg.exit_layer is None else SHIPPED_DIR
    return checkpoints.find_folder(
        cfg.init_from, shipped,
        missing=f"--init-from {cfg.init_from!r}: no such folder, and no shipped network of that name "
        f"({checkpoints.shipped_names(shipped)}); give a folder written by train-eagle or in a supported format.")


def check_init_from(cfg: TrainConfig) -> Path:
    """The folder of ``cfg.init_from``, checked to hold the kind of network ``cfg`` trains (read from
    its config and weight names, so before the target loads and before any self-distillation).

    Raises:
        FileNotFoundError: no such folder or shipped name.
        ValueError: a network of another kind (EAGLE-1 vs EAGLE-3 vs exit adapter), or not a drafter.
    """
    from ..drafters.eagle import checkpoints

    folder = init_source(cfg)
    mine = checkpoints.network_kind(folder)
    if mine != (cfg.version, cfg.exit_layer):
        def kind(version, exit_layer):
            return f"an exit adapter for layer {exit_layer}" if exit_layer is not None else f"an EAGLE-{version} drafter"
        raise ValueError(f"--init-from {cfg.init_from!r} is {kind(*mine)}, but this run trains {kind(cfg.version, cfg.exit_layer)}; "
                         "give a network of the same kind, or change --eagle1/--eagle3/--exit-layer to match it.")
    return folder


def _continued(cfg: TrainConfig, target: Any) -> EagleDraftModel:
    """``cfg.init_from`` loaded in float32 for training (checked by `check_init_from` first)."""
    from ..drafters.eagle import checkpoints

    return checkpoints.load_drafter(check_init_from(cfg), dtype=torch.float32, target_config=target.config).train()


def init_from_target(net: EagleDraftModel, target: Any, draft_ids: torch.Tensor | None) -> bool:
    """Warm start: the decoder layer from the target's last layer (q/k/v's feature half), the final
    norm and lm_head rows from the target's, ``fc`` passing the highest fused feature through.
    Only for Llama-style norms (``w * x``; Gemma's ``(1 + w) * x`` would be mis-copied). Returns
    whether it applied."""
    decoder = compat.decoder_of(target)
    last = decoder.layers[-1] if decoder is not None else None
    if last is None or "gemma" in type(decoder.norm).__name__.lower() or not hasattr(last, "mlp"):
        return False
    h = net.config.hidden_size
    with torch.no_grad():
        try:
            net.midlayer.mlp.load_state_dict(last.mlp.state_dict())
            net.midlayer.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
            net.midlayer.self_attn.o_proj.weight.copy_(last.self_attn.o_proj.weight)
            for name in ("q_proj", "k_proj", "v_proj"):
                mine, theirs = getattr(net.midlayer.self_attn, name), getattr(last.self_attn, name)
                mine.weight[:, -h:].copy_(theirs.weight)
                if mine.bias is not None and theirs.bias is not None:
                    mine.bias.copy_(theirs.bias)
            for name in ("input_layernorm", "hidden_norm"):
                if hasattr(net.midlayer, name):
                    getattr(net.midlayer, name).weight.copy_(last.input_layernorm.weight)
        except (RuntimeError, AttributeError):  # another layer layout: keep the random init
            return False
        net.fc.weight.mul_(0.1)
        net.fc.weight[:, -h:] += torch.eye(h, dtype=net.fc.weight.dtype)
        if net.config.version == 3:
            head = target.get_output_embeddings().weight
            net.lm_head.weight.copy_(head if draft_ids is None else head[draft_ids])
            net.norm.weight.copy_(decoder.norm.weight)
    return True


def refresh_vocabulary(net: EagleDraftModel, draft_ids: torch.Tensor, target_head: torch.Tensor) -> None:
    """Give a trained reduced-vocabulary drafter the vocabulary ``draft_ids`` (sorted target ids `[V']`,
    any size): lm_head rows of tokens it had are kept, the others start from ``target_head`` `[V, H]`."""
    if not net.config.reduced_vocab:
        raise ValueError("refresh_vocabulary: this drafter has no reduced vocabulary (EAGLE-1 shares the target's lm_head).")
    draft_ids = draft_ids.to(net.lm_head.weight.device)
    rows = target_head.detach().to(net.lm_head.weight)[draft_ids].clone()  # [V', H]
    was = torch.full((net.config.vocab_size,), -1, dtype=torch.long, device=draft_ids.device)  # [V] old draft id
    was[net.target_ids()] = torch.arange(net.config.draft_vocab_size, device=was.device)
    old_pos = was[draft_ids]  # [V'] the old row of every new token, -1 for new ones
    kept = old_pos >= 0
    rows[kept] = net.lm_head.weight.detach()[old_pos[kept]]
    net.config.draft_vocab_size = len(draft_ids)
    net.lm_head = torch.nn.Linear(rows.shape[1], len(draft_ids), bias=False).to(rows)
    with torch.no_grad():
        net.lm_head.weight.copy_(rows)
    net.d2t = torch.zeros(len(draft_ids), dtype=torch.long, device=net.t2d.device)
    _set_vocabulary(net, draft_ids)


def _set_vocabulary(net: EagleDraftModel, draft_ids: torch.Tensor) -> None:
    with torch.no_grad():
        net.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
        net.t2d.zero_()
        net.t2d[draft_ids] = True
