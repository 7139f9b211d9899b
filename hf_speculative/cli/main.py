"""The ``hf-speculative`` command line (typer; the [cli] extra).

Commands: ``models list`` / ``models fetch`` / ``models verify``, ``methods``, ``compare``, ``showcase``,
``bench``, ``bench-report``, ``profile``, ``project`` and the training commands. Each command is a plain
function registered on :data:`app` (or a sub-app such as :data:`models_app`), so adding one is one decorated
function; ``compare`` and ``bench`` share their options through :func:`hf_speculative.cli.options.run_options`.
Heavy imports (the models, the benchmark runner, the drafters) happen inside the commands, so ``--help``
stays fast.
"""

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

from ..bench.report import format_value
from ..bench.spec_bench import DATASET, SPEC_BENCH_CATEGORIES
from .flags import Typer
from .options import (
    AdapterOpt,
    DraftOpt,
    EagleOpt,
    ExitLayerOpt,
    JsonOpt,
    OptionOpt,
    ReferenceOpt,
    RunOptions,
    parse_option_pairs,
    run_options,
)
from ..extras import require
from ..tooling.methods import available_methods
from ..tooling.prompting import DEFAULT_EXAMPLE, EXAMPLES
from ..core.stats import format_acceptance

_CLI = "The hf-speculative command line"
typer = require("typer", "cli", _CLI)
Console = require("rich.console", "cli", _CLI).Console
Table = require("rich.table", "cli", _CLI).Table
escape = require("rich.markup", "cli", _CLI).escape

app = Typer(  # typer.Typer whose --help shows no <bool> beside a flag (.flags)
    name="hf-speculative",
    help="Speculative decoding for Hugging Face transformers: compare and benchmark decoding methods.",
    no_args_is_help=True,
    add_completion=False,
)
models_app = Typer(help="The offline model registry.", no_args_is_help=True)
app.add_typer(models_app, name="models")


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"hf-speculative {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="Print the version and exit.")] = False,
) -> None:
    """Speculative decoding for Hugging Face transformers: compare and benchmark decoding methods."""

DEFAULT_PROMPT = EXAMPLES[DEFAULT_EXAMPLE]  # the demo app's code-editing example
SHOWCASE_PROMPT = """\
Write this shopping list out again in full, one item per line.

- 2 kg of apples
- 1 litre of milk
- a loaf of whole-grain bread
- 6 free-range eggs
- 200 g of cheddar cheese
- a bunch of bananas
- 500 g of pasta
- a jar of tomato sauce"""
"""``hf-speculative showcase``'s prompt: a task whose answer the default model (smollm2-135m-instruct) really copies
from the prompt, so prompt lookup's drafts are accepted (a small model asked to "copy this sentence" often does
not copy it)."""
METHOD_NAMES = ", ".join(available_methods())  # for --help
SHIPPED_DATASET = "hf_speculative/" + DATASET.relative_to(Path(__file__).resolve().parents[1]).as_posix()  # for --help


def _apply_cpu_layout(model, layout: str) -> None:
    from ..cpu.layout import LAYOUT_NAMES, apply_layout

    if layout not in LAYOUT_NAMES:
        _fail(f"--cpu-layout {layout}: use none, output, all, output+packed, all+packed, output+kernel or all+kernel")
    try:
        apply_layout(model, layout)
    except RuntimeError as err:
        _fail(str(err))


def _apply_sdpa_gqa(enabled: bool) -> None:
    if enabled:
        os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"


def _err() -> Console:
    return Console(stderr=True)


def _progress(line: str) -> None:
    """One line of progress on stderr (stdout stays the result: the tables, or the JSON)."""
    _err().print(line, markup=False, highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 2) -> NoReturn:
    _err().print(f"[bold red]Error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _split(values: list[str] | str | None) -> list[str]:
    values = [values] if isinstance(values, str) else values or []
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _methods(names: list[str], draft_model: str | None, reference: str | None = None,
             options: dict | None = None) -> list[Any]:
    """Resolve method names (clear errors for unknown ones, for options none of them reads, with the close match,
    and for a missing --draft-model). An earlier name of a method (``eagle+lookup``, now ``hybrid``) resolves to it."""
    from ..tooling.methods import check_options, get_method

    try:
        specs = [get_method(n) for n in names]
        reference = get_method(reference).name if reference else None
        check_options(specs, options)
    except ValueError as err:
        _fail(str(err))
    if not specs:
        _fail("no method given")
    needing = [s.name for s in specs if s.needs_draft_model]
    if needing and not draft_model:
        _fail(f"method(s) {', '.join(needing)} need --draft-model NAME")
    if reference and reference not in {"greedy", *(s.name for s in specs)}:
        _fail(f"--reference {reference} must be greedy or one of the benchmarked methods ({', '.join(names)})")
    return specs


def _load(name: str | None, dtype: str = "float32") -> tuple[Any, Any, str]:
    from ..registry import models
    from .options import DTYPES

    if dtype not in DTYPES:
        _fail(f"--dtype {dtype}: use one of {', '.join(DTYPES)}.")
    name = name or models.DEFAULT_MODEL
    _progress(f"loading {name}…")
    try:
        model, tokenizer = models.load_model(name, dtype=dtype)
    except (models.RegistryError, OSError, ValueError) as err:
        message = str(err)
        if not any(known in message for known in models.REGISTRY):
            message += f" (known models: {', '.join(models.REGISTRY)})"
        _fail(f"cannot load model {name!r}: {message}")
    return model.eval(), tokenizer, name


# -- models -----------------------------------------------------------------------------------
@models_app.command("list")
def models_list(as_json: JsonOpt = False) -> None:
    """List the models of the offline registry (size, license, whether cached)."""
    from ..registry import models

    rows = models.list_models()
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    table = Table(title="hf_speculative models")
    longest = max((len(str(row["name"])) for row in rows), default=0)
    # whole names where the terminal leaves the other columns room, else folded like them (rich would otherwise
    # squeeze those to nothing)
    table.add_column("name", overflow="fold", no_wrap=Console().width >= longest + 50)
    for column in ("params", "license", "cached", "description"):
        table.add_column(column, overflow="fold")  # a long word folds onto the next line, never cut to "…"
    for row in rows:
        params = row.get("params")
        params = f"{params / 1e6:.0f}M" if isinstance(params, (int, float)) else str(params or "")
        cached = "yes" if row.get("cached") else "no"
        table.add_row(str(row["name"]), params, str(row.get("license", "")), cached, str(row.get("description", "")))
    _print_full_width(table)


def _print_full_width(renderable: Any) -> None:
    """Print ``renderable`` to stdout: in a terminal, to its width; otherwise (a pipe, a file) as wide as it needs
    (rich would otherwise assume 80 columns and wrap or fold every row)."""
    console = Console()
    if not console.is_terminal:
        from rich.measure import Measurement

        wide = Console(width=10_000)
        needed = Measurement.get(wide, wide.options, renderable).maximum
        console = Console(width=max(console.width, needed))
    console.print(renderable)


@models_app.command("fetch")
def models_fetch(
    name: Annotated[str, typer.Argument(help="Registry name.")],
    force: Annotated[bool, typer.Option("--force", help="Fetch again even if cached.")] = False,
) -> None:
    """Download and convert a registry model into the local cache."""
    from ..registry import models

    try:
        path = models.fetch(name, progress=True, force=force)
    except models.RegistryError as err:
        _fail(str(err))
    typer.echo(str(path))


@models_app.command("verify")
def models_verify(
    name: Annotated[Optional[str], typer.Argument(help="Registry name (default: every cached model).")] = None,
) -> None:
    """Re-hash every file of the cached models (and of the shipped drafters) against the sha256 recorded at
    fetch (at release); exit 1 if any differs."""
    import time

    from ..registry import models
    from ..drafters.eagle import checkpoints
    from ..drafters.eagle.drafter import PRETRAINED_DIR
    from ..drafters.self_speculative.exit_adapter import SHIPPED_DIR

    names = [name] if name else [n for n in models.REGISTRY if models.model_path(n).exists()]
    checks = [(f"model {n}", lambda n=n: len(json.loads((models.verify(n) / models.MARKER).read_text())["files"]))
              for n in names]
    if name is None:
        checks += [(f"drafter {root.name}/{n}", lambda d=root / n: checkpoints.check_manifest(d, full=True, required=True))
                   for root in (PRETRAINED_DIR, SHIPPED_DIR) for n in checkpoints.shipped_names(root)]
    failed = 0
    for label, check in checks:
        t0 = time.perf_counter()
        try:
            count = check()
        except (models.RegistryError, checkpoints.CheckpointError) as err:
            failed += 1
            typer.echo(f"FAILED {label}: {err}")
            continue
        typer.echo(f"ok     {label}: {count} files ({time.perf_counter() - t0:.1f} s)")
    if not names:
        typer.echo("no registry model is cached")
    if failed:
        raise typer.Exit(1)


# -- methods ----------------------------------------------------------------------------------
@app.command("methods")
def list_methods(
    model: Annotated[Optional[str], typer.Option(
        "--model", help="Also say whether each method runs on this model (registry name or local folder), and why "
                        "not; checked by building each method's drafter for it, without generating.")] = None,
    draft_model: DraftOpt = None,
    exit_layer: ExitLayerOpt = None,
    eagle: EagleOpt = None,
    adapter: AdapterOpt = None,
    option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the decoding methods, one line each; with --model, whether each runs on that model (and why not).

    The methods are those of the registry (hf_speculative.tooling.methods) that compare, showcase and bench run."""
    from ..tooling.methods import check_options, get_method, problem_on

    specs = [get_method(name) for name in available_methods()]
    problems: dict[str, str | None] = {}
    if model is not None:
        given = {"draft_model": draft_model, "exit_layer": exit_layer, "eagle": eagle, "adapter": adapter}
        options = {**{k: v for k, v in given.items() if v is not None}, **parse_option_pairs(option)}
        try:
            check_options(specs, options)
        except ValueError as err:
            _fail(str(err))
        target, tokenizer, model = _load(model)
        _progress(f"checking the {len(specs)} methods on {model}…")
        problems = {spec.name: problem_on(spec, target, tokenizer, options) for spec in specs}
    if as_json:
        rows = [{"method": s.name, "kind": s.kind, "label": s.label, "description": s.description,
                 "options": s.option_names} for s in specs]
        if model is not None:
            for row in rows:
                row.update(model=model, runs=problems[row["method"]] is None, why_not=problems[row["method"]])
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    width = max(len(s.name) for s in specs)
    if model is not None:
        typer.echo(f"methods on {model} (yes: builds and passes its checks for this model; no: why not)")
    for spec in specs:
        if model is None:
            typer.echo(f"{spec.name:<{width}}  {spec.description}")
        else:
            problem = problems[spec.name]
            verdict = f"yes  {spec.description}" if problem is None else f"no   {problem}"
            typer.echo(f"{spec.name:<{width}}  {verdict}")


# -- compare ----------------------------------------------------------------------------------
CompareMethodOpt = Annotated[
    list[str],
    typer.Option("--method", "--methods", help=f"Method to compare with greedy: repeat it or give a comma list "
                 f"(--method a --method b, --methods a,b). One of: {METHOD_NAMES}."),
]


CompareRepeatsOpt = Annotated[
    int,
    typer.Option("--repeats", min=1, help="Runs of each method, in turn (greedy, a, b, greedy, a, b, ...): the table "
                 "shows the median of each figure, the speedup as the ratio of the medians of tokens/s."),
]


@app.command()
@run_options
def compare(
    run: RunOptions,
    method: CompareMethodOpt = ["prompt-lookup"],  # noqa: B006
    prompt: Annotated[
        Optional[str], typer.Option("--prompt", help="Prompt text (default: a code-editing request).")
    ] = None,
    repeats: CompareRepeatsOpt = 1,
    as_json: JsonOpt = False,
) -> None:
    """Run plain greedy then each --method on one prompt; show outputs, tokens/s, tau and speedups."""
    _compare(run, method, prompt if prompt is not None else DEFAULT_PROMPT, as_json, repeats)


@app.command()
@run_options
def showcase(
    run: RunOptions,
    method: CompareMethodOpt = ["prompt-lookup"],  # noqa: B006
    repeats: CompareRepeatsOpt = 1,
    as_json: JsonOpt = False,
) -> None:
    """compare on a prompt that the default model answers by copying it: prompt lookup's drafts get accepted.

    The prompt asks to write a shopping list out again; the answer reuses the prompt's text, which is where
    prompt lookup pays off. Same options and output as compare (no --prompt)."""
    _progress("prompt: " + SHOWCASE_PROMPT.splitlines()[0] + " (a shopping list of 8 items)")
    _compare(run, method, SHOWCASE_PROMPT, as_json, repeats)


def _compare(run: RunOptions, method: list[str], text: str, as_json: bool, repeats: int = 1) -> None:
    """``compare`` and ``showcase``: greedy, then each method, on ``text``; ``repeats`` times, in turn."""
    _apply_sdpa_gqa(run.sdpa_gqa)
    names = _split(method)
    specs = _methods(names, run.draft_model, options=parse_option_pairs(run.option))
    import torch

    from ..bench.runner import environment
    from ..drafters.suffix.history import outputs_held
    from ..tooling.methods import get_method, run_method
    from ..tooling.prompting import encode_prompt
    from .compare_runs import summarise

    target, tokenizer, model_name = _load(run.model, run.dtype)
    _apply_cpu_layout(target, run.cpu_layout)
    options = run.method_options()
    torch.set_num_threads(run.threads)
    input_ids = encode_prompt(tokenizer, text, run.chat_template)
    specs = [get_method("greedy")] + [s for s in specs if s.name != "greedy"]
    max_new_tokens = run.max_new_tokens
    warm = min(max_new_tokens, 16)
    runs: list[list] = [[] for _ in specs]  # per method, its runs in order
    # SuffixDecoding's history keeps the model's outputs: the warm-up's and greedy's answers to this very prompt would
    # let it copy the answer whole (τ far above what a new prompt gets); no call of compare's joins it
    try:
        with outputs_held(target, keep=False):
            for spec in specs:  # warm-up
                _progress(f"warming up {spec.name} ({warm} tokens)…")
                run_method(spec, target, tokenizer, input_ids, options=options, max_new_tokens=warm)
            for repeat in range(repeats):
                for number, spec in enumerate(specs, 1):
                    step = f"[{number}/{len(specs)}] {spec.name}" + (f", run {repeat + 1}/{repeats}" if repeats > 1
                                                                      else "")
                    _progress(f"{step}: generating up to {max_new_tokens} tokens…")
                    done = run_method(spec, target, tokenizer, input_ids, options=options,
                                      max_new_tokens=max_new_tokens)
                    tau = "" if done.tau is None else f", tau {done.tau:.2f}"
                    _progress(f"{step}: done, {done.new_tokens} tokens in {done.seconds:.2f} s{tau}")
                    runs[number - 1].append(done)
    except ValueError as err:  # the options' errors (OptionTypeError is a ValueError too)
        _fail(str(err))
    results = summarise(runs, tokenizer)
    for doubt in timing_doubts(results, repeats):
        _progress(f"note: {doubt}")
    if as_json:
        payload = {"model": model_name, "prompt": text, "max_new_tokens": max_new_tokens, "repeats": repeats,
                   "results": results}
        typer.echo(json.dumps({**payload, "environment": environment(target, run.threads)}, indent=2))
        return
    _print_comparison(results, compare_title(model_name, results, max_new_tokens, run.threads, repeats))


def timing_doubts(results: list[dict], repeats: int = 1) -> list[str]:
    """Speedups that τ contradicts: a method whose drafts saved no target forward (τ at most 1.01) cannot be much
    faster or slower than greedy, so a speedup beyond ±10% there is the timing of one call (the machine's other work,
    caches), which one call of each cannot tell apart from a real effect; with ``repeats`` runs each, the medians
    still moved by the machine's other work."""
    if repeats > 1:
        why = (f"timing noise (the medians of {repeats} runs each still differ: the machine's other work); "
               "`hf-speculative bench` measures many prompts.")
    else:
        why = ("timing noise of single calls; `--repeats N` gives medians of N runs, and `hf-speculative bench` "
               "interleaves repeated runs on many prompts.")
    return [f"{res['method']}: {res['speedup']:.2f}× at τ {res['tau']:.2f}: with no target forward saved the speedup is "
            + why
            for res in results[1:]
            if res.get("tau") is not None and res["tau"] <= 1.01 and res.get("speedup")
            and not 0.9 <= res["speedup"] <= 1.1]


def compare_title(model_name: str, results: list[dict], max_new_tokens: int, threads: int, repeats: int = 1) -> str:
    """The title of ``compare``'s table: the tokens the methods generated (fewer than ``--max-new-tokens``
    when the model stopped), e.g. ``"m: 13 new tokens (--max-new-tokens 48), 1 thread(s)"``, and with
    ``repeats`` above 1 ``", medians of 5 runs"``."""
    counts = sorted({res["new_tokens"] for res in results})
    generated = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    tokens = "token" if generated == "1" else "tokens"
    runs = f", medians of {repeats} runs" if repeats > 1 else ""
    return f"{model_name}: {generated} new {tokens} (--max-new-tokens {max_new_tokens}), {threads} thread(s){runs}"


def _print_comparison(results: list[dict], title: str) -> None:
    console = Console()
    for res in results:
        console.rule(f"[bold]{res['method']}")
        console.print(res["text"], markup=False, highlight=False)
    table = Table(title=title)
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
            format_acceptance(res["acceptance_rate"], res.get("drafted")),
            "yes" if res["identical_to_greedy"] else "[red]NO[/]",
        )
    console.print(table)


# -- bench ------------------------------------------------------------------------------------
@app.command()
@run_options
def bench(
    run: RunOptions,
    methods: Annotated[
        list[str],
        typer.Option("--methods", "--method", help="Methods to benchmark; greedy always runs. A comma list or "
                     f"repeated (--methods a,b or --method a --method b). Known: {METHOD_NAMES}."),
    ] = ["prompt-lookup", "hf-prompt-lookup"],  # noqa: B006
    dataset: Annotated[
        Path,
        typer.Option("--dataset", show_default=False, help="A Spec-Bench question.jsonl. Default: "
                     f"{SHIPPED_DATASET} (Spec-Bench's 480 questions, shipped with hf_speculative)."),
    ] = DATASET,
    categories: Annotated[
        str, typer.Option("--categories", help="Comma-separated; mt-bench = the 8 MT-bench categories together.")
    ] = ",".join(SPEC_BENCH_CATEGORIES),
    per_category: Annotated[
        int, typer.Option("--per-category", min=0, help="First N prompts of each category (0 = all).")
    ] = 10,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, help="Runs per (prompt, method); the median time is kept.")
    ] = 1,
    out: Annotated[
        Path, typer.Option("--out", help="jsonl file of this run's results (replaced; see --append); this run's "
                                         "report goes next to it (.md).")
    ] = Path("results.jsonl"),
    append: Annotated[bool, typer.Option(
        "--append", help="Add this run's results to the end of --out instead of replacing it (the printed report "
                         "still shows this run only; `hf-speculative bench-report FILE` reports every run in it).")]
    = False,
    reference: ReferenceOpt = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    batch_size: Annotated[
        Optional[str],
        typer.Option("--batch-size", help="Batch sizes, comma-separated (e.g. 1,2,4,8,16): throughput over left-padded "
                     "batches against transformers' batched greedy (hf_speculative's methods; see docs/batching.md)."),
    ] = None,
) -> None:
    """Benchmark methods against greedy on Spec-Bench prompts (jsonl + markdown report of this run)."""
    _apply_sdpa_gqa(run.sdpa_gqa)
    if batch_size is not None:
        return _bench_batches(run, methods, dataset, categories, per_category, repeats, out, progress, batch_size,
                              append)
    from ..bench.report import write_report
    from ..bench.runner import run_bench
    from ..bench.spec_bench import load_prompts

    specs = _methods(_split(methods), run.draft_model, reference, parse_option_pairs(run.option))
    names = [spec.name for spec in specs]  # (an earlier name given: the records and the report use the method's)
    if reference:
        from ..tooling.methods import get_method

        reference = get_method(reference).name
    if not Path(dataset).is_file():
        _fail(f"dataset not found: {dataset} (use --dataset PATH)")
    try:
        prompts = load_prompts(dataset, _split(categories) or None, per_category or None)
    except (ValueError, KeyError, json.JSONDecodeError) as err:
        _fail(f"cannot read {dataset}: {err}")
    target, tokenizer, model_name = _load(run.model, run.dtype)
    _apply_cpu_layout(target, run.cpu_layout)
    try:
        records = run_bench(
            target,
            tokenizer,
            names,
            prompts,
            out=out,
            model_name=model_name,
            options=run.method_options(),
            max_new_tokens=run.max_new_tokens,
            threads=run.threads,
            repeats=repeats,
            chat_template=run.chat_template,
            progress=progress,
            append=append,
        )
    except ValueError as err:
        _fail(str(err))
    text, md_path = write_report(out, reference, records=records)
    typer.echo(text)
    _err().print(f"results {'appended to' if append else 'written to'} {out}; this run's report written to {md_path}",
                 soft_wrap=True)


def _bench_batches(run: RunOptions, methods: list[str], dataset: Path, categories: str, per_category: int,
                   repeats: int, out: Path, progress: bool, batch_size: str, append: bool) -> None:
    """``bench --batch-size``: hf_speculative.bench.batch (throughput per batch size)."""
    from ..bench.batch import format_summary, run_batch_bench, summarize
    from ..bench.spec_bench import load_prompts

    try:
        sizes = [int(b) for b in _split(batch_size)]
    except ValueError:
        _fail(f"--batch-size {batch_size!r}: give whole numbers, comma-separated (e.g. 1,2,4,8,16)")
    if not Path(dataset).is_file():
        _fail(f"dataset not found: {dataset} (use --dataset PATH)")
    try:
        prompts = load_prompts(dataset, _split(categories) or None, per_category or None)
    except (ValueError, KeyError, json.JSONDecodeError) as err:
        _fail(f"cannot read {dataset}: {err}")
    names = _split(methods)
    _methods(names, run.draft_model, options=parse_option_pairs(run.option))
    target, tokenizer, model_name = _load(run.model, run.dtype)
    _apply_cpu_layout(target, run.cpu_layout)
    if not append:
        Path(out).unlink(missing_ok=True)  # run_batch_bench appends: a run writes its own file unless --append
    try:
        records = run_batch_bench(target, tokenizer, names, prompts, batch_sizes=sizes, out=out,
                                  model_name=model_name, options=run.method_options(),
                                  max_new_tokens=run.max_new_tokens, threads=run.threads, repeats=repeats,
                                  chat_template=run.chat_template, progress=progress)
    except ValueError as err:
        _fail(str(err))
    table = format_summary(summarize(records))
    md_path = Path(out).with_suffix(".md")
    md_path.write_text(table + "\n", encoding="utf-8")
    typer.echo(table)
    _err().print(f"results {'appended to' if append else 'written to'} {out}; this run's table written to {md_path}",
                 soft_wrap=True)


@app.command("bench-report")
def bench_report(
    file: Annotated[Path, typer.Argument(help="A jsonl written by `hf-speculative bench`.")],
    reference: ReferenceOpt = None,
) -> None:
    """Re-make the markdown report of a benchmark jsonl (printed, and written next to it as .md)."""
    from ..bench.report import write_report

    if not file.is_file():
        _fail(f"no such file: {file}")
    try:
        text, _ = write_report(file, reference)
    except (json.JSONDecodeError, KeyError) as err:
        _fail(f"{file} is not a benchmark jsonl: {err!r}")
    typer.echo(text)


@app.command()
def profile(
    model: Annotated[Optional[str], typer.Option(help="Registry name or local folder to profile (real weights).")] = None,
    config: Annotated[Optional[str], typer.Option(
        help="A real architecture the package carries, built with --random-weights: "
             "smollm2-135m, qwen2.5-1.5b, qwen2.5-7b, llama-3.1-8b.")] = None,
    random_weights: Annotated[bool, typer.Option(help="Build --config with random weights (nothing downloaded).")] = False,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    contexts: Annotated[str, typer.Option(help="Comma-separated context lengths.")] = "512,2048",
    sizes: Annotated[str, typer.Option(help="Comma-separated draft tokens per forward (0 = one-token forward).")]
    = "0,1,2,4,8,16,32,64",
    repeats: Annotated[int, typer.Option(
        min=1, help="Timed forwards per size, the sizes taking turns (the median is kept).")] = 10,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads.")] = 1,
    out: Annotated[Path, typer.Option(help="JSON file to write (a .png plot goes next to it with --plot).")]
    = Path("profile.json"),
    plot: Annotated[bool, typer.Option(help="Also draw the relative costs (needs matplotlib: [app]).")] = False,
    compile: Annotated[Optional[str], typer.Option(
        help="Time the fixed-shape forward on a static cache: 'static' (eager) or a torch.compile mode "
             "(reduce-overhead, default, ...); default: the eager forward on a dynamic cache.")] = None,
    batches: Annotated[str, typer.Option(
        help="Also time batches (e.g. 1,2,4,8,16): the batch loop's forward over [B, 1 + n] tokens.")] = "",
) -> None:
    """Time verification on this model and device: one forward over n draft tokens (chain or tree) against one."""
    import torch

    from ..bench import profile as profiling
    from ..bench.bandwidth import describe as describe_bandwidth

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes:
        _fail(f"--dtype {dtype}: use float32, bfloat16 or float16.")
    if (model is None) == (config is None):
        _fail("profile needs one of --model NAME and --config NAME --random-weights.")
    if config is not None and not random_weights:
        _fail("--config builds a real architecture with random weights: add --random-weights.")
    if device == "cuda" and not torch.cuda.is_available():
        _fail("--device cuda: no CUDA device is visible to torch here; use --device cpu.")
    torch.set_num_threads(threads)
    try:
        settings = profiling.ProfileSettings(contexts=tuple(int(c) for c in _split(contexts)),
                                             sizes=tuple(int(n) for n in _split(sizes)), repeats=repeats,
                                             compile=compile, batches=tuple(int(b) for b in _split(batches)))
        if config is not None:
            target, label = profiling.random_model(config, device, dtypes[dtype]), f"{config} (random weights)"
        else:
            from ..registry.models import load_model

            target, _ = load_model(model, dtype=dtypes[dtype])
            target, label = target.to(device).eval(), model
    except ValueError as err:
        _fail(str(err))
    try:
        result = profiling.profile(target, settings, label=label, progress=lambda line: _err().print(line))
    except ValueError as err:  # a bad HFS_READ_BANDWIDTH_GBS
        _fail(str(err))
    profiling.save(result, out)
    for context, by_shape in result["relative"].items():
        cells = ", ".join(f"{n}: {r:.2f}" for n, r in by_shape["tree"].items())
        typer.echo(f"context {context}, tree nodes -> cost in one-token forwards: {cells}")
    for context, by_batch in result.get("batch_relative", {}).items():
        for batch, by_size in by_batch.items():
            cells = ", ".join(f"{n}: {r:.2f}" for n, r in by_size.items())
            typer.echo(f"context {context}, batch {batch}, draft tokens per row -> cost in plain steps: {cells}")
    for context, forward in profiling.one_token_seconds(result["seconds"]).items():
        line = describe_bandwidth(result, seconds_per_token=forward, threads=result["threads"])  # None off a CPU
        if line:
            typer.echo(f"context {context}, one-token forward {forward * 1e3:.2f} ms: {line}")
    if plot:
        _err().print(f"plot: {profiling.plot(result, out.with_suffix('.png'))}")
    _err().print(f"profile written to {out}")


@app.command()
def project(
    bench_file: Annotated[Path, typer.Argument(
        help="A JSONL written by `hf-speculative bench` (of this version: with per-step records), or a MagicDec grid "
             "(benchmarks/magicdec_grid.py's: projected by bytes over bandwidth, see --magicdec).")],
    profile_file: Annotated[Path, typer.Option(
        "--profile", help="A JSON written by `hf-speculative profile` on the device to project onto.")],
    out: Annotated[Optional[Path], typer.Option(
        help="Also write the projection as JSON to this file and as markdown beside it (.md).")] = None,
    draft_cost: Annotated[Optional[list[str]], typer.Option(
        "--draft-cost", help="Drafting cost per step in one-token forwards: X for every method or METHOD=X "
                             "(repeatable). Default: each step's own draft seconds over greedy's seconds per token, "
                             "from the benchmark (assumes drafting scales like the target between the devices).")]
    = None,
    loop_cost: Annotated[Optional[list[str]], typer.Option(
        "--loop-cost", help="The loop's own work per step (appending tokens, stops, the drafter's observe) in "
                            "one-token forwards: X or METHOD=X (repeatable; 0 leaves it out). Default: each step's "
                            "own seconds outside drafting and verifying over greedy's seconds per token.")]
    = None,
    magicdec: Annotated[bool, typer.Option(
        "--magicdec", help="Project a MagicDec grid's acceptance (detected from its records too) onto the profile's "
                           "device at a larger model's shape, by bytes over bandwidth "
                           "(hf_speculative/bench/magicdec_projection.py).")] = False,
    config: Annotated[str | None, typer.Option(
        help="--magicdec: the target's shape, a shipped config (llama-3.1-8b, ...) or a config.json path; default: "
             "the profile's model.")] = None,
    bandwidth_gbs: Annotated[float | None, typer.Option(
        help="--magicdec: the device's memory bandwidth, GB/s; default: effective, from the profile's one-token "
             "forward.")] = None,
    overhead_ms: Annotated[float | None, typer.Option(
        help="--magicdec: a fixed host overhead per forward, ms (default 0: decoding under CUDA graphs).")] = None,
    tflops: Annotated[float | None, typer.Option(
        help="--magicdec: the device's TFLOP/s, for a compute floor (default: none, memory-bound).")] = None,
    memory_gb: Annotated[float | None, typer.Option(
        help="--magicdec: the device's memory, GB (default: from its name in the profile).")] = None,
) -> None:
    """Project the benchmark's speedups onto the profile's device: each step costs the profile's relative cost of
    verifying its draft, plus the draft cost and the loop's own work, against one one-token forward per greedy
    token. A MagicDec grid (--magicdec) is projected by the bytes each step reads instead."""
    from ..bench import magicdec_projection as magic
    from ..bench import projection

    for path in (bench_file, profile_file):
        if not path.is_file():
            _fail(f"no such file: {path}")
    device = {"config": config, "bandwidth_gbs": bandwidth_gbs, "overhead_ms": overhead_ms, "tflops": tflops,
              "memory_gb": memory_gb}
    if magicdec or magic.is_grid(bench_file):
        if draft_cost or loop_cost:
            _fail("--draft-cost and --loop-cost project a benchmark's steps; a MagicDec grid takes --config, "
                  "--bandwidth-gbs, --overhead-ms, --tflops and --memory-gb.")
        kind = magic

        def run():
            return magic.project(magic.load_grid(bench_file), projection.load_profile(profile_file), **device,
                                 source=str(bench_file))
    else:
        given = [f"--{name.replace('_', '-')}" for name, value in device.items() if value is not None]
        if given:
            _fail(f"{', '.join(given)}: only for a MagicDec grid; add --magicdec (and pass "
                  "benchmarks/magicdec_grid.py's JSONL).")
        costs, loops = _draft_costs(draft_cost or []), _draft_costs(loop_cost or [], "--loop-cost")
        kind = projection

        def run():
            return projection.project(projection.load_benchmark(bench_file), projection.load_profile(profile_file),
                                      draft_cost=costs, loop_cost=loops, source=str(bench_file))
    try:
        result = run()
    except ValueError as err:
        _fail(str(err))
    typer.echo(kind.format_markdown(result))
    if out is not None:
        json_path, md_path = kind.save(result, out)
        _err().print(f"projection written to {json_path} and {md_path}", soft_wrap=True)


def _draft_costs(values: list[str], flag: str = "--draft-cost") -> float | dict[str, float] | None:
    """``--draft-cost`` (or ``--loop-cost``) values: ``X`` (every method) or ``METHOD=X``; a float, a dict by method
    (``"*"``: the others) or ``None`` (measured)."""
    import math

    costs: dict[str, float] = {}
    for value in _split(values):
        method, _, number = value.rpartition("=")
        try:
            cost = float(number)
        except ValueError:
            cost = -1.0
        if not math.isfinite(cost) or cost < 0:
            _fail(f"{flag} {value}: give a number >= 0 (one-token forwards per step) or METHOD=NUMBER.")
        costs[method or "*"] = cost
    if not costs:
        return None
    return costs["*"] if set(costs) == {"*"} else costs


def _register_training_commands() -> None:
    from ..training import cli as training_cli

    app.command("train-eagle")(training_cli.train_eagle)
    app.command("export-eagle")(training_cli.export_eagle)
    app.command("self-distill")(training_cli.self_distill)
    app.command("sample-prompts")(training_cli.sample_prompts)
    from ..training import cache_cli

    app.command("cache-features")(cache_cli.cache_features)
    from ..training import medusa_cli

    app.command("train-medusa")(medusa_cli.train_medusa)
    app.command("export-medusa")(medusa_cli.export_medusa)
    from ..training import dflash_cli

    app.command("train-dflash")(dflash_cli.train_dflash)
    from ..training import dflash_export_cli

    app.command("export-dflash")(dflash_export_cli.export_dflash)


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
