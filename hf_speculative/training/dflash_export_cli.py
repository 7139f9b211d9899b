"""``hf-speculative export-dflash`` (registered on the main CLI beside ``train-dflash``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer


def export_dflash(
    drafter: Annotated[str, typer.Argument(help="DFlash drafter folder (z-lab's or transformers' format) or a shipped "
                                                "drafter's name.")],
    out: Annotated[Path, typer.Option("--out", help="Folder to write (empty or new).")],
    format: Annotated[str, typer.Option("--format", help="vllm (vLLM's DFlash: the draft vocabulary as vLLM reads "
                                                          "it).")] = "vllm",
    target: Annotated[Optional[str], typer.Option(
        "--model", "--target", help="The target (registry name or folder): checked against the drafter, and its "
                                    "lm_head rows make the draft vocabulary's head. Default for a shipped drafter: "
                                    "its own target.")] = None,
    full_vocab: Annotated[bool, typer.Option(
        "--full-vocab", help="Leave the draft vocabulary out: vLLM drafts over the whole vocabulary (no --target "
                             "needed).")] = False,
) -> None:
    """Write a DFlash drafter in the layout vLLM serves (--speculative-config '{"method": "dflash", "model": OUT}')."""
    from ..drafters.dflash.drafter import PRETRAINED_DIR, pretrained_names
    from ..drafters.dflash.vllm_export import export_vllm

    if format != "vllm":
        raise typer.BadParameter(f"--format {format!r}: use vllm (train-dflash already writes z-lab's format, which "
                                 "SGLang and hfs.DFlash.from_pretrained read)")
    source = Path(drafter)
    if not source.is_dir() and drafter in pretrained_names():
        source = PRETRAINED_DIR / drafter
        target = target or drafter  # a shipped drafter is named after its registry target
    try:
        model = None
        if target is not None:
            from ..registry.models import load_model

            model, _ = load_model(target, dtype="float32")
        written = export_vllm(source, out, target=model, full_vocab=full_vocab)
    except (OSError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps({"format": format, "out": str(written)}))
