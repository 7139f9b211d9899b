"""Integrity of files loaded from disk: sha256 recorded once, checked before use, cheaply on repeat loads.

A folder's files are checked against digests recorded when they were written (a registry model's
marker, written at fetch; a shipped drafter's ``sha256sums.json``, written at release). Hashing a
540 MB model on every load would cost about a second, so a file that hashed right is remembered in a
*trust record*: its size, ``mtime_ns``, ``ctime_ns``, inode and device with the digest it matched. A
later check that finds the same five values and the same expected digest skips the hash; any change
(a write, a truncation, a copy, a ``touch``, a replaced file) makes it hash the file again. A file
changed less than ``SETTLE_NS`` (2 s) before it was hashed is not trusted yet: a second change within
the same tick of the file system's clock could leave its timestamps as they were (git's "racy clean"
case), so it is hashed again next time.

What this catches: accidental corruption through the file system (an interrupted copy or download, a
full disk, a partial write, a truncated file, a file edited or replaced by a tool or a person, even
one that then restored the mtime with ``os.utime``, since that sets the ctime to now). What it does
not catch: a change that leaves all five values as they were, i.e. bit rot under the file system, or
an attacker who can write the block device or set the clock and restore the mtime (root), or who can
rewrite the marker or the trust record themselves. A full re-hash (``hf-speculative models verify``)
ignores the trust record and catches everything but a rewritten marker.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["sha256_file", "stat_key", "settled", "check_files", "read_trust", "write_json_atomic", "drafter_trust_file"]

_CHUNK = 8 << 20
TRUST_VERSION = 1
SETTLE_NS = 2_000_000_000  # a file changed more recently than this is hashed, not trusted (see above)


def sha256_file(path: Path, update: Callable[[int], Any] | None = None) -> str:
    """Hex sha256 of the file at `path`; `update(n)` is called with each chunk's size (a progress bar)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            if update is not None:
                update(len(chunk))
    return digest.hexdigest()


def stat_key(st: os.stat_result) -> list[int]:
    """What a trust record compares: size, mtime_ns, ctime_ns, inode, device."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def settled(st: os.stat_result) -> bool:
    """Whether the file's last change (mtime or ctime) is at least `SETTLE_NS` old, so that any later
    change gets other timestamps and a trust entry of it is safe."""
    return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= SETTLE_NS


def read_trust(trust_file: Path | None, folder: Path) -> dict[str, list]:
    """The trust record's entries for `folder`, or {} when there is none or it is unreadable or for
    another folder (a record is only a cache: losing it costs a re-hash, nothing else)."""
    if trust_file is None:
        return {}
    try:
        data = json.loads(trust_file.read_text(encoding="utf-8"))
        if data.get("version") != TRUST_VERSION or data.get("folder") != str(folder):
            return {}
        files = data.get("files")
        return files if isinstance(files, dict) else {}
    except (OSError, ValueError, AttributeError):
        return {}


def write_json_atomic(path: Path, data: Any) -> bool:
    """Write `data` as JSON to `path` through a temporary file and a rename (readers never see a
    partial file); False when the folder is not writable."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        try:  # mkstemp's 0600 would hide a shared cache's marker from its other users
            mode = os.stat(path).st_mode & 0o777
        except OSError:
            mode = 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def check_files(folder: Path, expected: Mapping[str, str], trust_file: Path | None = None, *,
                full: bool = False) -> list[tuple[str, str]]:
    """Check the files of `folder` against `expected` (`{relative path: hex sha256}`).

    A file whose trust entry still matches its stat and its expected digest is not hashed (unless
    `full`); every other file is hashed, and those that match are recorded in `trust_file` (written
    atomically; skipped when it cannot be written). Returns the problems as `(relative path, what is
    wrong)`; empty when every file is as recorded.
    """
    folder = Path(folder)
    trust = read_trust(trust_file, folder)
    kept: dict[str, list] = {}
    problems: list[tuple[str, str]] = []
    hashed = False
    for name, want in sorted(expected.items()):
        want = want.lower()
        path = folder / name
        try:
            before = os.stat(path)
        except OSError:
            problems.append((name, "is missing"))
            continue
        key = stat_key(before)
        if not full and trust.get(name) == key + [want]:
            kept[name] = trust[name]
            continue
        try:
            got = sha256_file(path)
            after = os.stat(path)
        except OSError as e:
            problems.append((name, f"cannot be read ({e})"))
            continue
        hashed = True
        if got != want:
            problems.append((name, f"has sha256 {got}, expected {want}"))
        elif stat_key(after) == key and settled(before):  # not changed while read, nor just before
            kept[name] = key + [want]
    if trust_file is not None and (hashed or kept.keys() != trust.keys()):
        write_json_atomic(trust_file, {"version": TRUST_VERSION, "folder": str(folder), "files": kept})
    return problems


def drafter_trust_file(folder: Path) -> Path | None:
    """Where the trust record of a drafter folder lives: in the package cache (never in the folder,
    which may be the read-only package), under a name derived from the folder's path; None when no
    cache folder is writable (then every load hashes every file)."""
    from .models import cache_dir

    trust_dir = cache_dir() / "trust"
    try:
        trust_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(trust_dir, os.W_OK):
        return None
    resolved = str(Path(folder).resolve())
    return trust_dir / f"drafter-{hashlib.sha256(resolved.encode()).hexdigest()[:32]}.json"
