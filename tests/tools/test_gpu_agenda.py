"""Issue 69's GPU agenda, ``make gpu-check GPU_STEPS=inflated``: its dry run on this CPU (``DEVICE=cpu TINY=1``: the
same step, the same arms and reports, at a small inflation and a few tokens; only the device and torch.compile
differ), and the DFlash drafter carried to a lent GPU in the model's parts (``tools/gpu/travel.py`` pack, unpack)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import carry
from tools.gpu import travel
from tools.gpu.inflate import COST_MODEL

ROOT = Path(__file__).resolve().parents[2]
DRAFTER_ARMS = ("EAGLE tree 32", "EAGLE chain", "DFlash tree 32", "Medusa tree")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.single_version
def test_the_inflated_agenda_dry_run_on_the_cpu(tmp_path):
    """SmolLM2 and its shipped drafters inflated (576 -> 640 channels, 30 -> 32 layers), every arm through our loop on
    the static cache against transformers' static-cache greedy: every output identical to it and to SmolLM2's own
    greedy text, real acceptance somewhere, every table headed as a cost model, results within what a lent call
    brings back (8 files of 16 MiB)."""
    out = tmp_path / "gc"
    done = subprocess.run(["make", "-s", "gpu-check", "DEVICE=cpu", "TINY=1", "GPU_STEPS=inflated",
                           f"GPU_CHECK_OUT={out}", f"GPU_PY={sys.executable}", "GPU_BENCH="],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert COST_MODEL in done.stdout
    inflated = json.loads((out / "report.json").read_text())["inflated"]
    assert inflated == json.loads((out / "inflated_e2e.json").read_text())
    assert inflated["label"] == COST_MODEL and inflated["inflated"]["label"] == COST_MODEL
    shape = inflated["shape"]
    assert (shape["hidden_size"], shape["num_layers"], inflated["dtype"]) == (640, 32, "float32")
    arms = inflated["arms"]
    expected = {"transformers greedy (static cache)", "prompt lookup, compiled",
                *(f"{arm}, compiled{fixed}" for arm in DRAFTER_ARMS for fixed in ("", ", fixed"))}
    assert set(arms) == expected
    for label, arm in arms.items():
        assert "error" not in arm, (label, arm)
        assert arm["prompts"] == arm["identical"] == arm["identical_to_small"] == 1, (label, arm)
        assert arm["tokens_per_s"] > 0 and arm[f"vs {'transformers greedy (static cache)'}"] > 0
    for arm in DRAFTER_ARMS:  # drafting their whole budget: every step drafts and verifies
        fixed = arms[f"{arm}, compiled, fixed"]
        assert fixed["draft_ms_per_step"] > 0 < fixed["verify_ms_per_step"] and fixed["tau"] >= 1.0, arm
        assert fixed["drafting_in_greedy_tokens"] > 0 and fixed["speedup_per_tau"] > 0, arm
    assert max(arm.get("tau", 0) for arm in arms.values()) > 1.0  # the real drafters' drafts were accepted
    summary = (out / "summary.md").read_text()
    assert f"## {COST_MODEL}: smollm2-135m-instruct -> smollm2-wide" in summary
    assert "| arm (inflated, cost model) |" in summary
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(p.stat().st_size <= 16 << 20 for p in files), files


def _repo(tmp_path: Path) -> Path:
    """A repository with a tracked DFlash drafter folder (3 MiB) and 1 MiB of other tracked files."""
    root = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text(".aside/\ncarry/\n")
    for rel, size in {f"{travel.DFLASH}/smol/model.safetensors": 3 << 20, f"{travel.DFLASH}/smol/config.json": 100,
                      "pkg/code.py": 1 << 20}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(os.urandom(size))
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    return root


def test_pack_carries_the_set_aside_dflash_drafter_in_parts_that_fit_and_unpack_puts_it_back(tmp_path, monkeypatch):
    root = _repo(tmp_path)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "llm_model-1.0-py3-none-any.whl").write_bytes(os.urandom(5 << 20))
    monkeypatch.setattr(travel, "LIMIT_MIB", 5)  # a call of 5 MiB: the tree takes 1, the manifest's margin 1
    with pytest.raises(SystemExit, match="travel aside"):
        travel.pack(root, wheels, root / "carry")  # the drafter must not travel twice (in the tree and the parts)
    stashed = {p.name: p.read_bytes() for p in (root / travel.DFLASH / "smol").iterdir()}
    travel.aside(root)
    manifest = travel.pack(root, wheels, root / "carry")
    room = int(5 - 1 - travel.size(root)[0])
    carried = sum(f["size"] for f in manifest["files"])  # 5 MiB of wheel, 3 MiB of drafter and the tar's headers
    assert room == 2 and len(manifest["parts"]) == -(-carried // (room << 20)) == 5
    assert all(part["size"] <= room << 20 for part in manifest["parts"])
    assert {f["name"] for f in manifest["files"]} == {"llm_model-1.0-py3-none-any.whl", travel.DFLASH_TAR}
    # the device: a copy of the tree as it travels (the drafter set aside), the parts joined
    pkg = tmp_path / "pkg"
    carry.join(root / "carry", pkg)
    wheel = "llm_model-1.0-py3-none-any.whl"
    assert (pkg / wheel).read_bytes() == (wheels / wheel).read_bytes()
    assert travel.unpack(root, pkg) == ["smol"]
    assert {p.name: p.read_bytes() for p in (root / travel.DFLASH / "smol").iterdir()} == stashed
    assert travel.unpack(root, pkg) == []  # there already: left alone
    assert travel.unpack(root, tmp_path) == []  # nothing carried
