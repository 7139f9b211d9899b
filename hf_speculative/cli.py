"""The ``hf-speculative`` command line (typer).

Commands: ``models list`` / ``models fetch``, ``compare``, ``bench``, ``bench-report``. Each command
is a plain function registered on :data:`app` (or a sub-app such as :data:`models_app`), so adding one
is one decorated function. Heavy imports (torch, transformers, the models) happen inside the
commands, never at import time.
"""

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .app.examples import EXAMPLES
from .bench.runner import SPEC_BENCH_CATEGORIES

app = typer.Typer(
    name="hf-speculative",
    help="Speculative decoding for Hugging Face transformers: compare and benchmark decoding methods.",
    no_args_is_help=True,
    add_completion=False,
)
models_app = typer.Typer(help="The offline model registry.", no_args_is_help=True)
app.add_typer(models_app, name="models")

DEFAULT_PROMPT = EXAMPLES["code editing"]  # the demo app's code-editing example

# Options shared by the commands that run methods.
ModelOpt = Annotated[
    Optional[str], typer.Option("--model", help="Registry name or local folder (default: the registry's default).")
]
DraftOpt = Annotated[
    Optional[str],
    typer.Option("--draft-model", help="Draft model (registry name or folder) for draft-model / hf-assisted."),
]
NumTokensOpt = Annotated[
    Optional[int], typer.Option("--num-tokens", help="Tokens drafted per step (default: each method's own).")
]
MaxNgramOpt = Annotated[Optional[int], typer.Option("--max-ngram", help="Longest n-gram matched by prompt lookup.")]
ExitLayerOpt = Annotated[
    Optional[int], typer.Option("--exit-layer", help="Layers early-exit / hf-early-exit draft with (default 8).")
]
SkipOpt = Annotated[
    Optional[str], typer.Option("--skip", help="Layers layer-skip skips: 'auto' (default) or indices, e.g. 4,6,9.")
]
CalibrationOpt = Annotated[
    Optional[str], typer.Option("--calibration-file", help="JSON file layer-skip 'auto' loads its calibration from / saves it to.")
]
AdapterOpt = Annotated[
    Optional[str],
    typer.Option("--adapter", help="Exit adapter folder for early-exit-adapter (default: the one shipped for --model)."),
]
EagleOpt = Annotated[
    Optional[str],
    typer.Option("--eagle", help="EAGLE drafter folder for the eagle method (default: the one shipped for --model)."),
]
MaxNewOpt = Annotated[int, typer.Option("--max-new-tokens", min=1, help="Tokens to generate per prompt.")]
ThreadsOpt = Annotated[
    int, typer.Option("--threads", min=1, help="torch CPU threads (1 is fastest and steadiest on CPU).")
]
ChatOpt = Annotated[
    bool, typer.Option("--chat-template/--no-chat-template", help="Wrap prompts in the chat template.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
GqaOpt = Annotated[
    bool,
    typer.Option(
        "--sdpa-gqa/--no-sdpa-gqa",
        help="Set transformers' TRANSFORMERS_SDPA_FORCE_GQA=1 for this process (greedy and every method alike): "
        "grouped-query attention without repeat_kv copies in multi-token forwards, which makes verification "
        "cheaper on CPU.",
    ),
]


LayoutOpt = Annotated[
    str,
    typer.Option(
        "--cpu-layout",
        help="Re-lay out the target's fp32 CPU linear weights column-major (hfs.optimize_for_cpu) before running "
        "greedy and every method: none, output (the lm_head only) or all; output+packed / all+packed also run "
        "products of several rows on oneDNN-packed copies (pack=True); output+kernel / all+kernel run products of "
        "1-16 rows on hf_speculative's AVX2 kernel (kernel=True, compiled on first use; greedy runs on it too). "
        "Multi-token verification gets cheaper.",
    ),
]


def _apply_cpu_layout(model, layout: str) -> None:
    from .cpu_layout import LAYOUT_NAMES, apply_layout

    if layout not in LAYOUT_NAMES:
        _fail(f"--cpu-layout {layout}: use none, output, all, output+packed, all+packed, output+kernel or all+kernel")
    try:
        apply_layout(model, layout)
    except RuntimeError as err:
        _fail(str(err))


def _apply_sdpa_gqa(enabled: bool) -> None:
    if enabled:
        os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
ReferenceOpt = Annotated[Optional[str], typer.Option("--reference", help="Add a 'vs METHOD' speedup column.")]


def _err() -> Console:
    return Console(stderr=True)


def _fail(message: str, code: int = 2) -> NoReturn:
    _err().print(f"[bold red]Error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _split(values: list[str] | str | None) -> list[str]:
    values = [values] if isinstance(values, str) else values or []
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _methods(names: list[str], draft_model: str | None, reference: str | None = None) -> list[Any]:
    """Resolve method names (clear errors for unknown ones and for a missing --draft-model)."""
    from .methods import get_method

    try:
        specs = [get_method(n) for n in names]
        if reference:
            get_method(reference)
    except ValueError as err:
        _fail(str(err))
    if not specs:
        _fail("no method given")
    needing = [s.name for s in specs if s.needs_draft_model]
    if needing and not draft_model:
        _fail(f"method(s) {', '.join(needing)} need --draft-model NAME")
    if reference and reference not in {"greedy", *names}:
        _fail(f"--reference {reference} must be greedy or one of the benchmarked methods ({', '.join(names)})")
    return specs


def _load(name: str | None) -> tuple[Any, Any, str]:
    from . import models

    name = name or models.DEFAULT_MODEL
    try:
        model, tokenizer = models.load_model(name)
    except (models.RegistryError, OSError, ValueError) as err:
        message = str(err)
        if not any(known in message for known in models.REGISTRY):
            message += f" (known models: {', '.join(models.REGISTRY)})"
        _fail(f"cannot load model {name!r}: {message}")
    return model.eval(), tokenizer, name


def _options(draft_model: str | None, num_tokens: int | None, max_ngram: int | None, exit_layer: int | None,
             eagle: str | None = None, skip: str | None = None, calibration_file: str | None = None,
             adapter: str | None = None) -> dict:
    values = {"draft_model": draft_model, "num_tokens": num_tokens, "max_ngram": max_ngram, "exit_layer": exit_layer,
              "eagle": eagle, "skip": skip, "calibration_file": calibration_file, "adapter": adapter}
    return {k: v for k, v in values.items() if v is not None}


# -- models -----------------------------------------------------------------------------------
@models_app.command("list")
def models_list(as_json: JsonOpt = False) -> None:
    """List the models of the offline registry (size, license, whether cached)."""
    from . import models

    rows = models.list_models()
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    table = Table(title="hf_speculative models")
    table.add_column("name", no_wrap=True)
    for column in ("params", "license", "cached", "description"):
        table.add_column(column)
    for row in rows:
        params = row.get("params")
        params = f"{params / 1e6:.0f}M" if isinstance(params, (int, float)) else str(params or "")
        cached = "yes" if row.get("cached") else "no"
        table.add_row(str(row["name"]), params, str(row.get("license", "")), cached, str(row.get("description", "")))
    Console().print(table)


@models_app.command("fetch")
def models_fetch(
    name: Annotated[str, typer.Argument(help="Registry name.")],
    force: Annotated[bool, typer.Option("--force", help="Fetch again even if cached.")] = False,
) -> None:
    """Download and convert a registry model into the local cache."""
    from . import models

    try:
        path = models.fetch(name, progress=True, force=force)
    except models.RegistryError as err:
        _fail(str(err))
    typer.echo(str(path))


# -- compare ----------------------------------------------------------------------------------
@app.command()
def compare(
    method: Annotated[
        list[str], typer.Option("--method", help="Method to compare with greedy (repeatable).")
    ] = ["prompt-lookup"],  # noqa: B006
    model: ModelOpt = None,
    draft_model: DraftOpt = None,
    prompt: Annotated[
        Optional[str], typer.Option("--prompt", help="Prompt text (default: a code-editing request).")
    ] = None,
    max_new_tokens: MaxNewOpt = 128,
    threads: ThreadsOpt = 1,
    chat_template: ChatOpt = True,
    num_tokens: NumTokensOpt = None,
    max_ngram: MaxNgramOpt = None,
    exit_layer: ExitLayerOpt = None,
    eagle: EagleOpt = None,
    skip: SkipOpt = None,
    calibration_file: CalibrationOpt = None,
    adapter: AdapterOpt = None,
    as_json: JsonOpt = False,
    sdpa_gqa: GqaOpt = False,
    cpu_layout: LayoutOpt = "none",
) -> None:
    """Run plain greedy then each --method on one prompt; show outputs, tokens/s, tau and speedups."""
    _apply_sdpa_gqa(sdpa_gqa)
    specs = _methods(_split(method), draft_model)
    import torch

    from .bench.report import format_value
    from .bench.runner import encode_prompt, environment
    from .methods import get_method, run_method

    target, tokenizer, model_name = _load(model)
    _apply_cpu_layout(target, cpu_layout)
    options = _options(draft_model, num_tokens, max_ngram, exit_layer, eagle, skip, calibration_file, adapter)
    torch.set_num_threads(threads)
    text = prompt if prompt is not None else DEFAULT_PROMPT
    input_ids = encode_prompt(tokenizer, text, chat_template)
    specs = [get_method("greedy")] + [s for s in specs if s.name != "greedy"]
    try:
        for spec in specs:  # warm-up
            run_method(spec, target, tokenizer, input_ids, options=options, max_new_tokens=min(max_new_tokens, 16))
        runs = [
            run_method(s, target, tokenizer, input_ids, options=options, max_new_tokens=max_new_tokens) for s in specs
        ]
    except ValueError as err:
        _fail(str(err))
    greedy = runs[0]
    results = [
        {
            "method": run.method,
            "text": tokenizer.decode(run.output_ids, skip_special_tokens=True),
            "new_tokens": run.new_tokens,
            "seconds": run.seconds,
            "tokens_per_s": run.tokens_per_s,
            "tau": run.tau,
            "acceptance_rate": run.acceptance_rate,
            "target_forwards": run.target_forwards,
            "speedup": run.tokens_per_s / greedy.tokens_per_s if greedy.tokens_per_s else None,
            "identical_to_greedy": run.output_ids == greedy.output_ids,
        }
        for run in runs
    ]
    if as_json:
        payload = {"model": model_name, "prompt": text, "max_new_tokens": max_new_tokens, "results": results}
        typer.echo(json.dumps({**payload, "environment": environment(target, threads)}, indent=2))
        return
    console = Console()
    for res in results:
        console.rule(f"[bold]{res['method']}")
        console.print(res["text"], markup=False, highlight=False)
    table = Table(title=f"{model_name}: {max_new_tokens} new tokens, {threads} thread(s)")
    table.add_column("method", no_wrap=True)
    for column in ("tokens", "tokens/s", "speedup", "tau", "acceptance", "identical"):
        table.add_column(column)
    for res in results:
        table.add_row(
            res["method"],
            str(res["new_tokens"]),
            f"{res['tokens_per_s']:.2f}",
            format_value(res["speedup"], "{:.2f}×"),
            format_value(res["tau"], "{:.2f}"),
            format_value(res["acceptance_rate"], "{:.0%}"),
            "yes" if res["identical_to_greedy"] else "[red]NO[/]",
        )
    console.print(table)


# -- bench ------------------------------------------------------------------------------------
@app.command()
def bench(
    model: ModelOpt = None,
    methods: Annotated[
        str, typer.Option("--methods", help="Comma-separated methods; greedy always runs.")
    ] = "prompt-lookup,hf-prompt-lookup",
    dataset: Annotated[
        Optional[Path],
        typer.Option("--dataset", help="Spec-Bench question.jsonl [default: ../shared/data/spec_bench/question.jsonl]"),
    ] = None,
    categories: Annotated[
        str, typer.Option("--categories", help="Comma-separated; mt-bench = the 8 MT-bench categories together.")
    ] = ",".join(SPEC_BENCH_CATEGORIES),
    per_category: Annotated[
        int, typer.Option("--per-category", min=0, help="First N prompts of each category (0 = all).")
    ] = 10,
    max_new_tokens: MaxNewOpt = 128,
    threads: ThreadsOpt = 1,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, help="Runs per (prompt, method); the median time is kept.")
    ] = 1,
    out: Annotated[
        Path, typer.Option("--out", help="jsonl file to append results to; the report goes next to it (.md).")
    ] = Path("results.jsonl"),
    reference: ReferenceOpt = None,
    draft_model: DraftOpt = None,
    num_tokens: NumTokensOpt = None,
    max_ngram: MaxNgramOpt = None,
    exit_layer: ExitLayerOpt = None,
    eagle: EagleOpt = None,
    skip: SkipOpt = None,
    calibration_file: CalibrationOpt = None,
    adapter: AdapterOpt = None,
    chat_template: ChatOpt = True,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    sdpa_gqa: GqaOpt = False,
    cpu_layout: LayoutOpt = "none",
) -> None:
    """Benchmark methods against greedy on Spec-Bench prompts (jsonl + markdown report)."""
    _apply_sdpa_gqa(sdpa_gqa)
    from .bench.report import format_report, write_report
    from .bench.runner import default_dataset_path, load_prompts, run_bench

    names = _split(methods)
    _methods(names, draft_model, reference)
    dataset = dataset or default_dataset_path()
    if dataset is None or not Path(dataset).is_file():
        _fail(f"dataset not found: {dataset or '../shared/data/spec_bench/question.jsonl'} (use --dataset PATH)")
    try:
        prompts = load_prompts(dataset, _split(categories) or None, per_category or None)
    except (ValueError, KeyError, json.JSONDecodeError) as err:
        _fail(f"cannot read {dataset}: {err}")
    target, tokenizer, model_name = _load(model)
    _apply_cpu_layout(target, cpu_layout)
    try:
        records = run_bench(
            target,
            tokenizer,
            names,
            prompts,
            out=out,
            model_name=model_name,
            options=_options(draft_model, num_tokens, max_ngram, exit_layer, eagle, skip, calibration_file, adapter),
            max_new_tokens=max_new_tokens,
            threads=threads,
            repeats=repeats,
            chat_template=chat_template,
            progress=progress,
        )
    except ValueError as err:
        _fail(str(err))
    _, md_path = write_report(out, reference)
    typer.echo(format_report(records, reference))
    _err().print(f"results appended to {out}; report of the whole file written to {md_path}", soft_wrap=True)


@app.command("bench-report")
def bench_report(
    file: Annotated[Path, typer.Argument(help="A jsonl written by `hf-speculative bench`.")],
    reference: ReferenceOpt = None,
) -> None:
    """Re-make the markdown report of a benchmark jsonl (printed, and written next to it as .md)."""
    from .bench.report import write_report

    if not file.is_file():
        _fail(f"no such file: {file}")
    try:
        text, _ = write_report(file, reference)
    except (json.JSONDecodeError, KeyError) as err:
        _fail(f"{file} is not a benchmark jsonl: {err!r}")
    typer.echo(text)


def _register_training_commands() -> None:
    from .training import cli as training_cli

    app.command("train-eagle")(training_cli.train_eagle)
    app.command("export-eagle")(training_cli.export_eagle)
    app.command("self-distill")(training_cli.self_distill)
    app.command("sample-prompts")(training_cli.sample_prompts)


_register_training_commands()


def main() -> None:
    """Console-script entry point (``hf-speculative``)."""
    try:
        app()
    except SystemExit as done:
        if done.code not in (None, 0):
            raise  # failed: torchrun stops the other processes; waiting for them here could hang
    _leave_process_group()


def _leave_process_group() -> None:
    """Processes started together (torchrun, accelerate launch) wait for each other, then take their
    process group down before the interpreter exits. Left to interpreter shutdown, a process that
    finished first could abort in the group's teardown ("terminate called without an active
    exception": CI, 2026-11-24, a non-main process of train-eagle while the main one validated)."""
    distributed = sys.modules.get("torch.distributed")  # never imported here just to ask
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.barrier()
        distributed.destroy_process_group()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
