"""The drafters import without cycles: each module alone in a fresh interpreter, and no import
(at module level or inside a function) leads from a drafter module, or a piece the drafters share,
back to itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import hf_speculative

PACKAGE = Path(hf_speculative.__file__).parent


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its file (lazy imports included)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {module for module in found & known if module != name}


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A path of imports from ``start`` to ``goal`` (``None`` if there is none)."""
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop()
        for module in graph[path[-1]]:
            if module == goal:
                return path + [module]
            if module not in seen:
                seen.add(module)
                paths.append(path + [module])
    return None


# the pieces the drafters share; modules that know every drafter by name (the package root, the spec
# registry) are facades above them, and their imports of the drafters are no knot
SHARED = {f"hf_speculative.{name}" for name in ("accept", "base", "compat", "costs", "features", "state", "tree")}


def test_no_drafter_module_imports_itself_back():
    files = module_files()
    nodes = {name for name in files if name.startswith("hf_speculative.drafters.")} | (SHARED & set(files))
    assert {"hf_speculative.drafters.self_speculative.exit_adapter", "hf_speculative.drafters.self_speculative.strategies"} <= nodes
    graph = {name: imports_of(name, files[name], set(files)) & nodes for name in nodes}
    cycles = {name: path for name in sorted(nodes) if (path := reaches(graph, name, name))}
    assert not cycles, f"import cycles: {cycles}"


ALONE = [("hf_speculative.drafters.self_speculative.exit_adapter", "ExitAdapterCandidateGenerator"),
         ("hf_speculative.drafters.self_speculative.strategies", "EarlyExit"),
         ("hf_speculative.drafters.self_speculative.drafter", "SelfSpeculativeCandidateGenerator")]


# a cycle among our modules fails alike on either version, and whatever they import of transformers is imported by
# the tests of each drafter on both versions: CI runs these fresh interpreters (10-25 s each there) on 5.x only
@pytest.mark.single_version
@pytest.mark.parametrize("module, name", ALONE)
def test_each_module_imports_alone(module, name):
    code = f"import importlib; assert hasattr(importlib.import_module({module!r}), {name!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
