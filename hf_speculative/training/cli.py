"""``hf-speculative self-distill``, ``train-eagle`` and ``export-eagle`` (registered on the main CLI).

Run them on several GPUs or nodes with ``accelerate launch -m hf_speculative train-eagle ...``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

PROMPTS_HELP = ("Prompts to self-distill: a JSONL file with 'prompt' (and an optional 'id') on each line, or chat "
                "conversations ('messages', or ShareGPT's 'conversations': the first user turn is the prompt). "
                "hf-speculative sample-prompts writes such a file from the target itself.")
PromptsOpt = Annotated[Optional[str], typer.Option("--prompts", help=PROMPTS_HELP)]
SaveMinutesOpt = Annotated[float, typer.Option(
    "--save-minutes", min=0, help="Training minutes between saves of the training state besides the validations' "
                                  "(a run killed between two validations resumes at most this far behind; 0: at "
                                  "validations only).")]
# Removed with the team's prompt lists (builtin:N, context:N, wordnet:N), which moved to the repository's tools/;
# kept hidden so that an old command gets the tools/ command to run instead of "no such option".
PassagesOpt = Annotated[list[Path], typer.Option("--passages", hidden=True)]
MOVED_LISTS = ("builtin", "context", "wordnet")


def _refuse_moved_list(spec: str, passages: list[Path]) -> None:
    """Refuse ``--prompts builtin:N`` / ``context:N`` / ``wordnet:N`` (lists that left the package), naming the
    ``tools/`` command that writes the same prompts to a file (a file of that name is read as usual)."""
    kind, _, count = spec.partition(":")
    if kind not in MOVED_LISTS or Path(spec).exists():
        return
    sources = "".join(f" --passages {path}" for path in passages)
    raise typer.BadParameter(
        f"--prompts {spec}: the team's {kind} prompt list is not part of the package any more. In a clone of the "
        f"repository, write the same prompts to a file with `python -m tools.prompts {kind} {count or 'N'}{sources} "
        "--out prompts.jsonl`, then give --prompts prompts.jsonl (or use your own prompts file, or "
        "`hf-speculative sample-prompts`).")


def layer_indices(text: str) -> list[int] | None:
    """A comma-separated list of layer indices (``--layers``, ``--target-layer-ids``) as integers, spaces and
    empty parts ignored; ``None`` when a part is not an integer (each command words its own refusal)."""
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        return None


def _training_extra() -> None:
    """Stop with the ``pip install "hf-speculative[train]"`` to run when accelerate or tqdm is missing, before
    anything loads (instead of a traceback from deep inside the run)."""
    from ..extras import require
    from .config import FEATURE

    try:
        require("accelerate", "train", FEATURE)
        require("tqdm.auto", "train", FEATURE)
    except ImportError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None


def _refuse_passages(passages: list[Path]) -> None:
    """``--passages`` only fed the context list that moved to ``tools/``: say where it went."""
    if passages:
        raise typer.BadParameter("--passages fed the team's context prompt list, which is not part of the package "
                                 "any more (python -m tools.prompts context N --passages FILE --out prompts.jsonl, "
                                 "in a clone of the repository); a prompts file is used as it is.")


def _prompt_rows(spec: str, passages: list[Path] = ()) -> list[dict]:
    """The rows of a prompts file (``{"id", "prompt", ...}``; a conversation's first user turn is its prompt).

    Raises:
        typer.BadParameter: a moved prompt list, ``--passages``, or a row with neither a prompt nor a user turn.
    """
    from .conversations import conversation, first_user_turn
    from .selfdistill import read_jsonl

    _refuse_moved_list(spec, list(passages))
    _refuse_passages(passages)
    rows = read_jsonl(spec)
    for i, row in enumerate(rows):
        if "prompt" not in row:
            try:
                turns = conversation(row, where=f"{spec}:{i + 1}")
            except ValueError as error:
                raise typer.BadParameter(str(error)) from None
            first = first_user_turn(turns) if turns else None
            if first is None:
                raise typer.BadParameter(f"{spec}: line {i + 1} has no 'prompt' field and no conversation with a "
                                         "user turn ('messages' or 'conversations')")
            row = rows[i] = {key: value for key, value in row.items() if key not in ("messages", "conversations")}
            row["prompt"] = first
        row.setdefault("id", f"line{i:06d}")
    return rows


def self_distill(
    target: Annotated[str, typer.Option("--model", "--target", help="Registry name or folder of the target model.")],
    prompts: Annotated[str, typer.Option("--prompts", help=PROMPTS_HELP)],
    out: Annotated[Path, typer.Option("--out", help="JSONL file of answers (appended; resumes).")] = Path(
        "self_distill.jsonl"),
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 192,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 32,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1)] = None,
    max_prompt_tokens: Annotated[int, typer.Option("--max-prompt-tokens", min=1, help="Skip longer prompts.")] = 1024,
    passages: PassagesOpt = [],  # noqa: B006
    sort_window: Annotated[int, typer.Option(
        "--sort-window", min=0, help="Prompts are batched by length within windows of this many, in the list's "
                                     "order, so that a run stopped early holds a fair sample; 0 sorts the whole "
                                     "list (how answers were written before 2026-11-23's stage 6).")] = 1024,
) -> None:
    """Write the target's own greedy answers to a prompt list: the drafter's best training text. Started in
    several processes (torchrun, accelerate launch), they share the batches and the main one merges them."""
    import torch

    from ..registry.models import load_model
    from .loop import process_state
    from .selfdistill import generate_responses, merge_parts

    _training_extra()
    rows = _prompt_rows(prompts, passages)  # a bad --prompts fails before the model loads
    state = process_state()
    if threads:
        torch.set_num_threads(threads)
    model, tokenizer = load_model(target, device=None if state.device.type == "cpu" else state.device)
    shard = (state.process_index, state.num_processes)
    generate_responses(model.eval(), tokenizer, rows, out, max_new_tokens=max_new_tokens, batch_size=batch_size,
                       max_prompt_tokens=max_prompt_tokens, sort_window=sort_window, shard=shard,
                       progress=state.is_main_process)
    if state.num_processes > 1:
        state.wait_for_everyone()
        if state.is_main_process:
            merge_parts(out, state.num_processes)
        state.wait_for_everyone()


def _exclusions(paths: list[Path]) -> list[str]:
    """Texts never to train on: every turn of a Spec-Bench question file, or each row's 'prompt' / 'text'."""
    from .data import numbered_rows

    texts = []
    for path in paths:
        try:
            for line_no, row in numbered_rows(path):
                turns = row.get("turns") or []
                found = ([turns] if isinstance(turns, str) else list(turns)) + [
                    row[k] for k in ("prompt", "text") if k in row]
                if not found:
                    raise ValueError(f"line {line_no} has none of 'turns', 'prompt', 'text'")
                texts += found
        except (OSError, ValueError) as error:
            raise typer.BadParameter(f"--exclude {path}: not a file of texts to exclude: {error}") from None
    return texts


def sample_prompts(
    target: Annotated[str, typer.Option("--model", "--target", help="Registry name or folder of the target (a chat model).")],
    count: Annotated[int, typer.Option("--count", min=1, help="Prompts wanted in --out (rows there count).")],
    out: Annotated[Path, typer.Option("--out", help="JSONL file of prompts (appended; resumes).")] = Path(
        "self_prompts.jsonl"),
    seed: Annotated[int, typer.Option("--seed")] = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 64,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="Longer messages are dropped.")] = 96,
    temperature: Annotated[float, typer.Option("--temperature", help="> 0")] = 1.0,
    top_p: Annotated[float, typer.Option("--top-p", help="in (0, 1]")] = 0.95,
    min_words: Annotated[int, typer.Option("--min-words", min=0)] = 4,
    exclude: Annotated[list[Path], typer.Option(
        "--exclude", help="JSONL of texts never to train on (Spec-Bench question.jsonl, or rows with 'prompt' / "
                          "'text'); a prompt sharing a run of 8 words with one is dropped; repeatable. Default: "
                          "the Spec-Bench questions shipped with the package (bench's dataset).")] = [],  # noqa: B006
    threads: Annotated[Optional[int], typer.Option("--threads", min=1)] = None,
) -> None:
    """Let the target write user prompts itself (Magpie): its chat template up to a user turn, sampled.
    Feed the file to self-distill --prompts FILE."""
    import torch

    from ..bench.spec_bench import default_dataset_path
    from ..registry.models import load_model
    from .magpie import sample_prompts as sample

    if not temperature > 0 or not 0 < top_p <= 1:
        raise typer.BadParameter(f"--temperature {temperature} --top-p {top_p}: the temperature must be > 0 and "
                                 "top-p in (0, 1]")
    texts = _exclusions(list(exclude) or [default_dataset_path()])
    if threads:
        torch.set_num_threads(threads)
    model, tokenizer = load_model(target)
    try:
        sample(model.eval(), tokenizer, out, count, seed=seed, batch_size=batch_size, max_new_tokens=max_new_tokens,
               temperature=temperature, top_p=top_p, min_words=min_words, exclude=texts)
    except (ValueError, RuntimeError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{count} prompts in {out}; answer them with: hf-speculative self-distill --target {target} "
               f"--prompts {out}")


def train_eagle(
    target: Annotated[str, typer.Option("--model", "--target", help="Registry name or folder of the target model.")],
    out: Annotated[Path, typer.Option("--out", help="Output folder: drafter, checkpoint, feature cache, logs.")],
    data: Annotated[list[str], typer.Option("--data", help="JSONL training data (self-distillation rows, chat "
                                                            "conversations ('messages' or ShareGPT 'conversations': "
                                                            "the assistant turns are learnt) or {'text': ...} "
                                                            "documents); repeatable.")] = [],  # noqa: B006
    prompts: PromptsOpt = None,
    distill_tokens: Annotated[int, typer.Option("--distill-tokens", help="Answer length for --prompts.")] = 192,
    max_prompt_tokens: Annotated[int, typer.Option("--max-prompt-tokens", help="Skip longer --prompts.")] = 1024,
    passages: PassagesOpt = [],  # noqa: B006
    eagle3: Annotated[bool, typer.Option("--eagle3/--eagle1", help="EAGLE-3 (default) or EAGLE-1.")] = True,
    draft_vocab_size: Annotated[int, typer.Option("--draft-vocab-size")] = 8192,
    unroll: Annotated[Optional[int], typer.Option(
        "--unroll", help="Training-time-test steps (EAGLE-3 default 4).")] = None,
    epochs: Annotated[float, typer.Option("--epochs")] = 2.0,
    lr: Annotated[float, typer.Option("--lr")] = 5e-4,
    grad_accum: Annotated[int, typer.Option(
        "--grad-accum", help="Batches (forwards) per optimizer step and process.")] = 4,
    max_length: Annotated[int, typer.Option("--max-length")] = 1024,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per forward, padded to the longest "
                                                                 "(1 keeps a CPU busy; use more on a GPU).")] = 1,
    eval_every: Annotated[int, typer.Option(
        "--eval-every", help="Optimizer steps between validations/checkpoints.")] = 200,
    max_minutes: Annotated[Optional[float], typer.Option(
        "--max-minutes", help="Stop training after this long (counted over resumes), then validate and save a "
                              "checkpoint to go on from.")] = None,
    save_minutes: SaveMinutesOpt = 10.0,
    val_prompts: Annotated[int, typer.Option("--val-prompts")] = 8,
    max_examples: Annotated[Optional[int], typer.Option("--max-examples")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1)] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    exit_layer: Annotated[Optional[int], typer.Option(
        "--exit-layer", min=1, help="Train an exit adapter for hfs.EarlyExit(exit_layer=K, adapter=OUT) instead of an "
                                    "EAGLE drafter.")] = None,
    init_from: Annotated[Optional[str], typer.Option(
        "--init-from", help="Continue training this drafter (a folder, or a shipped drafter's name, e.g. "
                            "smollm2-135m-instruct) instead of starting a new one; its draft vocabulary is "
                            "kept.")] = None,
    feature_batch_tokens: Annotated[Optional[int], typer.Option(
        "--feature-batch-tokens", min=1, help="Padded tokens per target forward when caching features (examples "
                                              "of similar length share one; 1: one example at a time). Default: "
                                              "4096 on a GPU, 1 on a CPU.")] = None,
    features: Annotated[str, typer.Option(
        "--features", help="cache: the target's features computed once into OUT/cache, read every epoch; online: "
                           "computed for every batch (nothing on disk, the target runs again each epoch).")] = "cache",
    feature_cache: Annotated[Optional[Path], typer.Option(
        "--feature-cache", help="Read the target's features from this folder, built once by hf-speculative "
                                "cache-features over the same --data, --max-length and --max-examples, instead of "
                                "OUT/cache.")] = None,
    target_dtype: Annotated[Optional[str], typer.Option(
        "--target-dtype", help="The target's dtype while training: float32, bfloat16, float16 or auto (the "
                               "checkpoint's). Default: float32 on a CPU, the checkpoint's on a GPU. The drafter "
                               "trains in float32.")] = None,
    refresh_vocab: Annotated[bool, typer.Option(
        "--refresh-vocab", help="With --init-from: choose the draft vocabulary again from this run's data "
                                "(--draft-vocab-size tokens; rows of tokens the drafter had are kept).")] = False,
) -> None:
    """Train an EAGLE drafter (or, with --exit-layer K, an early-exit adapter) for --target (resumes from
    OUT/checkpoint when present)."""
    from .config import TrainConfig
    from .loop import process_state, train

    _training_extra()
    data = list(data)
    distilled = out / "self_distill.jsonl"
    if prompts:
        _prompt_rows(prompts, passages)  # a moved prompt list or a bad file fails before anything runs
        data.append(str(distilled))
    _refuse_passages(passages)
    if not data:
        raise typer.BadParameter("give --data FILE (repeatable) and/or --prompts FILE (prompts the target answers "
                                 "first)")
    try:  # checked before the (slow) self-distillation
        cfg = TrainConfig(target=target, data=data, out=str(out), eagle3=eagle3, draft_vocab_size=draft_vocab_size,
                          unroll=unroll, epochs=epochs, lr=lr, grad_accum=grad_accum, max_length=max_length,
                          batch_size=batch_size,
                          eval_every=eval_every, max_minutes=max_minutes, save_minutes=save_minutes or None,
                          val_prompts=val_prompts,
                          max_examples=max_examples, threads=threads,
                          seed=seed, exit_layer=exit_layer, init_from=init_from,
                          refresh_vocab=refresh_vocab, feature_batch_tokens=feature_batch_tokens,
                          features=features, target_dtype=target_dtype,
                          feature_cache=str(feature_cache) if feature_cache else None)
        if init_from is not None:
            from .start import check_init_from

            check_init_from(cfg)
        _check_vocabulary(cfg)
    except (ValueError, FileNotFoundError) as error:
        raise typer.BadParameter(str(error)) from None
    state = process_state()
    if prompts:
        self_distill(target, prompts, distilled, distill_tokens, threads=threads, max_prompt_tokens=max_prompt_tokens,
                     passages=passages)  # the processes share the batches
    try:
        path = train(cfg)
    except ValueError as error:  # a resume of another network, a target the drafter does not fit, too little data
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    if not state.is_main_process:
        return
    summary = path / "training_summary.json"
    if summary.exists():
        typer.echo(summary.read_text())
    if exit_layer is not None:
        typer.echo(f"exit adapter saved in {path}; use it with hfs.EarlyExit(adapter={str(path)!r})")
    else:
        typer.echo(f"drafter saved in {path}; use it with hfs.Eagle.from_pretrained({str(path)!r}, target=model)")


def _check_vocabulary(cfg) -> None:
    """``--draft-vocab-size`` against the target's vocabulary, read from its config alone (a local folder or a cached
    registry model; any other target is checked once it has loaded): before the self-distillation and the target."""
    from transformers import AutoConfig

    from ..registry.models import resolve
    from .start import check_draft_vocab_size

    try:
        config = AutoConfig.from_pretrained(resolve(cfg.target, fetch_missing=False))
    except Exception:  # noqa: BLE001 - the loader reports an unknown or missing target with its own message
        return
    check_draft_vocab_size(cfg, config)


def export_eagle(
    drafter: Annotated[str, typer.Argument(help="Drafter folder (any supported format) or a shipped drafter's name.")],
    out: Annotated[Path, typer.Option("--out", help="Folder to write.")],
    format: Annotated[str, typer.Option("--format", help="vllm (speculators format, for vLLM), safeailab "
                                                          "(SafeAILab EAGLE format, for SGLang and EAGLE's "
                                                          "repo) or openvino (an OpenVINO GenAI draft model; "
                                                          "needs the [openvino] extra).")] = "vllm",
    target: Annotated[Optional[str], typer.Option("--model", "--target", help="The target (registry name, folder or Hub id) "
                                                                   "recorded as the verifier; for openvino, the "
                                                                   "model it drafts for (default: the one the "
                                                                   "drafter records).")] = None,
    target_out: Annotated[Optional[Path], typer.Option("--target-out", help="openvino: also export the target "
                                                                            "to this folder (with its "
                                                                            "tokenizer).")] = None,
    weight_format: Annotated[str, typer.Option("--weight-format", help="openvino: fp16 or fp32 weights in the "
                                                                       "IR.")] = "fp16",
) -> None:
    """Write a drafter in the format a serving engine loads."""
    from ..drafters.eagle import checkpoints
    from ..drafters.eagle.drafter import PRETRAINED_DIR, pretrained_names

    source = Path(drafter)
    if not source.is_dir() and drafter in pretrained_names():
        source = PRETRAINED_DIR / drafter
    if format not in ("vllm", "safeailab", "openvino"):
        raise typer.BadParameter(f"--format {format!r}: use vllm, safeailab or openvino")
    if format != "openvino" and (target_out is not None or weight_format != "fp16"):
        raise typer.BadParameter("--target-out and --weight-format go with --format openvino")
    try:
        if format == "openvino":
            from ..drafters.eagle.openvino_export import export_openvino

            written = export_openvino(source, out, target, weight_format=weight_format, target_out=target_out)
            typer.echo(json.dumps({"format": format, "out": str(written),
                                   "target_out": None if target_out is None else str(target_out)}))
            return
        target_config = None
        if target is not None:
            from transformers import AutoConfig

            from ..registry.models import resolve

            target_config = AutoConfig.from_pretrained(resolve(target))
        written = checkpoints.export(source, out, format=format, target_config=target_config)
    except (ImportError, OSError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps({"format": format, "out": str(written or out)}))
