"""``train_dflash``: the accelerate loop of ``train-eagle`` (``loop.py``) for DFlash block drafters (``dflash.py``).

Same data readers, feature cache (``OUT/cache``: the target's raw layer outputs at ``target_layer_ids`` and its argmax,
built once by :class:`~hf_speculative.training.data.FeatureCache` as for EAGLE-3's fused layers; or ``--features
online``), epoch order, batches and checkpoint (``OUT/checkpoint``, resumed when present). At every validation the
drafter is written to ``OUT`` in z-lab's format (``config.json`` + ``model.safetensors``: what
``hfs.DFlash.from_pretrained`` reads and vLLM's and SGLang's DFlash support serve), with ``training.json`` (the run and
its last validation), and ``OUT/train_log.jsonl`` gets a line: teacher-forced top-1 per drafted position and the tau it
implies, and the real tau of greedy generation on held-out prompts.
"""

from __future__ import annotations

import copy
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
from .evaluate import greedy_tau
from .dflash import (LOG, STATE, DFlashTrainConfig, dflash_loss, draft_vocabulary_all_tokens, lr_factor, new_network,
                     tau_estimate, vocabulary_coverage, window_embedder)
from .loop import _Progress, float32_pieces, start_run
from .online import OnlineFeatures

TRAINING_FILE = "training.json"


class DFlashStep(torch.nn.Module):
    """The loss as a module's forward (what accelerate wraps in DDP with several processes); the target's embedding
    and lm_head are passed at call time, never parameters here."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, batch: dict[str, torch.Tensor], *, embed, head_weight: torch.Tensor, anchors: int, gamma: float,
                vocab: torch.Tensor | None = None, generator: torch.Generator | None = None):
        loss, metrics = dflash_loss(self.net, embed, head_weight, batch["ids"], batch["loss_mask"], batch["features"],
                                    batch["top"], anchors, gamma, generator=generator, vocab=vocab)
        if not loss.requires_grad:  # nothing learnt in this batch: a zero that reaches every parameter (DDP)
            loss = loss + sum(p.sum() for p in self.net.parameters()) * 0.0
        return loss, metrics


@torch.no_grad()
def teacher_forced(net, embed, head_weight, examples, source, indices, anchors: int, gamma: float,
                   vocab: torch.Tensor | None = None) -> dict:
    """On held-out examples (features from ``source``), every learnt anchor up to ``anchors`` per example: top-1 per
    drafted position and the chain tau it implies (:func:`~hf_speculative.training.dflash.tau_estimate`), over the
    loss's vocabulary (``vocab``: the draft vocabulary's ids). Anchors are drawn with a fixed seed, so validations
    compare."""
    generator = torch.Generator().manual_seed(0)
    device = head_weight.device
    correct = [0.0] * (net.config.block_size - 1)
    counts = [0] * (net.config.block_size - 1)
    run_sum, runs = 0.0, 0
    for i in indices:
        features, _, top = (x.to(device) for x in source.get(i))
        ex = examples[i]
        _, m = dflash_loss(net, embed, head_weight, torch.tensor([ex.ids], device=device),
                           torch.tensor([ex.loss_mask], device=device), features[None], top[None], anchors, gamma,
                           generator=generator if device.type == "cpu" else None, vocab=vocab)
        correct = [a + b for a, b in zip(correct, m.correct)]
        counts = [a + b for a, b in zip(counts, m.counts)]
        run_sum, runs = run_sum + m.run_sum, runs + m.runs
    return {"val_acc": [round(c / n, 4) if n else 0.0 for c, n in zip(correct, counts)],
            "val_tau_teacher_forced": tau_estimate(run_sum, runs)}


@torch.no_grad()
def validation_tau(net: Any, target: Any, examples: list, new_tokens: int = 64) -> float:
    """Mean tokens per target forward of greedy generation drafting with ``net`` (chains of every drafted position,
    no confidence cut, no cost rule: a property of the drafter, not of the machine) on the prompts of ``examples``."""
    from hf_speculative.drafters.dflash.drafter import DFlash

    param = next(target.parameters())
    net = copy.deepcopy(net).to(device=param.device, dtype=param.dtype).eval()
    strategy = DFlash(net, num_tokens=net.config.block_size - 1, confidence_threshold=0.0, adaptive=False)
    return greedy_tau(target, strategy, examples, new_tokens)


def _layer_ids_in(directory: Path) -> list[int] | None:
    """The target layers of a drafter saved in ``directory`` by an earlier run (a resume keeps them)."""
    config = directory / "config.json"
    if not config.exists():
        return None
    extra = json.loads(config.read_text()).get("dflash_config") or {}
    return extra.get("target_layer_ids")


def train_dflash(cfg: DFlashTrainConfig, *, progress: bool = True) -> Path:
    """Train a DFlash drafter as ``cfg`` says; returns its folder (``cfg.out``)."""
    accelerator, tqdm, out, started = start_run(cfg)

    from ..drafters.dflash.checkpoints import save_pretrained
    from ..registry.models import load_model

    dtype = cfg.target_dtype or ("float32" if accelerator.device.type == "cpu" else "auto")
    target, tokenizer = load_model(cfg.target, dtype=dtype)
    target.requires_grad_(False).eval().to(accelerator.device)
    net = new_network(cfg, target, tokenizer).to(accelerator.device)  # checked against the target before any work
    state_dir = out / STATE
    recover(accelerator, state_dir)  # a save that a kill cut short
    resuming = (state_dir / "progress.json").exists()
    saved_ids = _layer_ids_in(out) if resuming else None
    if saved_ids is not None and saved_ids != net.config.target_layer_ids:
        raise ValueError(f"{out} holds a run reading target layers {saved_ids}, this one reads "
                         f"{net.config.target_layer_ids}: resume with the same settings or use another --out.")
    examples = training_examples(cfg.data, tokenizer, cfg.max_length, cfg.max_examples)
    val_idx = [i for i in range(len(examples)) if i % cfg.val_every == 0]
    train_idx = [i for i in range(len(examples)) if i % cfg.val_every != 0]
    if not train_idx:
        raise ValueError(f"train-dflash: {len(examples)} examples leave none to train on after every "
                         f"{cfg.val_every}th is held out; give more data.")
    vocab = None
    if cfg.draft_vocab:  # picked from the training examples only; its coverage measured on the held-out ones
        vocab = draft_vocabulary_all_tokens([examples[i] for i in train_idx], cfg.draft_vocab)
        coverage = vocabulary_coverage([examples[i] for i in val_idx], vocab)
        accelerator.print(f"draft vocabulary: {vocab.numel()} ids, {coverage:.4f} of the held-out learnt tokens")
    layers = net.config.target_layer_ids
    online = None
    if cfg.features == "online":
        source = online = OnlineFeatures(target, examples, layers)
    elif cfg.feature_cache:
        source = FeatureCache.shared(cfg.feature_cache, target, examples, layers, target_name=cfg.target,
                                     batch_tokens=cfg.feature_batch_tokens,
                                     progress=progress and accelerator.is_main_process,
                                     state=accelerator if accelerator.num_processes > 1 else None)
    else:
        source = FeatureCache.build(out / "cache", target, examples, layers,
                                    source=json.dumps([cfg.data, cfg.max_length, cfg.max_examples, cfg.target]),
                                    batch_tokens=cfg.feature_batch_tokens,
                                    progress=progress and accelerator.is_main_process,
                                    state=accelerator if accelerator.num_processes > 1 else None)
    optimizer = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=0.0)
    order = EpochOrder([len(examples[i].ids) for i in train_idx], cfg.batch_size, cfg.seed)
    loader = torch.utils.data.DataLoader(CachedExamples(examples, source if online is None else None, train_idx),
                                         batch_size=cfg.batch_size, sampler=order, collate_fn=pad_batch)
    processes = accelerator.num_processes
    per_process = math.ceil(math.ceil(len(train_idx) / cfg.batch_size) / processes)
    total_steps = max(1, math.ceil(per_process * cfg.epochs / cfg.grad_accum))
    warmup_steps = max(1, round(cfg.warmup * total_steps))
    # accelerate steps the scheduler once per process per optimizer step
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s // processes, warmup_steps, total_steps))
    model, optimizer, loader, scheduler = accelerator.prepare(DFlashStep(net), optimizer, loader, scheduler)
    accelerator.register_for_checkpointing(_Progress())
    embed = window_embedder(target)
    _, head_weight = float32_pieces(target)
    loss_vocab = vocab.to(accelerator.device) if cfg.loss_vocab == "draft" else None  # the loss's rows (None: all)
    (out / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")

    step, done_batches, seconds_before = 0, 0, 0.0
    if resuming:
        accelerator.load_state(str(state_dir))
        saved = json.loads((state_dir / "progress.json").read_text())
        step, done_batches, seconds_before = saved["step"], saved["batches"], saved.get("train_seconds", 0.0)
        accelerator.print(f"resumed from {state_dir} at optimizer step {step}")
    clock = TrainClock(seconds_before)
    saves = Saves(accelerator, state_dir, clock, cfg.save_minutes)

    def save_progress() -> None:
        """The state to resume from: accelerate's (weights, optimizer, scheduler, RNGs) and our counters."""
        saves.save({"step": step, "batches": done_batches})

    def evaluate_and_save() -> dict:
        accelerator.wait_for_everyone()
        record: dict[str, Any] = {"step": step, "seconds": round(time.perf_counter() - started, 1),
                                  "train_seconds": round(clock.seconds, 1)}
        if accelerator.is_main_process:
            drafter = accelerator.unwrap_model(model).net.eval()
            record.update(teacher_forced(drafter, embed, head_weight, examples, source, val_idx[:64], cfg.anchors,
                                         cfg.gamma, loss_vocab))
            prompts = [examples[i] for i in val_idx[: cfg.val_prompts]]
            if vocab is not None:
                record.update(draft_vocab=vocab.numel(), val_vocab_coverage=round(coverage, 4))
            if prompts:  # with the vocabulary it ships with (the loss may read the whole one)
                drafter.set_draft_vocab(vocab)
                try:
                    record["val_tau"] = validation_tau(drafter, target, prompts, cfg.val_new_tokens)
                finally:
                    drafter.set_draft_vocab(None)
            drafter.train()
            saved_net = copy.deepcopy(drafter).to(device="cpu", dtype=getattr(torch, cfg.save_dtype))
            saved_net.set_draft_vocab(vocab)
            save_pretrained(saved_net, out)
            meta = {"train_config": cfg.to_dict(), "last_validation": record, "train_examples": len(train_idx),
                    "val_examples": len(val_idx), "processes": processes,
                    "mixed_precision": accelerator.mixed_precision}
            (out / TRAINING_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            with open(out / LOG, "a") as f:
                f.write(json.dumps(record) + "\n")
            accelerator.print(f"step {step}: " + ", ".join(f"{k}={v}" for k, v in record.items() if k != "step"))
        clock.tick("validation")
        save_progress()  # at the end too: a longer run (more --epochs) continues from here
        return record

    model.train()
    bar = tqdm(total=total_steps, initial=step, desc="train-dflash",
               disable=not (progress and accelerator.is_main_process))
    running, out_of_time, record = None, False, None
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
                loss, metrics = model(batch, embed=embed, head_weight=head_weight, anchors=cfg.anchors, gamma=cfg.gamma,
                                      vocab=loss_vocab, generator=draws)
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            done_batches += 1
            clock.tick()
            acc = metrics.correct[0] / max(metrics.counts[0], 1)
            running = acc if running is None else 0.95 * running + 0.05 * acc
            if accelerator.sync_gradients:
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{metrics.loss:.3f}", acc1=f"{running:.3f}",
                                lr=f"{scheduler.get_last_lr()[0]:.1e}")
                out_of_time = budget_spent(clock, cfg.max_minutes, accelerator)
                record = None
                if step % cfg.eval_every == 0 and not out_of_time:
                    record = evaluate_and_save()
                elif not out_of_time and saves.due():
                    save_progress()
    bar.close()
    if record is None:  # unless the last step was just validated and saved
        record = evaluate_and_save()
    if accelerator.is_main_process:
        summary = {"seconds": round(time.perf_counter() - started, 1), "optimizer_steps": step,
                   "total_steps": total_steps, "stopped_by_max_minutes": out_of_time, "final_validation": record}
        (out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out
