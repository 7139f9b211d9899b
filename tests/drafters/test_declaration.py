"""What a drafter is, it declares once: the keywords of its class statement make one ``Declaration``
(``drafters/declaration.py``), which the registry holds and everything reads. Checked here: the declaration of every
registered class, the class attributes that read it, what a class statement may not do (an unknown keyword, keywords
without ``method=``, a declaration set in the class body), the checks of each field, and the hooks the root gives every
strategy instead of an attribute to probe for (``private``, ``spec_save_beside`` / ``spec_load_beside``,
``draft_budget``)."""

from __future__ import annotations

import dataclasses

import pytest

import hf_speculative as hfs
from hf_speculative.drafters import registry
from hf_speculative.drafters.declaration import Declaration
from hf_speculative.drafters.registry import NO_FILES, Capabilities, SpecFiles
from hf_speculative.drafters.strategy import DraftStrategy


@pytest.fixture
def own_registry(monkeypatch):
    """The registry's classes as a copy: the classes these tests declare do not outlive them."""
    registry.registered()
    monkeypatch.setattr(registry, "_CLASSES", dict(registry._CLASSES))


def test_every_registered_class_is_its_declaration():
    for method, cls in registry.registered().items():
        declaration = cls.declaration
        assert isinstance(declaration, Declaration) and method in declaration.methods, method
        assert (cls.method, cls.name, cls.capabilities, cls.examples) == (
            declaration.method, declaration.name, declaration.capabilities, declaration.examples), method
        assert declaration.files_for(method) is (declaration.files if method == declaration.method
                                                 else declaration.variants[method])
        for field in declaration.live_fields:  # a live field is one of its init fields
            assert field in {f.name for f in dataclasses.fields(cls) if f.init}, (method, field)
    early = registry.registered()["early-exit"].declaration
    assert early.files_for("early-exit") is NO_FILES and early.files_for("early-exit-adapter").network == "checkpoint"
    assert hfs.Hybrid.declaration.holds_members and not hfs.Eagle.declaration.holds_members


def test_a_declaration_is_checked_field_by_field():
    assert Declaration("mine").name == "mine" and Declaration("mine", name="stats").name == "stats"
    assert dict(Declaration("mine", variants=("mine-b",)).variants) == {"mine-b": NO_FILES}
    files = SpecFiles(file_option="history", saved_name="h.json", fingerprint=str)
    assert Declaration("mine", variants={"mine-b": files}).files_for("mine-b") is files
    with pytest.raises(dataclasses.FrozenInstanceError):
        Declaration("mine").method = "other"
    bad = [({"method": ""}, "a method name is a non-empty string"),
           ({"method": "mine", "variants": ("",)}, "a method name is a non-empty string"),
           ({"method": "mine", "variants": 3}, r"variants=\.\.\.\) takes method names"),
           ({"method": "mine", "capabilities": {"trees": True}}, "takes a registry.Capabilities, got dict"),
           ({"method": "mine", "files": "eagle"}, "take a registry.SpecFiles, got str"),
           ({"method": "mine", "variants": {"mine-b": None}}, "take a registry.SpecFiles, got NoneType"),
           ({"method": "mine", "examples": "mine"}, r"examples=\.\.\.\) takes a tuple of names"),
           ({"method": "mine", "live_fields": ("model", 3)}, r"live_fields=\.\.\.\) takes a tuple of names"),
           ({"method": "mine", "spec_only_options": ["x"]}, r"spec_only_options=\.\.\.\) takes a dict")]
    for fields, message in bad:
        with pytest.raises(TypeError, match=message):
            Declaration(**fields)


def test_a_class_statement_declares_and_registers(own_registry):
    @dataclasses.dataclass
    class Mine(DraftStrategy, method="test-declared", capabilities=Capabilities(batch=True), examples=("test-declared",),
               live_fields=("model",), spec_only_options={"extra": 1}):
        model: object = None
        num_tokens: int = 5

    assert registry.registered()["test-declared"] is Mine and Mine.declaration.spec_only_options == {"extra": 1}
    assert Mine.name == "test-declared" and Mine.capabilities.batch and Mine.examples == ("test-declared",)
    assert Mine().draft_budget() == 5  # its num_tokens option: the budget of a chain drafter

    @dataclasses.dataclass
    class Wrapped(Mine):  # declares nothing: the same drafter, registered nothing
        label: str = "wrapped"

    assert Wrapped.declaration is Mine.declaration and registry.registered()["test-declared"] is Mine


def test_what_a_class_statement_may_not_do(own_registry):
    with pytest.raises(TypeError, match="exmples=...\\): not a field of a drafter's declaration; did you mean "
                                        "'examples'\\?"):
        class Typo(DraftStrategy, method="test-typo", exmples=("x",)):
            pass
    with pytest.raises(TypeError, match=r"Orphan\(capabilities=...\) needs method=..."):
        class Orphan(DraftStrategy, capabilities=Capabilities(batch=True)):
            pass
    with pytest.raises(TypeError, match="sets examples in its body; declare it in the class statement"):
        class InBody(DraftStrategy, method="test-in-body"):
            examples = ("test-in-body",)
    with pytest.raises(TypeError, match="sets live_fields in its body"):
        class Undeclared(DraftStrategy):
            live_fields = ("model",)
    with pytest.raises(TypeError, match="sets name in its body"):
        class Named(DraftStrategy, method="test-named"):
            name = "other"
    assert not {"test-typo", "test-in-body", "test-named"} & set(registry.registered())

    class Stats(DraftStrategy):  # a strategy that declares nothing may name its statistics
        name = "my-stats"

    assert Stats.name == "my-stats" and Stats.declaration is None and registry.name_of(Stats()) == "my-stats"


def test_the_root_answers_what_a_probe_asked():
    class Plain(DraftStrategy):  # not a dataclass, no declaration
        pass

    plain = Plain()
    assert plain.private() is plain and plain.draft_budget() is None and plain.declared() == registry.CHAINS_ONLY
    assert plain.spec_save_beside("folder", "path") == {} and Plain.spec_load_beside({"a": 1}, "p", None, "w") == {"a": 1}
    assert registry.name_of(plain) == "strategy" and registry.name_of(object()) == "object"
    lookup = hfs.PromptLookup()
    assert lookup.private() is lookup
    shared = hfs.SuffixDecoding()
    assert shared.private().history_tokens == 0 and shared.history_tokens > 0  # a copy: the strategy is untouched
    none = hfs.SuffixDecoding(history_tokens=0)
    assert none.private() is none
    assert hfs.SuffixDecoding().draft_budget() == 24 and hfs.LayerSkip().draft_budget() == 8  # its tree, its chain
    assert hfs.PromptLookup(tree=hfs.DynamicTree(nodes=12)).draft_budget() == 12
