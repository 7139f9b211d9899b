"""The training loop of hidden-state drafters, on ``accelerate``.

The same code runs on a CPU (``hf-speculative train-eagle ...``), one GPU, or many GPUs and nodes
(``accelerate launch -m hf_speculative train-eagle ...``): ``accelerate`` places the model, shards
the data loader, reduces gradients and saves/restores the full training state for ``--resume``.
The target's features are computed once into a memory-mapped cache (the processes share the chunks),
then every epoch reads them from disk; or, with ``--features online``, by the target for every batch
(nothing on disk; each process for its own batches).

With several processes, every one computes the loss of its own sequences inside the forward of the
module ``accelerate`` wrapped (:class:`TrainingStep`): DDP averages gradients only for work done
inside that forward, so calling the drafter's pieces directly would train each process on its own
shard alone. One optimizer step then covers ``batch_size x grad_accum x processes`` sequences.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .. import compat
from ..drafters.eagle.config import EagleConfig
from ..extras import require
from .clock import TrainClock, budget_spent
from .state_files import Saves, recover
from .config import FEATURE, TrainConfig
from .batches import CachedExamples, EpochOrder, pad_batch
from .data import FeatureCache, training_examples
from .evaluate import validation_tau
from .losses import eagle_loss
from .online import OnlineFeatures
from .resume import check_resume
from .start import initial_network

LOG = "train_log.jsonl"
STATE = "checkpoint"
# how long processes wait for each other (the main one merging answers, validating, saving; the slowest
# finishing its share); torchrun stops them all at once if a process fails, so a long limit never hangs a run
WAIT = datetime.timedelta(hours=24)


def process_state():
    """accelerate's view of this process (rank, count; one process without a launcher), set up
    with the long wait above. Launched processes that did not join one run are refused: each would
    train alone and write the same files."""
    import os

    accelerate = require("accelerate", "train", FEATURE)
    parse_flag_from_env = require("accelerate.utils", "train", FEATURE).parse_flag_from_env

    state = accelerate.PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"), timeout=WAIT)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if state.num_processes != launched:
        raise RuntimeError(
            f"{launched} processes were launched but accelerate runs {state.num_processes} (no GPU for each?). "
            "On CPUs, set ACCELERATE_USE_CPU=1 in the environment of the launcher (e.g. "
            "ACCELERATE_USE_CPU=1 torchrun --nproc_per_node N -m hf_speculative train-eagle ...).")
    return state


def start_run(cfg: Any) -> tuple[Any, Any, Path, float]:
    """The start every training loop shares (``train``, ``train_medusa``, ``train_dflash``): ``cfg.threads`` CPU
    threads when set, the ``cfg.out`` folder made, accelerate's process state (:func:`process_state`), an
    ``Accelerator`` accumulating ``cfg.grad_accum`` batches, every generator seeded with ``cfg.seed``.

    Returns:
        ``(accelerator, tqdm, out, started)``: tqdm's progress bar class, ``cfg.out`` as a ``Path`` and
        ``time.perf_counter()`` at the start.
    """
    Accelerator = require("accelerate", "train", FEATURE).Accelerator
    set_seed = require("accelerate.utils", "train", FEATURE).set_seed
    tqdm = require("tqdm.auto", "train", FEATURE).tqdm

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    process_state()
    accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum)
    set_seed(cfg.seed)
    return accelerator, tqdm, out, time.perf_counter()


class TrainingStep(torch.nn.Module):
    """The training loss of a drafter as a module's forward: what ``accelerate`` prepares (wraps in
    DDP with several processes). The target's embedding and lm_head are passed at call time, so
    they are neither parameters here nor broadcast between processes.

    Args:
        net (`EagleDraftModel`): the drafter being trained (``self.net``).
    """

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net
        self.register_load_state_dict_pre_hook(_unprefixed_checkpoint)

    def forward(self, batch: dict[str, torch.Tensor], *, embed: Callable, head_weight: torch.Tensor,
                inputs, unroll: int, noise: float = 0.0):
        loss, metrics = eagle_loss(self.net, embed, head_weight, batch["ids"], batch["loss_mask"],
                                   inputs(batch["features"]), batch["final"], unroll, noise=noise,
                                   target_top=batch["top"])
        if not loss.requires_grad:  # nothing learnt in this batch: a zero that still reaches every
            loss = loss + sum(p.sum() for p in self.net.parameters()) * 0.0  # parameter, as DDP expects
        return loss, metrics


def _unprefixed_checkpoint(module, state_dict, prefix, *args) -> None:
    """Checkpoints written before the loss ran inside :class:`TrainingStep` hold the drafter's weights
    without its ``net.`` prefix; renamed here, they resume."""
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + "net.")]:
        state_dict[prefix + "net." + key[len(prefix):]] = state_dict.pop(key)


def train(cfg: TrainConfig, *, progress: bool = True) -> Path:
    """Train a drafter as ``cfg`` says; returns the folder of the trained drafter (``cfg.out``)."""
    accelerator, tqdm, out, started = start_run(cfg)

    from ..drafters.eagle import checkpoints
    from ..registry.models import load_model

    dtype = cfg.target_dtype or ("float32" if accelerator.device.type == "cpu" else "auto")  # load_model's default
    target, tokenizer = load_model(cfg.target, dtype=dtype)
    target.requires_grad_(False).eval().to(accelerator.device)
    examples = training_examples(cfg.data, tokenizer, cfg.max_length, cfg.max_examples)
    val_idx = [i for i in range(len(examples)) if i % cfg.val_every == 0]
    train_idx = [i for i in range(len(examples)) if i % cfg.val_every != 0]
    net, warm = initial_network(cfg, target, [examples[i] for i in train_idx])
    eagle_cfg = net.config
    state_dir = out / STATE
    recover(accelerator, state_dir)  # a save that a kill cut short
    if (state_dir / "progress.json").exists():  # a resume: the checkpoint fits this network, checked before any work
        check_resume(state_dir, net, cfg.to_dict())

    online = None
    if cfg.features == "online":  # computed batch by batch, each process its own
        source = online = OnlineFeatures(target, examples, eagle_cfg.target_layers)
    elif cfg.feature_cache:  # one pass of the target for every drafter trained on this data
        source = FeatureCache.shared(cfg.feature_cache, target, examples, eagle_cfg.target_layers, target_name=cfg.target,
                                     batch_tokens=cfg.feature_batch_tokens,
                                     progress=progress and accelerator.is_main_process,
                                     state=accelerator if accelerator.num_processes > 1 else None)
    else:
        source = FeatureCache.build(out / "cache", target, examples, eagle_cfg.target_layers,
                                    source=json.dumps([cfg.data, cfg.max_length, cfg.max_examples, cfg.target]),
                                    batch_tokens=cfg.feature_batch_tokens, progress=progress and accelerator.is_main_process,
                                    state=accelerator if accelerator.num_processes > 1 else None)  # processes share the work

    optimizer = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    order = EpochOrder([len(examples[i].ids) for i in train_idx], cfg.batch_size, cfg.seed)
    loader = torch.utils.data.DataLoader(CachedExamples(examples, source if online is None else None, train_idx),
                                         batch_size=cfg.batch_size, sampler=order, collate_fn=pad_batch)
    processes = accelerator.num_processes
    # accelerate shards the batches evenly, repeating a few if needed
    per_process = math.ceil(math.ceil(len(train_idx) / cfg.batch_size) / processes)
    total_steps = max(1, math.ceil(per_process * cfg.epochs / cfg.grad_accum))

    def lr_at(scheduler_step: int) -> float:  # linear warm-up, cosine decay to 10%
        step = scheduler_step // processes  # accelerate steps the scheduler once per process per optimizer step
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        progress_ = min((step - cfg.warmup) / max(total_steps - cfg.warmup, 1), 1.0)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress_))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    model, optimizer, loader, scheduler = accelerator.prepare(TrainingStep(net), optimizer, loader, scheduler)
    if len(loader) != per_process:
        raise RuntimeError(f"accelerate gave each process {len(loader)} batches per epoch, expected {per_process}")
    accelerator.register_for_checkpointing(_Progress())
    embed, head_weight = float32_pieces(target)
    inputs = drafter_inputs(eagle_cfg, target)
    cfg.save(out / "train_config.json")

    # seen_tokens counts this process's tokens since the start or resume; earlier_tokens, every process's before
    step, earlier_tokens, seen_tokens, done_batches, seconds_before = 0, 0, 0, 0, 0.0
    if (state_dir / "progress.json").exists():
        accelerator.load_state(str(state_dir))
        saved = json.loads((state_dir / "progress.json").read_text())
        step, earlier_tokens, done_batches = saved["step"], saved["tokens"], saved["batches"]
        seconds_before = saved.get("train_seconds", 0.0)  # absent in checkpoints written before --max-minutes
        accelerator.print(f"resumed from {state_dir} at optimizer step {step}")
    clock = TrainClock(seconds_before)  # training time over every run of this --out (--max-minutes counts it)
    saves = Saves(accelerator, state_dir, clock, cfg.save_minutes)

    def save_progress(tokens: int | None = None) -> None:
        """The state to resume from: accelerate's (weights, optimizer, scheduler, RNGs) and our counters."""
        if tokens is None:
            tokens = earlier_tokens + int(accelerator.reduce(torch.tensor(seen_tokens, device=accelerator.device), "sum"))
        saves.save({"step": step, "tokens": tokens, "batches": done_batches})

    def evaluate_and_save(final: bool = False) -> dict:
        accelerator.wait_for_everyone()
        tokens = earlier_tokens + int(accelerator.reduce(torch.tensor(seen_tokens, device=accelerator.device), "sum"))
        record: dict[str, Any] = {"step": step, "tokens": tokens, "seconds": round(time.perf_counter() - started, 1)}
        if accelerator.is_main_process:
            drafter = accelerator.unwrap_model(model).net
            drafter.eval()
            record.update(_teacher_forced(drafter, embed, head_weight, examples, source, val_idx[:64], cfg.unroll, inputs))
            record["val_tau"] = validation_tau(drafter, target, [examples[i] for i in val_idx[: cfg.val_prompts]],
                                               cfg.val_new_tokens, cfg.val_draft)
            drafter.train()
            meta = {"train_config": cfg.to_dict(), "last_validation": record, "warm_start": warm,
                    "train_examples": len(train_idx), "val_examples": len(val_idx), "processes": processes,
                    "mixed_precision": accelerator.mixed_precision}
            checkpoints.save_pretrained(drafter, out, metadata=meta)
            with open(out / LOG, "a") as f:
                f.write(json.dumps(record) + "\n")
            accelerator.print(f"step {step}: " + ", ".join(f"{k}={v}" for k, v in record.items() if k != "step"))
        clock.tick("validation")
        if not final:
            save_progress(tokens)
        return record

    if cfg.init_from is not None and step == 0 and not (state_dir / "progress.json").exists():
        evaluate_and_save(final=True)  # the continued drafter's start, on this run's held-out data: the curve's step 0
    model.train()
    epochs = math.ceil(cfg.epochs)
    bar = tqdm(total=total_steps, initial=step, desc="train-eagle",
               disable=not (progress and accelerator.is_main_process))
    running, out_of_time = None, False
    for epoch in range(epochs):
        skip = done_batches - epoch * len(loader)
        if skip >= len(loader) or out_of_time:
            continue
        order.use_epoch(epoch)
        epoch_loader = accelerator.skip_first_batches(loader, skip) if skip > 0 else loader
        for batch in epoch_loader:
            if step >= total_steps or out_of_time:
                break
            if online is not None:
                batch = online.fill(batch)
            with accelerator.accumulate(model):
                loss, metrics = model(batch, embed=embed, head_weight=head_weight, inputs=inputs, unroll=cfg.unroll,
                                      noise=cfg.noise)
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            done_batches += 1
            clock.tick()
            seen_tokens += int(batch["tokens"])
            running = metrics.accuracy[0] if running is None else 0.98 * running + 0.02 * metrics.accuracy[0]
            if accelerator.sync_gradients:
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{metrics.loss:.3f}", acc0=f"{running:.3f}", lr=f"{scheduler.get_last_lr()[0]:.1e}")
                out_of_time = budget_spent(clock, cfg.max_minutes, accelerator)
                if step % cfg.eval_every == 0 and not out_of_time:
                    evaluate_and_save()
                elif not out_of_time and saves.due():
                    save_progress()
    bar.close()
    record = evaluate_and_save(final=not out_of_time)  # stopped by --max-minutes: a checkpoint to go on from
    if accelerator.is_main_process:
        summary = {"seconds": round(time.perf_counter() - started, 1), "optimizer_steps": step, "tokens_seen": record["tokens"],
                   "total_steps": total_steps, "stopped_by_max_minutes": out_of_time, "final_validation": record}
        (out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out


class _Progress:
    """Nothing to save itself (progress.json holds the counters); keeps accelerate's checkpoint
    layout stable when more objects are registered later."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def float32_pieces(target: Any) -> tuple[Any, torch.Tensor]:
    """The target's embedding (a callable, ids `[B, T]` -> `[B, T, H]`) and lm_head weight `[V, H]` in float32,
    what the float32 drafter's loss reads: a bfloat16 target's are cast (the weight copied once)."""
    embedding = target.get_input_embeddings()
    head = target.get_output_embeddings().weight
    if head.dtype == torch.float32:
        return embedding, head
    return (lambda ids: embedding(ids).float()), head.float()


def drafter_inputs(config: EagleConfig, target: Any):
    """What the network reads, from the cached features `[B, T, F]`: the features themselves for
    EAGLE; for an exit adapter, the next position's exit state through the target's final norm
    (:func:`~hf_speculative.drafters.self_speculative.exit_adapter.adapter_features`, the drafting path's definition)."""
    if config.exit_layer is None:
        return lambda features: features
    from ..drafters.self_speculative.exit_adapter import adapter_features

    norm = compat.decoder_of(target).norm

    def exit_inputs(features: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return adapter_features(features.to(next(norm.parameters()).dtype), norm).float()
    return exit_inputs


@torch.no_grad()
def _teacher_forced(net, embed, head_weight, examples, source, indices, unroll, inputs=lambda f: f) -> dict:
    """Per-step top-1 agreement with the target on held-out examples (features from ``source``, a
    ``FeatureCache`` or ``OnlineFeatures``), and the tau it implies for a chain as long as ``unroll``
    (1 + sum of running products of the per-step rates)."""
    correct, counts = [0.0] * unroll, [0] * unroll
    device = head_weight.device
    for i in indices:
        features, final, top = (x.to(device) for x in source.get(i))
        ex = examples[i]
        _, m = eagle_loss(net, embed, head_weight, torch.tensor([ex.ids], device=device),
                          torch.tensor([ex.loss_mask], device=device), inputs(features[None]), final[None], unroll,
                          target_top=top[None])
        for j, (a, n) in enumerate(zip(m.accuracy, m.counts)):
            correct[j] += a * n
            counts[j] += n
    rates = [c / n if n else 0.0 for c, n in zip(correct, counts)]
    tau, run = 1.0, 1.0
    for r in rates:
        run *= r
        tau += run
    return {"val_acc": [round(r, 4) for r in rates], "val_tau_teacher_forced": round(tau, 3)}
