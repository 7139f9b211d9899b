"""Move hf_speculative's modules into layered folders and rewrite every import and reference to them.

    python tools/refactor/move_modules.py [--dry-run]

MOVES maps an old dotted module (under hf_speculative) to its new one. Relative imports inside the package are
re-derived from the new locations (ast); dotted names and file paths in every text file of the repository
(code, tests, docs, configs) are rewritten. Run once, on a clean tree; `git mv` keeps history.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = "hf_speculative"
MOVES = {
    "accept": "core.accept", "loop": "core.loop", "batch_loop": "core.batch_loop", "tree": "core.tree",
    "tree_shapes": "core.tree_shapes", "verify": "core.verify", "batch_verify": "core.batch_verify",
    "static_cache": "core.static_cache", "costs": "core.costs", "batch_costs": "core.batch_costs",
    "cost_profile": "core.cost_profile", "state": "core.state", "stats": "core.stats", "sampling": "core.sampling",
    "features": "core.features", "drafters.policy": "core.policy", "chains": "core.chains",
    "base": "drafters.base",
    "integration": "hf.integration", "loop_entry": "hf.loop_entry", "spec": "hf.spec",
    "cli": "cli.main", "cli_options": "cli.options",
    "cpu_layout": "cpu.layout", "cpu_kernel": "cpu.kernel",
    "models": "registry.models", "integrity": "registry.integrity",
    "methods": "tooling.methods", "prompting": "tooling.prompting",
    "drafters.prompt_lookup": "drafters.prompt_lookup.drafter", "drafters.lookup_tree": "drafters.prompt_lookup.tree",
    "drafters.draft_model": "drafters.draft_model.drafter", "drafters.model_tree": "drafters.draft_model.tree",
    "drafters.self_speculative": "drafters.self_speculative.strategies",
    "drafters.layer_drafter": "drafters.self_speculative.drafter",
    "drafters.layer_view": "drafters.self_speculative.layer_view",
    "drafters.layer_calibration": "drafters.self_speculative.calibration",
    "drafters.exit_adapter": "drafters.self_speculative.exit_adapter",
    "drafters.suffix": "drafters.suffix.drafter", "drafters.suffix_tree": "drafters.suffix.tree",
    "drafters.suffix_history": "drafters.suffix.history",
    "drafters.lookahead": "drafters.lookahead.drafter", "drafters.hybrid": "drafters.hybrid.drafter",
}
DIR_MOVES = {"csrc": "cpu/csrc", "drafters/exit_adapters": "drafters/self_speculative/exit_adapters"}
NEW_PACKAGES = {
    "core": "The core: one loop, the acceptance rule, trees, verification, costs, per-model state, statistics.",
    "hf": "The transformers adapter: enable(), the generate() entry, the JSON spec of a strategy.",
    "cli": "The command line (`hf-speculative`; the [cli] extra).",
    "cpu": "CPU fast paths: the weight layout and the AVX2 kernel (C++ source in csrc/).",
    "tooling": "What the command line, the benchmark and the demo app share: the registry of decoding methods they run, prompt encoding.",
    "registry": "The offline model registry and the integrity checks of what it and the shipped drafters hold.",
}
INIT_EXPORTS = {
    "drafters.prompt_lookup": ("Prompt lookup (n-gram matching in the context), chains and trees.", "drafter", ["PromptLookup"]),
    "drafters.draft_model": ("A smaller model with the target's tokenizer drafts.", "drafter", ["DraftModel"]),
    "drafters.self_speculative": ("Self-speculation: early exit, layer skip, the exit adapter.", "strategies",
                                  ["EarlyExit", "LayerSkip"]),
    "drafters.suffix": ("SuffixDecoding: suffix trees over the prompt and earlier outputs.", "drafter",
                        ["SuffixDecoding"]),
    "drafters.lookahead": ("Lookahead decoding: Jacobi iterations and an n-gram pool.", "drafter", ["Lookahead"]),
    "drafters.hybrid": ("Several drafters, one step each, the best draft verified.", "drafter", ["Hybrid"]),
}
TEXT_SUFFIXES = {".py", ".md", ".cfg", ".toml", ".yml", ".yaml", ".txt", ".sh", ".ini", ".json", ".in", ""}


def module_file(dotted: str) -> Path:
    path = ROOT / PKG / Path(*dotted.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def old_modules() -> set[str]:
    names = set()
    for f in (ROOT / PKG).rglob("*.py"):
        rel = f.relative_to(ROOT / PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.add(".".join(parts))
    return names


def mapped(dotted: str) -> str:
    """The new name of an old module (or of anything under a moved one)."""
    for old in sorted(MOVES, key=len, reverse=True):
        if dotted == old or dotted.startswith(old + "."):
            return MOVES[old] + dotted[len(old):]
    return dotted


def package_of(module: str, is_init: bool) -> list[str]:
    parts = module.split(".") if module else []
    return parts if is_init else parts[:-1]


def relative(from_pkg: list[str], target: str) -> str:
    """`from X import` text reaching ``target`` (dotted under PKG, '' = PKG itself) from package ``from_pkg``."""
    tparts = target.split(".") if target else []
    common = 0
    while common < min(len(from_pkg), len(tparts)) and from_pkg[common] == tparts[common]:
        common += 1
    dots = "." * (len(from_pkg) - common + 1)
    return dots + ".".join(tparts[common:])


def rewrite_imports(path: Path, old_module: str, new_module: str, modules: set[str]) -> str:
    text = path.read_text()
    tree = ast.parse(text)
    is_init = path.name == "__init__.py"
    old_pkg, new_pkg = package_of(old_module, is_init), package_of(new_module, is_init)
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = old_pkg[: len(old_pkg) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
        groups: dict[str, list[str]] = {}
        for alias in node.names:
            sub = f"{source}.{alias.name}" if source else alias.name
            if sub in modules and alias.name != "*":
                new = mapped(sub)
                parent, _, last = new.rpartition(".")
                name = last if alias.asname is None and last == alias.name else f"{last} as {alias.asname or alias.name}"
                groups.setdefault(relative(new_pkg, parent), []).append(name)
            else:
                name = alias.name if alias.asname is None else f"{alias.name} as {alias.asname}"
                groups.setdefault(relative(new_pkg, mapped(source)), []).append(name)
        first = lines[node.lineno - 1]
        indent = first[: len(first) - len(first.lstrip())]
        statements = []
        for where, names in groups.items():
            one = f"{indent}from {where} import {', '.join(names)}"
            if len(one) > 120:
                one = f"{indent}from {where} import (\n" + "".join(f"{indent}    {n},\n" for n in names) + f"{indent})"
            statements.append(one)
        tail = lines[node.end_lineno - 1][node.end_col_offset:]
        edits.append((node.lineno, node.end_lineno, "\n".join(statements).lstrip() , node.col_offset, tail))
    for start, end, new, col, tail in sorted(edits, reverse=True):
        head = lines[start - 1][:col]
        lines[start - 1:end] = [head + new + tail]
    return "".join(lines)


def rewrite_absolute(text: str, modules: set[str]) -> str:
    """``from hf_speculative[.pkg] import submodule`` (outside the package, or absolute inside it) at new places."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level != 0 or not node.module:
            continue
        if node.module != PKG and not node.module.startswith(PKG + "."):
            continue
        source = node.module[len(PKG) + 1:]
        if not any((f"{source}.{a.name}" if source else a.name) in MOVES for a in node.names) and mapped(source) == source:
            continue
        groups: dict[str, list[str]] = {}
        for alias in node.names:
            sub = f"{source}.{alias.name}" if source else alias.name
            if sub in modules:
                new = mapped(sub)
                parent, _, last = new.rpartition(".")
                name = last if alias.asname is None and last == alias.name else f"{last} as {alias.asname or alias.name}"
                groups.setdefault(".".join(filter(None, ["HFS_NEW", parent])), []).append(name)
            else:
                name = alias.name if alias.asname is None else f"{alias.name} as {alias.asname}"
                groups.setdefault(".".join(filter(None, ["HFS_NEW", mapped(source)])), []).append(name)
        first = lines[node.lineno - 1]
        indent = first[: len(first) - len(first.lstrip())]
        statements = []
        for where, names in groups.items():
            one = f"{indent}from {where} import {', '.join(names)}"
            if len(one) > 120:
                one = f"{indent}from {where} import (\n" + "".join(f"{indent}    {n},\n" for n in names) + f"{indent})"
            statements.append(one)
        tail = lines[node.end_lineno - 1][node.end_col_offset:]
        edits.append((node.lineno, node.end_lineno, "\n".join(statements).lstrip(), node.col_offset, tail))
    for start, end, new, col, tail in sorted(edits, reverse=True):
        lines[start - 1:end] = [lines[start - 1][:col] + new + tail]
    return "".join(lines)


def references(modules: set[str], files: list[str]) -> None:
    # 3. dotted names and paths everywhere
    alternation = "|".join(re.escape(o) for o in sorted(MOVES, key=len, reverse=True))
    dotted = re.compile(rf"\b{PKG}\.({alternation})(?![\w])")
    path_moves = {f"{PKG}/{o.replace('.', '/')}.py": f"{PKG}/{n.replace('.', '/')}.py" for o, n in MOVES.items()}
    path_moves.update({f"{PKG}/{o}": f"{PKG}/{n}" for o, n in DIR_MOVES.items()})
    for name in files:
        f = ROOT / name
        if not f.is_file() or f.suffix not in TEXT_SUFFIXES or "tools/refactor" in name:
            continue
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite_absolute(text, modules) if f.suffix == ".py" else text
        new = dotted.sub(lambda m: f"{PKG}.{MOVES[m.group(1)]}", new)
        for old, newp in sorted(path_moves.items(), key=lambda kv: len(kv[0]), reverse=True):
            new = re.sub(re.escape(old) + r"(?![\w/])", newp, new)
        new = new.replace("HFS_NEW", PKG)
        # setup.cfg's package data: relative to the package
        if name == "setup.cfg":
            new = new.replace("    csrc/*.cpp", "    cpu/csrc/*.cpp").replace(
                "drafters/exit_adapters/", "drafters/self_speculative/exit_adapters/")
        if new != text:
            f.write_text(new)


def main() -> None:
    dry = "--dry-run" in sys.argv
    modules = old_modules()
    for old in MOVES:
        assert old in modules, old
    # 1. new imports for every package file, computed at the old locations
    new_text = {}
    for f in (ROOT / PKG).rglob("*.py"):
        rel = f.relative_to(ROOT / PKG).with_suffix("")
        parts = list(rel.parts)
        old = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        new_text[f] = (mapped(old), rewrite_imports(f, old, mapped(old), modules))
    if dry:
        for f, (new, _) in new_text.items():
            print(f.relative_to(ROOT), "->", new)
        return
    for f, (new, text) in new_text.items():
        f.write_text(text)
    # 2. move
    def git(*args):
        subprocess.run(["git", *args], cwd=ROOT, check=True)

    for pkg, doc in NEW_PACKAGES.items():
        d = ROOT / PKG / pkg
        d.mkdir(exist_ok=True)
    for old, new in sorted(MOVES.items()):
        src = ROOT / PKG / Path(*old.split(".")).with_suffix(".py")
        dst = ROOT / PKG / Path(*new.split(".")).with_suffix(".py")
        dst.parent.mkdir(parents=True, exist_ok=True)
        git("mv", str(src), str(dst))
    for old, new in DIR_MOVES.items():
        git("mv", str(ROOT / PKG / old), str(ROOT / PKG / new))
    for pkg, doc in NEW_PACKAGES.items():
        init = ROOT / PKG / pkg / "__init__.py"
        if not init.exists():
            init.write_text(f'"""{doc}"""\n')
    for pkg, (doc, module, names) in INIT_EXPORTS.items():
        init = ROOT / PKG / Path(*pkg.split(".")) / "__init__.py"
        init.write_text(f'"""{doc}"""\n\nfrom .{module} import {", ".join(names)}\n\n__all__ = {names!r}\n'.replace("'", '"'))
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    references(modules, files)


if __name__ == "__main__":
    main()
