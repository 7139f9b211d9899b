"""The files a Hugging Face Space reads: README front matter, requirements.txt, app.py."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

import gradio
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _front_matter() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n"), "the Spaces front matter must open README.md"
    block = text[4 : text.index("\n---\n", 4)]
    return dict(re.match(r"^(\w+):\s*(.*)$", line).groups() for line in block.splitlines() if line.strip())


def _setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config


def _requirements(text: str) -> list[Requirement]:
    return [Requirement(line) for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_front_matter_describes_a_gradio_space():
    meta = _front_matter()
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py" and (ROOT / "app.py").is_file()
    assert meta["python_version"] == '"3.11"', "Spaces reads an unquoted 3.10 as 3.1: keep it quoted"
    assert meta["title"]
    # the sdk_version Spaces installs satisfies the app extra, and has the major version the tests ran on
    app_extra = _requirements(_setup_cfg()["options.extras_require"]["app"])
    gradio_pin = next(r for r in app_extra if r.name == "gradio")
    assert Version(meta["sdk_version"]) in gradio_pin.specifier
    assert Version(meta["sdk_version"]).major == Version(gradio.__version__).major


SPACE_EXTRAS = ("app", "registry")  # the demo app, and the registry it fetches its models from


def test_requirements_are_the_package_and_the_apps_extras():
    """requirements.txt = install_requires + the [app] and [registry] extras (less gradio), same specifiers."""
    extras = _setup_cfg()["options.extras_require"]
    wanted = _requirements(_setup_cfg()["options"]["install_requires"])
    wanted += [r for extra in SPACE_EXTRAS for r in _requirements(extras[extra]) if r.name != "gradio"]
    have = {r.name.lower(): r for r in _requirements((ROOT / "requirements.txt").read_text())}
    for req in wanted:
        assert req.name.lower() in have, f"requirements.txt lacks {req}"
        assert str(have[req.name.lower()].specifier) == str(req.specifier), f"{req} differs in requirements.txt"
    assert "gradio" not in have, "Spaces installs gradio from the README's sdk_version"
    unexpected = set(have) - {r.name.lower() for r in wanted}
    assert not unexpected, f"requirements.txt lists {sorted(unexpected)}, which the app does not need"


def test_importing_app_py_builds_and_launches_nothing():
    code = ("import sys, runpy; ns = runpy.run_path('app.py', run_name='not_main'); "
            "assert 'gradio' not in sys.modules, 'gradio imported at import time'; "
            "assert callable(ns['build_app']); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_app_py_build_app_returns_blocks_with_a_bounded_queue():
    import runpy

    import torch

    from hf_speculative.app.cache import ModelCache

    build_app = runpy.run_path(str(ROOT / "app.py"), run_name="not_main")["build_app"]
    demo = build_app(cache=ModelCache(device=torch.device("cpu")), max_queue=5)
    assert isinstance(demo, gradio.Blocks)
    assert demo._queue.max_size == 5 and demo._queue.default_concurrency_limit == 1


@pytest.mark.parametrize("page", ["docs/spaces.md"])
def test_deploy_page_exists_and_links_its_screenshot(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    for needle in ("CPU", "GPU", "sdk_version", "requirements.txt", "make demo"):
        assert needle in text, f"{page} does not mention {needle}"
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (ROOT / "docs" / image).is_file(), f"{page} shows a missing image {image}"
