"""Compressed, incremental checkpoints of a corpus folder that can live in the repository, so that a lost machine
does not take days of CPU work with it (issue 72's corpus was lost with three machines, ~14 hours of two cores
each time).

    python -m tools.corpus snapshot --out ~/corpora/smollm2 --to data/snapshots/corpus-smollm2-135m-instruct
    python -m tools.corpus restore --from data/snapshots/corpus-smollm2-135m-instruct --out ~/corpora/smollm2

A snapshot adds one part, ``DIR/part-NNNN.jsonl.xz``, holding what the folder gained since the parts before it:
for a JSONL file the whole rows appended since (every writer of the corpus appends whole rows; a row still being
written is left for the next part), or the whole file again when it was rewritten (the prompt lists when a corpus
grows); other files (the manifest, the README) whole. A part's first line is its header::

    {"format": 1, "part": K, "created": "...", "files": [
        {"path": "answers/train.jsonl", "start": N, "lines": M, "prefix_sha256": "...", "sha256": "..."},
        {"path": "MANIFEST.json", "text": "..."}, ...]}

followed by the ``lines`` rows of each JSONL entry in the header's order. ``sha256`` is that of the file's first
``start + lines`` rows, so a restore checks every step and the next snapshot finds where the last one ended without
reading the parts' rows. The corpus's own settings stay in its manifest: a restored folder is resumed by the same
``python -m tools.corpus build`` command, which checks them.

The parts are read as untrusted input: each path must be a relative path inside the folder, and a part that does not
continue the rows restored before it is refused.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import re
import time
from pathlib import Path, PurePosixPath

FORMAT = 1
PART = re.compile(r"part-(\d{4,})\.jsonl\.xz")
SKIPPED = re.compile(r"(^\.|\.part\d+\.jsonl$|\.tmp$)")  # the .lock, temporary files, a helper's unmerged rows
XZ_PRESET = 9


def part_files(snapshots: Path) -> list[Path]:
    """The parts in ``snapshots``, in order; raises ValueError when their numbers are not 1, 2, 3, ..."""
    snapshots = Path(snapshots)
    found = sorted((int(m.group(1)), p) for p in snapshots.iterdir() if (m := PART.fullmatch(p.name))) \
        if snapshots.is_dir() else []
    if [k for k, _ in found] != list(range(1, len(found) + 1)):
        raise ValueError(f"{snapshots}: parts {[k for k, _ in found]} are not numbered 1, 2, 3, ...: a part is "
                         "missing or was renamed; restore from a complete checkout of the folder")
    return [p for _, p in found]


def _safe_relative(name: object, where: Path) -> str:
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or \
            any(part in ("", ".", "..") for part in name.split("/")):
        raise ValueError(f"{where}: path {name!r} is not a plain relative path inside the corpus folder; the part "
                         "is damaged or not a corpus snapshot")
    return str(PurePosixPath(name))


def _whole_rows(path: Path) -> list[bytes]:
    """The file's rows up to its last newline (a row still being written is left out), each with its newline."""
    data = path.read_bytes()
    return data[:data.rfind(b"\n") + 1].splitlines(keepends=True)


def _sha(rows: list[bytes], digest=None):
    """``digest`` (a new sha256 when None) updated with ``rows``; returned, so that a prefix's hash goes on."""
    digest = hashlib.sha256() if digest is None else digest
    for row in rows:
        digest.update(row)
    return digest


def _header(path: Path, first_line: bytes) -> dict:
    try:
        header = json.loads(first_line) if first_line else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT or not isinstance(header.get("files"), list):
        raise ValueError(f"{path}: not a corpus snapshot part of format {FORMAT} (its first line is not the header)")
    return header


def _read_part(path: Path) -> tuple[dict, list[bytes]]:
    with lzma.open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    return _header(path, lines[0] if lines else b""), lines[1:]


def _state(parts: list[Path]) -> dict[str, dict]:
    """Per JSONL path, the rows and the sha256 the parts restore to, from the headers alone (each part decompressed
    only as far as its first line)."""
    state: dict[str, dict] = {}
    for part in parts:
        with lzma.open(part, "rb") as f:
            header = _header(part, f.readline())
        for entry in header["files"]:
            if "lines" in entry:
                state[_safe_relative(entry["path"], part)] = {"rows": entry["start"] + entry["lines"],
                                                              "sha256": entry["sha256"]}
    return state


def behind(out: Path | str, snapshots: Path | str) -> dict[str, tuple[int, int]]:
    """Per JSONL file of the corpus in ``out``, ``(rows the parts hold, whole rows the file has)`` where they differ:
    what a :func:`snapshot` now would add (a rewritten file counts as all its rows)."""
    out = Path(out).expanduser()
    held = {name: entry["rows"] for name, entry in _state(part_files(Path(snapshots))).items()}
    found = {}
    for name in _corpus_files(out) if out.is_dir() else []:
        if name.endswith(".jsonl"):
            rows = (out / name).read_bytes().count(b"\n")  # whole rows: a row still being written has no newline
            if rows != held.get(name, 0):
                found[name] = (held.get(name, 0), rows)
    return found


def _corpus_files(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*")
                  if p.is_file() and not p.is_symlink() and not any(SKIPPED.search(q) for q in p.relative_to(out).parts))


def snapshot(out: Path | str, snapshots: Path | str) -> Path | None:
    """Write the part holding what ``out`` gained since ``snapshots``' parts; returns it, or None when the JSONL
    files gained nothing (the manifest alone is not worth a part)."""
    out, snapshots = Path(out).expanduser(), Path(snapshots)
    if not (out / "MANIFEST.json").is_file():
        raise ValueError(f"{out}: no corpus here (no MANIFEST.json); give the folder of python -m tools.corpus build")
    parts = part_files(snapshots)
    before = _state(parts)
    entries, body = [], []
    for name in _corpus_files(out):
        path = out / name
        if not name.endswith(".jsonl"):
            entries.append({"path": name, "text": path.read_text(encoding="utf-8")})
            continue
        rows = _whole_rows(path)
        known = before.get(name)
        start, digest = 0, hashlib.sha256()
        if known and len(rows) >= known["rows"]:  # the rows the parts hold, unchanged: only what follows is new
            prefix = _sha(rows[:known["rows"]])
            if prefix.hexdigest() == known["sha256"]:
                start, digest = known["rows"], prefix
        if known and start == len(rows):
            continue
        new = rows[start:]
        entries.append({"path": name, "start": start, "lines": len(new), "prefix_sha256": digest.hexdigest(),
                        "sha256": _sha(new, digest.copy()).hexdigest()})
        body.extend(new)
    if not any("lines" in entry for entry in entries):
        return None
    snapshots.mkdir(parents=True, exist_ok=True)
    header = {"format": FORMAT, "part": len(parts) + 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "files": entries}
    target = snapshots / f"part-{len(parts) + 1:04d}.jsonl.xz"
    tmp = target.with_name(f".{target.name}.tmp")
    with lzma.open(tmp, "wb", preset=XZ_PRESET) as f:
        f.write(json.dumps(header, ensure_ascii=False).encode() + b"\n")
        f.writelines(body)
    tmp.replace(target)
    return target


def restore(snapshots: Path | str, out: Path | str) -> dict:
    """Rebuild ``out`` (absent or empty) from ``snapshots``' parts; returns ``{"parts": K, "rows": {path: n}}``.

    Raises:
        ValueError: ``out`` holds files, there are no parts, or a part is damaged or does not continue the
            rows before it.
    """
    snapshots, out = Path(snapshots), Path(out).expanduser()
    parts = part_files(snapshots)
    if not parts:
        raise ValueError(f"{snapshots}: no corpus snapshot parts (part-0001.jsonl.xz, ...) to restore")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty: restore into a new folder (the build resumes from it), or move this "
                         "one away")
    rows: dict[str, list[bytes]] = {}
    digests: dict[str, object] = {}  # each file's sha256 so far, going on with its next entry
    texts: dict[str, str] = {}
    for part in parts:
        header, lines = _read_part(part)
        at = 0
        for entry in header["files"]:
            name = _safe_relative(entry.get("path"), part)
            if "text" in entry:
                texts[name] = str(entry["text"])
                continue
            start, count = entry.get("start"), entry.get("lines")
            if not (isinstance(start, int) and isinstance(count, int) and start >= 0 and count >= 0):
                raise ValueError(f"{part}: {name}: start {start!r} and lines {count!r} must be whole numbers >= 0")
            have, digest = (rows.get(name, []), digests.get(name)) if start else ([], hashlib.sha256())
            if start and (len(have) != start or digest.hexdigest() != entry.get("prefix_sha256")):
                raise ValueError(f"{part}: {name} continues from row {start}, which the parts before it do not "
                                 "restore: a part is missing or from another corpus")
            new = lines[at:at + count]
            at += count
            if len(new) != count:
                raise ValueError(f"{part}: {name}: the header promises {count} rows, the part holds {len(new)}")
            rows[name], digests[name] = have + new, _sha(new, digest)
            if digests[name].hexdigest() != entry.get("sha256"):
                raise ValueError(f"{part}: {name}: its rows do not match the header's sha256: the part is damaged")
        if at != len(lines):
            raise ValueError(f"{part}: {len(lines) - at} rows beyond those its header lists: the part is damaged")
    for name, content in rows.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(content))
    for name, text in texts.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return {"parts": len(parts), "rows": {name: len(content) for name, content in sorted(rows.items())}}
