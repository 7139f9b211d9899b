"""Our engines for the peers benchmark: hf_speculative in this process, with its defaults (``hfs-default``) or with
``hfs.optimize_for_cpu(model)`` and transformers' grouped-query SDPA (``hfs-kernel``)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

from engines import BASELINE, Engine, Run

KERNEL_LAYOUT = "all+kernel"


@contextmanager
def sdpa_gqa(enabled: bool) -> Iterator[None]:
    """``TRANSFORMERS_SDPA_FORCE_GQA=1`` while ``enabled`` (``--sdpa-gqa``; transformers reads it per call), unset
    otherwise, as before afterwards."""
    key = "TRANSFORMERS_SDPA_FORCE_GQA"
    before = os.environ.get(key)
    if enabled:
        os.environ[key] = "1"
    else:
        os.environ.pop(key, None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


class HfsEngine(Engine):
    """hf_speculative in this process: defaults, or the kernel layout with grouped-query SDPA."""

    def __init__(self, name: str, model_name: str, methods: list[str], options: dict, encoded: list[Any],
                 *, kernel: bool, threads: int, meta: dict, dtype: str = "float32"):
        super().__init__()
        self.name, self.kernel, self.model_name, self.encoded = name, kernel, model_name, encoded
        self.wanted, self.options, self.threads, self.meta = methods, dict(options), threads, meta
        self.dtype = dtype
        self.weights = "fp32 (registry)" if dtype == "float32" else f"{dtype} (the registry's, cast)"
        self.model = self.tokenizer = None

    @property
    def label(self) -> str:  # type: ignore[override]
        version = self.meta.get("hf_speculative", "")
        if self.kernel:
            return (f"hf_speculative {version} with `hfs.optimize_for_cpu(model)` + GQA SDPA "
                    "(`--cpu-layout all+kernel --sdpa-gqa`)")
        return f"hf_speculative {version} defaults (PyTorch {'fp32' if self.dtype == 'float32' else self.dtype})"

    def start(self) -> None:
        import torch

        from hf_speculative.bench.runner import environment
        from hf_speculative.cpu.layout import apply_layout
        from hf_speculative.registry.models import load_model
        from hf_speculative.tooling.methods import get_method, problem_on

        torch.set_num_threads(self.threads)
        self.model, self.tokenizer = load_model(self.model_name, dtype=getattr(torch, self.dtype))
        self.model.eval()
        if self.kernel:
            apply_layout(self.model, KERNEL_LAYOUT)
        for name in self.wanted:
            spec = get_method(name)
            if spec.needs_draft_model and not self.options.get("draft_model"):
                self.notes.append(f"{name}: needs --draft-model")
                continue
            problem = problem_on(spec, self.model, self.tokenizer, self.options)
            if problem:
                self.notes.append(f"{name}: {problem}")
                continue
            self.methods.append(name)
        with sdpa_gqa(self.kernel):
            self.base = {"run_id": self.meta["run_id"], "model": self.model_name, "engine": self.name,
                         "max_new_tokens": self.meta["max_new_tokens"], "repeats": self.meta["repeats"],
                         **environment(self.model, self.threads)}

    def run(self, index: int, method: str, max_new_tokens: int) -> Run:
        from hf_speculative.tooling.methods import run_method

        with sdpa_gqa(self.kernel):
            done = run_method(method, self.model, self.tokenizer, self.encoded[index], options=self.options,
                              max_new_tokens=max_new_tokens)
        return Run(method, done.output_ids, done.new_tokens, done.seconds, done.target_forwards, done.drafted,
                   done.accepted, done.extra, source=done)

    def method_label(self, method: str) -> str:
        from hf_speculative.tooling.methods import get_method

        if method == BASELINE:
            return BASELINE
        label = get_method(method).label.replace(" (hfs)", "")
        first = label.split()[0]
        if first[1:].islower() and first != "Medusa":  # "Prompt lookup" -> "prompt lookup"; names stay
            label = label[0].lower() + label[1:]
        if label.endswith(" (transformers)"):
            label = "transformers' " + label[: -len(" (transformers)")]
        return label

    def versions(self) -> dict:
        import torch
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__,
                "hf_speculative": self.meta.get("hf_speculative")}

    def close(self) -> None:
        self.model = None
