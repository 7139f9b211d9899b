"""Training Medusa heads (Medusa-1: the target frozen), on the same pieces as ``train-eagle``: the data readers,
the feature cache (the target's normed last hidden state and argmax at every position), the epoch order,
``accelerate``'s loop and its checkpoint/resume.

Head ``k`` (0-based) reads the hidden state ``h_q`` at position ``q`` and is taught the target's own choice two
positions further on, ``top[q + k + 1]`` (the target's argmax after ``ids[: q + k + 2]``: the token verification
compares its guess with), where that token is learnt (``loss_mask[q + k + 1]``). The loss is Medusa-1's,
``sum_k decay^k * CE_k`` over a random subset of ``positions`` positions per batch (a vocabulary head per
position and head is most of the cost on a CPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.nn import functional as F

from ..drafters.medusa.config import MedusaConfig
from ..drafters.medusa.model import MedusaHeads

STATE = "checkpoint"
LOG = "train_log.jsonl"


@dataclasses.dataclass
class MedusaTrainConfig:
    """What ``hf-speculative train-medusa`` does (saved as ``OUT/train_config.json``).

    Args:
        target, data, out: the target (registry name or folder), JSONL files (as ``train-eagle``), output folder.
        heads (`int`, 4), layers (`int`, 1), lm_head (`str`, ``"target"``): the heads' shape (see ``MedusaConfig``).
        decay (`float`, 0.8): head ``k``'s loss weight is ``decay ** k`` (Medusa-1's lambda).
        positions (`int`, 512): positions learnt per batch, drawn at random among the learnt ones.
        max_minutes (`float`, *optional*): stop training after this much wall time (then validate and save).
        save_minutes (`float`, 10): training minutes between saves of the training state besides the
            validations' (no validation, no drafter written): a run killed between two validations resumes at most
            this far behind; ``None``: at validations only.
        tree_nodes (`int`, 16): size of the static tree calibrated on the validation ranks (``tree.json``).
        features (`str`, ``"cache"``), feature_cache (`str`, *optional*): as ``train-eagle``'s.
    """

    target: str
    data: list[str]
    out: str
    heads: int = 4
    layers: int = 1
    lm_head: str = "target"
    decay: float = 0.8
    epochs: float = 1.0
    lr: float = 1e-3
    warmup: int = 20
    grad_accum: int = 1
    batch_size: int = 1
    max_length: int = 1024
    positions: int = 512
    val_every: int = 20
    eval_every: int = 200
    val_prompts: int = 4
    val_new_tokens: int = 64
    tree_nodes: int = 16
    max_examples: int | None = None
    max_minutes: float | None = None
    threads: int | None = None
    seed: int = 0
    features: str = "cache"
    feature_cache: str | None = None
    save_minutes: float | None = 10.0

    def __post_init__(self):
        if isinstance(self.data, str):
            self.data = [self.data]
        if not self.data:
            raise ValueError("MedusaTrainConfig(data=[]): give at least one JSONL file (--data).")
        MedusaConfig(num_heads=self.heads, hidden_size=1, vocab_size=1, num_layers=self.layers, lm_head=self.lm_head)
        if self.features not in ("cache", "online"):
            raise ValueError(f"MedusaTrainConfig(features={self.features!r}): use 'cache' or 'online'.")
        if self.feature_cache is not None and self.features == "online":
            raise ValueError(f"{type(self).__name__}(feature_cache={self.feature_cache!r}, features='online'): a shared "
                             "cache is read from disk; drop --features online or --feature-cache.")
        checks = {"decay": 0 < self.decay <= 1, "epochs": self.epochs > 0, "lr": self.lr > 0, "grad_accum": self.grad_accum >= 1,
                  "batch_size": self.batch_size >= 1, "max_length": self.max_length >= 8, "positions": self.positions >= 1,
                  "val_every": self.val_every >= 2, "eval_every": self.eval_every >= 1, "tree_nodes": 1 <= self.tree_nodes <= 64,
                  "max_minutes": self.max_minutes is None or self.max_minutes > 0,
                  "save_minutes": self.save_minutes is None or self.save_minutes > 0}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"MedusaTrainConfig: invalid {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)}.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def head_logits(heads: MedusaHeads, state: torch.Tensor, k: int, head_weight: torch.Tensor) -> torch.Tensor:
    """Head ``k``'s logits `[N, V]` from its state `[N, H]`; ``head_weight`` `[V, H]` is the target's lm_head."""
    if heads.config.lm_head == "per_head":
        return heads.lm_heads[k](state)
    if heads.config.lm_head == "shared":
        return heads.lm_head(state)
    return state @ head_weight.T


def medusa_loss(heads: MedusaHeads, final: torch.Tensor, top: torch.Tensor, mask: torch.Tensor,
                head_weight: torch.Tensor, decay: float = 0.8, positions: int | None = None,
                generator: torch.Generator | None = None):
    """Medusa-1's loss and per-head top-1 agreement.

    Args:
        final (`[B, T, H]`): the target's normed last hidden states; ``top`` `[B, T]`: its argmax at each position;
        mask (`[B, T]`): ``loss_mask`` (``mask[q]``: the token after ``q`` is learnt; 0 on padding).
        positions (`int`, *optional*): learn this many positions at most, drawn at random (all by default).
        generator (`torch.Generator`, *optional*): what draws them (on ``final``'s device; the global one by default).

    Returns:
        ``(loss, correct [K], counts [K])``: head ``k`` counts ``correct[k]`` of ``counts[k]`` guesses right.
    """
    K, T = heads.config.num_heads, final.shape[1]
    rows, cols = torch.nonzero(mask[:, 1:] > 0, as_tuple=True)  # positions q whose head 0 has a label at q + 1
    if positions is not None and rows.numel() > positions:
        keep = torch.randperm(rows.numel(), device=rows.device, generator=generator)[:positions]
        rows, cols = rows[keep], cols[keep]
    states = heads(final[rows, cols].float())  # [K, N, H]
    loss = final.new_zeros((), dtype=torch.float32)
    correct, counts = [], []
    for k in range(K):
        at = cols + k + 1  # the label's position
        valid = at < T
        valid[valid.clone()] &= mask[rows[valid], at[valid]] > 0
        labels = top[rows[valid], at[valid]]  # [N_k]
        if labels.numel() == 0:
            correct.append(0), counts.append(0)
            continue
        logits = head_logits(heads, states[k][valid], k, head_weight)  # [N_k, V]
        loss = loss + decay ** k * F.cross_entropy(logits.float(), labels)
        correct.append(int((logits.argmax(-1) == labels).sum()))
        counts.append(int(labels.numel()))
    return loss, correct, counts


def new_heads(cfg: MedusaTrainConfig, target: Any) -> MedusaHeads:
    """Heads shaped for ``target``, initialised as Medusa does: blocks zero (the identity), vocabulary heads from
    the target's lm_head, so every head starts as the target's own next-token guess."""
    heads = MedusaHeads(MedusaConfig.for_target(target.config, cfg.heads, num_layers=cfg.layers, lm_head=cfg.lm_head,
                                                target=cfg.target))
    with torch.no_grad():
        for block in heads.blocks:
            for layer in block.layers:
                layer.weight.zero_()
                layer.bias.zero_()
        weight = target.get_output_embeddings().weight.float()
        for head in ([heads.lm_head] if cfg.lm_head == "shared" else list(getattr(heads, "lm_heads", []))):
            head.weight.copy_(weight)
    return heads.float()


@torch.no_grad()
def validate(heads: MedusaHeads, source, indices: list[int], examples, head_weight: torch.Tensor) -> dict:
    """Teacher-forced top-1 per head on held-out examples, and every position's rank path (for the tree)."""
    correct, counts = [0] * heads.config.num_heads, [0] * heads.config.num_heads
    paths = []
    for i in indices:
        _, final, top = source.get(i)
        mask = torch.tensor(examples[i].loss_mask)[None]
        _, c, n = medusa_loss(heads, final[None], top[None], mask, head_weight)
        correct = [a + b for a, b in zip(correct, c)]
        counts = [a + b for a, b in zip(counts, n)]
        paths += rank_paths(heads, final, top, mask[0], head_weight)
    rates = [c / n if n else 0.0 for c, n in zip(correct, counts)]
    return {"val_top1": [round(r, 4) for r in rates], "val_positions": counts[0]}, paths


def rank_paths(heads: MedusaHeads, final: torch.Tensor, top: torch.Tensor, mask: torch.Tensor,
               head_weight: torch.Tensor, max_rank: int = 10) -> list[tuple[int, ...]]:
    """For every learnt position, the ranks of the target's tokens among the heads' guesses, head by head, up
    to the first one outside the top ``max_rank`` (what ``StaticTree.calibrate`` reads)."""
    T = final.shape[0]
    qs = [q for q in range(T - 1) if mask[q + 1] > 0]
    if not qs:
        return []
    states = heads(final[qs].float())  # [K, N, H]
    ranks = []
    for k in range(heads.config.num_heads):
        logits = head_logits(heads, states[k], k, head_weight)  # [N, V]
        guesses = logits.topk(max_rank, dim=-1).indices  # [N, R]
        at = torch.tensor(qs) + k + 1
        label = torch.where(at < T, top[at.clamp(max=T - 1)], -1)
        valid = (at < T) & (mask[at.clamp(max=T - 1)] > 0)
        hit = (guesses == label[:, None]) & valid[:, None]  # [N, R]
        ranks.append(torch.where(hit.any(-1), hit.float().argmax(-1), -1).tolist())
    paths = []
    for n in range(len(qs)):
        path = []
        for k in range(len(ranks)):
            if ranks[k][n] < 0:
                break
            path.append(ranks[k][n])
        if path:
            paths.append(tuple(path))
    return paths


def real_tau(heads: MedusaHeads, target: Any, prompts: list[list[int]], new_tokens: int, tree) -> float:
    """Tokens per target forward when the heads draft (greedy, ``tree`` or chains) on ``prompts``."""
    import hf_speculative as hfs

    from ..drafters.medusa.drafter import Medusa

    drafted = heads.to(next(target.parameters()).dtype)
    strategy = Medusa(drafted, tree=tree, adaptive=False)
    new, forwards = 0, 0
    hfs.enable(target)
    try:
        for prompt in prompts:
            ids = torch.tensor([prompt], device=next(target.parameters()).device)
            out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=new_tokens, candidate_generator=strategy)
            stats = hfs.last_stats(target)
            new += out.shape[1] - ids.shape[1]
            forwards += stats.target_forwards
    finally:
        hfs.disable(target)
        heads.float()
    return round(new / max(forwards, 1), 3)
