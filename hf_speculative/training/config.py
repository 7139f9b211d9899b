"""``TrainConfig``: everything one drafter training run depends on, saved beside the result."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

# What needs the [train] extra (accelerate, tqdm), in the message that names `pip install "hf-speculative[train]"`
FEATURE = "drafter training (hf-speculative self-distill / train-eagle)"
# --target-dtype's choices (None: float32 on a CPU, the checkpoint's own on an accelerator), for every trainer
TARGET_DTYPES = (None, "auto", "float32", "bfloat16", "float16")


@dataclasses.dataclass
class TrainConfig:
    """A drafter training run (``hf-speculative train-eagle``).

    Args:
        target (`str`): registry name or folder of the target model.
        data (`list[str]`): JSONL files: self-distillation rows or ``{"text": ...}`` documents.
        out (`str`): output folder (drafter, checkpoints, feature cache, logs).
        eagle3 (`bool`, defaults to `True`): EAGLE-3 (fused low/mid/high features, own reduced
            vocabulary, training-time test); ``False`` for EAGLE-1.
        draft_vocab_size (`int`, defaults to 8192): EAGLE-3's vocabulary (the most frequent learnt tokens).
        unroll (`int`, defaults to 4): draft steps trained per anchor (EAGLE-3's training-time test;
            EAGLE-1 uses 1 unless set).
        epochs (`float`, defaults to 2): passes over the training examples.
        lr (`float`, defaults to 5e-4), warmup (`int`, defaults to 50), weight_decay (`float`, defaults to 0),
            grad_accum (`int`, defaults to 4), max_grad_norm (`float`, defaults to 0.5).
        max_length (`int`, defaults to 1024): longest sequence, in tokens.
        batch_size (`int`, defaults to 1): sequences per forward, right-padded to the longest; batches are
            drawn from length-sorted windows (less padding). Its loss is the mean of its sequences', so
            ``batch_size x grad_accum`` sequences make one optimizer step either way. 1 keeps a CPU busy;
            an accelerator needs more.
        val_every (`int`, defaults to 20): one example in ``val_every`` is held out for validation.
        eval_every (`int`, defaults to 200): optimizer steps between validations (and checkpoints).
        max_minutes (`float`, *optional*): stop training after this much wall time (then validate and save), counted
            over resumes (``checkpoint/progress.json`` keeps the time trained), as ``train-dflash`` and
            ``train-medusa`` do.
        save_minutes (`float`, defaults to 10): training minutes between saves of the training state besides the
            validations' (no validation, no drafter written): a run killed between two validations resumes at most
            this far behind; ``None``: at validations only.
        val_prompts (`int`, defaults to 8), val_new_tokens (`int`, defaults to 64), val_draft (`int`,
            defaults to 6): the validation tau: greedy speculative generation on held-out prompts
            with drafts of up to ``val_draft`` tokens and no cost rule (a property of the drafter, not of
            the machine's speed; the longest draft drops by one after a rejection, grows by two after a
            fully kept draft).
        noise (`float`, defaults to 0.0): uniform feature noise (EAGLE-1's trick; 0.2 is typical there).
        init_from_target (`bool`, defaults to `True`): start the decoder layer, norm and lm_head from
            the target's last layer, final norm and lm_head rows (Llama-style norms only).
        init_from (`str`, *optional*): continue training an existing drafter instead: a folder in any
            supported format, or the name of a shipped drafter. Its weights, fused layers and draft
            vocabulary are kept (``draft_vocab_size`` and ``init_from_target`` are then unused); it must
            be of the kind trained here (EAGLE-1 or 3, exit adapter for the same layer) and fit the target.
        refresh_vocab (`bool`, defaults to `False`): with ``init_from`` (EAGLE-3 or exit adapter), choose the
            draft vocabulary again from this run's data, ``draft_vocab_size`` tokens: rows of tokens the
            drafter had are kept, new tokens start from the target's lm_head rows (for data that uses
            words the first training data never did).
        seed (`int`, defaults to 0), max_examples (`int`, *optional*), threads (`int`, *optional*).
        feature_batch_tokens (`int`, *optional*): padded tokens per target forward when the target's
            features are cached (examples of similar length share a forward; 1 for one example at a time).
            Default: 4096 on an accelerator, 1 on a CPU, where batching measured no faster.
        features (`str`, defaults to ``"cache"``): ``"cache"`` runs the target once over every example into
            a memory-mapped cache in ``out/cache`` that every epoch reads; ``"online"`` runs it for every
            batch instead (nothing on disk, the target's forward repeated each epoch), for data whose
            features would not fit on disk. Both train on the same numbers.
        feature_cache (`str`, *optional*): read the features from this folder, a cache that ``hf-speculative
            cache-features`` built over the same examples (one pass of the target for every drafter trained on
            them), instead of ``out/cache``.
        target_dtype (`str`, *optional*): the target's dtype while training (``"float32"``, ``"bfloat16"``,
            ``"float16"`` or ``"auto"``, its checkpoint's). Default: float32 on a CPU, the checkpoint's on an
            accelerator, as :func:`~hf_speculative.load_model` loads it. The drafter trains in float32 either way.
        exit_layer (`int`, *optional*): train an exit adapter for ``hfs.EarlyExit(exit_layer=k, adapter=...)``
            instead of an EAGLE drafter (EAGLE-3 shaped, reading the normed output of the target's first
            ``k`` layers for each token; ``unroll`` is 1: every input it sees when drafting is a real exit state).
    """

    target: str
    data: list[str]
    out: str
    eagle3: bool = True
    draft_vocab_size: int = 8192
    unroll: int | None = None
    epochs: float = 2.0
    lr: float = 5e-4
    warmup: int = 50
    weight_decay: float = 0.0
    grad_accum: int = 4
    max_grad_norm: float = 0.5
    max_length: int = 1024
    batch_size: int = 1
    val_every: int = 20
    eval_every: int = 200
    max_minutes: float | None = None
    val_prompts: int = 8
    val_new_tokens: int = 64
    val_draft: int = 6
    noise: float = 0.0
    init_from_target: bool = True
    seed: int = 0
    max_examples: int | None = None
    threads: int | None = None
    exit_layer: int | None = None
    init_from: str | None = None
    refresh_vocab: bool = False
    feature_batch_tokens: int | None = None
    features: str = "cache"
    target_dtype: str | None = None
    feature_cache: str | None = None
    save_minutes: float | None = 10.0

    def __post_init__(self):
        if isinstance(self.data, str):
            self.data = [self.data]
        if not self.data:
            raise ValueError("TrainConfig(data=[]): give at least one JSONL file (--data).")
        if self.exit_layer is not None:
            if not self.eagle3:
                raise ValueError("TrainConfig(exit_layer=..., eagle3=False): an exit adapter is EAGLE-3 shaped; drop --eagle1.")
            if self.unroll not in (None, 1):
                raise ValueError(f"TrainConfig(exit_layer={self.exit_layer}, unroll={self.unroll}): an exit adapter reads a real "
                                 "exit state at every draft step, so there is nothing to unroll; use --unroll 1 (the default).")
            if self.exit_layer < 1:
                raise ValueError(f"TrainConfig(exit_layer={self.exit_layer}): must be >= 1.")
        if self.refresh_vocab and (self.init_from is None or not self.eagle3):
            raise ValueError("TrainConfig(refresh_vocab=True) re-chooses the draft vocabulary of a drafter being continued: "
                             "it needs init_from (--init-from) and an EAGLE-3 drafter or exit adapter (EAGLE-1 uses the "
                             "target's whole vocabulary).")
        if self.features not in ("cache", "online"):
            raise ValueError(f"TrainConfig(features={self.features!r}): use 'cache' (the target's features computed once "
                             "into OUT/cache) or 'online' (computed for every batch, nothing on disk).")
        if self.feature_cache is not None and self.features == "online":
            raise ValueError(f"{type(self).__name__}(feature_cache={self.feature_cache!r}, features='online'): a shared "
                             "cache is read from disk; drop --features online or --feature-cache.")
        if self.features == "online" and self.feature_batch_tokens is not None:
            raise ValueError("TrainConfig(features='online', feature_batch_tokens=...): the batch size of the feature "
                             "cache does not apply online, where each training batch is one target forward; drop "
                             "--feature-batch-tokens or use --features cache.")
        if self.target_dtype not in TARGET_DTYPES:
            raise ValueError(f"TrainConfig(target_dtype={self.target_dtype!r}): use float32, bfloat16, float16 or auto "
                             "(the checkpoint's own).")
        if self.unroll is None:
            self.unroll = 1 if self.exit_layer is not None else 4 if self.eagle3 else 1
        checks = {"unroll": self.unroll >= 1, "epochs": self.epochs > 0, "lr": self.lr > 0, "grad_accum": self.grad_accum >= 1,
                  "batch_size": self.batch_size >= 1,
                  "max_length": self.max_length >= 8, "val_every": self.val_every >= 2, "eval_every": self.eval_every >= 1,
                  "draft_vocab_size": self.draft_vocab_size >= 16, "val_draft": self.val_draft >= 1, "noise": self.noise >= 0,
                  "feature_batch_tokens": self.feature_batch_tokens is None or self.feature_batch_tokens >= 1,
                  "max_minutes": self.max_minutes is None or self.max_minutes > 0,
                  "save_minutes": self.save_minutes is None or self.save_minutes > 0}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"TrainConfig: invalid {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)}.")

    @property
    def version(self) -> int:
        return 3 if self.eagle3 else 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        return cls(**json.loads(Path(path).read_text()))
