"""The host's work per step of every drafter and of the loop: torch operations and device-to-host reads outside the
target's forwards and outside the drafter network's forwards, kept under a budget (issue 69 item 3, issue 66 item 3).

    python benchmarks/host_ops.py                       # every case: the table, with ceilings and targets
    python benchmarks/host_ops.py --cases plain,eagle-tree-32@compiled --sites 15   # by function (--site-lines,
                                                        # --site-depth 2: by line, with callers)
    python benchmarks/host_ops.py --write-budget        # record today's counts; ceilings = them + 10% (both venvs)

Counts, not times: runs anywhere, beside other work. A case is a drafter of the registry's test matrix
(``registry.examples()``: every registered drafter, each as the identity tests build it, on a tiny random Llama of 4
layers; ``adaptive=False`` where the example is adaptive, since the cost model's sizing reads measured times), plus
an EAGLE tree of 32 nodes (depth 8, top-k 4) and a chain of 8 (``eagle_host_ops.py``'s two), plain greedy through
our loop (a drafter that never drafts) and transformers' own greedy ``generate`` (issue 66's reference, per token).
``@compiled``: as ``hfs.enable(model, compile=True)`` runs it (a static cache, EAGLE's fixed-shape drafting), the
compiled functions run eagerly and are left out of the counts, as the captured regions they are.

``host_ops_counter.py`` says what each column counts. ``host_ops_budget.json`` is the one place of the budget: per
case, today's counts under each transformers major version (``measured``), the ceilings CI holds them to
(``ceiling``: the highest of them + 10%, tests/bench/test_host_ops.py) and the issues' targets (``target``: glue and
loop operations together, and reads, per step; a case name there means that case's count).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))  # hf_speculative and tests.conftest from this checkout
if str(_HERE) not in sys.path:
    sys.path.append(str(_HERE))  # host_ops_counter beside it (last: no benchmark shadows a module)

from host_ops_counter import HostOps

from hf_speculative.core.tree import DraftTree
from hf_speculative.drafters.strategy import DraftStrategy
from hf_speculative.drafters.generator import SpeculativeCandidateGenerator

BUDGET = _HERE / "host_ops_budget.json"
MARGIN = 0.10
NEW_TOKENS = 16
MIN_STEPS, MAX_NEW_TOKENS = 4, 160  # steady steps averaged at least (tokens doubled until then, or EOS)
LIMITED = ("glue", "loop", "reads")  # what the ceilings hold, per step
EXTRAS = ("eagle-tree-32", "eagle-chain-8", "plain", "transformers-greedy")
CAPTURED_TREES = ("medusa-tree", "dflash-tree", "mtp-tree")  # @compiled too: a tree's step is its own region there
REFERENCE = "transformers-greedy"  # measured, not budgeted: transformers' own loop, whatever its version does


# -- cases ---------------------------------------------------------------------------------------------------------
class NeverDrafts(SpeculativeCandidateGenerator):
    """A per-call drafter whose every draft is empty: each step is one plain decoding step of our loop."""

    def draft(self, sequence, plan):
        return DraftTree.empty(sequence.device)


@dataclasses.dataclass(eq=False)
class NoDraft(DraftStrategy):
    """Plain greedy through our loop (not registered: it declares no method)."""

    def open(self, ctx):
        return NeverDrafts(ctx)


def compiles(label: str) -> bool:
    """Whether case ``label`` (no mode) runs on a compiled target (its class's ``capabilities.compile``)."""
    from hf_speculative.drafters import registry

    if label in EXTRAS:
        return label != REFERENCE
    return registry.examples()[label].capabilities.compile


def case_names() -> list[str]:
    """Every case: each matrix example and the extras eagerly, then ``@compiled`` the first example of each drafter
    class that compiles (the compiled path differs from the eager one in the loop's verifier and the captured draft
    steps, not in the other drafters' glue), the tree examples of the drafters whose trees are captured regions there
    (:data:`CAPTURED_TREES`) and the extras but transformers' greedy."""
    from hf_speculative.drafters import registry

    firsts = [cls.examples[0] for cls in dict.fromkeys(registry.examples().values())]
    trees = [label for label in CAPTURED_TREES if label in registry.examples()]
    compiled = [label for label in [*firsts, *trees, *EXTRAS] if compiles(label)]
    return [*registry.examples(), *EXTRAS, *(f"{label}@compiled" for label in compiled)]


def build(label: str) -> tuple[torch.nn.Module, Any]:
    """``(target, strategy)`` for case ``label`` (no mode); strategy ``None`` for transformers' greedy. Raises
    ``registry.ExampleNotApplicable`` where the drafter cannot be built with this transformers."""
    from hf_speculative.core.tree_shapes import DynamicTree
    from hf_speculative.drafters import registry
    from tests.conftest import build_model

    target = build_model("llama", layers=4).requires_grad_(False)
    if label == "eagle-tree-32":
        return target, registry.example("eagle-tree", target, tree=DynamicTree(nodes=32, depth=8, top_k=4))
    if label == "eagle-chain-8":
        return target, registry.example("eagle3", target, num_tokens=8)
    if label == "plain":
        return target, NoDraft()
    if label == REFERENCE:
        return target, None
    cls = registry.examples()[label]
    try:
        strategy = registry.example(label, target)
    except registry.ExampleNotApplicable:
        if not hasattr(cls, "example_target"):
            raise
        try:  # a drafter for its own kind of target (a Gemma-4 assistant)
            target = cls.example_target().requires_grad_(False)
        except ImportError as why:
            raise registry.ExampleNotApplicable(str(why)) from None
        strategy = registry.example(label, target)
    if getattr(strategy, "adaptive", False):  # the cost model's sizing reads measured times: counts would vary
        strategy = registry.example(label, target, adaptive=False)
    return target, strategy


@contextlib.contextmanager
def _compiled_eagerly():
    """``hfs.enable(model, compile=True)``'s paths with the compiled functions run as they are (not compiled)."""
    from hf_speculative.core import static_cache
    from hf_speculative.core import regions

    saved = static_cache.compiled_forward, regions.compile_region
    static_cache.compiled_forward = lambda target, mode: target
    regions.compile_region = lambda step, mode: step
    try:
        yield
    finally:
        static_cache.compiled_forward, regions.compile_region = saved


def count_case(case: str, new_tokens: int = NEW_TOKENS, *, attribute: bool = True, site_depth: int = 1,
               site_lines: bool = False) -> tuple[dict, HostOps]:
    """Run case ``case`` (``label`` or ``label@compiled``) and count its second call (the first sets up what a
    model sets up once: a calibration, a static cache). Returns its per-step figures (``HostOps.per_step`` and
    ``tokens_per_step``) and the counter."""
    import hf_speculative as hfs
    from tests.conftest import prompt_inputs

    label, _, mode = case.partition("@")
    target, strategy = build(label)
    compiled = mode == "compiled"
    hfs.enable(target, compile=compiled)
    counter = HostOps(target, attribute=attribute, depth=site_depth, lines=site_lines)
    options = dict(**prompt_inputs(), do_sample=False, max_new_tokens=new_tokens)

    def generate() -> torch.LongTensor:
        if strategy is None:  # transformers' own loop
            return type(target).generate(target, **options)
        return target.generate(**options, candidate_generator=strategy)

    with torch.no_grad(), (_compiled_eagerly() if compiled else contextlib.nullcontext()):
        generate()
        with counter:
            if strategy is not None:
                counter.track(strategy)
            out = generate()
    new = out.shape[1] - options["input_ids"].shape[1]
    if len(counter.steady()) < MIN_STEPS and new == new_tokens < MAX_NEW_TOKENS:  # long accepted drafts
        return count_case(case, min(2 * new_tokens, MAX_NEW_TOKENS), attribute=attribute, site_depth=site_depth,
                          site_lines=site_lines)
    figures = counter.per_step()
    figures["tokens_per_step"] = round(new / (len(counter.steps) - 1), 2)
    return figures, counter


# -- the budget ----------------------------------------------------------------------------------------------------
def version() -> str:
    """The transformers major version the counts are recorded under (``"4"``, ``"5"``)."""
    import transformers

    return transformers.__version__.split(".")[0]


def load_budget(path: Path = BUDGET) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"cases": {}}


def save_budget(budget: dict, path: Path = BUDGET) -> None:
    """Write ``budget`` with one line per case, sorted (short diffs when counts change)."""
    cases = ",\n".join(f"  {json.dumps(case)}: {json.dumps(entry, sort_keys=True)}"
                        for case, entry in sorted(budget["cases"].items()))
    about = json.dumps(budget.get("_about", ""))
    path.write_text(f'{{\n "_about": {about},\n "cases": {{\n{cases}\n }}\n}}\n')


def ceiling(measured: dict) -> dict:
    """The highest count of each figure across the versions recorded (``{"5": {...}, "4": {...}}``) + :data:`MARGIN`,
    rounded up to a tenth."""
    return {key: math.ceil(round(max(m[key] for m in measured.values()) * (1 + MARGIN) * 10, 6)) / 10
            for key in LIMITED}


def record(budget: dict, rows: dict) -> None:
    """Put ``rows``' counts (every case's) in ``budget`` under this transformers version, set the ceilings from them,
    and drop the cases that are gone (an example renamed)."""
    known = set(case_names())
    budget["cases"] = {case: entry for case, entry in budget["cases"].items() if case in known}
    for case, figures in rows.items():
        if isinstance(figures, str):
            continue
        entry = budget["cases"].setdefault(case, {})
        entry.setdefault("measured", {})[version()] = {key: figures[key] for key in LIMITED}
        if case != REFERENCE:
            entry["ceiling"] = ceiling(entry["measured"])


def over_budget(case: str, figures: dict, budget: dict) -> list[str]:
    """What of ``figures`` exceeds case ``case``'s ceilings, each as a sentence (empty: within budget)."""
    if case == REFERENCE:
        return []
    entry = budget["cases"].get(case, {})
    if "ceiling" not in entry:
        return [(f"{case}: no ceiling in benchmarks/{BUDGET.name} (a new drafter or case): record today's counts "
                 "with python benchmarks/host_ops.py --write-budget (under .venv and .venv-tf4)")]
    return [f"{case}: {figures[key]} {key} per step, over its ceiling of {entry['ceiling'][key]} (the count recorded "
            f"+ {MARGIN:.0%}): find the added work with python benchmarks/host_ops.py --cases {case} --sites 15"
            for key in LIMITED if figures[key] > entry["ceiling"][key]]


def target_of(case: str, budget: dict, rows: dict) -> tuple[Any, Any]:
    """Case ``case``'s target ``(ops, reads)`` per step (``None``: none set); a case name stands for its count."""
    target = budget["cases"].get(case, {}).get("target", {})

    def value(key: str, figure: str) -> Any:
        goal = target.get(key)
        if isinstance(goal, str):
            other = rows.get(goal)
            measured = budget["cases"].get(goal, {}).get("measured", {}).get(version())
            source = other if isinstance(other, dict) else measured
            if source is None:
                return goal
            return round(source["glue"] + source["loop"], 2) if figure == "ops" else source["reads"]
        return goal

    return value("ops", "ops"), value("reads", "reads")


# -- the command ---------------------------------------------------------------------------------------------------
def table(rows: dict, budget: dict) -> str:
    """The Markdown table: per case its figures per step, its ceilings and its target."""
    lines = [("| case | ops/step: glue + loop | reads/step | network calls (ops, reads) | tokens/step | "
              "ceiling glue/loop/reads | target ops/reads |"), "|---|---|---|---|---|---|---|"]
    for case, f in rows.items():
        if isinstance(f, str):
            lines.append(f"| {case} | {f} | | | | | |")
            continue
        cap = budget["cases"].get(case, {}).get("ceiling")
        ops, reads = target_of(case, budget, rows)
        goal = "-" if ops is None and reads is None else "/".join("-" if v is None else str(v) for v in (ops, reads))
        lines.append(f"| {case} | {f['glue'] + f['loop']:.1f} = {f['glue']} + {f['loop']} | {f['reads']} | "
                     f"{f['net_calls']} ({f['net']}, {f['net_reads']}) | {f['tokens_per_step']} | "
                     f"{'/'.join(str(cap[k]) for k in LIMITED) if cap else '-'} | {goal} |")
    return "\n".join(lines)


def busiest(sites: dict, n: int) -> str:
    """The ``n`` sites issuing the most operations and the ``n`` issuing the most reads, by operations, one a line."""
    by_reads = sorted(sites, key=lambda site: -sites[site]["reads"])[:n]
    chosen = [site for site in sites if site in by_reads or site in list(sites)[:n]]
    return "\n".join(f"  {s['ops']:8.2f} ops {s['reads']:6.2f} reads  {site}  ({s['top']})"
                     for site, s in ((site, sites[site]) for site in chosen))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=None, help="comma-separated cases (default: every one)")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--sites", type=int, default=0, help="print each case's N busiest sites (glue and loop)")
    parser.add_argument("--site-depth", type=int, default=1, help="hf_speculative frames per site (callers too)")
    parser.add_argument("--site-lines", action="store_true", help="sites by line (file:line:function)")
    parser.add_argument("--write-budget", action="store_true",
                        help="record these counts for this transformers version; ceilings = the highest + 10%%")
    parser.add_argument("--out", type=Path, default=None, help="write the figures and sites as JSON")
    args = parser.parse_args(argv)
    from hf_speculative.drafters.registry import ExampleNotApplicable

    torch.set_num_threads(1)
    cases = args.cases.split(",") if args.cases else case_names()
    if args.write_budget and (args.cases or args.new_tokens != NEW_TOKENS):
        parser.error("--write-budget records every case at the default --new-tokens")
    budget = load_budget()
    rows, sites, failures = {}, {}, []
    for case in cases:
        try:
            figures, counter = count_case(case, args.new_tokens, site_depth=args.site_depth,
                                          site_lines=args.site_lines)
        except ExampleNotApplicable as why:
            rows[case] = f"not applicable here: {why}"
            continue
        rows[case], sites[case] = figures, counter.sites()
        if args.new_tokens == NEW_TOKENS:
            failures += over_budget(case, figures, budget)
        if args.sites:
            print(f"{case}: {json.dumps(figures)}")
            print(busiest(sites[case], args.sites))
    if args.write_budget:
        record(budget, rows)
        save_budget(budget)
        failures = []
    print(table(rows, budget))
    if args.out:
        args.out.write_text(json.dumps({"figures": rows, "sites": sites}, indent=1) + "\n")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
