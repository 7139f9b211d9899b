"""The drafter registry: each drafter class declares once what it is (method, capabilities, spec I/O, examples) and
registers itself; the spec reader, the methods of the tools, the routing and checks of a call, the package's public
names and the identity matrix read the registry. Checked here: the declarations, ``capabilities_of`` for every
drafter (a Hybrid's from its members, a raw transformers ``CandidateGenerator``'s, a wrapper's), the errors, the
public names, that the matrix and the tools' methods cover every registered method, and how many places name each
drafter."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
from pathlib import Path

import pytest
import torch
import transformers

import hf_speculative as hfs
from hf_speculative import compat
from hf_speculative.core.static_cache import StaticCacheError
from hf_speculative.hf.checks import check_batch_strategy, check_strategy, draft_budget
from hf_speculative.drafters import registry
from hf_speculative.drafters.strategy import DraftStrategy
from hf_speculative.drafters.registry import CHAINS_ONLY, Capabilities, capabilities_of
from hf_speculative.hf.checks import drafts_trees
from hf_speculative.tooling import methods
from tests.conftest import DRAFTERS, OracleCandidateGenerator, build_model, make_drafter

PACKAGE = Path(hfs.__file__).resolve().parent


@pytest.fixture(scope="module")
def target():
    return build_model("llama")


@pytest.fixture(scope="module")
def built(target) -> dict:
    """Every example of the matrix, built once for the tiny Llama (a drafter for some targets only, such as a Gemma-4
    assistant, on its class's own tiny ``example_target()``; left out where this transformers lacks its classes)."""
    out = {}
    for label, cls in registry.examples().items():
        try:
            out[label] = registry.example(label, target)
        except registry.ExampleNotApplicable:
            with contextlib.suppress(ImportError, AttributeError, registry.ExampleNotApplicable):
                out[label] = registry.example(label, cls.example_target())
    return out


# -- declaring registers ---------------------------------------------------------------------------------
def test_every_drafter_class_declares_and_registers_itself():
    classes = registry.registered()
    assert {"prompt-lookup", "draft-model", "eagle", "medusa", "early-exit", "early-exit-adapter", "layer-skip",
            "suffix", "lookahead", "hybrid"} <= set(classes)
    assert classes["early-exit-adapter"] is classes["early-exit"]  # one class, two spec methods
    for method, cls in classes.items():
        assert issubclass(cls, DraftStrategy) and isinstance(cls.capabilities, Capabilities), method
        assert classes[cls.method] is cls and cls.name == cls.method, method
        assert cls.examples, f"{cls.__name__} declares no example for the identity matrix"
        assert registry.strategy_class(method) is cls


def test_the_registry_lists_the_methods_as_the_tools_do():
    tools = methods.available_methods()
    assert [m for m in registry.registered() if m in tools] == [m for m in tools if m in registry.registered()]
    assert next(iter(registry.registered())) == "prompt-lookup"  # (the spec's errors list it first)


@pytest.mark.parametrize("label, trees, batch, reads, static", [
    ("prompt-lookup", False, True, "outputs", True),  # a chain: transformers' route (trees=False)
    ("prompt-lookup-tree", True, True, "outputs", True),
    ("draft-model", False, True, "outputs", True),
    ("draft-model-tree", True, True, "outputs", True),
    ("eagle3", False, True, "features", True),
    ("eagle-tree", True, True, "features", True),
    ("medusa", False, False, "features", True),
    ("medusa-tree", True, False, "features", True),
    ("early-exit", False, False, "cache", False),
    ("early-exit-adapter", False, False, "cache", False),
    ("layer-skip", False, False, "cache", False),
    ("suffix", True, False, "outputs", True),
    ("lookahead", True, False, "outputs", True),
    ("hybrid", False, False, "features", True),  # its members: a lookup chain and an EAGLE chain
    ("hybrid-tree", True, False, "features", True),  # a member drafts trees; a hybrid never batches
    ("mtp", False, True, "features", True),
    ("mtp-tree", True, True, "features", True),
    ("dflash", False, True, "features", True),
    ("dflash-tree", True, True, "features", True),
    ("gemma4-assistant", False, False, "features", False),  # reads the target's own dynamic cache's shared K/V
    ("gemma4-assistant-tree", True, False, "features", False),
])
def test_capabilities_of_each_drafter(built, label, trees, batch, reads, static):
    if label not in built:
        pytest.skip(f"{label} cannot be built with transformers {transformers.__version__}")
    static, compiled = static if isinstance(static, tuple) else (static, static)
    strategy = built[label]
    got = capabilities_of(strategy)
    assert (got.trees, got.batch, got.reads_target, got.static_cache, got.compile) == (trees, batch, reads, static,
                                                                                       compiled), label
    assert drafts_trees(strategy) == trees
    if batch:
        check_batch_strategy(strategy)
    else:
        with pytest.raises(ValueError, match=r"supports .*hfs.PromptLookup\(\), .*hfs.DraftModel\(...\) and hfs.Eagle"):
            check_batch_strategy(strategy)
    if static:
        check_strategy(strategy, compiled=compiled)
    else:
        with pytest.raises(StaticCacheError, match="static cache"):
            check_strategy(strategy)


def test_a_hybrid_declares_what_all_its_members_can(target, built):
    with_self_speculation = hfs.Hybrid(hfs.PromptLookup(), built["early-exit"])
    assert capabilities_of(with_self_speculation) == Capabilities(reads_target="cache")
    outputs_only = hfs.Hybrid(hfs.PromptLookup(), hfs.SuffixDecoding(history_tokens=0))
    assert capabilities_of(outputs_only) == Capabilities(trees=True, reads_target="outputs")
    assert hfs.Hybrid.capabilities.batch is False  # the class's own "no" wins over batch-capable members
    assert not capabilities_of(hfs.Hybrid(hfs.PromptLookup(), built["draft-model"])).batch
    assert draft_budget(built["hybrid-tree"]) == max(draft_budget(m) for m in built["hybrid-tree"].strategies)


def test_a_raw_candidate_generator_drafts_chains_of_one_row():
    oracle = OracleCandidateGenerator([1, 2, 3], num_tokens=6)
    assert capabilities_of(oracle) == CHAINS_ONLY == Capabilities(trees=False, batch=False, reads_target="outputs")
    assert capabilities_of(None) == CHAINS_ONLY
    assert not drafts_trees(oracle) and draft_budget(oracle) == 6
    check_strategy(oracle, compiled=True)  # it reads the target's outputs: any cache
    with pytest.raises(ValueError, match="batch size > 1"):
        check_batch_strategy(oracle)


def test_capabilities_default_from_what_a_drafter_reads():
    assert Capabilities(reads_target="cache") == Capabilities(reads_target="cache", static_cache=False, compile=False)
    assert Capabilities(reads_target="features").compile is True
    assert Capabilities(static_cache=True, compile=False).compile is False
    with pytest.raises(ValueError, match="reads_target='bogus'"):
        Capabilities(reads_target="bogus")
    with pytest.raises(ValueError, match="cannot draft for a static one"):
        Capabilities(reads_target="cache", static_cache=True)
    with pytest.raises(ValueError, match="verifies on a static cache"):
        Capabilities(static_cache=False, compile=True)


# -- wrappers forward by construction ------------------------------------------------------------------------
@dataclasses.dataclass
class CountingLookup(hfs.PromptLookup):
    """A wrapper by inheritance (it declares no method): the same drafter, its base's declaration."""

    label: str = "counted"


class Forwarding(DraftStrategy):
    """A wrapper that holds another strategy and forwards to it, the declaration included."""

    def __init__(self, inner: DraftStrategy):
        self.inner = inner

    def declared(self) -> Capabilities:
        return capabilities_of(self.inner)

    def draft_budget(self) -> int | None:
        return self.inner.draft_budget()

    def open(self, ctx):
        return self.inner.open(ctx)


def test_a_subclass_keeps_its_base_declaration_and_registers_nothing(built):
    assert registry.registered()["prompt-lookup"] is hfs.PromptLookup
    assert CountingLookup.method == "prompt-lookup" and CountingLookup.capabilities == hfs.PromptLookup.capabilities
    tree = CountingLookup(tree=hfs.DynamicTree(nodes=8, depth=4, top_k=3))
    assert capabilities_of(tree) == capabilities_of(built["prompt-lookup-tree"]) and drafts_trees(tree)
    assert not drafts_trees(CountingLookup())
    check_batch_strategy(tree)
    from hf_speculative.hf import spec

    assert spec.method_of(tree) is None  # a spec would bring it back as a PromptLookup: it has none


@pytest.mark.parametrize("label", ["eagle-tree", "early-exit", "suffix", "prompt-lookup", "hybrid-tree"])
def test_a_wrapper_forwards_the_declaration_of_what_it_wraps(built, label):
    inner = built[label]
    wrapper = Forwarding(inner)
    assert capabilities_of(wrapper) == capabilities_of(inner)
    assert drafts_trees(wrapper) == drafts_trees(inner)
    assert draft_budget(wrapper) == draft_budget(inner)
    for check, args in ((check_batch_strategy, ()), (check_strategy, (True,))):
        outcomes = []
        for strategy in (inner, wrapper):
            try:
                check(strategy, *args)
                outcomes.append(None)
            except ValueError as error:
                outcomes.append(type(error))
        assert outcomes[0] == outcomes[1], (label, check.__name__)


def test_a_wrapper_of_a_tree_drafter_runs_in_our_loop_identical_to_greedy():
    model = hfs.enable(build_model("llama"))
    ids = torch.tensor([[3, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]])
    ref = type(model).generate(model, input_ids=ids, do_sample=False, max_new_tokens=12)
    out = model.generate(input_ids=ids, do_sample=False, max_new_tokens=12,
                         candidate_generator=Forwarding(registry.example("prompt-lookup-tree", model)))
    assert out.tolist() == ref.tolist()


# -- errors --------------------------------------------------------------------------------------------------
def test_an_unknown_method_names_the_close_match_and_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown drafter method 'prompt_lookup'\. Did you mean 'prompt-lookup'\? "
                                         r"Known: prompt-lookup, "):
        registry.strategy_class("prompt_lookup")
    with pytest.raises(ValueError, match="Known: "):
        registry.strategy_class(None)
    with pytest.raises(ValueError, match="no drafter example 'eagle2'. Did you mean 'eagle"):
        registry.example("eagle2", None)
    with pytest.raises(ValueError, match="PromptLookup has no example 'eagle3'"):
        hfs.PromptLookup.example(None, "eagle3")


def test_a_taken_method_name_is_refused_and_a_new_drafter_registers(monkeypatch):
    monkeypatch.setattr(registry, "_CLASSES", dict(registry._CLASSES))
    with pytest.raises(TypeError, match="declares method='prompt-lookup', which .*PromptLookup declares already"):
        class Clash(DraftStrategy, method="prompt-lookup"):
            pass
    with pytest.raises(TypeError, match="takes a registry.Capabilities"):
        class Wrong(DraftStrategy, method="test-wrong", capabilities={"trees": True}):
            pass
    assert "test-wrong" not in registry.registered()

    class Mine(DraftStrategy, method="test-mine", capabilities=Capabilities(batch=True)):
        def open(self, ctx):
            raise NotImplementedError

    assert registry.registered()["test-mine"] is Mine and Mine.name == "test-mine"
    assert capabilities_of(Mine()).batch and registry.strategy_class("test-mine") is Mine


# -- public names --------------------------------------------------------------------------------------------
def test_the_public_drafter_names_come_from_the_folders():
    import hf_speculative

    names = registry.public_names()
    assert {"PromptLookup", "DraftModel", "Eagle", "Medusa", "EarlyExit", "LayerSkip", "SuffixDecoding", "Lookahead",
            "Hybrid"} <= set(names)
    assert not set(names) & set(hf_speculative._LAZY), "drafter names are the folders' to declare"
    registered = set(registry.registered().values())
    for name in names:
        assert getattr(hfs, name) in registered and name in dir(hfs) and name in hfs.__all__, name
    from hf_speculative import Medusa, SuffixDecoding
    from hf_speculative.drafters.suffix import SuffixDecoding as from_the_folder

    assert Medusa is hfs.Medusa and SuffixDecoding is from_the_folder
    assert {"enable", "DraftStrategy", "Capabilities"} <= set(hfs.__all__)


# -- who reads the registry ----------------------------------------------------------------------------------
def test_the_matrix_covers_every_registered_method(built):
    covered = {strategy.spec_method() for strategy in built.values()}
    # a drafter whose classes this transformers lacks (MTP, Gemma-4 assistants on 4.x) is left out here; it must say
    # so rather than fail when built
    lacking = {method for method, cls in registry.registered().items() if method not in covered and _lacks(cls)}
    assert set(registry.registered()) - lacking <= covered, set(registry.registered()) - lacking - covered
    assert not lacking or not compat.IS_TRANSFORMERS_5, lacking
    assert set(registry.examples()) <= set(DRAFTERS)
    for label in ("medusa", "suffix", "lookahead"):
        assert label in DRAFTERS
    for label, strategy in built.items():
        assert type(strategy) is registry.examples()[label]


def _lacks(cls) -> bool:
    """Whether ``cls``'s example says this transformers lacks what it needs."""
    try:
        registry.example(cls.examples[0], cls.example_target() if hasattr(cls, "example_target") else None)
    except registry.ExampleNotApplicable as why:
        return "transformers" in str(why)
    except ImportError as why:
        return "transformers" in str(why)
    except Exception:  # noqa: BLE001 - built on no target: it needs one, so this transformers has its classes
        return False
    return False


def test_the_matrix_builds_each_example_through_conftest(target, built):
    for label in registry.examples():
        if label not in built:
            continue
        try:
            drafter = make_drafter(label, target, None)
        except pytest.skip.Exception:  # a drafter for other targets (a Gemma-4 assistant on a Llama)
            continue
        assert type(drafter) is registry.examples()[label], label


# Drafter folders with no method of the command line, the benchmark and the app, and why.
WITHOUT_METHODS = {
    "hf_speculative.drafters.mtp": "no registry model has MTP layers (DeepSeek-V3, GLM-4.5 are far larger)",
    "hf_speculative.drafters.assistant": "no registry model is a Gemma-4 target with a published assistant",
}


def test_every_registered_method_is_a_method_of_the_tools():
    declared = {folder: [entry["name"] for entry in entries]
                for folder, entries in registry.folder_data("methods", "METHODS")}
    for method, cls in registry.registered().items():
        folder = cls.__module__.rsplit(".", 1)[0]
        if folder in WITHOUT_METHODS:  # no model of the offline registry can run it: nothing to build a method on
            assert declared.get(folder, []) == [], f"{folder} declares methods now: drop it from WITHOUT_METHODS"
            continue
        assert declared.get(folder), f"{folder} declares no method of the tools"
        for name in declared[folder]:
            assert methods.get_method(name).kind == "hfs", name
        assert methods.get_method(method).kind == "hfs", method  # the same name in the spec and the tools


# -- how many places name each drafter ------------------------------------------------------------------------
# Modules outside a drafter's folder that may name it (its class or its method string), and why. Everything that
# reads drafters generically (spec.py, tooling/methods.py, the package root, the loop and its checks, the app's
# offer, the CLI's listing) reads the registry and names none.
ALLOWED = {
    "drafters/hybrid/": "the hybrids of the tools and of the matrix compose prompt lookup and EAGLE",
    "app/ui.py": "the app's default methods to compare (prompt-lookup)",
    "cli/main.py": "the commands' default method (prompt-lookup) and the --eagle option",
    "cli/options.py": "the --eagle option",
    "app/request.py": "the eagle option of a request",
    "app/cache.py": "the app keeps LayerSkip's calibration per model",
    "compat.py": "transformers' 'hybrid' cache implementation (not the drafter)",
    "training/": "training a drafter's network (EAGLE, Medusa, exit adapters) and evaluating it",
    "bench/": "benchmarks of named drafters",
}


def _naming_modules() -> dict[str, set[str]]:
    """Drafter class -> the package modules (paths relative to the package) naming it: its class as an identifier
    (a name, an attribute, an import) or one of its methods as a whole string (``"prompt-lookup"``)."""
    classes = {cls.__name__: cls for cls in registry.registered().values()}
    method_names = {name: {m for m, c in registry.registered().items() if c is cls} for name, cls in classes.items()}
    found: dict[str, set[str]] = {name: set() for name in classes}
    for path in sorted(PACKAGE.rglob("*.py")):
        identifiers, strings = set(), set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name):
                identifiers.add(node.id)
            elif isinstance(node, ast.Attribute):
                identifiers.add(node.attr)
            elif isinstance(node, ast.alias):
                identifiers.add(node.name.rsplit(".", 1)[-1])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
        for name in classes:
            if name in identifiers or method_names[name] & strings:
                found[name].add(path.relative_to(PACKAGE).as_posix())
    return found


def test_each_drafter_is_named_in_its_folder_and_the_listed_places_only():
    found = _naming_modules()
    report = []
    for name, modules in found.items():
        folder = registry.registered()[getattr(hfs, name).method].__module__.split(".")[2]
        outside = sorted(m for m in modules if not m.startswith(f"drafters/{folder}/"))
        report.append(f"{name}: {1 + len(outside)} (drafters/{folder}/" + "".join(f", {m}" for m in outside) + ")")
        unexpected = [m for m in outside if not any(m.startswith(allowed) for allowed in ALLOWED)]
        assert not unexpected, f"{name} is named outside its folder in {unexpected}: read the registry instead"
    print("\nplaces naming each drafter (its folder, then the modules outside it):\n" + "\n".join(report))
    readers = ("hf/spec.py", "tooling/methods.py", "__init__.py", "core/", "hf/", "app/offer.py")
    for name, modules in found.items():
        assert not [m for m in modules if m.startswith(readers)], (name, modules)
