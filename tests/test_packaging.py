"""setup.cfg's package_data ships every data file the package needs at run time (the CPU kernel's
source, the shipped drafters' configs and weights) in wheels, not only in editable installs."""

from __future__ import annotations

from pathlib import Path

from setuptools.config.setupcfg import read_configuration

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_speculative"


def test_package_data_covers_the_runtime_files():
    patterns = read_configuration(str(ROOT / "setup.cfg"))["options"]["package_data"]["hf_speculative"]
    shipped = {path for pattern in patterns for path in PACKAGE.glob(pattern)}
    needed = [PACKAGE / "csrc" / "skinny_linear.cpp"]
    for folder in ("drafters/eagle/pretrained", "drafters/exit_adapters"):
        needed += [p for p in (PACKAGE / folder).glob("*/*") if p.suffix in (".json", ".safetensors")]
    assert len(needed) >= 5
    missing = [str(p.relative_to(ROOT)) for p in needed if p not in shipped]
    assert not missing, f"setup.cfg [options.package_data] does not ship {missing} (one pattern per line)"
