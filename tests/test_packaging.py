"""What a user installs: setup.cfg's dependencies and extras, the data files, and a wheel that works.

setup.cfg's package_data ships every data file the package needs at run time (the CPU kernel's source,
the shipped drafters' configs and weights, Spec-Bench's questions) in wheels, not only in editable
installs; the extras agree with :data:`hf_speculative.extras.EXTRAS`, which names them in its messages;
and a wheel built from the source tree, installed into a fresh venv, runs the console script and
imports every subpackage (a folder without ``__init__.py`` silently drops out of a wheel).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from setuptools.config.setupcfg import read_configuration

from hf_speculative.cpu.build import HEADERS as KERNEL_HEADERS
from hf_speculative.cpu.build import SOURCES as KERNEL_SOURCES
from hf_speculative.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_speculative"
CORE = {"torch", "transformers", "safetensors", "numpy", "packaging"}
EXTRAS_WITHOUT_MESSAGES = {"docs", "dev", "app-test"}  # tools of the team: nothing in the package requires them


def _config() -> dict:
    return read_configuration(str(ROOT / "setup.cfg"))


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name.lower() for r in requirements}


def _runtime_data_files() -> list[Path]:
    """The files outside Python modules the package reads at run time."""
    needed = [PACKAGE / "cpu" / "csrc" / p.name for p in (*KERNEL_SOURCES, *KERNEL_HEADERS)]  # the kernel's C++, built on first use
    folders = [*PACKAGE.glob("drafters/*/pretrained"), PACKAGE / "drafters/self_speculative/exit_adapters"]
    assert PACKAGE / "drafters/dflash/pretrained" in folders
    for folder in folders:  # every drafter folder's shipped networks
        needed += [p for p in folder.glob("*/*") if p.suffix in (".json", ".safetensors")]
    needed += sorted((PACKAGE / "bench" / "data" / "spec_bench").iterdir())
    return needed


def test_package_data_covers_the_runtime_files():
    patterns = _config()["options"]["package_data"]["hf_speculative"]
    shipped = {path for pattern in patterns for path in PACKAGE.glob(pattern)}
    needed = _runtime_data_files()
    assert len(needed) >= 8 and PACKAGE / "bench/data/spec_bench/question.jsonl" in needed
    missing = [str(p.relative_to(ROOT)) for p in needed if p not in shipped]
    assert not missing, f"setup.cfg [options.package_data] does not ship {missing} (one pattern per line)"


def test_core_install_needs_only_the_library():
    assert _names(_config()["options"]["install_requires"]) == CORE


def test_extras_agree_with_extras_module():
    extras = _config()["options"]["extras_require"]
    declared = {extra.replace("_", "-"): _names(reqs) for extra, reqs in extras.items()}  # setuptools says app_test
    assert set(declared) - EXTRAS_WITHOUT_MESSAGES == set(EXTRAS)
    for extra, distributions in EXTRAS.items():
        assert declared[extra] == set(distributions), f"setup.cfg [{extra}] != extras.EXTRAS[{extra!r}]"


def _require_calls() -> list[tuple[str, int, str, str]]:
    """``(file, line, module, extra)`` of every ``require("module", "extra", ...)`` in the package."""
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "require":
                args = [a.value for a in node.args[:2] if isinstance(a, ast.Constant)]
                assert len(args) == 2, f"{path}:{node.lineno}: require() needs literal module and extra"
                calls.append((str(path.relative_to(ROOT)), node.lineno, *args))
    return calls


def test_every_optional_import_names_the_extra_that_installs_it():
    calls = _require_calls()
    used = {module.split(".")[0] for _, _, module, _ in calls}
    assert {"gguf", "ninja", "typer", "rich", "gradio", "matplotlib", "tqdm"} <= used
    for where, line, module, extra in calls:
        assert module.split(".")[0] in EXTRAS.get(extra, ()), f"{where}:{line}: [{extra}] does not install {module}"


# -- the wheel ----------------------------------------------------------------------------------
def _copy_source(dest: Path) -> Path:
    """The files a build reads, copied away from the working tree (no stale build/ folder, no caches)."""
    dest.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(PACKAGE, dest / "hf_speculative", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    return dest


def _build_wheel(tmp: Path) -> Path:
    source = _copy_source(tmp / "src")
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
         "--wheel-dir", str(tmp / "dist"), str(source)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PIP_NO_INDEX": "1"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    [wheel] = (tmp / "dist").glob("hf_speculative-*.whl")
    return wheel


def _venv_with(wheel: Path, tmp: Path) -> Path:
    """A fresh venv holding the wheel alone; its dependencies come from this interpreter's site-packages
    through a .pth file (whose own .pth files, this checkout's editable install among them, are not run)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([str(python), "-c", where], text=True).strip())
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "zz_test_dependencies.pth").write_text("\n".join(deps) + "\n")
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                          "--quiet", str(wheel)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return venv


def _subpackages() -> list[str]:
    """Every folder of the source tree that holds Python modules, as a dotted name."""
    folders = {p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    return sorted(".".join(f.relative_to(ROOT).parts) for f in folders)


@pytest.mark.slow
@pytest.mark.single_version
@pytest.mark.skipif(sys.platform == "win32", reason="the venv layout below is POSIX's")
def test_wheel_installs_and_runs_from_a_fresh_venv(tmp_path):
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    modules = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    missing = [str(p.relative_to(ROOT)) for p in modules + _runtime_data_files()
               if p.relative_to(ROOT).as_posix() not in names]
    assert not missing, f"the wheel lacks {missing}"

    venv = _venv_with(wheel, tmp_path)
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "HF_SPECULATIVE_CACHE": str(tmp_path / "cache")}

    def run(*args: str) -> str:
        out = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{args}: {out.stdout}{out.stderr}"
        return out.stdout

    script = str(venv / "bin" / "hf-speculative")
    assert all(command in run(script, "--help") for command in ("models", "compare", "bench", "train-eagle"))
    assert "smollm2-135m-instruct" in run(script, "models", "list")
    assert "spec_bench/question.jsonl" in run(script, "bench", "--help")
    data = [p.relative_to(PACKAGE).as_posix() for p in _runtime_data_files()]
    code = (
        "import importlib, sys\n"
        f"for name in {_subpackages()!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(venv)!r}), (name, module.__file__)\n"
        "from pathlib import Path\n"
        "import hf_speculative\n"
        "from hf_speculative.bench.spec_bench import DATASET, load_prompts\n"
        f"missing = [f for f in {data!r} if not (Path(hf_speculative.__file__).parent / f).is_file()]\n"
        "print(len(load_prompts(DATASET)), missing)\n"
    )
    assert run(str(venv / "bin" / "python"), "-c", code).split() == ["480", "[]"]
