"""Carry a model folder to the lent GPU machine in parts: each call takes at most 64 MiB there, and what an earlier
call left in an ignored folder stays for the next one while the machine is warm.

    python -m tools.carry split ~/.cache/hf_speculative/models/smollm2-135m-instruct/transformers-5 carry \
        --dtype bfloat16                    # carry/part-000 ... + carry/manifest.json, each part <= 60 MiB
    # one device call per part (run(..., carry=["carry/manifest.json", "carry/part-000"]), then part-001, ...)
    python -m tools.carry join carry /tmp/smollm2   # on the device: every part and every file checked by sha256

``split`` can first store the floating-point weights of ``*.safetensors`` files in another dtype (bfloat16 halves
an fp32 checkpoint). The parts are the folder's files concatenated in name order and cut every ``--part-mib``;
``join`` refuses a missing or damaged part, naming which, before it writes anything.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

PART_MIB = 60  # under the 64 MiB a call carries, with room for the manifest
MANIFEST = "manifest.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _converted(source: Path, dtype: str, scratch: Path) -> Path:
    """A copy of ``source`` whose safetensors weights are stored in ``dtype`` (floating-point tensors only)."""
    import torch
    from safetensors.torch import load_file, save_file

    target = getattr(torch, dtype, None)
    if not isinstance(target, torch.dtype) or not target.is_floating_point:
        raise SystemExit(f"--dtype {dtype!r}: use a floating-point torch dtype such as bfloat16 or float16.")
    for path in sorted(source.iterdir()):
        if path.is_file() and path.suffix == ".safetensors":
            weights = {k: (v.to(target) if v.is_floating_point() else v) for k, v in load_file(path).items()}
            save_file(weights, scratch / path.name, metadata={"format": "pt"})
        elif path.is_file():
            shutil.copy2(path, scratch / path.name)
    return scratch


def split(source: Path, out: Path, *, part_bytes: int = PART_MIB << 20, dtype: str | None = None) -> dict:
    """Write ``out/part-NNN`` (each at most ``part_bytes``) and ``out/manifest.json`` for the files directly in
    ``source``. Returns the manifest."""
    if not source.is_dir():
        raise SystemExit(f"{source}: not a folder; give the model's folder (config.json, *.safetensors, ...).")
    if part_bytes < 1:
        raise SystemExit("--part-mib: give at least 1.")
    with tempfile.TemporaryDirectory() as scratch:
        folder = _converted(source, dtype, Path(scratch)) if dtype else source
        files = [p for p in sorted(folder.iterdir()) if p.is_file()]
        stream = b"".join(p.read_bytes() for p in files)
        manifest = {"files": [{"name": p.name, "size": p.stat().st_size, "sha256": _sha256(p.read_bytes())}
                              for p in files], "dtype": dtype, "parts": []}
    out.mkdir(parents=True, exist_ok=True)
    for index, start in enumerate(range(0, len(stream), part_bytes)):
        chunk = stream[start:start + part_bytes]
        name = f"part-{index:03d}"
        (out / name).write_bytes(chunk)
        manifest["parts"].append({"name": name, "size": len(chunk), "sha256": _sha256(chunk)})
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def join(parts: Path, dest: Path) -> list[Path]:
    """Check every part against the manifest, then rebuild the files in ``dest`` and check each. Returns them."""
    manifest_path = parts / MANIFEST
    if not manifest_path.is_file():
        raise SystemExit(f"{manifest_path}: no manifest; carry {MANIFEST} with the first part.")
    manifest = json.loads(manifest_path.read_text())
    chunks = []
    for part in manifest["parts"]:
        path = parts / part["name"]
        if not path.is_file():
            raise SystemExit(f"{path}: missing; carry it (one device call per part) and join again.")
        data = path.read_bytes()
        if len(data) != part["size"] or _sha256(data) != part["sha256"]:
            raise SystemExit(f"{path}: damaged (size or sha256 differs from the manifest); carry it again.")
        chunks.append(data)
    stream = b"".join(chunks)
    dest.mkdir(parents=True, exist_ok=True)
    written, offset = [], 0
    for entry in manifest["files"]:
        data = stream[offset:offset + entry["size"]]
        offset += entry["size"]
        if _sha256(data) != entry["sha256"]:
            raise SystemExit(f"{entry['name']}: rebuilt with a wrong sha256; split the folder again.")
        path = dest / entry["name"]
        path.write_bytes(data)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cut = commands.add_parser("split", help="a folder -> parts of at most --part-mib MiB and a manifest")
    cut.add_argument("source", type=Path)
    cut.add_argument("out", type=Path)
    cut.add_argument("--part-mib", type=int, default=PART_MIB)
    cut.add_argument("--dtype", default=None, help="store floating-point safetensors weights in this dtype first")
    glue = commands.add_parser("join", help="parts and manifest -> the folder, every piece checked")
    glue.add_argument("parts", type=Path)
    glue.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    if args.command == "split":
        manifest = split(args.source, args.out, part_bytes=args.part_mib << 20, dtype=args.dtype)
        print(f"{len(manifest['parts'])} parts in {args.out}: " + ", ".join(p["name"] for p in manifest["parts"]))
    else:
        files = join(args.parts, args.dest)
        print(f"{len(files)} files in {args.dest}, every sha256 checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
