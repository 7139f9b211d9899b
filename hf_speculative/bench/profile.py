"""What verification costs on this model and device: ``hf-speculative profile``.

Speculative decoding pays when verifying ``n`` draft tokens in one forward costs little more than one
token. Whether it does depends on the model, the device, the dtype and the context, so it is measured,
not assumed: for each context length, one forward over the root plus ``n`` draft tokens, as a chain and as
a tree (the same tokens with a tree attention mask), timed against the forward of the root alone.

Real architectures can be timed without downloading weights: ``--config llama-3.1-8b --random-weights``
builds the model from a config the package carries, with random weights (timings do not depend on the
weights' values). The result is a JSON file the cost model can load instead of measuring.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .. import compat
from ..core import kv_cache
from ..core.cost_profile import FORMAT
from ..core.tree import DraftTree
from ..core.verify import forward_tree
from .bandwidth import bandwidth_fields, weights_gbs

CONFIG_DIR = Path(__file__).parent / "configs"


def shipped_configs() -> list[str]:
    """Names of the real architectures ``--config`` accepts."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def random_model(name: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The architecture of a shipped config (``shipped_configs()``) with random weights, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"--config {name!r}: use one of {', '.join(shipped_configs())}.")
    fields = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    config = AutoConfig.for_model(**fields)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, **compat.dtype_kwargs(dtype))
    return model.eval()


def tree_of(n: int, shape: str) -> DraftTree:
    """``n`` draft tokens as a chain, or as a binary tree (two children per node, breadth first)."""
    tokens = torch.arange(n, dtype=torch.long) % 97 + 3
    if shape == "chain":
        return DraftTree.chain(tokens)
    return DraftTree(tokens, torch.arange(n, dtype=torch.long) // 2 - 1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def in_turns(steps: Sequence[tuple[Callable[[], Any], Callable[[], Any]]], device: torch.device, repeats: int,
             warmup: int) -> list[float]:
    """Median seconds of each ``(run, tidy)`` step's ``run`` (``tidy``, untimed, puts the cache back).

    The steps take turns within every round rather than one after the other: a profile is read as ratios to the
    one-token forward, and a drift in the machine's speed (another tenant, the clock) then moves every size alike
    instead of whichever size was being timed when it came.
    """
    times: list[list[float]] = [[] for _ in steps]
    for i in range(warmup + repeats):
        for (run, tidy), kept in zip(steps, times):
            _sync(device)
            start = time.perf_counter()
            run()
            _sync(device)
            if i >= warmup:
                kept.append(time.perf_counter() - start)
            tidy()
    return [statistics.median(kept) for kept in times]


def time_verifications(model: torch.nn.Module, cache: Any, trees: Sequence[DraftTree], repeats: int,
                       warmup: int) -> list[float]:
    """Median seconds of one forward over a root and each of ``trees`` on top of ``cache`` (left as it was
    found), the trees taking turns (:func:`in_turns`)."""
    device = model.get_input_embeddings().weight.device
    steps = [(lambda tree=tree: forward_tree(model, cache, 5, tree),
              lambda tree=tree: compat.crop_cache(cache, tree.size + 1)) for tree in trees]
    return in_turns(steps, device, repeats, warmup)


@dataclasses.dataclass
class ProfileSettings:
    """What to measure. ``sizes``: draft tokens per forward (0 = the plain one-token forward)."""

    contexts: Sequence[int] = (512, 2048)
    sizes: Sequence[int] = (0, 1, 2, 4, 8, 16, 32, 64)
    shapes: Sequence[str] = ("chain", "tree")
    repeats: int = 10
    warmup: int = 3
    # None: the eager forward on a dynamic cache (what decoding without compile= runs); a torch.compile mode
    # (or "static" for a static cache without compiling): the fixed-shape forward of static_cache.StaticVerifier
    compile: str | None = None
    # batch sizes besides the one-row profile: forwards over [B, 1 + n] as the batch loop runs them (batch_verify.py)
    batches: Sequence[int] = ()

    def __post_init__(self) -> None:
        if not self.contexts or min(self.contexts) < 1:
            raise ValueError(f"profile contexts={list(self.contexts)}: give one or more lengths >= 1.")
        if 0 not in self.sizes or min(self.sizes) < 0 or max(self.sizes) > 256:
            raise ValueError(f"profile sizes={list(self.sizes)}: need 0 (the one-token forward) and sizes up to 256.")
        if not set(self.shapes) <= {"chain", "tree"}:
            raise ValueError(f"profile shapes={list(self.shapes)}: use chain and/or tree.")
        from ..core.static_cache import COMPILE_MODES

        if self.compile is not None and self.compile not in ("static", *COMPILE_MODES):
            raise ValueError(f"profile compile={self.compile!r}: use static or a torch.compile mode "
                             f"({', '.join(COMPILE_MODES)}).")
        if self.batches and (min(self.batches) < 1 or max(self.batches) > 64):
            raise ValueError(f"profile batches={list(self.batches)}: use batch sizes from 1 to 64.")
        if self.batches and self.compile is not None:
            raise ValueError(f"profile batches={list(self.batches)} with compile={self.compile!r}: batches run on the "
                             "dynamic cache (the batch loop does not compile); profile them without compile.")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"profile repeats={self.repeats}, warmup={self.warmup}: need repeats >= 1, warmup >= 0.")


def profile(model: torch.nn.Module, settings: ProfileSettings | None = None, *, label: str = "",
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time verification on ``model`` for every context, shape and size of ``settings``.

    Returns a JSON-ready dict: ``seconds[context][shape][n]`` (median seconds of one forward verifying
    ``n`` draft tokens) and ``relative[context][shape][n]`` (that over the one-token forward); on a CPU also
    ``weight_bytes_per_token``, ``read_bandwidth_gbs`` (``bandwidth.py``) and ``weights_gbs[context]``, the weights'
    read rate in the one-token forward.
    """
    settings = settings or ProfileSettings()
    bandwidth = bandwidth_fields(model)  # measured before the timings, not between them
    device = model.get_input_embeddings().weight.device
    vocab = int(compat.text_config(model.config).vocab_size)
    seconds: dict[str, dict[str, dict[str, float]]] = {}
    generator = torch.Generator().manual_seed(0)
    if settings.compile is not None:
        seconds = _static_seconds(model, settings, vocab, generator, progress)
    with torch.no_grad():
        for context in settings.contexts if settings.compile is None else ():
            cache = kv_cache.new_dynamic_cache()
            prompt = torch.randint(3, vocab, (1, context - 1), generator=generator).to(device)
            model(input_ids=prompt, use_cache=True, **{compat.cache_kwarg(): cache})
            row = seconds.setdefault(str(context), {})
            for shape in settings.shapes:
                medians = time_verifications(model, cache, [tree_of(n, shape) for n in settings.sizes],
                                             settings.repeats, settings.warmup)
                row[shape] = {str(n): t for n, t in zip(settings.sizes, medians)}
                if progress:
                    for n, t in zip(settings.sizes, medians):
                        progress(f"context {context} {shape} {n}: {t * 1e3:.2f} ms")
    relative = {c: {s: {n: t / by_shape[s]["0"] for n, t in times.items()} for s, times in by_shape.items()}
                for c, by_shape in seconds.items()}
    batches = {}
    if settings.batches:
        batch_seconds = _batch_seconds(model, settings, vocab, generator, progress)
        batches = {"batch_seconds": batch_seconds,
                   "batch_relative": {c: {b: {n: t / times["0"] for n, t in times.items()} for b, times in by_b.items()}
                                      for c, by_b in batch_seconds.items()}}
    if bandwidth:
        bandwidth["weights_gbs"] = {c: weights_gbs(bandwidth["weight_bytes_per_token"], 1 / t)
                                    for c, t in one_token_seconds(seconds).items()}
    return {"format": FORMAT, "label": label or type(model).__name__, "device": describe(device),
            **({"cpu": cpu_model()} if device.type == "cpu" else {}),  # as the benchmark records it
            "dtype": str(model.get_input_embeddings().weight.dtype).replace("torch.", ""),
            "torch": torch.__version__, "transformers": str(compat.TRANSFORMERS_VERSION),
            "threads": torch.get_num_threads(), "compile": settings.compile,
            "settings": {k: list(v) if isinstance(v, (tuple, list)) else v
                         for k, v in dataclasses.asdict(settings).items()},
            "seconds": seconds, "relative": relative, **batches, **bandwidth}


def one_token_seconds(seconds: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """Per context, the one-token forward's seconds: each shape times that same forward, the fastest is kept."""
    return {c: min(times["0"] for times in by_shape.values()) for c, by_shape in seconds.items()}


def _static_seconds(model: torch.nn.Module, settings: ProfileSettings, vocab: int, generator: torch.Generator,
                    progress: Callable[[str], None] | None) -> dict[str, dict[str, dict[str, float]]]:
    """The timings of :func:`profile` for the fixed-shape forward on a static cache (compiled unless
    ``settings.compile == "static"``): one verifier per size, all on one cache, so one graph per size."""
    from ..core.static_cache import StaticVerifier, capacity_for, compiled_forward

    device = model.get_input_embeddings().weight.device
    forward = None
    if settings.compile != "static":
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * len(settings.sizes))
        forward = compiled_forward(model, settings.compile)
    capacity = capacity_for(max(settings.contexts), max(settings.sizes))
    seconds: dict[str, dict[str, dict[str, float]]] = {}
    for n in settings.sizes:
        verifier = StaticVerifier(model, budget=n, capacity=capacity, forward=forward)
        try:
            for context in settings.contexts:
                prompt = torch.randint(3, vocab, (context,), generator=generator).to(device)
                verifier.length = 0
                verifier.forward_row(prompt, DraftTree.empty(device))  # prefill: the context before the root
                for shape in settings.shapes:
                    tree = tree_of(n, shape)
                    times = []
                    for i in range(settings.warmup + settings.repeats):
                        _sync(device)
                        start = time.perf_counter()
                        verifier.forward_row(prompt[-1:], tree)  # writes after the context; nothing kept
                        _sync(device)
                        if i >= settings.warmup:
                            times.append(time.perf_counter() - start)
                    seconds.setdefault(str(context), {}).setdefault(shape, {})[str(n)] = statistics.median(times)
                    if progress:
                        progress(f"context {context} {shape} {n} ({settings.compile}): {statistics.median(times) * 1e3:.2f} ms")
        finally:
            verifier.close()
    return seconds


def _batch_seconds(model: torch.nn.Module, settings: ProfileSettings, vocab: int, generator: torch.Generator,
                   progress: Callable[[str], None] | None) -> dict[str, dict[str, dict[str, float]]]:
    """``[context][B][n]``: median seconds of the batch loop's forward over ``[B, 1 + n]`` tokens (each row's root
    and a chain of ``n`` draft tokens) after ``context - 1`` tokens per row."""
    from ..core.batch_verify import BatchVerifier

    device = model.get_input_embeddings().weight.device
    seconds: dict[str, dict[str, dict[str, float]]] = {}
    with torch.no_grad():
        for context in settings.contexts:
            for batch in settings.batches:
                verifier = BatchVerifier(model, batch)
                prompt = torch.randint(3, vocab, (batch, context), generator=generator).to(device)
                mask = torch.ones_like(prompt, dtype=torch.bool)
                verifier.forward(prompt[:, :-1], mask[:, :-1], [DraftTree.empty(device)] * batch)
                verifier.keep([()] * batch)
                trees = [[tree_of(n, "chain")] * batch for n in settings.sizes]
                steps = [(lambda rows=rows: verifier.forward(prompt[:, -1:], mask[:, -1:], rows), verifier.undo)
                         for rows in trees]
                medians = in_turns(steps, device, settings.repeats, settings.warmup)
                seconds.setdefault(str(context), {})[str(batch)] = {str(n): t for n, t in zip(settings.sizes, medians)}
                if progress:
                    for n, t in zip(settings.sizes, medians):
                        progress(f"context {context} batch {batch} {n}: {t * 1e3:.2f} ms")
                verifier.close()
    return seconds


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), as ``hf-speculative bench`` records it; else the platform's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.processor() or platform.machine())
    except OSError:
        return platform.processor() or platform.machine()


def save(result: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Relative cost against draft tokens, one line per context and shape (needs matplotlib)."""
    from ..extras import require

    figure_module = require("matplotlib.figure", "app", "profile's plot")
    figure = figure_module.Figure(figsize=(6, 4))
    axes = figure.add_subplot()
    for context, by_shape in result["relative"].items():
        for shape, by_size in by_shape.items():
            sizes = sorted(int(s) for s in by_size)
            axes.plot(sizes, [by_size[str(s)] for s in sizes], marker="o", label=f"{shape}, context {context}")
    axes.set_xscale("symlog", base=2)
    axes.set_xlabel("draft tokens verified in one forward")
    axes.set_ylabel("cost (one-token forwards)")
    axes.set_title(f"{result['label']} on {result['device']} ({result['dtype']})", fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    path = Path(path)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    return path
