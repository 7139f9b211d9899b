"""``train_medusa``: the accelerate loop of ``train-eagle`` (``loop.py``) for Medusa heads (``medusa.py``).

Same data readers, feature cache (``OUT/cache``, or ``--features online``), epoch order, batches, warm-up and
cosine schedule, and checkpoint (``OUT/checkpoint``, resumed when present). At every validation the heads are
saved in our format (``OUT``), with ``training.json``, the per-head top-1, the static tree calibrated on the
validation ranks (``OUT/tree.json``) and the real tau of that tree on held-out prompts.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from .batches import CachedExamples, EpochOrder, batch_generator, pad_batch
from .clock import TrainClock, budget_spent
from .state_files import Saves, recover
from .data import FeatureCache, training_examples
from .loop import _Progress, float32_pieces, start_run
from .medusa import LOG, STATE, MedusaTrainConfig, medusa_loss, new_heads, real_tau, validate
from .online import OnlineFeatures


class MedusaStep(torch.nn.Module):
    """The loss as a module's forward (what accelerate wraps in DDP with several processes)."""

    def __init__(self, heads: torch.nn.Module):
        super().__init__()
        self.heads = heads

    def forward(self, batch: dict[str, torch.Tensor], *, head_weight: torch.Tensor, decay: float, positions: int,
                generator: torch.Generator | None = None):
        loss, correct, counts = medusa_loss(self.heads, batch["final"], batch["top"], batch["loss_mask"], head_weight,
                                            decay, positions, generator)
        if not loss.requires_grad:  # nothing learnt in this batch: a zero that still reaches every parameter
            loss = loss + sum(p.sum() for p in self.heads.parameters()) * 0.0
        return loss, correct, counts


def train_medusa(cfg: MedusaTrainConfig, *, progress: bool = True) -> Path:
    """Train Medusa heads as ``cfg`` says; returns the folder of the heads (``cfg.out``)."""
    accelerator, tqdm, out, started = start_run(cfg)

    from ..drafters.medusa.checkpoints import save_pretrained
    from ..drafters.medusa.drafter import TREE_FILE
    from ..registry.models import load_model
    from ..core.tree_shapes import StaticTree
    target, tokenizer = load_model(cfg.target, dtype="float32" if accelerator.device.type == "cpu" else "auto")
    target.requires_grad_(False).eval().to(accelerator.device)
    examples = training_examples(cfg.data, tokenizer, cfg.max_length, cfg.max_examples)
    val_idx = [i for i in range(len(examples)) if i % cfg.val_every == 0]
    train_idx = [i for i in range(len(examples)) if i % cfg.val_every != 0]
    if not train_idx:
        raise ValueError(f"train-medusa: {len(examples)} examples leave none to train on after every "
                         f"{cfg.val_every}th is held out; give more data.")
    heads = new_heads(cfg, target).to(accelerator.device)
    online = None
    if cfg.features == "online":
        source = online = OnlineFeatures(target, examples, [])
    elif cfg.feature_cache:
        source = FeatureCache.shared(cfg.feature_cache, target, examples, [], target_name=cfg.target,
                                     progress=progress and accelerator.is_main_process,
                                     state=accelerator if accelerator.num_processes > 1 else None)
    else:
        source = FeatureCache.build(out / "cache", target, examples, [],
                                    source=json.dumps([cfg.data, cfg.max_length, cfg.max_examples, cfg.target]),
                                    progress=progress and accelerator.is_main_process,
                                    state=accelerator if accelerator.num_processes > 1 else None)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=0.0)
    order = EpochOrder([len(examples[i].ids) for i in train_idx], cfg.batch_size, cfg.seed)
    loader = torch.utils.data.DataLoader(CachedExamples(examples, source if online is None else None, train_idx),
                                         batch_size=cfg.batch_size, sampler=order, collate_fn=pad_batch)
    processes = accelerator.num_processes
    per_process = math.ceil(math.ceil(len(train_idx) / cfg.batch_size) / processes)
    total_steps = max(1, math.ceil(per_process * cfg.epochs / cfg.grad_accum))

    def lr_at(scheduler_step: int) -> float:  # linear warm-up, cosine decay to 10% (as train-eagle)
        step = scheduler_step // processes
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        done = min((step - cfg.warmup) / max(total_steps - cfg.warmup, 1), 1.0)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    model, optimizer, loader, scheduler = accelerator.prepare(MedusaStep(heads), optimizer, loader, scheduler)
    accelerator.register_for_checkpointing(_Progress())
    _, head_weight = float32_pieces(target)
    (out / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")

    step, done_batches, seconds_before = 0, 0, 0.0
    state_dir = out / STATE
    recover(accelerator, state_dir)  # a save that a kill cut short
    if (state_dir / "progress.json").exists():
        accelerator.load_state(str(state_dir))
        saved = json.loads((state_dir / "progress.json").read_text())
        step, done_batches, seconds_before = saved["step"], saved["batches"], saved.get("train_seconds", 0.0)
        accelerator.print(f"resumed from {state_dir} at optimizer step {step}")
    clock = TrainClock(seconds_before)
    saves = Saves(accelerator, state_dir, clock, cfg.save_minutes)

    def save_progress() -> None:
        """The state to resume from: accelerate's (weights, optimizer, scheduler, RNGs) and our counters."""
        saves.save({"step": step, "batches": done_batches})

    def evaluate_and_save(final: bool = False) -> dict:
        accelerator.wait_for_everyone()
        record: dict[str, Any] = {"step": step, "seconds": round(time.perf_counter() - started, 1),
                                  "train_seconds": round(clock.seconds, 1)}
        if accelerator.is_main_process:
            trained = accelerator.unwrap_model(model).heads.eval()
            metrics, paths = validate(trained, source, val_idx[:64], examples, head_weight)
            record.update(metrics)
            tree = StaticTree.calibrate(paths, cfg.tree_nodes) if paths else None
            if tree is not None:
                record["tree"] = [list(p) for p in tree.paths]
                prompts = [examples[i].ids[: examples[i].prompt_length] for i in val_idx[: cfg.val_prompts]]
                record["val_tau_tree"] = real_tau(trained, target, prompts, cfg.val_new_tokens, tree)
                record["val_tau_chain"] = real_tau(trained, target, prompts, cfg.val_new_tokens, None)
            trained.train()
            meta = {"train_config": cfg.to_dict(), "last_validation": record, "train_examples": len(train_idx),
                    "val_examples": len(val_idx), "processes": processes,
                    "mixed_precision": accelerator.mixed_precision}
            save_pretrained(trained, out, metadata=meta)
            if tree is not None:
                tree.save(out / TREE_FILE)
            with open(out / LOG, "a") as f:
                f.write(json.dumps(record) + "\n")
            accelerator.print(f"step {step}: " + ", ".join(f"{k}={v}" for k, v in record.items()
                                                           if k not in ("step", "tree")))
        clock.tick("validation")
        if not final:
            save_progress()
        return record

    model.train()
    bar = tqdm(total=total_steps, initial=step, desc="train-medusa", disable=not (progress and accelerator.is_main_process))
    running, out_of_time = None, False
    for epoch in range(math.ceil(cfg.epochs)):
        skip = done_batches - epoch * len(loader)
        if skip >= len(loader) or out_of_time:
            continue
        order.use_epoch(epoch)
        for batch in (accelerator.skip_first_batches(loader, skip) if skip > 0 else loader):
            if step >= total_steps or out_of_time:
                break
            if online is not None:
                batch = online.fill(batch)
            with accelerator.accumulate(model):
                draws = batch_generator(accelerator.device, cfg.seed, done_batches, accelerator.process_index)
                loss, correct, counts = model(batch, head_weight=head_weight, decay=cfg.decay, positions=cfg.positions,
                                              generator=draws)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            done_batches += 1
            clock.tick()
            acc = correct[0] / max(counts[0], 1)
            running = acc if running is None else 0.95 * running + 0.05 * acc
            if accelerator.sync_gradients:
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{float(loss.detach()):.3f}", top1_head0=f"{running:.3f}")
                out_of_time = budget_spent(clock, cfg.max_minutes, accelerator)
                if step % cfg.eval_every == 0 and not out_of_time:
                    evaluate_and_save()
                elif not out_of_time and saves.due():
                    save_progress()
    bar.close()
    record = evaluate_and_save(final=True)
    if accelerator.is_main_process:
        summary = {"seconds": round(time.perf_counter() - started, 1), "optimizer_steps": step,
                   "stopped_by_max_minutes": out_of_time, "final_validation": record}
        (out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out
