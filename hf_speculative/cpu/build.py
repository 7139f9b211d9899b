"""Building the CPU kernel (``kernel.py``): its sources, its build folder and the lock around torch's builder.

``torch.utils.cpp_extension.load`` compiles ``csrc/*.cpp`` with ninja into a build folder, once per machine (about a
minute), and later loads check the build there. Two things about that folder are ours to get right:

- **One folder per torch installation** (:func:`build_directory`): torch writes the installation's include paths
  into the folder's ``build.ninja``, and ninja rebuilds everything when that file changes, so two venvs that shared
  one folder (a venv per transformers version, as CI and ``make install VENV=...`` give) rebuilt each other's kernel
  at every switch.
- **One build per torch release, shared** (:func:`shared_binary`): the folder's build is for one installation, but
  its binary is not: two venvs with the same torch release (CI's two, a user's venv per project) can load the same
  ``.so``, since it resolves torch's symbols from the libraries the process has already loaded. After a build the
  binary is copied to a file named by a hash of everything that makes it (the sources and headers, the flags, torch's
  release, commit and CXX11 ABI, Python's version), and any installation whose hash matches imports that file
  without building or running ninja; a changed source, flag or release is another hash, and builds.
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
CFLAGS = ["-O3", "-mavx2", "-mfma"]


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


def shared_binary() -> Path:
    """The built kernel that every installation of this torch release shares, beside the build folders:
    ``EXTENSION-shared/<hash>.so``, the hash over the sources and headers' bytes, the flags, torch's release, commit,
    CUDA version and CXX11 ABI, and Python's version and ABI flags (what the compiled module depends on; not where
    torch is installed)."""
    digest = hashlib.sha256()
    for part in (torch.__version__, torch.version.git_version, str(torch.version.cuda),
                 str(torch.compiled_with_cxx11_abi()), sys.version, getattr(sys, "abiflags", ""), " ".join(CFLAGS)):
        digest.update(part.encode() + b"\0")
    for path in SOURCES + HEADERS:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return build_directory().parent / f"{EXTENSION}-shared" / f"{digest.hexdigest()[:20]}.so"


def _import_binary(path: Path):
    """The extension module from a built ``.so`` (its init function is named after EXTENSION, not the file), or None
    where there is none or it does not load here (a home folder shared with another system): then it is built again."""
    import importlib.util

    if not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(EXTENSION, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None
    return module


def _share(built: Path, shared: Path) -> None:
    """Copies a fresh build to ``shared``, whole or not at all (another installation may be importing it)."""
    if not built.is_file():
        return
    partial = shared.with_name(f"{shared.name}.{os.getpid()}.partial")
    shutil.copyfile(built, partial)
    os.replace(partial, shared)


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
    """The compiled extension module: imported from :func:`shared_binary` where this torch release's build of these
    sources is there, else built in :func:`build_directory` and shared."""
    from torch.utils.cpp_extension import load

    shared = shared_binary()
    module = _import_binary(shared)  # written whole (os.replace): no lock needed to read it
    if module is not None:
        return module
    _ninja_on_path()  # a missing [kernel] extra raises here, and load_kernel's message quotes it
    folder = build_directory()
    folder.mkdir(parents=True, exist_ok=True)
    shared.parent.mkdir(parents=True, exist_ok=True)
    # one build per release at a time (another installation waits, then imports it), then this folder's own lock
    with exclusive(shared.parent / f"{shared.stem}.flock"), _build_lock(folder):
        module = _import_binary(shared)
        if module is None:
            module = load(name=EXTENSION, sources=[str(p) for p in SOURCES], extra_cflags=CFLAGS,
                          build_directory=str(folder), verbose=False)
            _share(folder / f"{EXTENSION}.so", shared)
        return module
