"""Inflate a real small model into a larger shape that computes the same function: a cost model with real acceptance.

    python -m tools.gpu.inflate --model smollm2-135m-instruct --shape llama-3.1-8b --out /tmp/inflated \
        --dtype bfloat16 --drafters eagle,dflash,medusa --check-tokens 16

Every figure measured on the result is labelled ``inflated (cost model)``: it verifies and drafts at the large shape's
cost, while its predictions (so τ) are the small model's. How the small model sits in the large one (``d`` -> ``D``
hidden channels; real channels first, the rest zero):

- Embedding, projections and MLP: the small weights in the top-left block, every other weight zero. A zero input
  channel adds exact zeros to every sum, and SiLU(0) * 0 = 0, so the extra hidden channels stay zero everywhere.
- Attention: ``head_dim`` is kept, so the rotary embedding (its frequencies follow ``head_dim``) and the 1/sqrt(
  head_dim) scale are the small model's; the large shape's q/k/v widths are met with more heads of that width
  (Llama-3.1-8B's 32 heads of 128 become 64 of 64: the same q/k/v/o matrices and KV bytes). Real query heads take
  slots whose key/value head is their own (``widening.head_slots``); extra heads attend to something, and their zero
  columns in ``o_proj`` drop it.
- RMSNorm over ``D`` channels of which ``d`` are real sees a mean of squares ``c = d / D`` times the small one's:
  ``w' x / sqrt(c m + eps')`` equals ``w x / sqrt(m + eps)`` for every ``m`` exactly when ``eps' = c eps`` and
  ``w' = sqrt(c) w`` (not ``eps D / d``: ``tests/tools/test_inflate.py`` checks both numerically). The config's
  ``rms_norm_eps`` is the one eps of every norm of a Llama, so it becomes ``c eps``.
- Extra layers come after the real ones, every weight zero (the model is built on the meta device and zeroed:
  nothing random, no time spent initialising): attention and MLP add exact zeros to the residual stream (zero
  ``o_proj`` and ``down_proj``), so layer ``i``'s output is the small model's for ``i`` below its depth and the
  drafters' layer indices stay as they are.
- The vocabulary is unchanged (a padded row would score 0, above real negative logits). At Llama-3.1-8B's shape the
  decoder layers are the 8B's (6.98 B weights) but the head is SmolLM2's 49k rows, tied to the embedding, not the
  8B's own 128k: a token reads 7.18 B weights against the 8B's 7.50 B (96%).

Shapes and the channel mapping live in ``widening.py``; the drafters (``inflate_drafters.py``) follow the same rules.
Sums over more channels round differently in the last bit, so float32 outputs equal the small model's up to rounding;
greedy tokens are identical unless two logits tie within it (the tests compare token for token).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch

from .widening import SMALL_SHAPES, Shape, Widening, check_fits, materialized, put, put_linear, shipped_shape, widening

COST_MODEL = "inflated (cost model)"
MARKER = "hf_speculative_inflated"  # the inflated config's field: what it was inflated from and to
SUPPORTED = ("llama", "qwen2")
__all__ = ["COST_MODEL", "MARKER", "SMALL_SHAPES", "Shape", "inflate_model", "is_inflated", "marker", "shipped_shape"]


def marker(small_name: str, shape: Shape) -> dict[str, Any]:
    """What an inflated config records: a cost model, from which model, to which shape."""
    return {"label": COST_MODEL, "from": small_name, "shape": dataclasses.asdict(shape),
            "note": "the small model's function at a large shape's cost: real acceptance, not a real large model"}


# -- the target ----------------------------------------------------------------------------------------------
def inflate_model(small: torch.nn.Module, shape: Shape, *, device: Any = None, dtype: torch.dtype | None = None,
                  name: str | None = None) -> torch.nn.Module:
    """A ``type(small)`` of ``shape`` computing ``small``'s function (module docstring), in eval mode on ``device``
    (default ``small``'s) in ``dtype`` (default ``small``'s); its config carries ``hf_speculative_inflated``."""
    from transformers import AutoModelForCausalLM

    from hf_speculative import compat

    config = small.config
    if getattr(config, "model_type", None) not in SUPPORTED:
        raise ValueError(f"inflate: {type(small).__name__} ({getattr(config, 'model_type', None)}) is not supported; "
                         f"inflate a model of type {', '.join(SUPPORTED)} (RMSNorm over the hidden size, no per-head "
                         "norms).")
    if getattr(config, MARKER, None):
        raise ValueError("inflate: this model is inflated already; inflate the small model it came from.")
    param = next(small.parameters())
    device, dtype = device or param.device, dtype or param.dtype
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    check_fits(type(small).__name__, shape, num_layers=config.num_hidden_layers)
    widen = widening(config.hidden_size, config.num_attention_heads, kv_heads, head_dim, config.intermediate_size,
                     shape, f"{type(small).__name__} (hidden {config.hidden_size})")
    big_config = copy.deepcopy(config)
    for field, value in (("hidden_size", shape.hidden_size), ("num_hidden_layers", shape.num_layers),
                         ("intermediate_size", shape.intermediate_size), ("num_attention_heads", shape.num_heads),
                         ("num_key_value_heads", shape.num_kv_heads), ("head_dim", head_dim),
                         ("rms_norm_eps", widen.eps(config.rms_norm_eps))):
        setattr(big_config, field, value)
    types = getattr(config, "layer_types", None)
    if isinstance(types, list):  # Qwen2 on 5.x: one type per layer; the extra layers attend fully
        big_config.layer_types = types + ["full_attention"] * (shape.num_layers - len(types))
    setattr(big_config, MARKER, marker(name or getattr(config, "_name_or_path", "") or type(small).__name__, shape))
    with torch.device("meta"):
        big = AutoModelForCausalLM.from_config(big_config, **compat.dtype_kwargs(dtype))
    big = materialized(big, small, device, dtype)
    big.generation_config = copy.deepcopy(small.generation_config)
    _copy_target(big, small, widen)
    return big


@torch.no_grad()
def _copy_target(big: torch.nn.Module, small: torch.nn.Module, widen: Widening) -> None:
    """The small model's weights into the zeroed ``big`` (same class), layer by layer."""
    vocab = torch.arange(small.config.vocab_size)
    hidden = torch.arange(widen.hidden)
    put(big.get_input_embeddings().weight, small.get_input_embeddings().weight, vocab, hidden)
    head, big_head = small.get_output_embeddings(), big.get_output_embeddings()
    if big_head.weight.data_ptr() != big.get_input_embeddings().weight.data_ptr():  # untied: its own weights
        put_linear(big_head, head, vocab, hidden)
    inner, big_inner = small.model, big.model
    for layer, big_layer in zip(inner.layers, big_inner.layers):
        widen.attention(big_layer.self_attn, layer.self_attn)
        widen.mlp(big_layer.mlp, layer.mlp)
        widen.norm(big_layer.input_layernorm, layer.input_layernorm)
        widen.norm(big_layer.post_attention_layernorm, layer.post_attention_layernorm)
    widen.norm(big_inner.norm, inner.norm)


def is_inflated(model_or_config: Any) -> dict[str, Any] | None:
    """The marker of an inflated model or config (``None`` for a real one)."""
    config = getattr(model_or_config, "config", model_or_config)
    return getattr(config, MARKER, None)


# -- the command ------------------------------------------------------------------------------------------
def _shape_from(args: argparse.Namespace, head_dim: int) -> Shape:
    custom = [args.hidden, args.layers, args.intermediate, args.heads, args.kv_heads]
    if any(v is not None for v in custom):
        if None in custom or args.shape:
            raise SystemExit("inflate: give either --shape or all of --hidden, --layers, --intermediate, --heads and "
                             "--kv-heads (heads of the small model's head_dim).")
        return Shape("custom", *custom)
    return shipped_shape(args.shape or "llama-3.1-8b", head_dim)


def check_greedy(small: torch.nn.Module, big: torch.nn.Module, tokenizer: Any, tokens: int) -> bool:
    """Whether ``big``'s greedy text of ``tokens`` new tokens on a fixed chat prompt is ``small``'s, token for token."""
    from hf_speculative.tooling.prompting import encode_prompt

    ids = encode_prompt(tokenizer, "Explain why the sky is blue in two sentences.").to(next(small.parameters()).device)
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False)
    return torch.equal(type(small).generate(small, **kwargs).cpu(), type(big).generate(big, **kwargs.copy()).cpu())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a registry name or a model folder")
    parser.add_argument("--shape", default=None, help=f"a shipped config's shape (default llama-3.1-8b) or one of "
                                                      f"{', '.join(SMALL_SHAPES)}")
    for flag in ("--hidden", "--layers", "--intermediate", "--heads", "--kv-heads"):
        parser.add_argument(flag, type=int, default=None)
    parser.add_argument("--drafters", default="eagle,dflash,medusa",
                        help="the shipped drafters of --model to inflate too (comma-separated; '' for none)")
    parser.add_argument("--dtype", default=None, help="the saved weights' dtype (default: the model's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--check-tokens", type=int, default=0,
                        help="compare this many greedy tokens with the small model's")
    args = parser.parse_args(argv)
    import hf_speculative as hfs

    from .inflate_drafters import inflate_strategy, load_shipped, save_strategy

    small, tokenizer = hfs.load_model(args.model, device=args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else next(small.parameters()).dtype
    small = small.to(dtype)  # built in the dtype saved: an 8B shape in float32 would take 29 GB
    head_dim = getattr(small.config, "head_dim", None) or small.config.hidden_size // small.config.num_attention_heads
    shape = _shape_from(args, head_dim)
    big = inflate_model(small, shape, name=args.model)
    if args.check_tokens:  # (in bfloat16 two logits may tie within its rounding; float32 is the exact check)
        same = check_greedy(small, big, tokenizer, args.check_tokens)
        verdict = "identical" if same else "DIFFERENT"
        print(f"greedy, {args.check_tokens} tokens in {dtype}: {verdict} to {args.model}'s")
    strategies = {method: inflate_strategy(load_shipped(method, args.model, small), big, shape, small_name=args.model)
                  for method in [m.strip() for m in args.drafters.split(",") if m.strip()]}
    args.out.mkdir(parents=True, exist_ok=True)
    big.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    for method, strategy in strategies.items():
        save_strategy(strategy, args.out / "drafters" / method, None, shape, args.model)
    print(f"{COST_MODEL}: {args.model} -> {shape} in {args.out} ({sum(p.numel() for p in big.parameters()) / 1e9:.2f} "
          "B parameters); label every figure measured on it as a cost model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
