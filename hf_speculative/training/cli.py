"""``hf-speculative self-distill``, ``train-eagle`` and ``export-eagle`` (registered on the main CLI).

Run them on several GPUs or nodes with ``accelerate launch -m hf_speculative train-eagle ...``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

PromptsOpt = Annotated[
    Optional[str],
    typer.Option("--prompts", help="Prompts to self-distill: a JSONL file with 'id' and 'prompt' (or chat "
                 "conversations, 'messages' or ShareGPT 'conversations': their first user turn is the prompt), "
                 "builtin:N for the first N of the team's built-in training prompts (never Spec-Bench's), or "
                 "builtin:A-B for those numbered A to B-1 (e.g. the ones an earlier drafter did not see); context:N or "
                 "context:A-B for the "
                 "long-context list (summaries and RAG over --passages, short factual questions); wordnet:N or "
                 "wordnet:A-B for topic-diverse prompts drawn from the machine's WordNet and fortune files (Debian's "
                 "wordnet-base, fortunes, fortunes-de)."),
]
PassagesOpt = Annotated[
    list[Path],
    typer.Option("--passages", help="JSONL texts for --prompts context:...: earlier self-distillation answers (each "
                 "answer a passage, its prompt the question it answers) or {'text': ...} documents; repeatable."),
]


def _prompt_rows(spec: str, passages: list[Path] = (), target: str | None = None) -> list[dict]:
    from .context_prompts import build_context_prompts, read_passages
    from .conversations import conversation, first_user_turn
    from .prompts import build_prompts
    from .selfdistill import read_jsonl
    from .wordnet_prompts import build_wordnet_prompts

    kind = spec.split(":", 1)[0]
    if kind in ("builtin", "context", "wordnet"):
        match = re.fullmatch(kind + r":(?:(\d+)-)?(\d+)", spec)
        first, last = (int(match.group(1) or 0), int(match.group(2))) if match else (0, 0)
        if first >= last:
            raise typer.BadParameter(f"--prompts {spec}: use {kind}:N (the first N {kind} prompts) or {kind}:A-B "
                                     "(prompts A to B-1), with 0 <= A < B.")
        if passages and kind != "context":
            raise typer.BadParameter(f"--passages only feeds --prompts context:N; {kind}:N builds its own texts.")
        if kind == "builtin":
            return build_prompts(last)[first:]
        if kind == "wordnet":
            try:
                return build_wordnet_prompts(last)[first:]
            except (FileNotFoundError, ValueError) as error:
                raise typer.BadParameter(f"--prompts {spec}: cannot build the WordNet prompts: {error}") from None
        texts, tokenizer = [], _tokenizer(target) if passages else None
        for path in passages:
            try:
                texts += read_passages(path, tokenizer=tokenizer)
            except (OSError, ValueError) as error:
                raise typer.BadParameter(f"--passages {path}: {error}") from None
        return build_context_prompts(last, texts)[first:]
    if passages:
        raise typer.BadParameter("--passages only feeds --prompts context:N; a prompts file is used as it is.")
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


def _tokenizer(target: str | None) -> Any:
    """The target's tokenizer, loaded on its own (passages stored as token ids are decoded before the model loads)."""
    if target is None:
        return None
    from transformers import AutoTokenizer

    from ..models import resolve

    return AutoTokenizer.from_pretrained(resolve(target))


def self_distill(
    target: Annotated[str, typer.Option("--target", help="Registry name or folder of the target model.")],
    prompts: PromptsOpt = "builtin:1600",
    out: Annotated[Path, typer.Option("--out", help="JSONL file of answers (appended; resumes).")] = Path("self_distill.jsonl"),
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

    from ..models import load_model
    from .loop import process_state
    from .selfdistill import generate_responses, merge_parts

    rows = _prompt_rows(prompts, passages, target)  # a bad --prompts fails before the model loads
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
    target: Annotated[str, typer.Option("--target", help="Registry name or folder of the target (a chat model).")],
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
                          "../shared/data/spec_bench/question.jsonl when it exists.")] = [],  # noqa: B006
    threads: Annotated[Optional[int], typer.Option("--threads", min=1)] = None,
) -> None:
    """Let the target write user prompts itself (Magpie): its chat template up to a user turn, sampled.
    Feed the file to self-distill --prompts FILE."""
    import torch

    from ..bench.runner import default_dataset_path
    from ..models import load_model
    from .magpie import sample_prompts as sample

    if not temperature > 0 or not 0 < top_p <= 1:
        raise typer.BadParameter(f"--temperature {temperature} --top-p {top_p}: the temperature must be > 0 and "
                                 "top-p in (0, 1]")
    paths = list(exclude) or [p for p in [default_dataset_path()] if p is not None]
    if not paths:
        typer.echo("note: no Spec-Bench question.jsonl beside the checkout and no --exclude: prompts are not checked "
                   "against the benchmark", err=True)
    texts = _exclusions(paths)
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
    target: Annotated[str, typer.Option("--target", help="Registry name or folder of the target model.")],
    out: Annotated[Path, typer.Option("--out", help="Output folder: drafter, checkpoint, feature cache, logs.")],
    data: Annotated[list[str], typer.Option("--data", help="JSONL training data (self-distillation rows, chat "
                                                            "conversations ('messages' or ShareGPT 'conversations': "
                                                            "the assistant turns are learnt) or {'text': ...} documents); "
                                                            "repeatable.")] = [],  # noqa: B006
    prompts: PromptsOpt = None,
    distill_tokens: Annotated[int, typer.Option("--distill-tokens", help="Answer length for --prompts.")] = 192,
    max_prompt_tokens: Annotated[int, typer.Option("--max-prompt-tokens", help="Skip longer --prompts.")] = 1024,
    passages: PassagesOpt = [],  # noqa: B006
    eagle3: Annotated[bool, typer.Option("--eagle3/--eagle1", help="EAGLE-3 (default) or EAGLE-1.")] = True,
    draft_vocab_size: Annotated[int, typer.Option("--draft-vocab-size")] = 8192,
    unroll: Annotated[Optional[int], typer.Option("--unroll", help="Training-time-test steps (EAGLE-3 default 4).")] = None,
    epochs: Annotated[float, typer.Option("--epochs")] = 2.0,
    lr: Annotated[float, typer.Option("--lr")] = 5e-4,
    grad_accum: Annotated[int, typer.Option("--grad-accum", help="Batches (forwards) per optimizer step and process.")] = 4,
    max_length: Annotated[int, typer.Option("--max-length")] = 1024,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per forward, padded to the longest "
                                                                 "(1 keeps a CPU busy; use more on a GPU).")] = 1,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Optimizer steps between validations/checkpoints.")] = 200,
    val_prompts: Annotated[int, typer.Option("--val-prompts")] = 8,
    max_examples: Annotated[Optional[int], typer.Option("--max-examples")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1)] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    exit_layer: Annotated[Optional[int], typer.Option(
        "--exit-layer", min=1, help="Train an exit adapter for hfs.EarlyExit(exit_layer=K, adapter=OUT) instead of an "
                                    "EAGLE drafter.")] = None,
    init_from: Annotated[Optional[str], typer.Option(
        "--init-from", help="Continue training this drafter (a folder, or a shipped drafter's name, e.g. "
                            "smollm2-135m-instruct) instead of starting a new one; its draft vocabulary is kept.")] = None,
    feature_batch_tokens: Annotated[Optional[int], typer.Option(
        "--feature-batch-tokens", min=1, help="Padded tokens per target forward when caching features (examples "
                                              "of similar length share one; 1: one example at a time). Default: "
                                              "4096 on a GPU, 1 on a CPU.")] = None,
    features: Annotated[str, typer.Option(
        "--features", help="cache: the target's features computed once into OUT/cache, read every epoch; online: "
                           "computed for every batch (nothing on disk, the target runs again each epoch).")] = "cache",
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

    data = list(data)
    distilled = out / "self_distill.jsonl"
    if prompts:
        data.append(str(distilled))
    if not data:
        raise typer.BadParameter("give --data FILE (repeatable) and/or --prompts builtin:N to self-distill first")
    try:  # checked before the (slow) self-distillation
        cfg = TrainConfig(target=target, data=data, out=str(out), eagle3=eagle3, draft_vocab_size=draft_vocab_size,
                          unroll=unroll, epochs=epochs, lr=lr, grad_accum=grad_accum, max_length=max_length, batch_size=batch_size,
                          eval_every=eval_every, val_prompts=val_prompts, max_examples=max_examples, threads=threads,
                          seed=seed, exit_layer=exit_layer, init_from=init_from,
                          refresh_vocab=refresh_vocab, feature_batch_tokens=feature_batch_tokens,
                          features=features, target_dtype=target_dtype)
        if init_from is not None:
            from .start import check_init_from

            check_init_from(cfg)
    except (ValueError, FileNotFoundError) as error:
        raise typer.BadParameter(str(error)) from None
    state = process_state()
    if prompts:
        self_distill(target, prompts, distilled, distill_tokens, threads=threads, max_prompt_tokens=max_prompt_tokens,
                     passages=passages)  # the processes share the batches
    path = train(cfg)
    if not state.is_main_process:
        return
    summary = path / "training_summary.json"
    if summary.exists():
        typer.echo(summary.read_text())
    if exit_layer is not None:
        typer.echo(f"exit adapter saved in {path}; use it with hfs.EarlyExit(adapter={str(path)!r})")
    else:
        typer.echo(f"drafter saved in {path}; use it with hfs.Eagle.from_pretrained({str(path)!r}, target=model)")


def export_eagle(
    drafter: Annotated[str, typer.Argument(help="Drafter folder (any supported format) or a shipped drafter's name.")],
    out: Annotated[Path, typer.Option("--out", help="Folder to write.")],
    format: Annotated[str, typer.Option("--format", help="vllm (speculators format, for vLLM) or safeailab "
                                                          "(SafeAILab EAGLE format, for SGLang and EAGLE's repo).")] = "vllm",
    target: Annotated[Optional[str], typer.Option("--target", help="The target (registry name, folder or Hub id) "
                                                                   "recorded as the verifier.")] = None,
) -> None:
    """Write a drafter in the format a serving engine loads."""
    from ..drafters.eagle import checkpoints
    from ..drafters.eagle.drafter import PRETRAINED_DIR, pretrained_names

    source = Path(drafter)
    if not source.is_dir() and drafter in pretrained_names():
        source = PRETRAINED_DIR / drafter
    if format not in ("vllm", "safeailab"):
        raise typer.BadParameter(f"--format {format!r}: use vllm or safeailab")
    try:
        target_config = None
        if target is not None:
            from transformers import AutoConfig

            from ..models import resolve

            target_config = AutoConfig.from_pretrained(resolve(target))
        written = checkpoints.export(source, out, format=format, target_config=target_config)
    except (OSError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps({"format": format, "out": str(written or out)}))
