"""Write (or check) the ``sha256sums.json`` of every drafter shipped inside the package.

Each shipped drafter folder (``hf_speculative/drafters/eagle/pretrained/<name>/``,
``hf_speculative/drafters/medusa/pretrained/<name>/``, ``hf_speculative/drafters/dflash/pretrained/<name>/``,
``hf_speculative/drafters/exit_adapters/<name>/``) carries the sha256 of its files, recorded at release;
loading a shipped drafter checks its files against it (``checkpoints.check_manifest``). Run after
changing a shipped drafter's files, in the repository's root::

    python -m tools.drafter_manifests          # rewrite the manifests
    python -m tools.drafter_manifests --check  # exit 1 if one is stale (tests/registry/test_integrity.py checks too)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hf_speculative.drafters.checkpoints import MANIFEST, shipped_names
from hf_speculative.registry.integrity import sha256_file


def shipped_folders() -> list[Path]:
    from hf_speculative.drafters.eagle.drafter import PRETRAINED_DIR
    from hf_speculative.drafters.self_speculative.exit_adapter import SHIPPED_DIR
    from hf_speculative.drafters.medusa.drafter import PRETRAINED_DIR as MEDUSA_DIR
    from hf_speculative.drafters.dflash.drafter import PRETRAINED_DIR as DFLASH_DIR

    roots = (PRETRAINED_DIR, MEDUSA_DIR, DFLASH_DIR, SHIPPED_DIR)
    return [root / name for root in roots for name in shipped_names(root)]


def manifest_of(folder: Path) -> dict:
    """The manifest the files of ``folder`` call for: every file but the manifest itself."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)
    return {"sha256": {p.name: sha256_file(p) for p in files}}


def text_of(manifest: dict) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when a manifest is stale")
    args = parser.parse_args(argv)
    stale = []
    for folder in shipped_folders():
        text = text_of(manifest_of(folder))
        path = folder / MANIFEST
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text)
            print(f"wrote {path}")
    if args.check and stale:
        print("stale: " + ", ".join(map(str, stale)) + " (run python -m tools.drafter_manifests)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
