"""The CPU kernel's build (``hf_speculative/cpu/build.py``): a folder per torch installation, one binary shared by the
installations of a torch release, and no endless wait on the lock file of a build that was killed. torch's builder is replaced by a stand-in where compiling would take a
minute; ``tests/cpu/test_cpu_kernel.py`` builds and runs the real kernel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hf_speculative.cpu import build as cpu_build
from hf_speculative.cpu import kernel as cpu_kernel

# holds the build's OS lock as a build does, with torch's lock file beside it, until killed or for `seconds`
_HOLDER = """
import sys, time
from pathlib import Path
from hf_speculative.locks import exclusive
folder, ours, torchs, seconds = Path(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
with exclusive(folder / ours):
    (folder / torchs).touch()
    (folder / "holding").touch()
    time.sleep(seconds)
    (folder / torchs).unlink()
    (folder / "released").touch()
"""

def test_each_torch_installation_builds_in_a_folder_of_its_own(tmp_path, monkeypatch):
    """Two environments (a venv per transformers version) must not share a build folder: torch writes the
    installation's include paths into its build file, and ninja rebuilds everything when that file changes."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    here = cpu_build.build_directory()
    assert here.parent == tmp_path and here.name.startswith(cpu_build.EXTENSION + "-")
    assert cpu_build.build_directory() == here  # stable: the next process finds its build
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "other-venv" / "site-packages" / "torch" / "__init__.py"))
    there = cpu_build.build_directory()
    assert there.parent == tmp_path and there != here
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    from torch.utils.cpp_extension import get_default_build_root

    assert cpu_build.build_directory().parent.parent == Path(get_default_build_root())


def _other_installation(tmp_path, monkeypatch) -> None:
    """This torch, as if installed in another venv (what build_directory keys on)."""
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "other-venv" / "site-packages" / "torch" / "__init__.py"))


def test_one_binary_per_torch_release_and_sources_whatever_the_installation(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    shared, folder = cpu_build.shared_binary(), cpu_build.build_directory()
    assert shared.parent == tmp_path / f"{cpu_build.EXTENSION}-shared" and shared.suffix == ".so"
    _other_installation(tmp_path, monkeypatch)
    assert cpu_build.shared_binary() == shared and cpu_build.build_directory() != folder
    edited = tmp_path / cpu_build.SOURCES[0].name  # a source changed by a byte: another binary
    edited.write_bytes(cpu_build.SOURCES[0].read_bytes() + b"\n")
    monkeypatch.setattr(cpu_build, "SOURCES", [edited, *cpu_build.SOURCES[1:]])
    assert cpu_build.shared_binary() != shared
    monkeypatch.undo()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    with monkeypatch.context() as m:
        m.setattr(cpu_build, "CFLAGS", ["-O2", "-mavx2", "-mfma"])
        assert cpu_build.shared_binary() != shared
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "0.0.1+other")
        assert cpu_build.shared_binary() != shared


@pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA")
def test_the_kernel_is_built_once_and_another_installation_of_the_release_imports_it(tmp_path, monkeypatch):
    cpu_kernel.load_kernel()  # built in this installation's folder, or imported from the shared binary
    shared = cpu_build.shared_binary()
    assert shared.is_file()
    folder = cpu_build.build_directory()
    if (folder / "build.ninja").exists():  # this installation built it: for itself, then shared it
        ninja = (folder / "build.ninja").read_text()
        assert os.path.join(os.path.dirname(os.path.realpath(torch.__file__)), "include") in ninja
    _other_installation(tmp_path, monkeypatch)
    assert cpu_build.build_directory() != folder and cpu_build.shared_binary() == shared
    monkeypatch.setattr("torch.utils.cpp_extension.load", lambda **kwargs: pytest.fail("built again"))
    module = cpu_build.build.__wrapped__()
    assert module.isa() == cpu_kernel.load_kernel().isa()
    assert not cpu_build.build_directory().exists()  # nothing built, no ninja run


def _stand_in_builder(folder: Path, monkeypatch, binary: bytes | None = None) -> list:
    """torch's `load`, replaced: it records whether torch's lock file was there and whether the holder had let go
    (torch's own builder would wait on that file for as long as it exists); with ``binary``, it writes it as the
    build's ``.so``."""
    seen = []

    def load(name, sources, extra_cflags, build_directory, verbose):
        assert build_directory == str(folder)
        seen.append({"lock": (folder / cpu_build.TORCH_LOCK).exists(), "released": (folder / "released").exists()})
        if binary is not None:
            (folder / f"{name}.so").write_bytes(binary)
        return "the module"

    monkeypatch.setattr("torch.utils.cpp_extension.load", load)
    monkeypatch.setattr(cpu_build, "_ninja_on_path", lambda: None)
    return seen


def test_a_shared_binary_that_does_not_load_is_built_again_and_replaced(tmp_path, monkeypatch):
    """A home folder shared with another system, or a file damaged on disk: the kernel is built again, not refused."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    shared = cpu_build.shared_binary()
    shared.parent.mkdir(parents=True)
    shared.write_bytes(b"not an ELF file")
    seen = _stand_in_builder(cpu_build.build_directory(), monkeypatch, binary=b"the new build")
    assert cpu_build.build.__wrapped__() == "the module" and len(seen) == 1
    assert shared.read_bytes() == b"the new build" and not list(shared.parent.glob("*.partial"))


def _start_holder(folder: Path, seconds: float) -> subprocess.Popen:
    folder.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder), cpu_build.OUR_LOCK,
                               cpu_build.TORCH_LOCK, str(seconds)])
    deadline = time.monotonic() + 60
    while not (folder / "holding").exists():
        assert holder.poll() is None and time.monotonic() < deadline, "the holder did not start"
        time.sleep(0.05)
    return holder


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_the_lock_file_of_a_killed_build_does_not_block_the_next(tmp_path, monkeypatch):
    """A build killed mid-way (Ctrl-C, a timeout, the out-of-memory killer) leaves torch's lock file; torch's builder
    would wait on it forever. The OS lock died with the process, so the next build removes the file and builds."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = cpu_build.build_directory()
    seen = _stand_in_builder(folder, monkeypatch)
    holder = _start_holder(folder, 600)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    assert (folder / cpu_build.TORCH_LOCK).exists()  # left behind
    assert cpu_build.build.__wrapped__() == "the module"
    assert seen == [{"lock": False, "released": False}]


def test_a_live_build_is_waited_for_and_its_lock_file_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = cpu_build.build_directory()
    seen = _stand_in_builder(folder, monkeypatch)
    holder = _start_holder(folder, 1.5)
    assert cpu_build.build.__wrapped__() == "the module"
    holder.wait(timeout=30)
    assert seen == [{"lock": False, "released": True}]  # ran after the live build let go, which removed its file
