"""Training data for hidden-state drafters: token sequences and the target's features over them.

Sources (``read_examples``): a JSONL corpus with a ``text`` field (the loss covers every token); chat
conversations (``messages`` or ShareGPT ``conversations``, laid out by the target's chat template; the
loss covers the assistant turns, see :mod:`~hf_speculative.training.conversations`); or
self-distillation rows written by :func:`~hf_speculative.training.selfdistill.generate_responses`
(``prompt_tokens`` + ``response_tokens``; the loss covers the answer only, which is where drafting
happens, while the prompt still gives the context).

:class:`FeatureCache` runs the target once over every example and stores, memory-mapped on disk,
what the drafter's training reads: the fused features (EAGLE-3: the outputs of three layers; EAGLE-1:
the final normed hidden state) and the final normed hidden state (the target's distribution at every
position, recomputed from it through the target's lm_head). Features are captured with the same
:class:`~hf_speculative.core.features.FeatureTap` hooks that inference uses, so training and drafting see
identical inputs. The cache is built in chunks and resumes after an interruption.
"""

from __future__ import annotations

import collections
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

from .. import compat
from ..extras import require
from ..registry.integrity import write_text_atomic  # a kill while writing the index left half a JSON
from ..core.features import FeatureTap
from .config import FEATURE
from .conversations import chat_tokens, conversation

INDEX = "index.json"


@dataclass
class Example:
    """One training sequence: ``ids`` `[T]` and ``loss_mask`` `[T]` (``loss_mask[q] = 1`` where the
    token after position ``q``, ``ids[q + 1]``, is learnt)."""

    ids: list[int]
    loss_mask: list[int]

    @property
    def prompt_length(self) -> int:
        """Tokens before the first learnt one (the prompt of a self-distillation row)."""
        return next((q + 1 for q, m in enumerate(self.loss_mask) if m), len(self.ids))


def numbered_rows(path: str | Path) -> Iterator[tuple[int, dict]]:
    """``(line number, row)`` for every non-blank line of a JSONL file (numbers from 1, for messages)."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                yield line_no, json.loads(line)


def read_examples(path: str | Path, tokenizer: Any = None, max_length: int = 1024) -> list[Example]:
    """Examples from a JSONL file of self-distillation rows, chat conversations or ``{"text": ...}`` documents."""
    examples = []
    for line_no, row in numbered_rows(path):
        turns = conversation(row, where=f"{path}:{line_no}")
        if turns is not None:
            if tokenizer is None:
                raise ValueError(f"{path}:{line_no}: a conversation needs the target's tokenizer to be laid out.")
            ids, learnt = chat_tokens(tokenizer, turns, where=f"{path}:{line_no}")
            ids, mask = ids[:max_length], (learnt[1:] + [0])[:max_length]
        elif "response_tokens" in row:
            prompt, response = list(row["prompt_tokens"]), list(row["response_tokens"])
            ids = (prompt + response)[:max_length]
            mask = ([0] * (len(prompt) - 1) + [1] * len(response) + [0])[:max_length]
        elif "text" in row:
            if tokenizer is None:
                raise ValueError(f"{path}:{line_no}: a text corpus needs the target's tokenizer to be tokenized.")
            ids = tokenizer(row["text"], add_special_tokens=True)["input_ids"][:max_length]
            mask = [1] * (len(ids) - 1) + [0]
        else:
            raise ValueError(f"{path}:{line_no}: expected a 'text' field, a conversation ('messages' or "
                             f"'conversations') or self-distillation fields ('prompt_tokens', 'response_tokens'); "
                             f"got {sorted(row)}.")
        if len(ids) >= 4 and sum(mask) >= 2:
            examples.append(Example(ids, mask))
    if not examples:
        raise ValueError(f"{path} holds no usable example (each needs at least 4 tokens).")
    return examples


def training_examples(data: list[str], tokenizer: Any, max_length: int, max_examples: int | None) -> list[Example]:
    """The examples every trainer and ``cache-features`` train from: each file of ``data`` read in turn by
    :func:`read_examples`, the list cut to its first ``max_examples``. One function for all four, since a shared
    feature cache is matched to a trainer by these examples' digest."""
    examples = [ex for path in data for ex in read_examples(path, tokenizer, max_length)]
    return examples[:max_examples] if max_examples else examples


def token_frequencies(examples: Iterable[Example]) -> collections.Counter:
    """How often each token is a learnt next token (what a reduced draft vocabulary must cover)."""
    counts: collections.Counter = collections.Counter()
    for ex in examples:
        counts.update(t for t, m in zip(ex.ids[1:], ex.loss_mask[:-1]) if m)
    return counts


def draft_vocabulary(examples: Iterable[Example], size: int, vocab_size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``size`` most frequent learnt tokens (plus ``always``, e.g. EOS), sorted target ids `[size]`.
    Rarer tokens fill up with the lowest unused ids so that the map is complete."""
    counts = token_frequencies(examples)
    chosen = list(dict.fromkeys([int(t) for t in always if 0 <= int(t) < vocab_size]))
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if token not in chosen and token < vocab_size:
            chosen.append(token)
    taken = set(chosen)
    filler = (t for t in range(vocab_size) if t not in taken)
    while len(chosen) < size:
        chosen.append(next(filler))
    return torch.tensor(sorted(chosen), dtype=torch.long)


class FeatureCache:
    """Memory-mapped target features over a list of examples.

    Files in ``directory``: ``features.f16`` `[N, F]`, ``final.f16`` `[N, H]` (float16), ``top.i32`` `[N]`
    (the target's argmax at every position, what a greedy draft must match), ``index.json``
    (shapes, per-example offsets, how many examples are done, and a description of the source).
    """

    def __init__(self, directory: str | Path, layers: list[int] | None = None):
        """Open the cache in ``directory``; ``layers`` (*optional*): the features of these stored layers only, in
        this order (``[]``: the final normed state, EAGLE-1's feature), for a cache shared by several drafters
        (:meth:`shared`); default every stored feature."""
        self.directory = Path(directory)
        meta = json.loads((self.directory / INDEX).read_text())
        self.meta = meta
        self.offsets: list[int] = meta["offsets"]
        self.done: int = meta["done"]
        self.features, self.final, self.top = _arrays(self.directory, meta, "r")
        self._columns = _columns(meta, layers)

    def __len__(self) -> int:
        return self.done

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Features `[T, F]`, final hidden states `[T, H]` (float32) and the target's argmax `[T]` of example ``i``."""
        a, b = self.offsets[i], self.offsets[i + 1]
        final = torch.from_numpy(np.array(self.final[a:b])).float()
        if isinstance(self._columns, str):  # "final"
            features = final
        else:
            features = np.array(self.features[a:b] if self._columns is None else self.features[a:b, self._columns])
            features = torch.from_numpy(features).float()
        return features, final, torch.from_numpy(np.array(self.top[a:b])).long()

    @staticmethod
    def shared(directory: str | Path, target: Any, examples: list[Example], layers: list[int], *, target_name: str,
               batch_tokens: int | None = None, progress: bool = True, state: Any = None) -> "FeatureCache":
        """The cache ``hf-speculative cache-features`` built in ``directory`` (finished first if it was stopped),
        read as a drafter that fuses ``layers`` needs (``[]``: the final normed state): one pass of the target
        over the data serves EAGLE, DFlash and Medusa runs alike.

        Raises:
            FileNotFoundError: no cache there. ValueError: a cache of other examples (other ``--data``,
                ``--max-length`` or ``--max-examples``), of another target or dtype, without one of ``layers``, or
                a training run's own cache.
        """
        directory = Path(directory)
        index = directory / INDEX
        if not index.exists():
            raise FileNotFoundError(
                f"--feature-cache {directory}: no feature cache there (no {INDEX}); build it first with "
                f"hf-speculative cache-features --target {target_name} --data ... --out {directory}")
        meta = json.loads(index.read_text())
        try:
            built = json.loads(meta["source"])
            built = built if isinstance(built, dict) and built.get("shared") else None
        except (KeyError, TypeError, ValueError):
            built = None
        if built is None:
            raise ValueError(f"--feature-cache {directory}: a cache of one training run, not one that "
                             "hf-speculative cache-features built; build a shared one with cache-features")
        if built.get("target") != target_name:
            raise ValueError(f"--feature-cache {directory} holds the features of target {built.get('target')!r}, "
                             f"not {target_name!r}: give --target {built.get('target')} or build a cache for this one")
        dtype = str(next(target.parameters()).dtype)
        if built.get("dtype", dtype) != dtype:
            raise ValueError(f"--feature-cache {directory} holds features of the target in {built['dtype']}, this run "
                             f"loads it in {dtype}: give --target-dtype {built['dtype'].removeprefix('torch.')} or "
                             "build a cache in this dtype")
        digest = examples_digest(examples)
        if built.get("examples_sha256") != digest:
            raise ValueError(
                f"--feature-cache {directory} was built for other examples ({meta.get('num_examples')} of them, "
                f"--max-length {built.get('max_length')}) than this run's {len(examples)}: give the --data, "
                "--max-length and --max-examples of its cache-features command, or build a cache for this data")
        missing = [layer for layer in layers if layer not in meta["layers"]]
        if missing:
            raise ValueError(f"--feature-cache {directory} stores target layers {meta['layers']}, not {missing}, which "
                             f"this drafter reads ({layers}): build a cache with cache-features --layers "
                             f"{','.join(map(str, sorted(set(meta['layers']) | set(layers))))}")
        FeatureCache.build(directory, target, examples, meta["layers"], source=meta["source"],
                           batch_tokens=batch_tokens, progress=progress, state=state)
        return FeatureCache(directory, layers)

    @staticmethod
    @torch.no_grad()
    def build(directory: str | Path, target: Any, examples: list[Example], layers: list[int], *,
              source: str = "", chunk: int = 64, batch_tokens: int | None = None, progress: bool = True,
              state: Any = None, fast_cpu: bool = True) -> "FeatureCache":
        """Run ``target`` over ``examples`` (resuming a partial cache of the same source) and return the cache.

        Args:
            layers (`list[int]`): EAGLE-3's fused layers; empty for EAGLE-1 (features = final hidden).
            chunk (`int`, defaults to 64): examples written between two saves of the progress (what an
                interruption can lose).
            batch_tokens (`int`, *optional*): padded tokens per target forward. Within a chunk,
                examples of similar length share a forward (right-padded); 1 runs one example per
                forward. Batching changes the features only by float rounding. Defaults to
                :func:`default_batch_tokens` for the target's device.
            state (*optional*): accelerate's ``PartialState`` or ``Accelerator`` when several processes build
                the cache together. The main process creates the files; chunk ``k`` of the missing examples
                goes to process ``k % N`` (chunks shrink so that each process gets as many), which writes its
                rows of the shared files and records what it finished in ``finished.<rank>.json``; the
                main process then counts them into the index. Each example's rows are those one process
                computes.
            fast_cpu (`bool`, defaults to `True`): an fp32 target on the CPU, not laid out already, runs the pass
                on ``hfs.optimize_for_cpu``'s path (hf_speculative's kernel where it runs), undone after: the
                same features up to float rounding, 1.17x faster on SmolLM2-135M (one thread).
        """
        tqdm = require("tqdm.auto", "train", FEATURE).tqdm

        if batch_tokens is None:
            batch_tokens = default_batch_tokens(next(target.parameters()).device)
        if chunk < 1 or batch_tokens < 1:
            raise ValueError(f"FeatureCache.build(chunk={chunk}, batch_tokens={batch_tokens}): both must be >= 1.")
        count, rank = (1, 0) if state is None else (state.num_processes, state.process_index)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        hidden = int(compat.text_config(target.config).hidden_size)
        feature_size = hidden * max(len(layers), 1)
        lengths = [len(ex.ids) for ex in examples]
        offsets = [0] + list(np.cumsum(lengths).tolist())
        meta = {"num_tokens": offsets[-1], "feature_size": feature_size, "hidden_size": hidden, "layers": list(layers),
                "offsets": offsets, "done": 0, "finished": [], "source": source, "num_examples": len(examples)}
        if rank == 0:
            meta = _open_index(directory, meta)
        if count > 1:
            state.wait_for_everyone()
            meta = json.loads((directory / INDEX).read_text())
        finished = set(_expand(meta["finished"]))
        missing = [i for i in range(meta["done"], len(examples)) if i not in finished]
        size = chunk
        if count > 1:  # as many chunks for each process, each at most `chunk` examples
            pieces = -(-len(missing) // chunk)
            size = max(1, -(-len(missing) // max(-(-pieces // count) * count, 1)))
        mine = [missing[a : a + size] for a in range(0, len(missing), size)][rank::count]
        features, final, top = _arrays(directory, meta, "r+")
        undo = _cpu_path(target) if fast_cpu and mine else None
        tap = FeatureTap(target, list(layers))
        final_tap = FeatureTap(target, []) if layers else tap
        bar = tqdm(total=sum(map(len, mine)), desc="target features", disable=not progress)
        written: list[int] = []
        try:
            for part in mine:
                for batch in length_batches(lengths, part, batch_tokens):
                    feats, norm, best = _forward_features(target, [examples[i].ids for i in batch], tap,
                                                          final_tap if layers else None)
                    for row, i in enumerate(batch):
                        a, b = offsets[i], offsets[i + 1]
                        features[a:b] = feats[row, : b - a].float().cpu().numpy().astype(np.float16)
                        final[a:b] = norm[row, : b - a].float().cpu().numpy().astype(np.float16)
                        top[a:b] = best[row, : b - a].cpu().numpy().astype(np.int32)
                    bar.update(len(batch))
                features.flush()
                final.flush()
                top.flush()
                if count == 1:
                    meta = _count_finished(directory, meta, part)
                else:  # only the main process writes the index; the others leave a note of their own
                    written += part
                    write_text_atomic(directory / f"finished.{rank}.json", json.dumps(_runs(written)))
        finally:
            tap.remove()
            final_tap.remove()
            bar.close()
            if undo is not None:
                undo()
        del features, final, top
        if count > 1:
            state.wait_for_everyone()
            if rank == 0:
                _count_finished(directory, meta)
            state.wait_for_everyone()
        return FeatureCache(directory)


def examples_digest(examples: Iterable[Example]) -> str:
    """sha256 of the examples' token ids, in order: what a shared feature cache was computed over."""
    digest = hashlib.sha256()
    for ex in examples:
        ids = np.asarray(ex.ids, dtype=np.int64)
        digest.update(np.int64(len(ids)).tobytes())
        digest.update(ids.tobytes())
    return digest.hexdigest()


def _columns(meta: dict, layers: list[int] | None) -> np.ndarray | str | None:
    """Which feature columns :meth:`FeatureCache.get` returns for ``layers``: ``None`` (all of them), ``"final"``
    (the final normed state) or the columns of each layer's block, in ``layers``' order."""
    stored = list(meta["layers"])
    if layers is None or list(layers) == stored:
        return None
    if not layers:
        return "final"
    missing = [layer for layer in layers if layer not in stored]
    if missing:
        raise ValueError(f"FeatureCache({meta.get('source', '')!r}): layers {missing} are not stored (only {stored})")
    hidden = meta["hidden_size"]
    return np.concatenate([np.arange(stored.index(layer) * hidden, (stored.index(layer) + 1) * hidden)
                           for layer in layers])


def _cpu_path(target: Any) -> Callable[[], None] | None:
    """Put an fp32 CPU ``target`` that is not laid out yet on ``hfs.optimize_for_cpu``'s path for a feature pass;
    returns what undoes it (``None`` when nothing changed). The decoder's modules stay the ones the taps hook."""
    from ..cpu.layout import cpu_layout, optimize_for_cpu

    parameters = list(target.parameters())
    if not parameters or any(p.device.type != "cpu" or p.dtype != torch.float32 for p in parameters):
        return None
    if cpu_layout(target) != "none" or not optimize_for_cpu(target):
        return None
    return lambda: optimize_for_cpu(target, False)


def _runs(indices: Iterable[int]) -> list[list[int]]:
    """Sorted indices as ``[start, stop)`` runs (what progress files store)."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def _expand(runs: list[list[int]]) -> Iterator[int]:
    for a, b in runs:
        yield from range(a, b)


def finished_examples(directory: Path) -> int:
    """Examples a features' pass in ``directory`` has finished so far, read without writing anything (a status,
    while the pass runs): its index's finished prefix and runs, and what its processes noted since
    (``finished.<rank>.json``; a note being replaced while read is skipped)."""
    meta = json.loads((directory / INDEX).read_text())
    finished = set(_expand(meta.get("finished", []))) | _noted(directory, strict=False)[1]
    return meta["done"] + sum(i >= meta["done"] for i in finished)


def _noted(directory: Path, strict: bool) -> tuple[list[Path], set[int]]:
    """The processes' ``finished.<rank>.json`` notes in ``directory`` and the examples they list. ``strict``: a note
    that cannot be read raises (the main process counting them); else it is skipped (a status read while a process
    replaces its note)."""
    notes, finished = sorted(directory.glob("finished.*.json")), set()
    for note in notes:
        try:
            finished |= set(_expand(json.loads(note.read_text())))
        except (OSError, ValueError):
            if strict:
                raise
    return notes, finished


def _count_finished(directory: Path, meta: dict, extra: Iterable[int] = ()) -> dict:
    """``meta`` with every finished example counted (its ``finished`` runs, the processes'
    ``finished.<rank>.json`` notes and ``extra``): ``done`` grows over the finished prefix, the rest stay
    runs. Writes the index, then removes the notes it read."""
    notes, noted = _noted(directory, strict=True)
    finished = set(_expand(meta["finished"])) | set(extra) | noted
    done = meta["done"]
    while done in finished:
        done += 1
    meta = dict(meta, done=done, finished=_runs(i for i in finished if i > done))
    write_text_atomic(directory / INDEX, json.dumps(meta))
    for note in notes:
        note.unlink()
    return meta


def _open_index(directory: Path, meta: dict) -> dict:
    """The main process's start: keep what a cache of the same examples, layers and source finished
    (counting interrupted processes' notes), else create empty files; writes the index."""
    index = directory / INDEX
    if index.exists() and all((directory / name).exists() for name in _FILES):
        old = json.loads(index.read_text())
        if {k: old.get(k) for k in ("offsets", "layers", "source")} == {k: meta[k] for k in ("offsets", "layers", "source")}:
            return _count_finished(directory, dict(meta, done=old["done"], finished=old.get("finished", [])))
    for note in directory.glob("finished.*.json"):  # notes of another cache
        note.unlink()
    for array in _arrays(directory, meta, "w+"):
        array.flush()
    write_text_atomic(index, json.dumps(meta))
    return meta


_FILES = {"features.f16": (np.float16, "feature_size"), "final.f16": (np.float16, "hidden_size"), "top.i32": (np.int32, None)}


def _arrays(directory: Path, meta: dict, mode: str) -> list[np.memmap]:
    """The cache's three files memory-mapped in ``mode`` ("r", "r+", or "w+" to create them): features
    `[N, F]`, final states `[N, H]`, argmax `[N]`, for the shapes ``meta`` gives."""
    return [np.memmap(directory / name, dtype=dtype, mode=mode,
                      shape=(meta["num_tokens"],) + ((meta[width],) if width else ()))
            for name, (dtype, width) in _FILES.items()]


def default_batch_tokens(device: torch.device) -> int:
    """The feature cache's batch: on a CPU one ~170-token example per forward is already compute-bound
    and batching measured no faster (0.89-1.06x on the 2-core VM, benchmarks/training-history.md); an
    accelerator is left mostly idle by one example, so examples of similar length share a forward."""
    return 1 if device.type == "cpu" else 4096


def length_batches(lengths: list[int], indices: Iterable[int], batch_tokens: int) -> list[list[int]]:
    """``indices`` grouped, longest first, so that each group padded to its longest member holds at most
    ``batch_tokens`` tokens (an example longer than that goes alone)."""
    order = sorted(indices, key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def _forward_features(target: Any, sequences: list[list[int]], tap: FeatureTap, final_tap: FeatureTap | None,
                      head_rows: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One target forward over right-padded ``sequences``: the tapped features `[B, T, F]`, the final normed
    hidden states `[B, T, H]` and the target's argmax `[B, T]` (positions past a sequence's end are padding).

    The decoder runs without the lm_head, which is applied ``head_rows`` positions at a time for the argmax:
    a batch's full logits (`[B, T, V]`, float32) would not fit in memory for large vocabularies."""
    device = next(target.parameters()).device
    longest = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), longest, dtype=torch.long, device=device)  # [B, T]
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, device=device)
    # No attention mask: the padding is on the right, and a causal model's real positions never attend to
    # later ones, so the plain causal path (the fast one) gives them exactly their own context.
    compat.decoder_of(target)(input_ids=ids, use_cache=False)
    feats = tap.take()  # [B, T, F]
    norm = final_tap.take() if final_tap is not None else feats  # [B, T, H]
    head = target.get_output_embeddings()
    flat = norm.reshape(-1, norm.shape[-1])  # [B*T, H]
    best = torch.cat([head(flat[a: a + head_rows]).argmax(-1) for a in range(0, flat.shape[0], head_rows)])
    return feats, norm, best.view(len(sequences), longest)
