"""Count the host's work around the forwards of a ``generate()`` call: torch operator calls and device-to-host reads,
per step, by who issued them.

    with HostOps(target) as counted:
        counted.track(strategy)            # its per-call drafter's draft() / observe() are "drafting"
        target.generate(...)
    counted.per_step()                     # {"glue": ..., "loop": ..., "net": ..., "reads": ...} per steady step

Every ATen operator that reaches the dispatcher is one operation (``TorchDispatchMode``: views, copies, a
``torch.tensor`` of a Python list, each index). Each operation falls into one category:

- ``target``: inside an ``nn.Module`` call made outside drafting (the target's forwards; not budgeted);
- ``net``: inside an ``nn.Module`` call made while drafting (the drafter's network, the target's layers a
  self-speculative drafter runs, EAGLE's fixed-shape ``DraftStep``: what a captured region would hold);
- ``glue``: the rest of what the drafter's ``draft`` and ``observe`` issue (frontier bookkeeping, masks, top-k over
  the vocabulary, the map to the target's vocabulary, feature queues);
- ``loop``: the rest: the loop's own work (verification's masks and acceptance, logits processing, the cache's
  keep, stop checks, the sequence's growth, the budget), budget code called from inside a drafter included.

A read is an operation that hands a tensor's values to Python or waits for them (a sync on a GPU):
``_local_scalar_dense`` (``item()``, ``int(t)``, ``float(t)``, ``bool(t)``, ``t`` as an index), ``tolist()`` and
``numpy()`` (wrapped here: they dispatch no operator of their own), and the operators whose output size depends on
values (``nonzero``, ``masked_select``, ``unique``, ``equal``, a boolean index, ``repeat_interleave`` without
``output_size``) or that copy to the host. On this CPU every tensor lives on the host, so a read of a tensor that a
GPU run would keep on the host too is counted as well: an upper bound of a GPU run's syncs.

Steps are cut at the target's top-level forwards (each call of the ``target`` module outside drafting starts one):
step ``k`` holds forward ``k`` and everything until forward ``k + 1`` (its verification, the next draft). The
steady steps leave out the first two (before the prefill; the prefill and the drafter's catch-up on the prompt)
and the last (the call's tail).

Each counted operation outside the target is also attributed to the innermost ``hf_speculative`` frame of the
Python stack at dispatch time (else the innermost ``transformers`` one): ``core/loop.py:processed_scores``.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

CATEGORIES = ("glue", "loop", "net", "target")
# budget code (core/budget.py, core/policy.py) is the loop's, even when a drafter calls it (plan.tree_nodes())
LOOP_FILES = ("hf_speculative/core/budget.py", "hf_speculative/core/policy.py")
# operators whose result needs the tensor's values on the host (beside _local_scalar_dense and the wrapped methods)
_VALUE_SIZED = {"nonzero", "masked_select", "_unique2", "unique_consecutive", "unique_dim", "equal", "_unique"}
_READ_METHODS = ("tolist", "numpy")
READ = "<read>"  # a read's entry among a site's operations


@dataclasses.dataclass
class Step:
    """One step's counts: ``ops[category]`` and ``reads[category]``; ``sites[(category, site, op)]`` operations
    (``op`` :data:`READ`: reads)."""

    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    reads: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    sites: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    net_calls: int = 0  # top-level nn.Module calls while drafting (the drafter network's calls)


def _is_read(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether operator ``name`` on ``args`` reads values to the host (see the module docstring)."""
    if name == "_local_scalar_dense" or name in _VALUE_SIZED:
        return True
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
    if name == "repeat_interleave":
        return kwargs.get("output_size") is None and isinstance(args[0], torch.Tensor)
    if name in ("_to_copy", "copy_"):  # a copy from a device to the host
        source = args[1] if name == "copy_" else args[0]
        device = kwargs.get("device") if name == "_to_copy" else args[0].device
        return (isinstance(source, torch.Tensor) and source.device.type != "cpu" and device is not None
                and torch.device(device).type == "cpu")
    return False


def site_of(frame: Any, depth: int = 1, lines: bool = False) -> str:
    """``"hf_speculative/core/loop.py:processed_scores"``: the innermost frame of hf_speculative's code on the stack
    from ``frame`` out, else the innermost of transformers', else ``"other"``; with ``depth`` > 1, that many of
    hf_speculative's frames, innermost first, joined by ``" < "`` (``tree.py:__post_init__ < tree.py:empty``); with
    ``lines``, each with its line number (``loop.py:127:stop_index``)."""
    found, fallback = [], None
    while frame is not None and len(found) < depth:
        path = frame.f_code.co_filename.replace("\\", "/")
        cut = path.rfind("/hf_speculative/")
        name = f":{frame.f_lineno}:{frame.f_code.co_name}" if lines else f":{frame.f_code.co_name}"
        if cut >= 0:
            found.append(path[cut + 1:] + name)
        elif fallback is None and not found:
            cut = path.rfind("/transformers/")
            if cut >= 0:
                fallback = path[cut + 1:] + name
        frame = frame.f_back
    return " < ".join(found) or fallback or "other"


class HostOps(TorchDispatchMode):
    """Counts operations and reads per step while active (see the module docstring).

    Args:
        target (`nn.Module`): the model whose top-level calls are the target's forwards.
        attribute (`bool`, defaults to `True`): attribute each operation outside the target to its site (a stack walk
            per operation).
        depth (`int`, defaults to 1), lines (`bool`, defaults to `False`): hf_speculative frames per site, and their
            line numbers (:func:`site_of`).
    """

    def __init__(self, target: torch.nn.Module, attribute: bool = True, depth: int = 1, lines: bool = False):
        super().__init__()
        self.target, self.attribute, self.site_depth, self.site_lines = target, attribute, depth, lines
        self.steps: list[Step] = [Step()]
        self.depth = 0      # nn.Module calls in progress
        self.drafting = 0   # drafter draft()/observe() calls in progress
        self._saved: dict[str, Any] = {}  # what __enter__ replaced, put back by __exit__

    # -- what is counted where ----------------------------------------------------------------------
    def category(self) -> str:
        """Where an operation issued now falls (see the module docstring)."""
        if self.depth:
            return "net" if self.drafting else "target"
        return "glue" if self.drafting else "loop"

    def count(self, name: str | None, read: bool) -> None:
        """Count operator ``name`` (``None``: a read that dispatches none) in the current step."""
        step, category = self.steps[-1], self.category()
        site = None
        if category != "target" and self.attribute:
            site = site_of(sys._getframe(2), self.site_depth, self.site_lines)
            if category == "glue" and site.split(":")[0] in LOOP_FILES:
                category = "loop"
        if name is not None:
            step.ops[category] += 1
            if site is not None:
                step.sites[(category, site, name)] += 1
        if read:
            step.reads[category] += 1
            if site is not None:
                step.sites[(category, site, READ)] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket.__name__)
        self.count(name, _is_read(name, args, kwargs))
        return func(*args, **kwargs)

    # -- boundaries: module calls, drafting, reads that dispatch nothing ------------------------------
    def _module_call(self, call: Callable) -> Callable:
        counter = self

        def counted_call(module, *args, **kwargs):
            if not counter.depth:
                if counter.drafting:
                    counter.steps[-1].net_calls += 1
                elif module is counter.target:
                    counter.steps.append(Step())  # a target forward starts a step
            counter.depth += 1
            try:
                return call(module, *args, **kwargs)
            finally:
                counter.depth -= 1
        return counted_call

    def _read_method(self, method: Callable) -> Callable:
        counter = self

        def counted_read(tensor, *args, **kwargs):
            counter.count(None, True)
            return method(tensor, *args, **kwargs)
        return counted_read

    def drafting_call(self, method: Callable) -> Callable:
        """``method`` (a drafter's bound ``draft`` / ``observe``) counted as drafting."""
        def drafting(*args, **kwargs):
            self.drafting += 1
            try:
                return method(*args, **kwargs)
            finally:
                self.drafting -= 1
        return drafting

    def track(self, strategy: Any) -> None:
        """Count the per-call drafters ``strategy.open(ctx)`` returns as drafting (their ``draft`` and ``observe``;
        set on the instance, undone on exit)."""
        opened = type(strategy).open

        def open_tracked(ctx):
            generator = opened(strategy, ctx)
            generator.draft = self.drafting_call(generator.draft)
            generator.observe = self.drafting_call(generator.observe)
            return generator

        object.__setattr__(strategy, "open", open_tracked)
        self._saved.setdefault("strategies", []).append(strategy)

    def __enter__(self):
        self._saved["call"] = torch.nn.Module.__call__
        torch.nn.Module.__call__ = self._module_call(torch.nn.Module.__call__)
        for method in _READ_METHODS:
            self._saved[method] = getattr(torch.Tensor, method)
            setattr(torch.Tensor, method, self._read_method(self._saved[method]))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            torch.nn.Module.__call__ = self._saved.pop("call")
            for method in _READ_METHODS:
                setattr(torch.Tensor, method, self._saved.pop(method))
            for strategy in self._saved.pop("strategies", []):
                object.__delattr__(strategy, "open")

    # -- results --------------------------------------------------------------------------------------
    def steady(self) -> list[Step]:
        """The steps counted per step: all but the first two and the last (see the module docstring)."""
        return self.steps[2:-1]

    def per_step(self) -> dict[str, float]:
        """Mean operations per steady step by category (``glue``, ``loop``, ``net``, ``target``), ``reads`` (glue and
        loop), ``glue_reads``, ``net_reads``, ``net_calls`` (top-level module calls while drafting: the drafter's
        forwards, and its embedding and head calls where it makes them apart), and ``steps`` (how many were
        averaged)."""
        steps = self.steady()
        if not steps:
            raise ValueError(f"{len(self.steps) - 1} target forwards: too few for a steady step; generate more tokens.")
        mean = lambda values: round(sum(values) / len(steps), 2)
        out = {category: mean(s.ops[category] for s in steps) for category in CATEGORIES}
        out["reads"] = mean(s.reads["glue"] + s.reads["loop"] for s in steps)
        out["glue_reads"] = mean(s.reads["glue"] for s in steps)
        out["net_reads"] = mean(s.reads["net"] for s in steps)
        out["net_calls"] = mean(s.net_calls for s in steps)
        out["steps"] = len(steps)
        return out

    def sites(self, categories: tuple[str, ...] = ("glue", "loop")) -> dict[str, dict[str, float]]:
        """Per steady step, operations and reads by site (``{"ops": ..., "reads": ..., "top": "op x n, ..."}``) of
        ``categories``, most operations first."""
        ops, reads, kinds = collections.Counter(), collections.Counter(), collections.defaultdict(collections.Counter)
        steps = self.steady()
        if not steps:
            return {}
        for step in steps:
            for (category, site, op), n in step.sites.items():
                if category not in categories:
                    continue
                if op == READ:
                    reads[site] += n
                else:
                    ops[site] += n
                    kinds[site][op] += n
        return {site: {"ops": round(ops[site] / len(steps), 2), "reads": round(reads[site] / len(steps), 2),
                       "top": ", ".join(f"{op} {n / len(steps):.1f}" for op, n in kinds[site].most_common(4))}
                for site in sorted(set(ops) | set(reads), key=lambda s: -ops[s])}
