"""``hf-speculative cache-features``: the target's features over a training set, computed once into a folder that
``train-eagle``, ``train-dflash`` and ``train-medusa`` all read (``--feature-cache DIR``).

Each trainer caches the features it needs in its own ``OUT/cache`` otherwise: three passes of the target over the
same data, which on a CPU cost about as much as a training epoch each (SmolLM2-135M: ~320 tokens/s a core). A
shared cache stores the outputs of the union of the layers the drafters read (by default EAGLE-3's low / middle /
high layers and DFlash's five), the final normed state (Medusa's input, EAGLE-1's feature) and the target's argmax;
each trainer reads its own layers' columns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from .cli import _training_extra, layer_indices


def default_layers(num_layers: int) -> list[int]:
    """The layers the trainers read by default from a target of ``num_layers`` decoder layers: EAGLE-3's fused
    low / middle / high layers and DFlash's five (z-lab's spread; none on a target too shallow for five), sorted."""
    from ..drafters.eagle.config import default_target_layers
    from .dflash import build_target_layer_ids

    try:
        dflash = build_target_layer_ids(num_layers, 5)
    except ValueError:
        dflash = []
    return sorted(set(default_target_layers(num_layers)) | set(dflash))


def parse_layers(text: str, num_layers: int) -> list[int]:
    """``--layers 1,8,14``: decoder layer indices of the target, each once."""
    layers = layer_indices(text) or []
    if not layers or len(set(layers)) != len(layers) or not all(0 <= layer < num_layers for layer in layers):
        raise typer.BadParameter(f"--layers {text}: give distinct decoder layer indices in 0..{num_layers - 1}, "
                                 "comma-separated (e.g. 1,8,14,20,26,27)")
    return sorted(layers)


def cache_features(
    target: Annotated[str, typer.Option("--model", "--target", help="Registry name or folder of the target model.")],
    out: Annotated[Path, typer.Option("--out", help="Folder of the cache (resumed when it holds one of this data).")],
    data: Annotated[list[str], typer.Option("--data", help="JSONL training data, as train-eagle reads it; "
                                                            "repeatable.")] = [],  # noqa: B006
    layers: Annotated[Optional[str], typer.Option(
        "--layers", help="Target layers whose outputs are stored, comma-separated. Default: those EAGLE-3 and "
                         "DFlash read by default (SmolLM2-135M: 1,8,14,20,26,27).")] = None,
    max_length: Annotated[int, typer.Option("--max-length", min=8, help="As the trainers' --max-length.")] = 1024,
    max_examples: Annotated[Optional[int], typer.Option(
        "--max-examples", min=1, help="As the trainers' --max-examples.")] = None,
    target_dtype: Annotated[Optional[str], typer.Option(
        "--target-dtype", help="float32, bfloat16, float16 or auto. Default: float32 on a CPU, the checkpoint's on "
                               "a GPU.")] = None,
    feature_batch_tokens: Annotated[Optional[int], typer.Option(
        "--feature-batch-tokens", min=1, help="Padded tokens per target forward (default 4096 on a GPU, 1 on a "
                                              "CPU).")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1)] = None,
) -> None:
    """Compute the target's features over --data once into --out, for every drafter trainer to read with
    --feature-cache (give them the same --data, --max-length and --max-examples). Started in several processes
    (torchrun, accelerate launch), they share the work."""
    import torch

    from .. import compat
    from ..registry.models import load_model
    from .config import TARGET_DTYPES
    from .data import FeatureCache, examples_digest, training_examples
    from .loop import process_state

    _training_extra()
    if not data:
        raise typer.BadParameter("give --data FILE (repeatable): the training data the drafters will read")
    if target_dtype not in TARGET_DTYPES:
        raise typer.BadParameter(f"--target-dtype {target_dtype}: use float32, bfloat16, float16 or auto")
    state = process_state()
    if threads:
        torch.set_num_threads(threads)
    dtype = target_dtype or ("float32" if state.device.type == "cpu" else "auto")
    model, tokenizer = load_model(target, dtype=dtype)
    model.requires_grad_(False).eval().to(state.device)
    depth = int(compat.text_config(model.config).num_hidden_layers)
    chosen = parse_layers(layers, depth) if layers else default_layers(depth)
    examples = training_examples(data, tokenizer, max_length, max_examples)
    source = json.dumps({"shared": True, "target": target, "dtype": str(next(model.parameters()).dtype),
                         "max_length": max_length, "data": list(data), "max_examples": max_examples,
                         "examples_sha256": examples_digest(examples)})
    cache = FeatureCache.build(out, model, examples, chosen, source=source, batch_tokens=feature_batch_tokens,
                               progress=state.is_main_process, state=state if state.num_processes > 1 else None)
    if state.is_main_process:
        size = sum((out / name).stat().st_size for name in ("features.f16", "final.f16", "top.i32")) / 2**30
        typer.echo(f"features of {len(cache)} examples ({cache.meta['num_tokens']} tokens) of layers {chosen} in "
                   f"{out} ({size:.1f} GiB); train with --feature-cache {out} and the same --data, --max-length "
                   "and --max-examples")
