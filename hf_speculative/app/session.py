"""One comparison: the baseline and the chosen methods run on one prompt, observed live.

Methods run one after another on the same model (fair timings: no two calls compete for the CPU or
the GPU), the baseline first so that every later pane can show its speedup while it streams. On a GPU
the visitor may ask for all of them at once instead.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

from ..drafters.strategy import DraftStrategy
from ..tooling.methods import get_method, pad_token_id
from ..tooling.prompting import encode_prompt
from .cache import LoadedModel, ModelCache
from .highlight import SourcedText
from .request import AppError, CompareRequest, Sources
from .streaming import MethodTrace, describe_error, generate_into

THREAD_PREFIX = "hfs-app-generate"


class Comparison:
    """Runs :class:`CompareRequest` ``request`` on ``loaded`` and keeps one trace and text per method.

    Args:
        loaded (`LoadedModel`): the target.
        request (`CompareRequest`): what to run.
        cache (`ModelCache`): where draft models come from.
        max_prompt_tokens (`int`): longest prompt accepted, in tokens (chat template included).
        sources (`Sources`, *optional*): what the app offers (draft models on disk, shipped drafters); default:
            the registry's models and ``loaded``'s name.

    Every method is prepared here, before anything runs: its options resolved (a blank draft model is the first
    model on disk that shares the target's tokenizer), its strategy built and checked against the target. A
    method that cannot run on this model refuses the whole request with a message saying why.

    Raises:
        AppError: the prompt is too long for this demo or for the model's context, or a method cannot run.
    """

    def __init__(self, loaded: LoadedModel, request: CompareRequest, cache: ModelCache, max_prompt_tokens: int,
                 sources: Sources | None = None):
        self.loaded, self.request, self.cache = loaded, request, cache
        self.sources = sources or Sources.offered(loaded.name)
        self.input_ids = encode_prompt(loaded.tokenizer, request.prompt).to(loaded.model.device)
        self._check_length(max_prompt_tokens)
        self._check_layers()
        self.traces = [MethodTrace(get_method(name), request.max_new_tokens) for name in request.methods]
        self._extras = self._prepare()
        self.texts = [SourcedText(loaded.tokenizer) for _ in self.traces]
        self._rendered_blocks = [0] * len(self.traces)
        self.cancel_event = threading.Event()
        self.stopped = False  # the visitor pressed Stop (or left)
        self._threads: list[threading.Thread] = []

    @property
    def prompt_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def baseline(self) -> MethodTrace:
        return self.traces[0]

    # -- running --------------------------------------------------------------------------------
    def run(self, interval: float = 0.2) -> Iterator[int]:
        """Run every method, yielding (the index of the running method) every ``interval`` seconds
        and when a method ends, so that the caller can redraw the page."""
        order = [list(range(len(self.traces)))] if self.request.concurrent else [[i] for i in range(len(self.traces))]
        for group in order:
            threads = [self._start(i) for i in group]
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(interval / len(threads))
                self.refresh_texts()
                yield group[0]
            self.refresh_texts(final=True)
            yield group[-1]
            if self.cancel_event.is_set():
                return

    def cancel(self, wait: float = 5.0, *, stopped: bool = False) -> None:
        """Stop the running generations (each at its next token block) and wait up to ``wait`` seconds.
        ``stopped``: the visitor asked for it (the page then says "Stopped")."""
        if stopped and not self.finished:
            self.stopped = True
        self.cancel_event.set()
        deadline = time.monotonic() + wait
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for trace in self.traces:
            if trace.status == "waiting":
                trace.status = "cancelled"

    @property
    def finished(self) -> bool:
        """Every method ended (done, failed or stopped)."""
        return all(t.status in ("done", "error", "cancelled") for t in self.traces)

    def _start(self, index: int) -> threading.Thread:
        trace = self.traces[index]
        thread = threading.Thread(target=self._generate, args=(trace,), name=f"{THREAD_PREFIX}-{trace.spec.name}",
                                  daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _generate(self, trace: MethodTrace) -> None:
        if self.cancel_event.is_set():
            trace.status = "cancelled"
            return
        model, tokenizer = self.loaded.model, self.loaded.tokenizer
        generate_into(trace, model, self.input_ids, self._extras[self.traces.index(trace)], cancel=self.cancel_event,
                      pad_token_id=pad_token_id(model, tokenizer), sampling=self.request.sampling)

    # -- preparing ----------------------------------------------------------------------------------
    def _prepare(self) -> list[dict]:
        """Each method's ``generate()`` kwargs, built and checked against the target before anything runs."""
        from .offer import method_problem

        extras, problems = [], []
        name = self.loaded.name
        for trace in self.traces:
            spec = trace.spec
            problem = None if spec.kind == "baseline" else method_problem(
                spec.name, name, self.sources, self._layer_count(), self.request.options.get(spec.name, {}))
            if problem is None:
                try:
                    extras.append(self._build(spec))
                    continue
                except AppError as err:
                    problem = str(err)
                except Exception as err:  # noqa: BLE001 - a drafter that does not fit this model
                    problem = describe_error(err)
            extras.append({})
            problems.append(f"{spec.label} cannot run on {name}: {problem.rstrip('.')}.")
        if problems:
            raise AppError(" ".join(problems) + " Untick it, or pick another model.")
        return extras

    def _build(self, spec: Any) -> dict:
        import hf_speculative as hfs

        model, tokenizer = self.loaded.model, self.loaded.tokenizer
        options = self._resolve_options(spec)
        if spec.kind == "hfs":
            hfs.enable(model)  # idempotent, per instance
        extra = dict(spec.build(model, tokenizer, options))
        strategy = extra.get("candidate_generator")
        if isinstance(strategy, DraftStrategy):
            # without state shared across calls that a visitor could read another visitor's answers from
            # (SuffixDecoding's history of the model's outputs): a visitor's tau depends on their own prompt only
            extra["candidate_generator"] = strategy = strategy.private()
            strategy.validate_target(model)
        if extra.get("assistant_model") is not None:  # transformers' assisted generation: same vocabulary
            from ..drafters.draft_model.drafter import check_same_vocabulary

            check_same_vocabulary(model, extra["assistant_model"], tokenizer, None)
        return extra

    def _layer_count(self) -> int | None:
        config = self.loaded.model.config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        total = getattr(config, "num_hidden_layers", None)
        return total if isinstance(total, int) else None

    def _resolve_options(self, spec: Any) -> dict:
        """The method's options, with a draft model name replaced by the cached model (blank: the first model
        on this server that shares the target's tokenizer), and LayerSkip's calibration kept in the package's
        cache under the model's fingerprint."""
        from .offer import draft_models

        options = dict(self.request.options.get(spec.name, {}))
        if "calibration_file" in spec.options and spec.option(options, "skip") == "auto":
            options["calibration_file"] = str(self.cache.calibration_file(self.loaded))
        if "draft_model" in spec.options and options.get("draft_model") is None:
            candidates = draft_models(self.loaded.name, self.sources)
            if not candidates:
                raise AppError("it needs a draft model: pick one in the method's options (a smaller model with the "
                               "same tokenizer)")
            options["draft_model"] = candidates[0]
        draft = options.get("draft_model")
        if isinstance(draft, str):
            try:
                options["draft_model"] = self.cache.draft(draft)
            except Exception as err:  # noqa: BLE001
                raise AppError(f"cannot load the draft model {draft!r}: {describe_error(err)}") from err
        return options

    # -- text -------------------------------------------------------------------------------------
    def refresh_texts(self, final: bool = False) -> None:
        """Decode the blocks that arrived since the last call into each pane's text (page thread)."""
        for i, (trace, text) in enumerate(zip(self.traces, self.texts)):
            blocks = trace.blocks_since(self._rendered_blocks[i])
            for ids, accepted in blocks:
                text.add_block(ids, accepted)
            self._rendered_blocks[i] += len(blocks)
            if final and trace.status in ("done", "error", "cancelled"):
                text.finish()

    # -- figures ----------------------------------------------------------------------------------
    def speedup(self, trace: MethodTrace) -> float | None:
        """``trace``'s tokens/s over the baseline's (live while either runs)."""
        if trace is self.baseline:
            return 1.0 if trace.new_tokens else None
        base = self.baseline.tokens_per_s
        if base <= 0 or trace.new_tokens == 0:
            return None
        return trace.tokens_per_s / base

    def identical(self, trace: MethodTrace) -> bool | None:
        """Whether ``trace``'s tokens equal the baseline's (``None`` until both are done)."""
        if trace.status != "done" or self.baseline.status != "done":
            return None
        return trace.ids == self.baseline.ids

    def results(self) -> dict:
        """Everything measured, JSON-ready (the page's "raw results")."""
        methods = []
        for trace, text in zip(self.traces, self.texts):
            stats = trace.final_stats
            methods.append({
                "method": trace.spec.name, "label": trace.spec.label, "kind": trace.spec.kind,
                "status": trace.status, "error": trace.error, "text": text.text, "output_ids": list(trace.ids),
                "new_tokens": trace.new_tokens, "seconds": trace.seconds, "tokens_per_s": trace.tokens_per_s,
                "speedup": self.speedup(trace), "tau": trace.tau, "acceptance_rate": trace.acceptance_rate,
                "target_forwards": trace.target_forwards, "accepted_tokens": trace.accepted_tokens,
                "drafted_tokens": trace.drafted_tokens, "accepted_lengths": list(trace.accepted_lengths),
                "identical_to_baseline": self.identical(trace),
                "hfs_stats": None if stats is None else _json_keys(stats.to_dict()),
            })
        return {
            "model": self.loaded.name, "device": str(self.loaded.device), "prompt_tokens": self.prompt_tokens,
            "max_new_tokens": self.request.max_new_tokens, "sampling": self.request.sampling,
            "order": "concurrent" if self.request.concurrent else "sequential", "methods": methods,
        }

    def _check_layers(self) -> None:
        """Layer options the visitor set, against the loaded model's layer count."""
        config = self.loaded.model.config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        total = getattr(config, "num_hidden_layers", None)
        if not isinstance(total, int):
            return
        for name in self.request.methods:
            options, spec = self.request.options.get(name, {}), get_method(name)
            label = spec.label
            exit_layer = spec.option(options, "exit_layer") if "exit_layer" in spec.options else None
            if exit_layer is not None and not 1 <= exit_layer < total:
                default = "" if options.get("exit_layer") is not None else " (the method's default: set exit_layer " \
                                                                            "in its options)"
                raise AppError(f"{label}: exit_layer must be from 1 to {total - 1} for {self.loaded.name!r} "
                               f"({total} layers), got {exit_layer}{default}.")
            skip = options.get("skip")
            if isinstance(skip, str) and skip != "auto":
                indices = [int(i) for i in skip.split(",")]
                if max(indices) >= total or len(indices) >= total:
                    raise AppError(f"{label}: skip must list fewer than {total} distinct layers from 0 to {total - 1} "
                                   f"for {self.loaded.name!r}, got {skip!r}.")

    def _check_length(self, max_prompt_tokens: int) -> None:
        n = self.prompt_tokens
        if n > max_prompt_tokens:
            raise AppError(f"The prompt is too long: {n:,} tokens, this demo accepts at most {max_prompt_tokens:,}.")
        context = getattr(self.loaded.model.config, "max_position_embeddings", None)
        if isinstance(context, int) and n + self.request.max_new_tokens > context:
            raise AppError(f"The prompt ({n:,} tokens) plus {self.request.max_new_tokens} new tokens exceed the "
                           f"model's context of {context:,} tokens.")


def _json_keys(value: Any) -> Any:
    """``value`` with every dict key as a string (JSON objects have string keys only)."""
    if isinstance(value, dict):
        return {str(k): _json_keys(v) for k, v in value.items()}
    return value
