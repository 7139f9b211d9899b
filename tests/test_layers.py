"""The package's layers, read from its source (``ast``, nothing imported): no import cycle, arrows point down.

Layers, bottom first; a module imports its own unit and the layers below it, never a peer of its layer:

    compat, options, extras, locks   the root leaves: nothing of the package
    core                        call, entry, loop, accept, tree, verify, costs, state, stats, sampling, policy, static cache,
                                kv_cache, sdpa
    cpu, registry               the CPU layout and kernel; the offline model registry and its integrity checks
    drafters                    declaration, strategy, generator, assisted, registry, spec_writer, checkpoints,
                                vllm_support (base: old names);
                                then one folder per method
    hf                          the transformers adapter: integration (enable, the generate() entry), loop_hooks,
                                drafter_source, call_checks, checks, spec
    hf_speculative              the package's ``__init__``: the public names, each loaded on first use
    tooling                     methods, prompting: what the command line, the app and the benchmark share
    bench
    training                    (its CLI evaluates on the benchmark's prompts)
    cli, app                    (the command line runs bench and training; the app is a peer, never imported)
    __main__

Only module-level imports run when a module is imported, so only they make the import graph whose cycles are
refused; an import inside a function runs on use and one under ``if TYPE_CHECKING:`` never does. Those must point
down all the same, except the function-level ones in ``FUNCTION_LEVEL_UP``, each with the reason it cannot (yet).
Inside ``drafters/``, a method's folder imports the shared modules and no other method's, except ``CROSS_METHOD``.

``python tests/test_layers.py`` prints every import that is not module-level, and every violation.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.single_version  # reads the source only: transformers' version changes nothing here

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_speculative"
FACADE = "hf_speculative"  # the package's __init__

LAYERS: tuple[tuple[str, ...], ...] = (
    ("compat", "options", "extras", "locks"),
    ("core",),
    ("cpu", "registry"),
    ("drafters",),
    ("hf",),
    (FACADE,),
    ("tooling",),
    ("bench",),
    ("training",),
    ("cli", "app"),
    ("__main__",),
)
# The shared modules of drafters/ (the rest of it is one folder per method)
DRAFTERS_SHARED = ("base", "strategy", "declaration", "spec_writer", "generator", "assisted", "registry", "checkpoints",
                   "vllm_support")  # vllm_support: what vLLM reads, for exports

# Function-level imports that point up: (importing module, imported module) -> why. Each must still exist (an
# entry that no longer matches fails the test: delete it); the list only shrinks.
FUNCTION_LEVEL_UP: dict[tuple[str, str], str] = {}
# A method's folder importing another method's: (importing folder, imported folder) -> why.
CROSS_METHOD: dict[tuple[str, str], str] = {
    ("self_speculative", "eagle"): "an exit adapter is an EAGLE network (EagleDraftModel with exit_layer), saved and "
                                   "loaded by EAGLE's checkpoint module, and EarlyExit drafts with EAGLE's drafter",
    ("suffix", "self_speculative"): "SuffixDecoding names its history file by LayerSkip's model_fingerprint "
                                    "(calibration.py); goes when the fingerprint moves to a shared module",
    ("dflash", "eagle"): "the DFlash network keeps its context keys and values in EAGLE's DraftKVCache and attends "
                         "with EAGLE's attend() (SDPA under an explicit mask); goes when both move to a shared module",
}


@dataclasses.dataclass(frozen=True)
class Import:
    importer: str  # module name
    imported: str  # module name (the deepest module of the package the statement names)
    line: int
    kind: str  # "module", "function" or "type_checking"

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} ({self.kind}) imports {self.imported}"


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.Module):
    """Every import statement with where it runs: at import ("module"), on a call ("function"), never
    ("type_checking")."""
    def visit(node: ast.AST, kind: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, kind
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, "function" if kind == "module" else kind)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.body:
                    yield from visit(ast.Module(body=[statement], type_ignores=[]), "type_checking")
                for statement in child.orelse:
                    yield from visit(ast.Module(body=[statement], type_ignores=[]), kind)
            else:
                yield from visit(child, kind)
    yield from visit(tree, "module")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, names: dict[str, Path]) -> list[str]:
    """The package's modules an import statement loads (the deepest one each name reaches)."""
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parent = module.split(".") if is_package else module.split(".")[:-1]
            parent = parent[:len(parent) - (node.level - 1)]
            base = ".".join(parent + ([base] if base else []))
        wanted = [f"{base}.{alias.name}" for alias in node.names]
    targets = []
    for name in wanted:
        while name not in names and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in names:
            targets.append(name)
    return sorted(set(targets))


def imports(package: Path = PACKAGE) -> list[Import]:
    return list(_imports(package))


@functools.lru_cache(maxsize=4)
def _imports(package: Path) -> tuple[Import, ...]:
    # read once per session: walking every node of the package's source took about 10 s, and five tests ask
    names = module_names(package)
    found = []
    for module, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, kind in _statements(tree):
            for target in _targets(node, module, path.name == "__init__.py", names):
                if target != module:
                    found.append(Import(module, target, node.lineno, kind))
    return tuple(found)


def unit(module: str) -> str:
    parts = module.split(".")
    return FACADE if len(parts) == 1 else parts[1]


def layer(module: str) -> int:
    for index, units in enumerate(LAYERS):
        if unit(module) in units:
            return index
    raise AssertionError(f"{module}: in no layer of tests/test_layers.py's LAYERS; add its folder there")


def layering_violations(found: list[Import]) -> list[Import]:
    """Imports that point up, or sideways to a peer of the same layer."""
    return [i for i in found if unit(i.importer) != unit(i.imported) and layer(i.imported) >= layer(i.importer)]


def method_of(module: str) -> str | None:
    """The drafter method folder a module is in, or None (outside drafters/, or one of its shared modules)."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "drafters" or parts[2] in DRAFTERS_SHARED:
        return None
    return parts[2]


def cross_method(found: list[Import]) -> list[Import]:
    return [i for i in found if None not in (method_of(i.importer), method_of(i.imported))
            and method_of(i.importer) != method_of(i.imported)]


def cycles(found: list[Import]) -> list[list[str]]:
    """The strongly connected components (more than one module) of the module-level import graph."""
    graph: dict[str, set[str]] = {}
    for i in found:
        if i.kind == "module":
            graph.setdefault(i.importer, set()).add(i.imported)
            graph.setdefault(i.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def connect(node: str) -> None:  # Tarjan; the graph is a few hundred modules deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for node in sorted(graph):
            if node not in index:
                connect(node)
    finally:
        sys.setrecursionlimit(limit)
    return components


# -- the tests -------------------------------------------------------------------------------------
def test_the_reader_finds_the_package_imports():
    found = imports()
    assert len(module_names()) > 100 and len(found) > 300, "the reader found too few modules or imports: broken?"
    assert any(i.importer == "hf_speculative.hf.integration" and i.imported == "hf_speculative.core.state"
               and i.kind == "module" for i in found)
    assert any(i.kind == "type_checking" and i.importer == FACADE for i in found)
    assert any(i.kind == "function" for i in found)


def test_no_import_cycle_among_module_level_imports():
    found = cycles(imports())
    assert not found, "import cycles (module-level imports):\n" + "\n".join(" -> ".join(c) for c in found)


def test_every_module_is_in_a_layer():
    for module in module_names():
        layer(module)


def test_module_level_and_type_checking_imports_point_down():
    bad = [i for i in layering_violations(imports()) if i.kind != "function"]
    assert not bad, "imports that point up or to a peer (none allowed at module level):\n" + "\n".join(map(str, bad))


def test_function_level_imports_point_down_but_for_the_listed_ones():
    bad = [i for i in layering_violations(imports()) if i.kind == "function"]
    unlisted = [str(i) for i in bad if (i.importer, i.imported) not in FUNCTION_LEVEL_UP]
    assert not unlisted, ("function-level imports that point up or to a peer; move the helper down, or list it in "
                          "FUNCTION_LEVEL_UP with the reason:\n" + "\n".join(unlisted))
    stale = sorted(set(FUNCTION_LEVEL_UP) - {(i.importer, i.imported) for i in bad})
    assert not stale, f"FUNCTION_LEVEL_UP lists imports that no longer point up (delete them): {stale}"


def test_a_drafter_folder_imports_no_other_method_but_the_listed_ones():
    found = cross_method(imports())
    pairs = {(method_of(i.importer), method_of(i.imported)) for i in found}
    unlisted = [str(i) for i in found if (method_of(i.importer), method_of(i.imported)) not in CROSS_METHOD]
    assert not unlisted, ("a drafter method's folder imports another's; move the shared piece to drafters/ (base, "
                          "registry, checkpoints, vllm_support) or list it in CROSS_METHOD with the reason:\n" + "\n".join(unlisted))
    stale = sorted(set(CROSS_METHOD) - pairs)
    assert not stale, f"CROSS_METHOD lists folders that no longer import each other (delete them): {stale}"


def test_the_checks_see_what_they_refuse(tmp_path):
    """A small package with one of each problem: a cycle, an upward import, a peer import, an upward import
    under TYPE_CHECKING, and a cross-method import; imports inside functions stay out of the cycle check."""
    package = tmp_path / "hf_speculative"
    files = {
        "__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .core import loop\n",
        "core/__init__.py": "",
        "core/loop.py": "from . import tree\nfrom ..drafters import base\n",
        "core/tree.py": "from . import loop\n\ndef later():\n    from ..hf import spec\n",
        "cpu/__init__.py": "from ..registry import models\n",
        "registry/__init__.py": "", "registry/models.py": "",
        "drafters/__init__.py": "", "drafters/base.py": "",
        "drafters/eagle/__init__.py": "", "drafters/eagle/model.py": "",
        "drafters/medusa/__init__.py": "", "drafters/medusa/heads.py": "from ..eagle import model\n",
        "hf/__init__.py": "", "hf/spec.py": "from ..core import loop\n\ndef f():\n    from .. import core\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    found = imports(package)
    assert cycles(found) == [["hf_speculative.core.loop", "hf_speculative.core.tree"]]
    assert {(i.importer, i.imported, i.kind) for i in layering_violations(found)} == {
        ("hf_speculative.core.loop", "hf_speculative.drafters.base", "module"),
        ("hf_speculative.core.tree", "hf_speculative.hf.spec", "function"),
        ("hf_speculative.cpu", "hf_speculative.registry.models", "module")}
    assert [(i.importer, i.imported) for i in cross_method(found)] == [
        ("hf_speculative.drafters.medusa.heads", "hf_speculative.drafters.eagle.model")]
    assert any(i.kind == "type_checking" and i.importer == FACADE for i in found)


def main() -> None:
    found = imports()
    print("Imports inside functions or under TYPE_CHECKING (outside the cycle check):")
    for i in sorted((i for i in found if i.kind != "module"), key=lambda i: (i.importer, i.line)):
        print(" ", i)
    print("\nLayering violations (up, or to a peer):")
    for i in layering_violations(found):
        listed = FUNCTION_LEVEL_UP.get((i.importer, i.imported))
        print(" ", i, f"[listed: {listed}]" if listed else "")
    print("\nCross-method imports inside drafters/:")
    for i in cross_method(found):
        print(" ", i)
    print("\nImport cycles (module level):", cycles(found) or "none")


if __name__ == "__main__":
    main()


# Per-call state travels on the call object (core/call.CallContext), passed down. A ContextVar only where
# transformers' entry leaves no other way: the running call, which transformers' callbacks into the enabled model
# (_get_candidate_generator, _get_logits_processor, _get_stopping_criteria, custom_generate) cannot be handed. (The
# spec a model's save_pretrained wrote is handed to hf.spec.keep_field_on_load, not kept in a ContextVar.)
CONTEXT_VARS = {("hf_speculative.hf.loop_hooks", "_ACTIVE_CALL")}


def context_vars() -> set[tuple[str, str]]:
    """``(module, name)`` of every ``contextvars.ContextVar`` the package creates (ast: assignments to a call)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            value = getattr(node, "value", None)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(value, ast.Call):
                name = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
                if name == "ContextVar":
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    found |= {(module, t.id) for t in targets if isinstance(t, ast.Name)}
    return found


def test_context_vars_are_only_the_listed_ones():
    assert context_vars() == CONTEXT_VARS, (
        "per-call state goes on the call object (hf_speculative/core/call.py), not in a ContextVar")
