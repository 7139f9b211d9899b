"""``hf-speculative train-dflash`` (registered on the main CLI beside ``train-eagle``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .cli import PromptsOpt, SaveMinutesOpt, _prompt_rows, _training_extra, layer_indices, self_distill


def _layer_list(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    layers = layer_indices(text)
    if layers is None:
        raise typer.BadParameter(f"--target-layer-ids {text!r}: give comma-separated layer indices, e.g. "
                                 "1,8,14,20,27")
    return layers


def train_dflash(
    target: Annotated[str, typer.Option("--model", "--target", help="Registry name or folder of the target model.")],
    out: Annotated[Path, typer.Option("--out", help="Output folder: drafter (z-lab format), checkpoint, feature "
                                                    "cache, logs.")],
    data: Annotated[list[str], typer.Option("--data", help="JSONL training data, as for train-eagle (self-distilled "
                                                            "answers, chat conversations, {'text': ...}); "
                                                            "repeatable.")] = [],  # noqa: B006
    prompts: PromptsOpt = None,
    distill_tokens: Annotated[int, typer.Option("--distill-tokens", min=1, help="Answer length for --prompts.")] = 192,
    max_prompt_tokens: Annotated[int, typer.Option("--max-prompt-tokens", min=1, help="Skip longer --prompts.")] = 1024,
    block_size: Annotated[int, typer.Option("--block-size", help="The window: the anchor and block_size - 1 drafted "
                                                                 "positions (the recipe: 8 or 16).")] = 8,
    layers: Annotated[int, typer.Option("--layers", help="Drafter decoder layers.")] = 2,
    target_layers: Annotated[int, typer.Option(
        "--target-layers", help="Target layers the drafter reads, spread as z-lab's build_target_layer_ids.")] = 5,
    target_layer_ids: Annotated[Optional[str], typer.Option(
        "--target-layer-ids", help="Name them instead: comma-separated layer indices (before the last layer).")] = None,
    mask_token_id: Annotated[Optional[int], typer.Option(
        "--mask-token-id", help="The window's filler token (default: the tokenizer's mask token, else the last "
                                "vocabulary id).")] = None,
    anchors: Annotated[int, typer.Option("--anchors", help="Windows drawn per sequence and step.")] = 512,
    gamma: Annotated[Optional[float], typer.Option(
        "--gamma", help="Loss decay exp(-(k-1)/gamma) over window positions; default 4 for block 8, 5 for 10, 7 for "
                        "16, else block/2; 0: uniform.")] = None,
    epochs: Annotated[float, typer.Option("--epochs")] = 6.0,
    lr: Annotated[float, typer.Option("--lr")] = 6e-4,
    grad_accum: Annotated[int, typer.Option("--grad-accum", help="Batches per optimizer step and process.")] = 1,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per forward.")] = 1,
    max_length: Annotated[int, typer.Option("--max-length")] = 1024,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Optimizer steps between validations.")] = 200,
    val_prompts: Annotated[int, typer.Option("--val-prompts", help="Held-out prompts for the real tau.")] = 8,
    max_examples: Annotated[Optional[int], typer.Option("--max-examples")] = None,
    max_minutes: Annotated[Optional[float], typer.Option("--max-minutes", help="Stop training after this long.")] = None,
    save_minutes: SaveMinutesOpt = 10.0,
    save_dtype: Annotated[str, typer.Option("--save-dtype", help="float32, float16 or bfloat16.")] = "float32",
    draft_vocab: Annotated[Optional[int], typer.Option(
        "--draft-vocab", min=1, help="Ship a draft vocabulary of this many ids (the training data's most frequent "
                                     "tokens): a drafting step reads only those lm_head rows (8192 for a 49k "
                                     "vocabulary about halves it on a CPU).")] = None,
    loss_vocab: Annotated[str, typer.Option(
        "--loss-vocab", help="full: the loss reads the whole vocabulary (the paper's); draft: only --draft-vocab's "
                             "ids, as EAGLE-3 trains and the shipped drafter drafts (labels outside it are not learnt; "
                             "a CPU training step about halves on a 49k vocabulary).")] = "full",
    features: Annotated[str, typer.Option("--features", help="cache (OUT/cache) or online.")] = "cache",
    feature_cache: Annotated[Optional[Path], typer.Option(
        "--feature-cache", help="Read the target's features from this folder, built once by hf-speculative "
                                "cache-features over the same --data, --max-length and --max-examples, instead of "
                                "OUT/cache.")] = None,
    feature_batch_tokens: Annotated[Optional[int], typer.Option(
        "--feature-batch-tokens", min=1, help="Padded tokens per target forward when caching features.")] = None,
    target_dtype: Annotated[Optional[str], typer.Option(
        "--target-dtype", help="float32, bfloat16, float16 or auto; default float32 on a CPU.")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1)] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Train a DFlash block drafter for --target (resumes from OUT/checkpoint when present); it is written in z-lab's
    format, which hfs.DFlash.from_pretrained reads and vLLM and SGLang serve."""
    from .dflash import DFlashTrainConfig
    from .dflash_loop import train_dflash as train

    _training_extra()
    data = list(data)
    distilled = out / "self_distill.jsonl"
    if prompts:
        _prompt_rows(prompts)  # a bad file fails before anything runs
        data.append(str(distilled))
    if not data:
        raise typer.BadParameter("give --data FILE (repeatable) and/or --prompts FILE (prompts the target answers "
                                 "first)")
    try:
        cfg = DFlashTrainConfig(target=target, data=data, out=str(out), block_size=block_size, layers=layers,
                                target_layers=target_layers, target_layer_ids=_layer_list(target_layer_ids),
                                mask_token_id=mask_token_id, anchors=anchors, gamma=gamma, epochs=epochs, lr=lr,
                                grad_accum=grad_accum, batch_size=batch_size, max_length=max_length,
                                eval_every=eval_every, val_prompts=val_prompts, max_examples=max_examples,
                                max_minutes=max_minutes, save_minutes=save_minutes or None, save_dtype=save_dtype,
                                draft_vocab=draft_vocab,
                                loss_vocab=loss_vocab, features=features, feature_cache=str(feature_cache) if feature_cache else None,
                                feature_batch_tokens=feature_batch_tokens, target_dtype=target_dtype, threads=threads,
                                seed=seed)
        _check_shape(cfg)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    if prompts:
        self_distill(target, prompts, distilled, distill_tokens, threads=threads, max_prompt_tokens=max_prompt_tokens)
    try:
        path = train(cfg)
    except ValueError as error:  # data that leaves nothing to train on, a resume with other settings
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    summary = path / "training_summary.json"
    if summary.exists():
        typer.echo(summary.read_text())
    typer.echo(f"drafter saved in {path} (z-lab DFlash format); use it with hfs.DFlash.from_pretrained({str(path)!r}, "
               "target=model)")


def _check_shape(cfg) -> None:
    """The drafter's shape against the target's config alone (no weights loaded): layer ids inside its depth and
    before its last layer, the mask id inside its vocabulary; raises ValueError naming both sides."""
    from transformers import AutoConfig

    from ..registry.models import resolve
    from .dflash import build_target_layer_ids

    try:  # a local folder or a cached registry model; anything else is checked once loaded
        config = AutoConfig.from_pretrained(resolve(cfg.target, fetch_missing=False))
    except Exception:  # noqa: BLE001 - the loader reports an unknown or missing target with its own message
        return
    from .. import compat
    from ..drafters.dflash.config import DFlashConfig

    text = compat.text_config(config)
    depth = int(text.num_hidden_layers)
    ids = cfg.target_layer_ids if cfg.target_layer_ids is not None else build_target_layer_ids(depth, cfg.target_layers)
    fields = dict(num_hidden_layers=cfg.layers, target_layer_ids=ids, block_size=cfg.block_size)
    if cfg.mask_token_id is not None:
        fields["mask_token_id"] = cfg.mask_token_id
    DFlashConfig.for_target(config, **fields).check_target(config)
