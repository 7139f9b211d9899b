"""Every strategy's constructor refuses bad options where they are born (issue 30): a fuzz table over every
field of every public strategy and tree shape, asserting a ``ValueError``/``TypeError`` that names the class
and the field, raised before anything is sized by the value (``tracemalloc``); valid edge values are
accepted and normalised; the verify-cost model and the policies refuse oversize sizes from any path."""

from __future__ import annotations

import itertools
import math
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import hf_speculative as hfs
from hf_speculative import options
from hf_speculative.hf import spec
from hf_speculative.core.costs import VerifyCostModel, verify_costs_for
from hf_speculative.core.policy import ChainLengthPolicy, TreeBudget
from hf_speculative.tooling.methods import get_method
from hf_speculative.options import OptionError, OptionTypeError
from hf_speculative.core.state import state_of
from hf_speculative.core.tree_shapes import DynamicTree, StaticTree
from tests.conftest import build_model, random_eagle, random_exit_adapter

HUGE = 10**9
# what a hostile or careless caller passes for a number: each must be refused with a clear error
NOT_INTS = [2.5, 8.0, math.nan, math.inf, "5", b"5", True, False, [5], (5,), {"n": 5}, Path("5"), np.float64(5.0),
            np.bool_(True), object()]
NOT_NUMBERS = [math.nan, math.inf, -math.inf, "0.3", True, [0.3], Path("0.3"), object()]
NOT_BOOLS = [1, 0, "false", "True", 1.0, [True], np.int64(1), Path("x")]


@pytest.fixture(scope="module")
def target():
    return build_model("llama", layers=4)


@pytest.fixture(scope="module")
def makers(target):
    """One constructor per public strategy and tree shape: ``make(**fields)``, its other arguments fixed."""
    eagle_net, adapter = random_eagle(target), random_exit_adapter(target, exit_layer=2)
    return {
        "PromptLookup": hfs.PromptLookup,
        "DraftModel": lambda **kw: hfs.DraftModel(target, **kw),
        "Eagle": lambda **kw: hfs.Eagle(eagle_net, **kw),
        "EarlyExit": lambda **kw: hfs.EarlyExit(**{"exit_layer": 2, **kw}),
        "EarlyExit+adapter": lambda **kw: hfs.EarlyExit(adapter=adapter, **kw),
        "LayerSkip": hfs.LayerSkip,
        "DynamicTree": DynamicTree,
    }


def _ints(low: int, high: int, *, none_ok: bool = False) -> list:
    """Bad values of a whole-number field in ``[low, high]``."""
    bad = [high + 1, HUGE, 10**100, -1, -HUGE, low - 1, *NOT_INTS]
    return bad if none_ok else [*bad, None]


CHAIN = {  # the options every chain drafter shares
    "num_tokens": _ints(1, options.MAX_DRAFT_TOKENS),
    "confidence_threshold": [-0.1, 1.0, 1.5, None, *NOT_NUMBERS],
    "adaptive": [None, *NOT_BOOLS],
    "draft_cost": [-0.1, options.MAX_DRAFT_COST + 1, *NOT_NUMBERS],
}
FIELDS = {  # class -> field -> values its constructor must refuse
    "PromptLookup": {"num_tokens": CHAIN["num_tokens"], "max_ngram": _ints(1, options.MAX_NGRAM),
                     "min_ngram": _ints(1, options.MAX_NGRAM), "adaptive": CHAIN["adaptive"],
                     "tree": [5, "tree", [32], {"nodes": 32}, StaticTree([(0,)]), Path("tree.json")]},
    "DraftModel": CHAIN,
    "Eagle": {**CHAIN, "tree": [5, "tree", [(0,)], {"nodes": 32}, Path("tree.json")]},
    "EarlyExit": {**CHAIN, "exit_layer": _ints(1, options.MAX_LAYERS - 1, none_ok=True),
                  "adapter": [5, 2.5, True, [1], {"a": 1}, object()]},
    "EarlyExit+adapter": {"num_tokens": CHAIN["num_tokens"], "exit_layer": [1, 3, *_ints(1, 1023, none_ok=True)]},
    "LayerSkip": {**CHAIN, "calibration_tokens": _ints(4, options.MAX_CALIBRATION_TOKENS),
                  "skip": [[], [1, 1], [-1], [1024], [HUGE], [2.5], ["1"], [True], 5, 2.5, None, True, "most", b"1",
                           {1: 1}, range(HUGE), [[1]], Path("1")],
                  "calibration_file": [5, 2.5, True, [Path("x")], {"f": 1}, object()]},
    "DynamicTree": {"nodes": _ints(1, options.MAX_TREE_NODES), "depth": _ints(1, options.MAX_TREE_DEPTH),
                    "top_k": _ints(1, options.MAX_TOP_K)},
}
CASES = [(cls, field) for cls, fields in FIELDS.items() for field in fields]


def _refusal(make, cls: str, field: str, value) -> str | None:
    """What is wrong with how ``make(field=value)`` fails (``None``: refused with a clear, short message)."""
    try:
        make(**{field: value})
    except (ValueError, TypeError) as error:
        message = str(error)
        if f"{cls.split('+')[0]}(" not in message or field not in message:
            return f"{field}={options.shown(value)}: the message does not name the class and field: {message}"
        if len(message) > 400:
            return f"{field}={options.shown(value)}: a message of {len(message)} characters"
        return None
    return f"{field}={options.shown(value)}: accepted"


@pytest.mark.parametrize("cls, field", CASES, ids=[f"{c}-{f}" for c, f in CASES])
def test_every_bad_option_is_refused_naming_class_and_field(makers, cls, field):
    """One test per field (not per value: hundreds of tiny tests cost more in pytest than in the checks)."""
    problems = [p for value in FIELDS[cls][field] if (p := _refusal(makers[cls], cls, field, value))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("cls, field", [(c, f) for c, fields in FIELDS.items() for f in fields
                                        if "num_tokens" == f or f in ("nodes", "depth", "top_k", "max_ngram",
                                                                      "calibration_tokens", "exit_layer")])
def test_an_oversize_number_is_refused_before_anything_is_allocated(makers, cls, field):
    """``num_tokens=10**9`` once built lists of 10**9 entries (the verify-cost model): now it is refused
    at construction, in well under a millisecond's worth of memory and time."""
    make = makers[cls]
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ValueError, match=rf"{field}=1000000000\): must be an integer from \d+ to \d+\."):
            make(**{field: HUGE})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20, f"{peak} bytes allocated before refusing {field}={HUGE}"
    assert time.perf_counter() - start < 1.0


def test_wrong_types_are_type_errors_and_value_errors_alike():
    with pytest.raises(TypeError, match=r"PromptLookup\(num_tokens='5'\): must be an integer from 1 to 64\."):
        hfs.PromptLookup(num_tokens="5")
    with pytest.raises(OptionTypeError, match=r"PromptLookup\(num_tokens=2\.5\)"):
        hfs.PromptLookup(num_tokens=2.5)
    with pytest.raises(ValueError, match=r"PromptLookup\(num_tokens=100000\): must be an integer from 1 to 64\."):
        hfs.PromptLookup(num_tokens=100000)
    error = pytest.raises(OptionError, hfs.PromptLookup, num_tokens=0).value
    assert not isinstance(error, TypeError), "an out-of-range int is a ValueError only"
    big = pytest.raises(ValueError, hfs.PromptLookup, num_tokens=10**100000).value  # repr() refuses 4300+ digits
    assert "-bit integer>" in str(big) and len(str(big)) < 100


def test_valid_edge_values_are_accepted_and_normalised(makers):
    lookup = hfs.PromptLookup(num_tokens=np.int64(64), max_ngram=np.int32(16), min_ngram=16, adaptive=np.bool_(False))
    assert (lookup.num_tokens, lookup.max_ngram, lookup.adaptive) == (64, 16, False)
    assert type(lookup.num_tokens) is int and type(lookup.adaptive) is bool
    assert hfs.PromptLookup(num_tokens=1, max_ngram=1, tree=DynamicTree(nodes=256, depth=64, top_k=64)).tree.nodes == 256
    for make in (makers["DraftModel"], makers["Eagle"], makers["EarlyExit"], hfs.LayerSkip):
        low = make(num_tokens=1, confidence_threshold=0, adaptive=True, draft_cost=0)
        high = make(num_tokens=64, confidence_threshold=0.999, adaptive=False, draft_cost=options.MAX_DRAFT_COST)
        assert (low.num_tokens, high.num_tokens, high.draft_cost) == (1, 64, 100.0)
        assert make(draft_cost=None).draft_cost is None
    assert hfs.EarlyExit(exit_layer=np.int16(1023)).exit_layer == 1023
    assert hfs.LayerSkip(skip=np.array([1023, 0]), calibration_tokens=4).skip == [0, 1023]
    assert hfs.LayerSkip(skip=(5,)).skip == [5] and hfs.LayerSkip(calibration_tokens=1024).calibration_tokens == 1024
    assert hfs.LayerSkip(calibration_file=Path("calibration.json")).calibration_file == Path("calibration.json")
    assert makers["Eagle"](tree=StaticTree.chain(64)).tree.depth == 64
    shape = DynamicTree(nodes=np.int64(7), depth=1, top_k=1)
    assert type(shape.nodes) is int and shape == DynamicTree(nodes=7, depth=1, top_k=1)
    assert len(hfs.Hybrid(*[hfs.PromptLookup()] * options.MAX_HYBRID_MEMBERS).strategies) == 8


@pytest.mark.parametrize("paths, message", [
    (5, r"StaticTree\(paths=5\): must be a list of rank paths"),
    ("0", r"StaticTree\(paths='0'\): must be a list of rank paths"),
    (None, r"StaticTree\(paths=None\)"),
    ([], "give 1 to 256 rank paths, got 0"),
    ([(0,)] * 2000, "give 1 to 256 rank paths, got more than 256"),
    # an endless-looking iterable is not consumed; lazy itself: a list of HUGE references was 8 GB held by every
    # process that collected this module, and each of its full garbage collections walked it (~7 s)
    (itertools.repeat((0,), HUGE), "got more than 256"),
    ([(0, 64)], r"rank path \(0, 64\) must hold 1 to 64 integer ranks from 0 to 63"),
    ([(0,) * 65], "must hold 1 to 64 integer ranks"),
    ([(HUGE,)], "ranks from 0 to 63"), ([(-1,)], "ranks from 0 to 63"),
    ([(0.5,)], "integer ranks"), ([("0",)], "integer ranks"), ([(True,)], "integer ranks"), ([5], "rank path 5"),
    ([None], "rank path None"), ([()], "must hold 1 to 64"), ([range(HUGE)], "must hold 1 to 64"),
])
def test_static_tree_paths_are_bounded(paths, message):
    tracemalloc.start()
    try:
        with pytest.raises((ValueError, TypeError), match=message):
            StaticTree(paths)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20


def test_static_tree_edges_are_accepted():
    wide = [(i,) for i in range(64)] + [(0, j) for j in range(64)] + [(1, j) for j in range(64)] + \
        [(2, j) for j in range(64)]
    assert StaticTree(wide).size == 256 and StaticTree(wide).top_k == 64
    assert StaticTree([[0], (0, 0), np.array([1])]).paths == ((0,), (1,), (0, 0))
    assert StaticTree([(0,)] * 1000).paths == ((0,),)  # duplicates collapse, up to a bounded list


@pytest.mark.parametrize("members, message", [
    ([hfs.PromptLookup()] * 9, r"Hybrid\(\.\.\.\) takes at most 8 strategies, got 9\."),
    ([hfs.PromptLookup()], "two or more"),
    ([hfs.PromptLookup(), "prompt-lookup"], "got str"),
    ([hfs.PromptLookup(), 5], "got int"),
    ([hfs.PromptLookup(), None], "got NoneType"),
    ([hfs.PromptLookup(), DynamicTree()], "got DynamicTree"),
])
def test_hybrid_members_must_be_a_few_strategies(members, message):
    with pytest.raises((ValueError, TypeError), match=message):
        hfs.Hybrid(*members)


def test_the_cost_model_refuses_an_oversize_draft_length():
    """Whatever path an oversize length comes by, the shared per-model cost lists are never built for it."""
    owner = build_model("llama", layers=1)
    before = state_of(owner).verify_costs
    tracemalloc.start()
    try:
        for n in (options.MAX_VERIFY_TOKENS + 1, HUGE, -1, 2.5, "8", None, True):
            with pytest.raises((ValueError, TypeError), match=r"verify_costs_for\(max_tokens=.*\): must be an integer "
                                                              r"from 0 to 256\."):
                verify_costs_for(owner, n)
            with pytest.raises((ValueError, TypeError), match=r"VerifyCostModel\(max_tokens="):
                VerifyCostModel(n)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20 and state_of(owner).verify_costs is before
    costs = verify_costs_for(owner, options.MAX_VERIFY_TOKENS)  # the largest allowed: a chain or a full tree
    assert costs.max_tokens == 256 and verify_costs_for(owner, 8) is costs
    with pytest.raises(ValueError, match=r"ChainLengthPolicy\(num_tokens=65\): must be an integer from 1 to 64"):
        ChainLengthPolicy(costs, 65, lambda: 0.1)
    with pytest.raises(ValueError, match=r"TreeBudget\(nodes=1000000000\): must be an integer from 1 to 256"):
        TreeBudget(costs, HUGE)
    assert TreeBudget(costs, 256).choose() in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)


def test_saved_specs_and_registry_methods_go_through_the_same_checks(target):
    """generation_config.json's options build the dataclasses, and so do the registry's methods (CLI, app)."""
    bad = {"method": "prompt-lookup", "options": {"num_tokens": HUGE}}
    with pytest.raises(spec.SpecError, match=r"options are invalid: PromptLookup\(num_tokens=1000000000\): must be an "
                                             r"integer from 1 to 64\."):
        spec.from_spec(bad, target, None)
    shape = {"method": "prompt-lookup", "options": {"tree": {"dynamic_tree": {"nodes": HUGE}}}}
    with pytest.raises(spec.SpecError, match=r"options\.tree: DynamicTree\(nodes=1000000000\)"):
        spec.from_spec(shape, target, None)
    paths = {"method": "prompt-lookup", "options": {"tree": {"static_tree": [[0, 64]]}}}
    with pytest.raises(spec.SpecError, match=r"options\.tree: StaticTree: rank path \[0, 64\]"):
        spec.from_spec(paths, target, None)
    many = {"method": "hybrid", "members": [{"method": "prompt-lookup"}] * 9}
    with pytest.raises(spec.SpecError, match=r"\.members: at most 8 specs, got 9\."):
        spec.from_spec(many, target, None)
    for method, option, value in [("prompt-lookup", "num_tokens", HUGE), ("prompt-lookup", "max_ngram", 17),
                                  ("early-exit", "exit_layer", 2.7), ("layer-skip", "num_tokens", "8"),
                                  ("hf-prompt-lookup", "num_tokens", HUGE), ("hf-prompt-lookup", "max_ngram", 0),
                                  ("hf-early-exit", "exit_layer", HUGE), ("hf-early-exit", "num_tokens", 65)]:
        with pytest.raises(ValueError, match=rf"\({option}=.*\): must be an integer from \d+ to \d+\."):
            get_method(method).build(target, None, {option: value})
    assert get_method("hf-prompt-lookup").build(target, None, {"num_tokens": 64}) == {"prompt_lookup_num_tokens": 64}
