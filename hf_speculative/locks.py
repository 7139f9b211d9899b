"""An exclusive lock on a file, across processes, that the operating system releases when its holder dies (a lock
*file* that is created and deleted is not: a killed holder leaves it behind). The model cache's fetches
(``registry/models.py``) and the CPU kernel's build (``cpu/build.py``) hold one.

``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows, each imported on use, so that the package imports on both.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold the lock of the file at ``path`` (created if missing, with its folder) for the ``with`` block; waits
    while another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        lock, unlock = _lock_functions()
        lock(f)
        try:
            yield
        finally:
            unlock(f)


def _lock_functions() -> tuple[Any, Any]:
    """`(lock, unlock)` of an open file: `fcntl.flock` on POSIX, `msvcrt.locking` (byte 0, retried) on Windows."""
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        def lock(f: Any) -> None:
            f.seek(0)
            while True:  # LK_LOCK gives up after 10 s; a fetch or a build of another process takes minutes
                try:
                    msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
                    return
                except OSError:
                    time.sleep(0.5)

        def unlock(f: Any) -> None:
            f.seek(0)
            msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)

        return lock, unlock
    return (lambda f: fcntl.flock(f, fcntl.LOCK_EX)), (lambda f: fcntl.flock(f, fcntl.LOCK_UN))
