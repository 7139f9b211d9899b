"""Training DFlash block drafters: the run's settings, the network's start, and the block objective.

The objective is the published DFlash recipe (Chen, Liang & Liu 2026, "DFlash: Block Diffusion for Flash Speculative
Decoding", arXiv 2602.06036), as its reference trainer implements it: SpecForge (sgl-project/SpecForge)
``specforge/core/dflash.py`` (``OnlineDFlashModel``) and ``scripts/train_dflash.py``, which z-lab's README points to
for training (z-lab/dflash ships inference code only). Read for facts; nothing is copied.

* **Anchors.** Each step draws, per sequence, up to ``anchors`` positions at random (SpecForge ``--num-anchors``,
  default 512) among those whose next token is learnt, sorted; a new draw every time the sequence is read. Anchor ``a``
  makes one window ``[ids[a], mask x (W - 1)]`` at positions ``a .. a + W - 1`` (the mask-token window; ``W`` is the
  block size).
* **What a window sees.** The context features (the target's raw layer outputs at ``target_layer_ids``, projected) at
  positions strictly before its anchor, and its own window, bidirectionally; never another window (SpecForge's
  ``create_dflash_block_mask``). This is exactly what drafting after ``ids[: a + 1]`` shows it, so the training forward
  (``DFlashDraftModel.forward_blocks``) and :meth:`DFlashDraftModel.forward` agree window by window (tested).
* **Labels and weights.** Window position ``k >= 1`` predicts the token at ``a + k``; position 0 (the anchor) is never
  learnt, nor a label outside the learnt tokens. The loss is the weighted mean cross-entropy with weight
  ``exp(-(k - 1) / gamma)`` (the paper's Eq. 4; SpecForge's ``--loss-decay-gamma``, suggested 7 for block 16, 5 for
  10, 4 for 8). Our label is the target's own argmax after ``ids[: a + k]`` (from the feature cache), which is what
  greedy verification compares a draft with; on self-distilled answers it is the answer's next token.
* **Shape.** ``target_layer_ids`` by z-lab's ``build_target_layer_ids(num_target_layers, n)``: ``n`` ids spread over
  layers ``1 .. num_target_layers - 3`` (the middle layer for ``n = 1``). The drafter is the target's own layer shape
  (Qwen3-like: heads, head size, MLP width, RMSNorm epsilon, RoPE theta), ``num_hidden_layers`` deep; its weights start
  from N(0, ``initializer_range``) (SpecForge builds it from the target's config and trains it from scratch); the
  target's embedding (the window) and lm_head (the logits) are frozen and not part of it.

Defaults and where they come from: block size 8 (vLLM speculators' and NVIDIA ModelOpt's DFlash default; z-lab's
releases use 16) with ``gamma = 4`` (SpecForge's suggestion for 8); 2 drafter layers (SpecForge's default is 1; z-lab's
releases have 5, too slow to draft on a CPU); 5 target layers (every z-lab release reads 5, e.g. Qwen3-8B's
``[1, 9, 17, 25, 33]``; for SmolLM2-135M's 30 layers ``[1, 8, 14, 20, 27]``); AdamW, learning rate 6e-4, warm-up 4% of
the steps, gradient norm clipped at 1.0 (SpecForge's defaults); a cosine decay to 10% as ``train-eagle``'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from .. import compat
from ..drafters.dflash.config import LAYER_TYPES, MAX_BLOCK_SIZE, DFlashConfig
from ..drafters.dflash.model import DFlashDraftModel
from .config import TARGET_DTYPES

STATE = "checkpoint"
LOG = "train_log.jsonl"
GAMMA_BY_BLOCK = {16: 7.0, 10: 5.0, 8: 4.0}  # SpecForge's suggested decay per block size


@dataclasses.dataclass
class DFlashTrainConfig:
    """What ``hf-speculative train-dflash`` does (saved as ``OUT/train_config.json``).

    Args:
        target, data, out: the target (registry name or folder), JSONL files (as ``train-eagle``), output folder.
        block_size (`int`, 8): the window: the anchor and ``block_size - 1`` drafted positions.
        layers (`int`, 2): drafter decoder layers.
        target_layers (`int`, 5): how many target layers the drafter reads, spread as z-lab's
            ``build_target_layer_ids``; ``target_layer_ids`` (`list[int]`, *optional*) names them instead.
        mask_token_id (`int`, *optional*): the window's filler token; default the tokenizer's mask token when it has one
            inside the vocabulary, else the last vocabulary id (:meth:`DFlashConfig.for_target`).
        anchors (`int`, 512): windows drawn per sequence and step (SpecForge ``--num-anchors``).
        gamma (`float`, *optional*): the loss decay ``exp(-(k - 1) / gamma)``; default SpecForge's suggestion for the
            block size (7 for 16, 5 for 10, 4 for 8), else ``block_size / 2``; 0 weighs every position alike.
        epochs (`float`, 6), lr (`float`, 6e-4), warmup (`float`, 0.04: a fraction of the steps), max_grad_norm
            (`float`, 1.0), grad_accum (`int`, 1), batch_size (`int`, 1), max_length (`int`, 1024): the optimisation.
        val_every (`int`, 20): one example in ``val_every`` is held out. eval_every (`int`, 200): optimizer steps
            between validations and checkpoints. val_prompts (`int`, 8), val_new_tokens (`int`, 64): the real tau on
            held-out prompts (greedy, chains of every drafted position, no cost rule).
        max_minutes (`float`, *optional*): stop training after this much wall time (then validate and save).
        save_minutes (`float`, 10): training minutes between saves of the training state besides the
            validations' (no validation, no drafter written): a run killed between two validations resumes at most
            this far behind; ``None``: at validations only.
        save_dtype (`str`, ``"float32"``): the dtype of the saved drafter (``float16`` or ``bfloat16`` to ship).
        draft_vocab (`int`, *optional*): save a draft vocabulary of this many ids with the drafter: the most frequent
            tokens of the training examples (``draft_vocab.safetensors``; the drafter then reads only those
            rows of the lm_head: on a CPU about half a drafting step). Training itself uses the whole vocabulary
            unless ``loss_vocab="draft"``.
        loss_vocab (`str`, ``"full"``): the vocabulary the loss reads. ``"full"``: the target's whole lm_head (the
            paper's, SpecForge's). ``"draft"`` (needs ``draft_vocab``): only the draft vocabulary's rows, as EAGLE-3
            trains and as the shipped drafter drafts: labels outside it are not learnt (the drafter can never propose
            them) and count as misses in the metrics; the vocabulary product, about half of a CPU training step on
            a 49k vocabulary, shrinks by the ratio of the vocabularies.
        features (`str`, ``"cache"``), feature_batch_tokens, feature_cache, target_dtype, threads, seed,
            max_examples: as ``train-eagle``'s.
    """

    target: str
    data: list[str]
    out: str
    block_size: int = 8
    layers: int = 2
    target_layers: int = 5
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    anchors: int = 512
    gamma: float | None = None
    epochs: float = 6.0
    lr: float = 6e-4
    warmup: float = 0.04
    max_grad_norm: float = 1.0
    grad_accum: int = 1
    batch_size: int = 1
    max_length: int = 1024
    val_every: int = 20
    eval_every: int = 200
    val_prompts: int = 8
    val_new_tokens: int = 64
    max_minutes: float | None = None
    save_dtype: str = "float32"
    draft_vocab: int | None = None
    loss_vocab: str = "full"
    features: str = "cache"
    feature_batch_tokens: int | None = None
    feature_cache: str | None = None
    target_dtype: str | None = None
    threads: int | None = None
    seed: int = 0
    max_examples: int | None = None
    save_minutes: float | None = 10.0

    def __post_init__(self):
        if isinstance(self.data, str):
            self.data = [self.data]
        if not self.data:
            raise ValueError("DFlashTrainConfig(data=[]): give at least one JSONL file (--data).")
        if not 2 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"DFlashTrainConfig(block_size={self.block_size}): must be 2 to {MAX_BLOCK_SIZE} (the "
                             "anchor and 1 to 64 drafted positions); the recipe uses 8 or 16.")
        if self.target_layer_ids is not None:
            ids = list(self.target_layer_ids)
            if not ids or len(set(ids)) != len(ids) or any(not isinstance(i, int) or i < 0 for i in ids):
                raise ValueError(f"DFlashTrainConfig(target_layer_ids={self.target_layer_ids}): must be distinct "
                                 "layer indices >= 0, e.g. 1,8,14,20,27.")
            self.target_layer_ids = ids
        if self.gamma is None:
            self.gamma = GAMMA_BY_BLOCK.get(self.block_size, self.block_size / 2)
        if self.features not in ("cache", "online"):
            raise ValueError(f"DFlashTrainConfig(features={self.features!r}): use 'cache' or 'online'.")
        if self.feature_cache is not None and self.features == "online":
            raise ValueError(f"{type(self).__name__}(feature_cache={self.feature_cache!r}, features='online'): a shared "
                             "cache is read from disk; drop --features online or --feature-cache.")
        if self.features == "online" and self.feature_batch_tokens is not None:
            raise ValueError("DFlashTrainConfig(features='online', feature_batch_tokens=...): the feature cache's batch "
                             "does not apply online; drop --feature-batch-tokens or use --features cache.")
        if self.draft_vocab is not None:
            from ..drafters.dflash.checkpoints import MAX_DRAFT_VOCAB

            if not isinstance(self.draft_vocab, int) or not 1 <= self.draft_vocab <= MAX_DRAFT_VOCAB:
                raise ValueError(f"DFlashTrainConfig(draft_vocab={self.draft_vocab!r}): must be 1 to {MAX_DRAFT_VOCAB} "
                                 "ids (the recipe: 8192 for a 49k vocabulary), or None for the whole vocabulary.")
        if self.loss_vocab not in ("full", "draft"):
            raise ValueError(f"DFlashTrainConfig(loss_vocab={self.loss_vocab!r}): use 'full' (the whole vocabulary) "
                             "or 'draft' (the draft vocabulary's rows).")
        if self.loss_vocab == "draft" and self.draft_vocab is None:
            raise ValueError("DFlashTrainConfig(loss_vocab='draft'): the loss reads the draft vocabulary, so give its "
                             "size too (--draft-vocab 8192), or use --loss-vocab full.")
        if self.save_dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"DFlashTrainConfig(save_dtype={self.save_dtype!r}): use float32, float16 or bfloat16.")
        if self.target_dtype not in TARGET_DTYPES:
            raise ValueError(f"DFlashTrainConfig(target_dtype={self.target_dtype!r}): use float32, bfloat16, float16 "
                             "or auto (the checkpoint's own).")
        checks = {"layers": 1 <= self.layers <= 64, "target_layers": 1 <= self.target_layers <= 64,
                  "anchors": self.anchors >= 1, "gamma": self.gamma >= 0, "epochs": self.epochs > 0,
                  "lr": self.lr > 0, "warmup": 0 <= self.warmup < 1, "max_grad_norm": self.max_grad_norm >= 0,
                  "grad_accum": self.grad_accum >= 1, "batch_size": self.batch_size >= 1,
                  "max_length": self.max_length >= 2 * self.block_size, "val_every": self.val_every >= 2,
                  "eval_every": self.eval_every >= 1, "val_prompts": self.val_prompts >= 0,
                  "val_new_tokens": self.val_new_tokens >= 1,
                  "max_minutes": self.max_minutes is None or self.max_minutes > 0,
                  "save_minutes": self.save_minutes is None or self.save_minutes > 0,
                  "mask_token_id": self.mask_token_id is None or self.mask_token_id >= 0,
                  "feature_batch_tokens": self.feature_batch_tokens is None or self.feature_batch_tokens >= 1}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"DFlashTrainConfig: invalid {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)} "
                             "(max_length must hold two blocks).")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def build_target_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """z-lab's rule: ``count`` target layers evenly spread over ``1 .. num_target_layers - 3``, the middle one for a
    single layer (``build_target_layer_ids`` in z-lab/dflash and SpecForge). Refused where it would read the last layer
    or repeat one (a target too shallow for ``count``)."""
    if count == 1:
        ids = [num_target_layers // 2]
    else:
        start, end = 1, num_target_layers - 3
        ids = [round(start + i * (end - start) / (count - 1)) for i in range(count)]
    if len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= num_target_layers - 1:
        raise ValueError(f"{count} target layers do not spread over a target of {num_target_layers} layers (they would "
                         f"be {ids}); use fewer (--target-layers) or name them (--target-layer-ids), before its last "
                         f"layer {num_target_layers - 1}.")
    return ids


def _rope_theta(text: Any) -> float | None:
    theta = getattr(text, "rope_theta", None)
    params = getattr(text, "rope_parameters", None)
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    return None if theta is None else float(theta)


def network_config(cfg: DFlashTrainConfig, target: Any, tokenizer: Any = None) -> DFlashConfig:
    """The drafter's shape for ``target`` (its layer shape, ``cfg``'s depth, block and layers), checked against it."""
    text = compat.text_config(target.config)
    depth = int(text.num_hidden_layers)
    ids = cfg.target_layer_ids if cfg.target_layer_ids is not None else build_target_layer_ids(depth, cfg.target_layers)
    vocab = int(text.vocab_size)
    mask = cfg.mask_token_id
    if mask is None:
        own = getattr(tokenizer, "mask_token_id", None)
        mask = own if isinstance(own, int) and 0 <= own < vocab else vocab - 1
    fields: dict[str, Any] = dict(num_hidden_layers=cfg.layers, target_layer_ids=ids, block_size=cfg.block_size,
                                  mask_token_id=mask,
                                  max_position_embeddings=int(getattr(text, "max_position_embeddings", 32768)))
    theta = _rope_theta(text)
    if theta is not None:
        fields["rope_theta"] = theta
    act = getattr(text, "hidden_act", "silu")
    if act in ("silu", "gelu", "gelu_pytorch_tanh", "relu"):
        fields["hidden_act"] = act
    config = DFlashConfig.for_target(target.config, **fields)
    assert config.layer_types is None or set(config.layer_types) <= set(LAYER_TYPES)
    config.check_target(target)
    return config


def new_network(cfg: DFlashTrainConfig, target: Any, tokenizer: Any = None) -> DFlashDraftModel:
    """A fresh drafter for ``target``: linear weights ~ N(0, the target's ``initializer_range``), norms at one (how a
    transformers model of the target's family initialises; SpecForge trains from there), float32."""
    net = DFlashDraftModel(network_config(cfg, target, tokenizer))
    std = float(getattr(compat.text_config(target.config), "initializer_range", 0.02) or 0.02)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, std)
                if module.bias is not None:
                    module.bias.zero_()
    return net.float()


def window_embedder(target: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The window's embedding as drafting computes it (``DFlashCandidateGenerator._embed`` with ``embed_scale=None``):
    the target's embedding module, without an ``embed_norm``; float32."""
    embed = target.get_input_embeddings()
    if getattr(embed, "embed_norm", None) is None:
        return lambda ids: embed(ids).float()
    scale = getattr(embed, "embed_scale", 1.0)
    return lambda ids: (F.embedding(ids, embed.weight) * scale).float()


def sample_anchors(loss_mask: torch.Tensor, count: int, generator: torch.Generator | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``count`` anchors per row, drawn uniformly without replacement among the positions whose next token is
    learnt (``loss_mask[b, a] = 1``), sorted: ``(anchors [B, N], keep [B, N])``; ``keep`` is False on the filler of rows
    with fewer candidates (their anchor is 0). ``N`` is at most ``count`` and at least 1."""
    valid = loss_mask > 0  # [B, T]
    available = valid.sum(dim=1)  # [B]
    n = max(1, min(count, int(available.max())))
    noise = torch.rand(valid.shape, generator=generator, device=loss_mask.device)
    noise = torch.where(valid, noise, torch.full_like(noise, 2.0))  # candidates first, in a random order
    chosen = noise.argsort(dim=1)[:, :n]  # [B, N]
    keep = torch.arange(n, device=loss_mask.device)[None, :] < available[:, None]  # [B, N]
    chosen = torch.where(keep, chosen, torch.zeros_like(chosen))
    order = torch.where(keep, chosen, torch.full_like(chosen, loss_mask.shape[1])).argsort(dim=1)
    return chosen.gather(1, order), keep.gather(1, order)


@dataclasses.dataclass
class BlockMetrics:
    """One batch's figures: ``loss``; per drafted position ``k = 1 .. W - 1``, ``correct[k - 1]`` of ``counts[k - 1]``
    labels the argmax got right; ``run_sum`` / ``runs``: mean count of leading correct positions over windows whose
    positions are all learnt (a chain's accepted drafts)."""

    loss: float
    correct: list[float]
    counts: list[int]
    run_sum: float
    runs: int


def block_inputs(ids: torch.Tensor, loss_mask: torch.Tensor, top: torch.Tensor, anchors: torch.Tensor,
                 keep: torch.Tensor, block_size: int, mask_token_id: int) -> dict[str, torch.Tensor]:
    """The windows of ``anchors`` `[B, N]` over sequences ``ids`` `[B, T]`.

    Returns:
        ``window_ids`` `[B, N * W]` (anchor token, then mask tokens), ``positions`` `[B, T + N * W]` (the context's,
        then the windows'), ``allowed`` bool `[B, N * W, T + N * W]` (a window sees context positions before its
        anchor and its own window), ``labels`` `[B, N, W]` (``top[a + k - 1]``) and ``valid`` bool `[B, N, W]` (a
        learnt label, ``k >= 1``, inside the sequence, a kept anchor).
    """
    b, t = ids.shape
    n, w, device = anchors.shape[1], block_size, ids.device
    offsets = torch.arange(w, device=device)
    window_ids = torch.full((b, n, w), mask_token_id, dtype=ids.dtype, device=device)
    window_ids[:, :, 0] = ids.gather(1, anchors)
    block_positions = anchors[:, :, None] + offsets  # [B, N, W]
    positions = torch.cat([torch.arange(t, device=device).expand(b, t), block_positions.reshape(b, n * w)], dim=1)
    window_of = torch.arange(n, device=device).repeat_interleave(w)  # [Q]: each query's window
    sees_context = torch.arange(t, device=device)[None, None, :] < anchors.repeat_interleave(w, dim=1)[:, :, None]
    own = (window_of[:, None] == window_of[None, :]).expand(b, -1, -1)  # [B, Q, Q]
    allowed = torch.cat([sees_context & keep.repeat_interleave(w, dim=1)[:, :, None], own], dim=2)
    at = (block_positions - 1).clamp(0, t - 1)  # [B, N, W]: the position whose next token labels k
    inside = (block_positions < t) & (offsets > 0)
    labels = top.gather(1, at.reshape(b, -1)).view(b, n, w)
    learnt = loss_mask.gather(1, at.reshape(b, -1)).view(b, n, w) > 0
    valid = inside & learnt & keep[:, :, None]
    return {"window_ids": window_ids.reshape(b, n * w), "positions": positions, "allowed": allowed, "labels": labels,
            "valid": valid}


def dflash_loss(net: DFlashDraftModel, embed: Callable, head_weight: torch.Tensor, ids: torch.Tensor,
                loss_mask: torch.Tensor, features: torch.Tensor, top: torch.Tensor, anchors: int, gamma: float,
                generator: torch.Generator | None = None, vocab: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, BlockMetrics]:
    """DFlash's block loss on a batch (see the module doc).

    Args:
        net (`DFlashDraftModel`): the drafter being trained.
        embed (callable): ids `[B, L]` -> float32 embeddings `[B, L, H]` (:func:`window_embedder`).
        head_weight (`torch.Tensor` of shape `[V, H]`): the target's lm_head, float32.
        ids, loss_mask, top (`[B, T]`): tokens, ``loss_mask[q] = 1`` where ``ids[q + 1]`` is learnt (0 on padding),
            the target's argmax at every position. features (`[B, T, F]`): its features at ``target_layer_ids``.
        anchors (`int`): windows per sequence; gamma (`float`): the decay (0: uniform).
        vocab (`torch.LongTensor` of shape `[V_d]`, *optional*): the draft vocabulary (sorted target ids): the logits
            are its rows' only, labels outside it are left out of the loss and count as misses.

    Returns:
        ``(loss, metrics)``; the loss is a float32 scalar (zero without a learnt label).
    """
    config = net.config
    w = config.block_size
    picked, keep = sample_anchors(loss_mask, anchors, generator)
    inputs = block_inputs(ids, loss_mask, top, picked, keep, w, config.mask_token_id)
    hidden = net.forward_blocks(embed(inputs["window_ids"]), features.float(), inputs["positions"],
                                inputs["allowed"], width=w)  # [B, N * W, H]
    b, n = picked.shape
    hidden = hidden.view(b, n, w, -1)
    valid, labels = inputs["valid"], inputs["labels"]
    k = torch.arange(w, device=ids.device)
    weight = torch.exp(-(k - 1).clamp(min=0).float() / gamma) if gamma > 0 else torch.ones(w, device=ids.device)
    targets, weights = labels[valid], weight.expand(b, n, w)[valid]  # [M] each
    head = head_weight
    if vocab is not None:  # target ids -> draft ids, -1 outside the draft vocabulary
        to_draft = torch.full((head_weight.shape[0],), -1, dtype=torch.long, device=ids.device)
        to_draft[vocab] = torch.arange(vocab.numel(), device=ids.device)
        targets, head = to_draft[targets], head_weight[vocab]
    logits = hidden[valid] @ head.T  # [M, V or V_d]: only the learnt positions reach the vocabulary
    if vocab is not None:  # the labels the draft vocabulary can propose (no copy of the whole vocabulary's logits)
        learnt = targets >= 0
        logits_learnt, targets_learnt, weights = logits[learnt], targets[learnt], weights[learnt]
    else:
        logits_learnt, targets_learnt = logits, targets
    if logits_learnt.shape[0] == 0:
        loss = hidden.sum() * 0.0
    else:
        loss = (F.cross_entropy(logits_learnt.float(), targets_learnt, reduction="none") * weights).sum() / weights.sum()
    with torch.no_grad():
        right = torch.zeros(b, n, w, dtype=torch.bool, device=ids.device)
        right[valid] = logits.argmax(-1) == targets
        correct = [float(right[:, :, j].sum()) for j in range(1, w)]
        counts = [int(valid[:, :, j].sum()) for j in range(1, w)]
        full = valid[:, :, 1:].all(dim=-1)  # [B, N]: windows labelled throughout
        run = right[:, :, 1:].int().cumprod(dim=-1).sum(dim=-1)  # leading correct positions
        metrics = BlockMetrics(float(loss.detach()), correct, counts, float(run[full].sum()), int(full.sum()))
    return loss, metrics


def tau_estimate(run_sum: float, runs: int) -> float:
    """Teacher-forced tau of chains of every drafted position: 1 + mean accepted drafts per window."""
    return round(1.0 + run_sum / runs, 3) if runs else 1.0


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to 10% at ``total_steps`` (as ``train-eagle``)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    done = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))


def draft_vocabulary_all_tokens(examples: list, size: int) -> torch.Tensor:
    """The ``size`` most frequent tokens of ``examples``, sorted (ties: the lower id). Unlike
    :func:`~hf_speculative.training.data.draft_vocabulary` (EAGLE-3's: learnt tokens only, EOS always, filled up to
    ``size``), every token counts, prompts included: answers copy their prompts' words (on the shipped DFlash
    drafter's data 8,192 ids of every token cover 93.5% of held-out answer tokens, of learnt tokens only 92.4%), and
    a DFlash drafter does not need a complete map (its vocabulary may be smaller than ``size``)."""
    counts: Counter = Counter()
    for example in examples:
        counts.update(example.ids)
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]
    return torch.tensor(sorted(t for t, _ in top), dtype=torch.long)


def vocabulary_coverage(examples: list, ids: torch.Tensor) -> float:
    """The share of ``examples``' learnt tokens inside ``ids`` (1.0 when they learn none)."""
    from .data import token_frequencies

    counts = token_frequencies(examples)
    inside = set(ids.tolist())
    total = sum(counts.values())
    return sum(n for t, n in counts.items() if t in inside) / total if total else 1.0
