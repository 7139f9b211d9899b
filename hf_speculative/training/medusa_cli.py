"""``hf-speculative train-medusa`` and ``export-medusa`` (registered on the main CLI beside ``train-eagle``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from .cli import PromptsOpt, SaveMinutesOpt, _prompt_rows, _training_extra, self_distill


def train_medusa(
    target: Annotated[str, typer.Option("--model", "--target", help="Registry name or folder of the target model.")],
    out: Annotated[Path, typer.Option("--out", help="Output folder: heads, tree.json, checkpoint, feature cache, logs.")],
    data: Annotated[list[str], typer.Option("--data", help="JSONL training data, as for train-eagle (self-distilled "
                                                            "answers, chat conversations, {'text': ...}); "
                                                            "repeatable.")] = [],  # noqa: B006
    prompts: PromptsOpt = None,
    distill_tokens: Annotated[int, typer.Option("--distill-tokens", help="Answer length for --prompts.")] = 192,
    heads: Annotated[int, typer.Option("--heads", min=1, help="Heads: tokens guessed ahead.")] = 4,
    layers: Annotated[int, typer.Option("--layers", min=0, help="Residual blocks per head.")] = 1,
    lm_head: Annotated[str, typer.Option(
        "--lm-head", help="target: the heads feed the target's own frozen lm_head (small: hidden^2 per block); "
                          "per_head: each head its own vocabulary head (Medusa-1, hidden x vocab each); shared: one "
                          "trained vocabulary head for all.")] = "target",
    decay: Annotated[float, typer.Option("--decay", help="Head k's loss weight is decay**k.")] = 0.8,
    epochs: Annotated[float, typer.Option("--epochs")] = 1.0,
    lr: Annotated[float, typer.Option("--lr")] = 1e-3,
    grad_accum: Annotated[int, typer.Option("--grad-accum")] = 1,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 1,
    max_length: Annotated[int, typer.Option("--max-length")] = 1024,
    positions: Annotated[int, typer.Option("--positions", help="Positions learnt per batch (random subset).")] = 512,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Optimizer steps between validations.")] = 200,
    val_prompts: Annotated[int, typer.Option("--val-prompts", help="Held-out prompts for the real tau.")] = 4,
    tree_nodes: Annotated[int, typer.Option("--tree-nodes", help="Nodes of the calibrated tree.json.")] = 16,
    max_examples: Annotated[Optional[int], typer.Option("--max-examples")] = None,
    max_minutes: Annotated[Optional[float], typer.Option("--max-minutes", help="Stop training after this long.")] = None,
    save_minutes: SaveMinutesOpt = 10.0,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1)] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    features: Annotated[str, typer.Option("--features", help="cache (OUT/cache) or online.")] = "cache",
    feature_cache: Annotated[Optional[Path], typer.Option(
        "--feature-cache", help="Read the target's features from this folder, built once by hf-speculative "
                                "cache-features over the same --data, --max-length and --max-examples, instead of "
                                "OUT/cache.")] = None,
) -> None:
    """Train Medusa heads for --target (Medusa-1: the target frozen; resumes from OUT/checkpoint when present)."""
    from .medusa import MedusaTrainConfig
    from .medusa_loop import train_medusa as train

    _training_extra()
    data = list(data)
    distilled = out / "self_distill.jsonl"
    if prompts:
        _prompt_rows(prompts)
        data.append(str(distilled))
    if not data:
        raise typer.BadParameter("give --data FILE (repeatable) and/or --prompts FILE (prompts the target answers "
                                 "first)")
    try:
        cfg = MedusaTrainConfig(target=target, data=data, out=str(out), heads=heads, layers=layers, lm_head=lm_head,
                                decay=decay, epochs=epochs, lr=lr, grad_accum=grad_accum, batch_size=batch_size,
                                max_length=max_length, positions=positions, eval_every=eval_every,
                                val_prompts=val_prompts, tree_nodes=tree_nodes, max_examples=max_examples,
                                max_minutes=max_minutes, save_minutes=save_minutes or None, threads=threads, seed=seed,
                                features=features,
                                feature_cache=str(feature_cache) if feature_cache else None)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    if prompts:
        self_distill(target, prompts, distilled, distill_tokens, threads=threads)
    path = train(cfg)
    summary = path / "training_summary.json"
    if summary.exists():
        typer.echo(summary.read_text())
    typer.echo(f"heads saved in {path}; use them with hfs.Medusa.from_pretrained({str(path)!r}, target=model, "
               "tree='calibrated')")


def export_medusa(
    heads: Annotated[str, typer.Argument(help="Heads folder (any supported layout) or a shipped name.")],
    out: Annotated[Path, typer.Option("--out", help="Folder to write.")],
    format: Annotated[str, typer.Option("--format", help="vllm (vLLM's Medusa) or medusa (FasterDecoding's, also "
                                                          "TGI's).")] = "vllm",
    target: Annotated[Optional[str], typer.Option(
        "--model", "--target", help="The target (registry name or folder); needed for heads on the target's lm_head.")] = None,
) -> None:
    """Write Medusa heads in the layout a serving engine loads."""
    from ..drafters.medusa import checkpoints
    from ..drafters.medusa.drafter import PRETRAINED_DIR, pretrained_names

    if format not in ("vllm", "medusa"):
        raise typer.BadParameter(f"--format {format!r}: use vllm or medusa")
    source = Path(heads)
    if not source.is_dir() and heads in pretrained_names():
        source = PRETRAINED_DIR / heads
    try:
        model = None
        if target is not None:
            from ..registry.models import load_model

            model, _ = load_model(target, dtype="float32")
        written = checkpoints.export(source, out, format=format, target=model)
    except (OSError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps({"format": format, "out": str(written)}))
