"""benchmarks/host_ops.py: the host's work per step (torch operations and device-to-host reads outside the target's
and the drafter network's forwards) of every registered drafter and of the loop stays under the budget recorded in
benchmarks/host_ops_budget.json (issue 69 item 3); the counter sorts operations and reads by who issued them; added
work in the loop or in a drafter fails the check (negative controls)."""

from __future__ import annotations

import collections
import math
import sys

import pytest
import torch

from hf_speculative.drafters.registry import ExampleNotApplicable
from tests.conftest import load_benchmark

host_ops = load_benchmark("host_ops")
counter_module = sys.modules["host_ops_counter"]
HostOps, site_of = counter_module.HostOps, counter_module.site_of
BUDGET = host_ops.load_budget()


def _count(case: str, **options):
    try:
        return host_ops.count_case(case, attribute=False, **options)[0]
    except ExampleNotApplicable as why:
        pytest.skip(f"{case}: {why}")


# -- the budget ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", host_ops.case_names())
def test_host_work_per_step_within_budget(case):
    """Every registered drafter's examples (and the extras): glue and loop operations and reads per step at most
    their ceilings (today's counts + 10%)."""
    figures = _count(case)
    assert figures["steps"] >= 1 and figures["target"] > 0  # steps were counted, the target's forwards apart
    assert not host_ops.over_budget(case, figures, BUDGET), host_ops.over_budget(case, figures, BUDGET)


def test_budget_holds_current_cases_with_targets_beside_ceilings():
    cases = set(host_ops.case_names())
    assert set(BUDGET["cases"]) <= cases, f"stale cases: {sorted(set(BUDGET['cases']) - cases)} (--write-budget)"
    assert "ceiling" not in BUDGET["cases"][host_ops.REFERENCE]  # transformers' loop: measured, not held
    tree = BUDGET["cases"]["eagle-tree-32@compiled"]["target"]
    assert (tree["ops"], tree["reads"]) == (150, 2)  # issue 69's Targets
    for case, entry in BUDGET["cases"].items():
        for figures in entry.get("measured", {}).values():  # ceilings hold every version's recorded counts
            assert case == host_ops.REFERENCE or all(figures[k] <= entry["ceiling"][k] for k in host_ops.LIMITED)
        goal = entry.get("target", {})  # a number, or a case whose count it is, and where it comes from
        assert not goal or (goal["source"] and all(isinstance(goal.get(k, 0), (int, float)) or goal[k] in cases
                                                   for k in ("ops", "reads")))


def test_plain_greedy_target_is_transformers_greedy_count():
    """Issue 66's target for plain greedy through our loop is transformers' greedy count per token, read from that
    case's figures."""
    rows = {"transformers-greedy": {"glue": 0.0, "loop": 31.0, "reads": 1.0}}
    assert host_ops.target_of("plain", BUDGET, rows) == (31.0, 1.0)


# -- negative controls: added work fails the check -----------------------------------------------------------------
def _extra_over_ceiling(case: str) -> dict:
    """Per budgeted figure, the operations (or reads) per step that lift ``case``'s count just over its ceiling."""
    baseline = _count(case)
    assert not host_ops.over_budget(case, baseline, BUDGET)
    return {key: math.floor(BUDGET["cases"][case]["ceiling"][key] - baseline[key]) + 1 for key in host_ops.LIMITED}


def test_work_added_to_the_loop_fails_the_check(monkeypatch):
    from hf_speculative.core import loop

    extra = _extra_over_ceiling("plain")
    stop_index = loop.stop_index

    def with_more_work(sequence, *args, **kwargs):  # copies of the sequence, reads of its last token, per step
        for _ in range(extra["loop"]):
            sequence = sequence.clone()
        for _ in range(extra["reads"]):
            int(sequence[0, -1])
        return stop_index(sequence, *args, **kwargs)

    monkeypatch.setattr(loop, "stop_index", with_more_work)
    failures = host_ops.over_budget("plain", _count("plain"), BUDGET)
    assert [f.split(" per step")[0].split()[-1] for f in failures] == ["loop", "reads"], failures


def test_work_added_to_a_drafter_fails_the_check(monkeypatch):
    extra = _extra_over_ceiling("plain")
    draft = host_ops.NeverDrafts.draft

    def with_more_work(self, sequence, plan):  # views of the sequence, no read
        for _ in range(extra["glue"]):
            sequence = sequence[:, 1:]
        return draft(self, sequence, plan)

    monkeypatch.setattr(host_ops.NeverDrafts, "draft", with_more_work)
    failures = host_ops.over_budget("plain", _count("plain"), BUDGET)
    assert len(failures) == 1 and failures[0].startswith("plain: ") and " glue per step" in failures[0], failures


def test_a_case_without_a_ceiling_fails_naming_the_fix():
    figures = {"glue": 0.0, "loop": 0.0, "reads": 0.0}
    assert "--write-budget" in host_ops.over_budget("new-drafter", figures, {"cases": {}})[0]


# -- the counter ---------------------------------------------------------------------------------------------------
def _at(path: str, source: str):
    """A function defined in a file named ``path`` (the counter attributes operations by their code's file)."""
    scope = {"torch": torch, "sys": sys}
    exec(compile(source, path, "exec"), scope)
    return scope["f"]


def test_counter_sorts_operations_and_reads_by_who_issues_them():
    target, net = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    call, tolist = torch.nn.Module.__call__, torch.Tensor.tolist
    loop_work = _at("/x/hf_speculative/core/loop.py", "def f(x):\n    return (x + 1).tolist()")
    glue_work = _at("/x/hf_speculative/drafters/d.py", "def f(x, net):\n    return int(net(x)[0, 0])")
    budget_work = _at("/x/hf_speculative/core/budget.py", "def f(x):\n    return x * 2")
    with torch.no_grad(), HostOps(target) as counted:
        x + 1                                                   # before the first forward: step 0
        target(x)                                               # the target's forward starts step 1
        loop_work(x)                                            # loop: add; a read (tolist)
        counted.drafting_call(glue_work)(x, net)                # net: the linear; glue: 2 selects and a read
        counted.drafting_call(budget_work)(x)                   # budget code a drafter calls: the loop's
        bool(torch.tensor([True, False]).nonzero().numel())     # loop: lift_fresh, nonzero (a read)
        x[torch.tensor([True])]                                 # loop: lift_fresh, a boolean index (a read)
        target(x)                                               # step 2
    step0, step1, step2 = counted.steps
    assert step0.ops == {"loop": 1} and not step0.reads
    assert step1.ops["target"] > 0 and step1.ops["net"] > 0 and step1.net_calls == 1
    assert step1.ops["glue"] == 3 and step1.reads["glue"] == 1  # select, select, _local_scalar_dense
    assert step1.ops["loop"] == 1 + 1 + 2 + 2 and step1.reads["loop"] == 3
    assert not step1.reads["net"] and not step1.reads["target"] and step2.ops["target"] > 0 and not step2.ops["loop"]
    sites = {(category, site) for category, site, _op in step1.sites}
    assert sites >= {("loop", "hf_speculative/core/loop.py:f"), ("glue", "hf_speculative/drafters/d.py:f"),
                     ("loop", "hf_speculative/core/budget.py:f")}
    assert torch.nn.Module.__call__ is call and torch.Tensor.tolist is tolist  # put back on exit


def test_sites_name_callers_to_the_depth_asked():
    inner = _at("/x/hf_speculative/core/tree.py", "def f():\n    return sys._getframe()")
    outer = _at("/x/hf_speculative/core/loop.py", "def f(inner):\n    return inner()")
    frame = outer(inner)
    assert site_of(frame) == "hf_speculative/core/tree.py:f"
    assert site_of(frame, 2) == "hf_speculative/core/tree.py:f < hf_speculative/core/loop.py:f"
    assert site_of(frame, lines=True) == "hf_speculative/core/tree.py:2:f"
    assert site_of(sys._getframe()) == "other"


def test_steady_steps_leave_out_the_first_two_and_the_last():
    counted = HostOps(torch.nn.Linear(1, 1))
    counted.steps = [counter_module.Step() for _ in range(3)]
    with pytest.raises(ValueError, match="too few"):
        counted.per_step()
    counted.steps = [counter_module.Step(ops=collections.Counter(loop=n)) for n in (100, 50, 4, 6, 70)]
    assert counted.per_step()["loop"] == 5.0 and counted.per_step()["steps"] == 2
