"""One comparison: the baseline and the chosen methods run on one prompt, observed live.

Methods run one after another on the same model (fair timings: no two calls compete for the CPU or
the GPU), the baseline first so that every later pane can show its speedup while it streams. On a GPU
the visitor may ask for all of them at once instead.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

from ..methods import get_method, pad_token_id
from ..prompting import encode_prompt
from .cache import LoadedModel, ModelCache
from .highlight import SourcedText
from .request import AppError, CompareRequest
from .streaming import MethodTrace, describe_error, generate_into

THREAD_PREFIX = "hfs-app-generate"


class Comparison:
    """Runs :class:`CompareRequest` ``request`` on ``loaded`` and keeps one trace and text per method.

    Args:
        loaded (`LoadedModel`): the target.
        request (`CompareRequest`): what to run.
        cache (`ModelCache`): where draft models come from.
        max_prompt_tokens (`int`): longest prompt accepted, in tokens (chat template included).

    Raises:
        AppError: the prompt is too long for this demo or for the model's context.
    """

    def __init__(self, loaded: LoadedModel, request: CompareRequest, cache: ModelCache, max_prompt_tokens: int):
        self.loaded, self.request, self.cache = loaded, request, cache
        self.input_ids = encode_prompt(loaded.tokenizer, request.prompt).to(loaded.model.device)
        self._check_length(max_prompt_tokens)
        self._check_layers()
        self.traces = [MethodTrace(get_method(name), request.max_new_tokens) for name in request.methods]
        self.texts = [SourcedText(loaded.tokenizer) for _ in self.traces]
        self._rendered_blocks = [0] * len(self.traces)
        self.cancel_event = threading.Event()
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

    def cancel(self, wait: float = 5.0) -> None:
        """Stop the running generations (each at its next token block) and wait up to ``wait`` seconds."""
        self.cancel_event.set()
        deadline = time.monotonic() + wait
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for trace in self.traces:
            if trace.status == "waiting":
                trace.status = "cancelled"

    def _start(self, index: int) -> threading.Thread:
        trace = self.traces[index]
        thread = threading.Thread(target=self._generate, args=(trace,), name=f"{THREAD_PREFIX}-{trace.spec.name}",
                                  daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _generate(self, trace: MethodTrace) -> None:
        import hf_speculative as hfs

        if self.cancel_event.is_set():
            trace.status = "cancelled"
            return
        model, tokenizer = self.loaded.model, self.loaded.tokenizer
        try:
            options = self._resolve_options(trace.spec)
            if trace.spec.kind == "hfs":
                hfs.enable(model)  # idempotent, per instance
            extra = trace.spec.build(model, tokenizer, options)
        except Exception as err:  # noqa: BLE001 - a drafter that does not fit: shown in its pane
            trace.error, trace.status = describe_error(err), "error"
            return
        generate_into(trace, model, self.input_ids, extra, cancel=self.cancel_event,
                      pad_token_id=pad_token_id(model, tokenizer), sampling=self.request.sampling)

    def _resolve_options(self, spec: Any) -> dict:
        """The method's options, with a draft model name replaced by the cached model, and LayerSkip's
        calibration kept in the package's cache under the model's fingerprint."""
        options = dict(self.request.options.get(spec.name, {}))
        if "calibration_file" in spec.options and spec.option(options, "skip") == "auto":
            options["calibration_file"] = str(self.cache.calibration_file(self.loaded))
        draft = options.get("draft_model")
        if isinstance(draft, str):
            try:
                options["draft_model"] = self.cache.draft(draft)
            except Exception as err:  # noqa: BLE001
                raise AppError(f"cannot load draft model {draft!r}: {describe_error(err)}") from err
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
        for name, options in self.request.options.items():
            label = get_method(name).label
            exit_layer = options.get("exit_layer")
            if exit_layer is not None and not 1 <= exit_layer < total:
                raise AppError(f"{label}: exit_layer must be from 1 to {total - 1} for {self.loaded.name!r} "
                               f"({total} layers), got {exit_layer}.")
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
