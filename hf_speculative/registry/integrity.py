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
import stat
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping, NoReturn

from ..options import escaped

__all__ = ["sha256_file", "is_sha256_hex", "stat_key", "settled", "check_files", "first_problem", "read_trust",
           "write_json_atomic", "write_text_atomic", "drafter_trust_file", "FileRefused", "confined", "folder_file",
           "check_model_folder", "open_regular", "read_capped", "read_json_capped", "MAX_JSON_BYTES", "MAX_HASHED_BYTES", "MAX_NAME_CHARS"]

_CHUNK = 8 << 20
MAX_JSON_BYTES = 4 << 20  # a config.json, manifest, weights index or calibration file read from disk
MAX_HASHED_BYTES = 64 << 30  # a file hashed against a digest (a drafter's weights): read at most this much
MAX_NAME_CHARS = 1024  # a relative file name in a spec or a manifest
TRUST_VERSION = 1
SETTLE_NS = 2_000_000_000  # a file changed more recently than this is hashed, not trusted (see above)
# The package's own files (its shipped drafters): an installer may hard-link them from its cache (uv does on Linux)
PACKAGE_DIR = Path(__file__).resolve().parents[1]


class FileRefused(ValueError):
    """A file that is not read: outside its folder, not a regular file (a device such as ``/dev/zero``, a FIFO,
    a socket, a folder) or over its size cap. The message names the field that named the file; ``reason`` says
    what is wrong with it in a few words (``"is a FIFO"``), for a caller that lists several files."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or "is refused"


def confined(folder: str | os.PathLike, name: Any, what: str, *, fix: str | None = None) -> Path:
    """``folder / name``, resolved, when ``name`` is a plain relative name inside ``folder``: a non-empty string
    of at most ``MAX_NAME_CHARS`` characters, not absolute, no ``..``, no ``~``, no backslash or NUL, and no
    symlink on the way that leads out of ``folder``. ``what`` names the field in the error, ``fix`` (optional) what
    to do about a link out. For a file that is about to be opened, :func:`folder_file` checks more.

    Raises:
        FileRefused: anything else (nothing is opened or stat'ed outside ``folder``).
    """
    relative = check_relative_name(name, what, folder)
    root = Path(folder).resolve()
    resolved = (root / relative).resolve()
    if not _inside(resolved, _link_root(root)):
        _leads_out(name, root, resolved, what, fix)
    return resolved


def folder_file(folder: str | os.PathLike, name: Any, what: str, *, hashed: bool = False) -> Path:
    """``folder / name``, to be opened, after the checks that must come before anything opens it (the one gate of
    every file a loader reads from a folder it did not write): ``name`` is a plain relative name (see
    :func:`confined`); it is refused when it is a symlink, or under one, that leads out of ``folder``, and when it
    is not a regular file (a device, a FIFO, a socket, a folder). With ``hashed`` (a file checked against a digest,
    which a message may print) a file of more than one hard link is refused too: another name of it may be a file
    outside the folder, whose digest would then be told (the package's own files are exempt). A name that does
    not exist is returned as it is: the caller says what is missing.

    Raises:
        FileRefused: naming ``what``, the file relative to the folder (escaped) and the fix; ``reason`` in brief.
    """
    relative = check_relative_name(name, what, folder)
    path = Path(folder) / relative
    if not os.path.lexists(path):
        return path
    resolved = confined(folder, name, what, fix="if you trust the file it leads to, put a copy of it in the link's "
                        "place (cp --remove-destination \"$(readlink -f LINK)\" LINK)")
    try:
        st = os.stat(resolved)
    except FileNotFoundError:  # a dangling link inside the folder: missing
        return path
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st, what)
    if hashed and st.st_nlink > 1 and not _inside(resolved, PACKAGE_DIR):
        raise FileRefused(f"{what}: {_quoted(name)} in the folder {escaped(Path(folder).resolve())} has {st.st_nlink} "
                          "hard links, so it "
                          "may be a file outside the folder as well, and a file checked against a digest must be the "
                          "folder's own: it is not read. Give it its own copy (cp NAME NAME.copy && mv NAME.copy "
                          "NAME).", reason=f"has {st.st_nlink} hard links (it is not read)")
    return path


MAX_FOLDER_ENTRIES = 10_000  # entries of a model folder checked before transformers reads it (a 1 TB model: ~200)


def check_model_folder(folder: str | os.PathLike, what: str) -> None:
    """Every file transformers may open in a model ``folder`` (``from_pretrained``'s config, generation config,
    weights, tokenizer files, chat template, and whatever a later version reads), checked by :func:`folder_file`
    before transformers runs: each entry of the folder (its subfolders are checked where a weights index names a
    shard in one), and each shard a ``*.index.json`` names. transformers itself follows any link.

    Raises:
        FileRefused: naming ``what`` and the first file refused.
    """
    folder = Path(folder)
    indexes = []
    with os.scandir(folder) as entries:
        for count, entry in enumerate(entries):
            if count >= MAX_FOLDER_ENTRIES:
                raise FileRefused(f"{what}: the folder {escaped(folder)} holds more than {MAX_FOLDER_ENTRIES} entries, "
                                  "more than any model folder, so it is not read; keep the model's files there only.",
                                  reason="holds too many entries")
            if entry.is_dir(follow_symlinks=False):
                continue
            if entry.is_symlink() and entry.is_dir():  # a link to a folder: where it leads is what matters
                confined(folder, entry.name, what)
                continue
            folder_file(folder, entry.name, what)
            if entry.name.endswith(".index.json"):
                indexes.append(entry.name)
    for name in indexes:
        weight_map = read_json_capped(folder / name, f"{what} {escaped(name)}")
        shards = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        for shard in set(shards.values()) if isinstance(shards, dict) else ():
            if isinstance(shard, str):  # (anything else is transformers' error to report)
                folder_file(folder, shard, f"{what} {escaped(name)} weight_map")


_FIX = ("name a file inside the folder by its relative name (e.g. \"config.json\"); copy the file into {folder} "
        "if it lives elsewhere")


def _quoted(name: Any) -> str:
    return repr(name[:200]) if isinstance(name, str) else repr(escaped(name, 200))


def _leads_out(name: Any, root: Path, resolved: Path, what: str, fix: str | None = None) -> NoReturn:
    fix = fix or f"{_FIX.format(folder=escaped(root))}, as a real file rather than a link"
    raise FileRefused(f"{what}: {_quoted(name)} is a symlink that leads out of the folder {escaped(root)} (to "
                      f"{escaped(resolved)}), so it is not read; {fix}.",
                      reason="is a symlink that leads out of the folder (it is not read)")


_NOT_RELATIVE = "is not a relative name inside the folder (it is not read)"


def check_relative_name(name: Any, what: str, folder: Any = "the model's folder") -> PurePosixPath:
    """``name`` as a relative path when it is a plain relative name (see :func:`confined`), without looking
    at any file; else :class:`FileRefused` naming ``what``."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        shown = repr(name)[:60] if isinstance(name, str) else type(name).__name__
        raise FileRefused(f"{what}: must be a relative file name of 1 to {MAX_NAME_CHARS} characters, got {shown}; "
                          f"{_FIX.format(folder=escaped(folder))}.", reason=_NOT_RELATIVE)
    relative = PurePosixPath(name)
    if ("\\" in name or "\x00" in name or relative.is_absolute() or Path(name).is_absolute() or name.startswith("~")
            or ".." in relative.parts):
        raise FileRefused(f"{what}: {name[:200]!r} leaves the folder (an absolute path, '..', '~' or a backslash); "
                          f"{_FIX.format(folder=escaped(folder))}.", reason=_NOT_RELATIVE)
    return relative


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _link_root(root: Path) -> Path:
    """Where symlinks of ``root`` may lead: ``root`` itself, or for a snapshot of the Hugging Face Hub cache
    (``models--org--name/snapshots/<revision>/...``, whose files are links to ``../../blobs/``) that repository's
    folder in the cache."""
    parts = root.parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith("models--"):
            return Path(*parts[:i])
    return root


def _not_regular(path: Path, st: os.stat_result, what: str) -> FileRefused:
    kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else
            "a socket" if stat.S_ISSOCK(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "not a regular file")
    return FileRefused(f"{what}: {escaped(path)} is {kind}, not a regular file, so it is not read; name a regular "
                       "file.", reason=f"is {kind}, not a regular file (it is not read)")


def open_regular(path: str | os.PathLike, what: str) -> tuple[int, os.stat_result]:
    """An open descriptor (read-only) of the regular file at ``path`` and its stat. A device, FIFO, socket or
    folder is refused before it is opened, and again after (opened non-blocking, so a FIFO swapped in
    meanwhile cannot hang the open). The caller closes the descriptor.

    Raises:
        FileRefused: not a regular file. OSError: it cannot be opened.
    """
    path = Path(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st, what)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st, what)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _too_big(path: Path, size: int | str, cap: int, what: str) -> FileRefused:
    return FileRefused(f"{what}: {escaped(path)} has {size} bytes, over the limit of {cap} bytes for this file, so it "
                       "is not read (see docs/hosting.md); use a smaller file.",
                       reason=f"has {size} bytes, over its limit")


def read_capped(path: str | os.PathLike, cap: int, what: str) -> bytes:
    """The bytes of the regular file at ``path``, refused when it holds more than ``cap`` bytes: its size is
    checked before reading, and at most ``cap + 1`` bytes are read anyway (a file that grows meanwhile)."""
    path = Path(path)
    fd, st = open_regular(path, what)
    with os.fdopen(fd, "rb") as handle:
        if st.st_size > cap:
            raise _too_big(path, st.st_size, cap, what)
        data = handle.read(cap + 1)
    if len(data) > cap:
        raise _too_big(path, f"more than {cap}", cap, what)
    return data


def read_json_capped(path: str | os.PathLike, what: str, cap: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in the regular file at ``path`` (at most ``cap`` bytes); a file that is not JSON (or
    nests too deep, or holds an integer of more than 4300 digits) is a :class:`FileRefused` naming ``what``."""
    data = read_capped(path, cap, what)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise FileRefused(f"{what}: {escaped(path)} is not valid JSON ({type(error).__name__}: "
                          f"{escaped(error, 200)}); replace it "
                          "with the file that was saved.") from None


def sha256_file(path: Path, update: Callable[[int], Any] | None = None, *, cap: int = MAX_HASHED_BYTES,
                what: str | None = None) -> str:
    """Hex sha256 of the regular file at `path` (at most `cap` bytes, else :class:`FileRefused`); `update(n)` is
    called with each chunk's size (a progress bar)."""
    what = what or str(path)
    fd, st = open_regular(path, what)
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        if st.st_size > cap:
            raise _too_big(Path(path), st.st_size, cap, what)
        left = cap + 1
        while left > 0 and (chunk := f.read(min(_CHUNK, left))):
            left -= len(chunk)
            digest.update(chunk)
            if update is not None:
                update(len(chunk))
    if left <= 0:
        raise _too_big(Path(path), f"more than {cap}", cap, what)
    return digest.hexdigest()


def is_sha256_hex(value: Any) -> bool:
    """Whether ``value`` is written as a sha256 digest: 64 hex digits (either case)."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdefABCDEF" for c in value)


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
        data = read_json_capped(trust_file, "the trust record")
        if data.get("version") != TRUST_VERSION or data.get("folder") != str(folder):
            return {}
        files = data.get("files")
        return files if isinstance(files, dict) else {}
    except (OSError, ValueError, AttributeError):  # FileRefused is a ValueError
        return {}


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file and a rename: readers, and a run killed while it writes, see the
    old file or the new one, never part of one. The file keeps its mode (a new one 0644, as a plain write makes it).

    Raises:
        OSError: the folder or the file cannot be written (the temporary file removed).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:  # mkstemp's 0600 would make the file the owner's alone
            mode = os.stat(path).st_mode & 0o777
        except OSError:
            mode = 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
                full: bool = False, own_files: bool = False) -> list[tuple[str, str]]:
    """Check the files of `folder` against `expected` (`{relative path: hex sha256}`).

    A file whose trust entry still matches its stat and its expected digest is not hashed (unless
    `full`); every other file is hashed, and those that match are recorded in `trust_file` (written
    atomically; skipped when it cannot be written). Each file passes :func:`folder_file` first (a link out
    of the folder, a FIFO or a device is not opened), and with `own_files` (a folder from anyone, whose
    digests a message may print) a file of several hard links is not read either. Returns the problems as
    `(relative path, what is wrong)`; empty when every file is as recorded.
    """
    folder = Path(folder)
    trust = read_trust(trust_file, folder)
    kept: dict[str, list] = {}
    problems: list[tuple[str, str]] = []
    hashed = False
    for name, want in sorted(expected.items()):
        want = want.lower()
        try:  # a name from a manifest is a relative name inside the folder: nothing outside it is opened
            path = folder_file(folder, name, "a file listed in the manifest", hashed=own_files)
        except FileRefused as refused:
            problems.append((str(name)[:200], refused.reason))
            continue
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
        except (OSError, FileRefused) as e:
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


def first_problem(problems: list[tuple[str, str]]) -> str:
    """:func:`check_files`' problems in a message: the first one, and how many more (named). The names come from
    a manifest: escaped."""
    (name, what), more = problems[0], problems[1:]
    named = ", ".join(escaped(n, 200) for n, _ in more[:8]) + (", ..." if len(more) > 8 else "")
    others = f" (and {len(more)} more: {named})" if more else ""
    return f"{escaped(name, 200)} {what}{others}"


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
