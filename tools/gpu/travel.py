"""What a lent GPU call carries, and the tracked folders it does not need set aside while it runs.

A device call sends the working tree (tracked files and untracked ones git does not ignore) and at most 64 MiB in
all. The shipped drafters alone are about 58 MB, so the tree leaves too little room for a model part:

    python -m tools.gpu.travel size              # MiB that would travel now, and the largest folders
    python -m tools.gpu.travel aside             # move ASIDE (not needed on the GPU) into .aside/ (ignored)
    ... the device calls (tools/gpu/lent_real.sh) ...
    python -m tools.gpu.travel back              # put them back; refuses to overwrite anything

Set aside: the DFlash drafter and the exit adapters (the real step runs EAGLE, Medusa, lookup and suffix), the
benchmark results and the docs' images. ``back`` must run before committing: git would see them deleted.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ASIDE = ("hf_speculative/drafters/dflash/pretrained", "hf_speculative/drafters/self_speculative/exit_adapters",
         "benchmarks/results", "docs/img")
STASH = ".aside"
LIMIT_MIB = 64


def travelling(root: Path) -> list[Path]:
    """The files a device call sends: tracked ones present and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            check=True, capture_output=True).stdout.split(b"\0")
    return [root / name.decode() for name in listed if name and (root / name.decode()).is_file()]


def size(root: Path) -> tuple[float, list[tuple[str, float]]]:
    """MiB travelling, and the ten largest top-two-level folders in MiB."""
    by_folder: Counter[str] = Counter()
    total = 0
    for path in travelling(root):
        n = path.stat().st_size
        total += n
        by_folder["/".join(path.relative_to(root).parts[:3][:-1] or ["."])] += n
    return total / 2**20, [(k, v / 2**20) for k, v in by_folder.most_common(10)]


def _move(root: Path, into_stash: bool) -> list[str]:
    """Move each folder of ``ASIDE`` between its place and ``.aside/`` (same relative path); refuse, naming it,
    where the destination exists already. Returns the folders moved."""
    moved = []
    for rel in ASIDE:
        place, stash = root / rel, root / STASH / rel
        source, target = (place, stash) if into_stash else (stash, place)
        if not source.exists():
            continue
        if target.exists() and into_stash:
            raise SystemExit(f"{stash} exists already: put it back first (python -m tools.gpu.travel back).")
        if target.exists():
            raise SystemExit(f"{place} exists and {stash} too: compare them and remove one by hand.")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), str(target))
        moved.append(rel)
    return moved


def aside(root: Path) -> list[str]:
    """Move each present folder of ``ASIDE`` under ``.aside/``."""
    return _move(root, into_stash=True)


def back(root: Path) -> list[str]:
    """Move every folder set aside back to its place."""
    return _move(root, into_stash=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("size", "aside", "back"))
    parser.add_argument("--root", type=Path, default=Path.cwd())
    args = parser.parse_args(argv)
    if args.command == "aside":
        print("set aside:", ", ".join(aside(args.root)) or "nothing")
    elif args.command == "back":
        print("put back:", ", ".join(back(args.root)) or "nothing")
    total, largest = size(args.root)
    print(f"{total:.1f} MiB travel ({LIMIT_MIB} MiB a call, with the carried parts); room for a part: "
          f"{max(0.0, LIMIT_MIB - 1 - total):.1f} MiB")
    for folder, mib in largest:
        print(f"  {mib:7.2f} MiB  {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
