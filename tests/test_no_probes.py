"""Nothing probes a strategy or a drafter for an optional attribute: what a drafter is, it declares
(``drafters/declaration.py``), and what it can do, its class's hooks say (issue 68 item 2). Read from the source
(``ast``, nothing imported): a probe is ``hasattr(x, ...)`` or ``getattr(x, name, default)`` (three arguments) where

- ``x`` is a strategy or a drafter by its name: ``strategy``, ``drafter``, ``generator``, ``candidate_generator``,
  ``member``, ``inner``, ``wrapped`` (or an attribute of that name: ``ctx.strategy``, ``self.inner``), or ``self`` /
  ``cls`` inside a drafter class (a class deriving, in the package's source, from ``Drafter``, ``DraftStrategy``,
  ``SpeculativeCandidateGenerator`` or ``AssistedLoopAdapter``), or ``self.config`` inside a per-call drafter (its
  strategy); or
- the attribute probed is one a drafter declares or implements (a field of ``Declaration``, a hook of
  ``DraftStrategy``, the ``tree`` / ``num_tokens`` options the routing reads), whatever ``x`` is called.

``getattr(x, name)`` with two arguments reads an attribute that is there (a declared field's value); a probe on
something else (a model's config, a tokenizer, transformers' objects) is not this test's business. ``ALLOWED`` lists
the probes that stay, each with why; an entry that no longer matches fails, so the list only shrinks.

``python tests/test_no_probes.py`` prints every probe found.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

import pytest

pytestmark = pytest.mark.single_version  # reads the source only

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_speculative"
# the roots of the drafter classes: a strategy (configuration) and a per-call drafter
ROOTS = {"Drafter", "DraftStrategy", "SpeculativeCandidateGenerator", "AssistedLoopAdapter"}
PER_CALL_ROOTS = {"SpeculativeCandidateGenerator", "AssistedLoopAdapter"}
# names that hold a strategy or a drafter, as variables or as attributes
HOLDERS = {"strategy", "strategies", "drafter", "generator", "candidate_generator", "member", "inner", "wrapped"}
# attributes a drafter declares or implements: never probed, whatever holds them
DECLARED = {"declaration", "method", "variants", "capabilities", "examples", "live_fields", "files", "spec_files",
            "spec_only_options", "holds_members", "declared", "draft_budget", "private", "example", "example_target",
            "validate_target", "open", "spec_method", "files_for", "spec_path", "spec_network", "spec_members",
            "spec_save_beside", "spec_load_beside", "load_network", "from_spec_options", "from_spec_members",
            "to_dict", "save_pretrained", "tree", "num_tokens", "history_tokens", "history_file", "sizing"}

# (path relative to the package, the probe as ``ast.unparse`` writes it) -> why it stays. Only shrinks.
ALLOWED: dict[tuple[str, str], str] = {
    ("hf/checks.py", "getattr(strategy, 'num_tokens', None)"):
        "the else branch of draft_budget: a user's raw transformers CandidateGenerator, which declares nothing (it is "
        "no Drafter); its num_tokens, where it has one, sizes a static cache's padding (tests/drafters/"
        "test_registry.py's oracle); a DraftStrategy says its own draft_budget()",
    ("drafters/generator.py", "getattr(self.inner, 'update_candidate_strategy', None)"):
        "ExternalCandidateGenerator wraps a user's raw transformers CandidateGenerator (duck-typed by transformers' "
        "own assisted loop too): update_candidate_strategy is optional in that protocol, not a drafter's hook",
}


@dataclasses.dataclass(frozen=True)
class Probe:
    path: str  # relative to the package
    line: int
    source: str  # ast.unparse of the call

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source}"


def _base_names(node: ast.ClassDef) -> set[str]:
    return {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))}


def drafter_classes(trees: dict[str, ast.Module]) -> tuple[set[str], set[str]]:
    """The names of the package's drafter classes and of its per-call drafter classes: the roots and every class
    deriving from one, by the names in its class statement (a fixed point over every module)."""
    classes = [node for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    found, per_call = set(ROOTS), set(PER_CALL_ROOTS)
    changed = True
    while changed:
        changed = False
        for node in classes:
            bases = _base_names(node)
            if node.name not in found and bases & found:
                found.add(node.name)
                changed = True
            if node.name not in per_call and bases & per_call:
                per_call.add(node.name)
                changed = True
    return found, per_call


def _holds_a_drafter(node: ast.expr, in_drafter: bool, in_per_call: bool) -> bool:
    if isinstance(node, ast.Name):
        return node.id in HOLDERS or (in_drafter and node.id in ("self", "cls"))
    if isinstance(node, ast.Attribute):
        if node.attr in HOLDERS:
            return True
        return in_per_call and node.attr == "config" and isinstance(node.value, ast.Name) and node.value.id == "self"
    if isinstance(node, ast.Subscript):  # strategies[i]
        return _holds_a_drafter(node.value, in_drafter, in_per_call)
    return False


def _is_probe(call: ast.Call, in_drafter: bool, in_per_call: bool) -> bool:
    if not isinstance(call.func, ast.Name) or call.func.id not in ("hasattr", "getattr") or not call.args:
        return False
    if call.func.id == "getattr" and len(call.args) < 3:
        return False  # reads an attribute that is there
    name = call.args[1] if len(call.args) > 1 else None
    probed = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None
    return _holds_a_drafter(call.args[0], in_drafter, in_per_call) or probed in DECLARED


@functools.lru_cache(maxsize=4)
def parsed(package: Path) -> dict[str, ast.Module]:
    """Every module of ``package`` parsed, by its path inside it: once a session (both tests read the package's)."""
    return {path.relative_to(package).as_posix(): ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for path in sorted(package.rglob("*.py"))}


def probes(package: Path = PACKAGE) -> list[Probe]:
    trees = parsed(package)
    drafters, per_call = drafter_classes(trees)
    found: list[Probe] = []

    def visit(node: ast.AST, path: str, in_drafter: bool, in_per_call: bool) -> None:
        if isinstance(node, ast.ClassDef):
            in_drafter, in_per_call = node.name in drafters, node.name in per_call
        elif isinstance(node, ast.Call) and _is_probe(node, in_drafter, in_per_call):
            found.append(Probe(path, node.lineno, ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, path, in_drafter, in_per_call)

    for path, tree in trees.items():
        visit(tree, path, False, False)
    return found


def test_no_probe_on_a_strategy_or_a_drafter_but_the_listed_ones():
    found = probes()
    unlisted = [str(p) for p in found if (p.path, p.source) not in ALLOWED]
    assert not unlisted, ("attribute probes on a strategy or a drafter: declare it (drafters/declaration.py) or give "
                          "the root class a hook with a default, then read that:\n" + "\n".join(unlisted))
    stale = sorted(set(ALLOWED) - {(p.path, p.source) for p in found})
    assert not stale, f"ALLOWED lists probes that are gone (delete them): {stale}"


def test_the_reader_sees_the_drafter_classes():
    drafters, per_call = drafter_classes(parsed(PACKAGE))
    assert {"PromptLookup", "Eagle", "Hybrid", "EarlyExit", "LayerSkip", "_SelfSpeculative"} <= drafters
    assert {"PromptLookupCandidateGenerator", "EagleCandidateGenerator", "ExternalCandidateGenerator"} <= per_call
    assert "PromptLookup" not in per_call


def test_the_check_catches_every_kind_of_probe(tmp_path):
    """Negative control: a package with one probe of each kind, and reads that are not probes."""
    package = tmp_path / "hf_speculative"
    package.mkdir()
    (package / "mine.py").write_text('''
class Mine(DraftStrategy):
    def declared(self):
        return getattr(self, "tree", None)                  # self in a strategy

class Sub(Mine):
    @classmethod
    def made(cls):
        return hasattr(cls, "example_target")              # cls in a strategy's subclass

class Step(TreeOrChainCandidateGenerator):
    def draft(self):
        return getattr(self.config, "window", 0)           # a per-call drafter's strategy

class TreeOrChainCandidateGenerator(SpeculativeCandidateGenerator):
    pass

def route(strategy, ctx, s, model_config, tokenizer):
    hasattr(strategy, "spec_load_beside")                  # by the holder's name
    getattr(ctx.strategy, "adaptive", True)                # an attribute holding a strategy
    getattr(s, "num_tokens", None)                         # a declared attribute, whatever holds it
    getattr(model_config, "sliding_window", None)          # a model's config: not a drafter
    getattr(tokenizer, "pad_token_id", None)               # a tokenizer
    getattr(strategy, "tree")                              # two arguments: a read
''')
    got = [p.source for p in probes(package)]
    assert got == ["getattr(self, 'tree', None)", "hasattr(cls, 'example_target')", "getattr(self.config, 'window', 0)",
                   "hasattr(strategy, 'spec_load_beside')", "getattr(ctx.strategy, 'adaptive', True)",
                   "getattr(s, 'num_tokens', None)"], got


if __name__ == "__main__":
    for probe in probes():
        listed = ALLOWED.get((probe.path, probe.source))
        print(probe, "[allowed]" if listed else "")
