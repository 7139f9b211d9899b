"""Building the CPU kernel (``kernel.py``): its sources, its build folder and the lock around torch's builder.

``torch.utils.cpp_extension.load`` compiles ``csrc/*.cpp`` with ninja into a build folder, once per machine (about a
minute), and later loads check the build there. Two things about that folder are ours to get right:

- **One folder per torch installation** (:func:`build_directory`): torch writes the installation's include paths
  into the folder's ``build.ninja``, and ninja rebuilds everything when that file changes, so two venvs that shared
  one folder (a venv per transformers version, as CI and ``make install VENV=...`` give) rebuilt each other's kernel
  at every switch.
- **No wait on a dead build** (:func:`_build_lock`): torch's own lock is a ``lock`` file that waiters poll until it
  is gone; a build that is killed (Ctrl-C, a timeout, the out-of-memory killer) leaves it, and every later use of the
  kernel then waits on it forever, silently. An OS file lock is released when its process dies: held around torch's
  builder, it means that a ``lock`` file found while holding it belongs to no live build, and is removed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import sys
import sysconfig
from pathlib import Path

import torch

from ..extras import require
from ..locks import exclusive

SOURCES = [Path(__file__).parent / "csrc" / name
           for name in ("skinny_linear.cpp", "bf16_linear.cpp", "few_query_attention.cpp", "decoder_layer.cpp",
                        "prefill_attention.cpp", "huge_pages.cpp")]
HEADERS = [Path(__file__).parent / "csrc" / name
           for name in ("tensor.h", "decoder_layer.h", "exp.h")]  # included by the sources (ninja tracks them)
EXTENSION = "hfs_skinny_linear_v8"
TORCH_LOCK = "lock"  # torch's FileBaton in the build folder (torch.utils.cpp_extension)
OUR_LOCK = "hfs-build.flock"


def build_directory() -> Path:
    """The kernel's build folder: torch's extensions root (``TORCH_EXTENSIONS_DIR``, by default
    ``~/.cache/torch_extensions/py<version>_cpu``), then ``hfs_skinny_linear_v<N>-<key>``, the key a hash of this
    torch installation (its folder and version) and Python's headers."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        accelerator = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
        folder = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_{accelerator}"
        root = os.path.join(get_default_build_root(), folder)
    installation = "\n".join([os.path.dirname(os.path.realpath(torch.__file__)), torch.__version__,
                              sysconfig.get_paths()["include"]])
    key = hashlib.sha256(installation.encode()).hexdigest()[:12]
    return Path(root) / f"{EXTENSION}-{key}"


@contextlib.contextmanager
def _build_lock(folder: Path):
    """Holds an OS lock on ``folder`` (:func:`..locks.exclusive`: released if this process dies) and, once held,
    removes a torch ``lock`` file that a killed build left behind."""
    with exclusive(folder / OUR_LOCK):  # waits while another process builds or checks the build
        (folder / TORCH_LOCK).unlink(missing_ok=True)  # every live user holds our lock: this one is stale
        yield


def _ninja_on_path() -> None:
    """torch's builder runs ``ninja`` from PATH; the pip ``ninja`` package (the [kernel] extra) puts its
    binary in the venv, which is not on PATH when the venv's python is run by its full path. A system
    ninja on PATH does as well."""
    if shutil.which("ninja") is None:
        ninja = require("ninja", "kernel", "optimize_for_cpu(kernel=True)")
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


@functools.lru_cache(maxsize=1)
def build():
    """The compiled extension module: built in :func:`build_directory` on first use, loaded from it after."""
    from torch.utils.cpp_extension import load

    _ninja_on_path()  # a missing [kernel] extra raises here, and load_kernel's message quotes it
    folder = build_directory()
    folder.mkdir(parents=True, exist_ok=True)
    with _build_lock(folder):
        return load(name=EXTENSION, sources=[str(p) for p in SOURCES], extra_cflags=["-O3", "-mavx2", "-mfma"],
                    build_directory=str(folder), verbose=False)
