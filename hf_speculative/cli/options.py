"""The options that ``hf-speculative compare`` and ``bench`` share, declared once.

:func:`run_options` adds the shared options (the model, the method options, the generation and CPU
settings) to a command's own, and hands the command one :class:`RunOptions` instead of fifteen
parameters. Each option is a typer ``Annotated`` alias, so the other commands can reuse single ones
(``ModelOpt``, ``ReferenceOpt``...). Needs the [cli] extra (typer); imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from typing import Annotated, Any, Callable, Optional

from ..extras import require

typer = require("typer", "cli", "The hf-speculative command line")

ModelOpt = Annotated[
    Optional[str], typer.Option("--model", help="Registry name or local folder (default: the registry's default).")
]
DraftOpt = Annotated[
    Optional[str],
    typer.Option("--draft-model", help="Draft model (registry name or folder) for draft-model / hf-assisted."),
]
NumTokensOpt = Annotated[
    Optional[int], typer.Option("--num-tokens", min=1,
                                help="Tokens drafted per step (default: each method's own).")
]
MaxNgramOpt = Annotated[Optional[int], typer.Option("--max-ngram", help="Longest n-gram matched by prompt lookup.")]
ExitLayerOpt = Annotated[
    Optional[int], typer.Option("--exit-layer", help="Layers early-exit / hf-early-exit draft with (default 8).")
]
SkipOpt = Annotated[
    Optional[str], typer.Option("--skip", help="Layers layer-skip skips: 'auto' (default) or indices, e.g. 4,6,9.")
]
CalibrationOpt = Annotated[
    Optional[str],
    typer.Option("--calibration-file", help="JSON file layer-skip 'auto' loads its calibration from / saves it to."),
]
AdapterOpt = Annotated[
    Optional[str],
    typer.Option("--adapter",
                 help="Exit adapter folder for early-exit-adapter (default: the one shipped for --model)."),
]
EagleOpt = Annotated[
    Optional[str],
    typer.Option("--eagle", help="EAGLE drafter folder for the eagle method (default: the one shipped for --model)."),
]
TreeNodesOpt = Annotated[
    Optional[int],
    typer.Option("--tree-nodes", min=1, max=64,
                 help="Largest draft tree of the tree methods (eagle-tree, eagle+lookup-tree, dflash-tree; default "
                 "32): each step verifies as many of them as the measured verification cost says pay (0 to this)."),
]
AdaptiveOpt = Annotated[
    Optional[bool],
    typer.Option("--adaptive/--fixed-budget",
                 help="Tree methods (and the dflash and draft-model-uag chains): choose each step's draft size from "
                 "the measured verification cost (default), or always draft the whole --tree-nodes / --num-tokens (to "
                 "measure tau by budget)."),
]


def _check_pairs(values: Optional[list[str]]) -> Optional[list[str]]:
    for value in values or []:
        key, equals, _ = value.partition("=")
        if not equals or not key.strip():
            raise typer.BadParameter(f"{value!r}: give KEY=VALUE, e.g. --option num_tokens=4")
    return values


OptionOpt = Annotated[
    Optional[list[str]],
    typer.Option("--option", metavar="KEY=VALUE", callback=_check_pairs,
                 help="Any method option as KEY=VALUE (repeatable), e.g. --option num_tokens=4 or --option "
                 "medusa=PATH; `hf-speculative methods` lists the methods, their options are those of "
                 "hf_speculative.tooling.methods. A name no method given reads is refused with the close match."),
]


def parse_option_pairs(values: Optional[list[str]]) -> dict[str, Any]:
    """``["num_tokens=4", "adaptive=false", "skip=4,6,9"]`` -> ``{"num_tokens": 4, "adaptive": False, "skip":
    "4,6,9"}``: a value is read as JSON (numbers, true/false, null) when it is JSON, else kept as text; dashes in
    a key become underscores (``num-tokens`` is ``num_tokens``)."""
    options: dict[str, Any] = {}
    for value in values or []:
        key, _, text = value.partition("=")
        lowered = text.strip().lower()
        words = {"true": True, "false": False, "none": None, "null": None}
        if lowered in words:
            parsed: Any = words[lowered]
        else:
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = text
        options[key.strip().replace("-", "_")] = parsed
    return options


MaxNewOpt = Annotated[int, typer.Option("--max-new-tokens", min=1, help="Tokens to generate per prompt (at most).")]
ThreadsOpt = Annotated[
    int, typer.Option("--threads", min=1, help="torch CPU threads (1 is fastest and steadiest on CPU).")
]
ChatOpt = Annotated[
    bool, typer.Option("--chat-template/--no-chat-template", help="Wrap prompts in the chat template.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
ReferenceOpt = Annotated[Optional[str], typer.Option("--reference", help="Add a 'vs METHOD' speedup column.")]
GqaOpt = Annotated[
    bool,
    typer.Option(
        "--sdpa-gqa/--no-sdpa-gqa",
        help="Set transformers' TRANSFORMERS_SDPA_FORCE_GQA=1 for this process (greedy and every method alike): "
        "grouped-query attention without repeat_kv copies in multi-token forwards.",
    ),
]
DTYPES = ("float32", "bfloat16", "float16")
DtypeOpt = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="The target's dtype (and a --draft-model's): float32, bfloat16 or float16. bfloat16 with --cpu-layout "
        "all+kernel runs the products on the CPU's bf16 dot products where it has AVX512-BF16, every output still "
        "identical to greedy.",
    ),
]
LayoutOpt = Annotated[
    str,
    typer.Option(
        "--cpu-layout",
        help="Re-lay out the target's fp32 CPU linear weights column-major (hfs.optimize_for_cpu) before running "
        "greedy and every method: none, output (the lm_head only) or all; output+packed / all+packed also run "
        "products of several rows on oneDNN-packed copies (pack=True); output+kernel / all+kernel run products of "
        "1-16 rows on hf_speculative's AVX2/AVX-512 kernel (kernel=True, compiled on first use; greedy runs on "
        "it too). "
        "Multi-token verification gets cheaper.",
    ),
]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The shared options of one ``compare`` / ``bench`` call (``None``: each method's own default)."""

    model: Optional[str] = None
    max_new_tokens: int = 128
    threads: int = 1
    chat_template: bool = True
    draft_model: Optional[str] = None
    num_tokens: Optional[int] = None
    max_ngram: Optional[int] = None
    exit_layer: Optional[int] = None
    eagle: Optional[str] = None
    skip: Optional[str] = None
    calibration_file: Optional[str] = None
    adapter: Optional[str] = None
    tree_nodes: Optional[int] = None
    adaptive: Optional[bool] = None
    sdpa_gqa: bool = False
    cpu_layout: str = "none"
    dtype: str = "float32"
    option: Optional[list[str]] = None

    def method_options(self) -> dict[str, Any]:
        """The options the methods read (:mod:`hf_speculative.tooling.methods`), the ones given only: the named flags,
        then each ``--option KEY=VALUE`` (which wins over a flag of the same name)."""
        names = ("draft_model", "num_tokens", "max_ngram", "exit_layer", "eagle", "skip", "calibration_file",
                 "adapter", "tree_nodes", "adaptive")
        given = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        return {**given, **parse_option_pairs(self.option)}


_ALIASES = {
    "model": ModelOpt, "max_new_tokens": MaxNewOpt, "threads": ThreadsOpt, "chat_template": ChatOpt,
    "draft_model": DraftOpt, "num_tokens": NumTokensOpt, "max_ngram": MaxNgramOpt, "exit_layer": ExitLayerOpt,
    "eagle": EagleOpt, "skip": SkipOpt, "calibration_file": CalibrationOpt, "adapter": AdapterOpt,
    "tree_nodes": TreeNodesOpt, "adaptive": AdaptiveOpt,
    "sdpa_gqa": GqaOpt, "cpu_layout": LayoutOpt, "dtype": DtypeOpt, "option": OptionOpt,
}
_SHARED = [
    inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default,
                      annotation=_ALIASES[field.name])
    for field in dataclasses.fields(RunOptions)
]


def run_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` (a typer command with a ``run: RunOptions`` parameter) the shared options.

    Typer reads a command's options from its signature: the wrapper's signature is the command's own
    parameters, ``run`` left out, followed by one option per :class:`RunOptions` field; a call gathers
    those into ``run``.
    """
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "run"]
    clash = {p.name for p in own} & {p.name for p in _SHARED}
    if clash:
        raise TypeError(f"{command.__name__} declares shared options itself: {sorted(clash)}")

    @functools.wraps(command)
    def with_run_options(**kwargs: Any) -> Any:
        shared = {p.name: kwargs.pop(p.name) for p in _SHARED}
        return command(run=RunOptions(**shared), **kwargs)

    parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + _SHARED
    with_run_options.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    with_run_options.__annotations__ = {p.name: p.annotation for p in parameters}
    del with_run_options.__wrapped__  # typer must see the new signature, not the command's
    return with_run_options
