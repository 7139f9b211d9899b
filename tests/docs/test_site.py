"""``mkdocs build --strict`` of the docs site, offline, into a scratch folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from docblocks import DOCS, ROOT

pytestmark = pytest.mark.single_version  # the site's build: CI runs it on 5.x only

# Any attempt to reach the network fails fast: the build must need none.
OFFLINE = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "",
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": "",
           "NO_MKDOCS_2_WARNING": "1"}


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return out


def _config() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # mkdocs' !ENV etc.
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            __import__(module)
        except ImportError:
            pytest.fail(f"{module} is missing: install the docs extra (pip install -e '.[docs]'; `make test` does)")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(out)],
        cwd=ROOT, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    BUILD_LOG.append(proc.stdout + proc.stderr)
    return out


BUILD_LOG: list[str] = []  # the build's output, for the tests that read its messages


def test_site_builds_strictly_offline(site):
    assert (site / "index.html").is_file()
    for html in site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text, html


def test_every_page_is_in_the_nav_and_built(site):
    nav = _nav_pages(_config()["nav"])
    written = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    missing_from_nav = written - set(nav)
    assert not missing_from_nav, f"pages not in mkdocs.yml's nav: {sorted(missing_from_nav)}"
    for page in nav:
        if page not in written:
            assert page == "spaces.md", f"nav names {page}, which is not in docs/"  # written by issue 5
            continue
        built = site / ("index.html" if page == "index.md" else page[: -len(".md")] + "/index.html")
        assert built.is_file(), built


def test_api_reference_is_rendered_from_docstrings(site):
    text = (site / "api" / "drafters" / "index.html").read_text(encoding="utf-8")
    for needle in ("PromptLookup", "DraftModel", "Eagle", "num_tokens", "confidence_threshold"):
        assert needle in text
    assert "N-gram lookup over the prompt and the generated text" in text


def test_signatures_are_formatted(site):
    """mkdocstrings formats the API reference's separate signatures with Ruff (or Black); without either
    it says so, at INFO level, which --strict lets through: the [docs] extra must bring one."""
    assert "Formatting signatures requires" not in BUILD_LOG[-1], (
        "mkdocstrings found neither Ruff nor Black: add ruff to setup.cfg's [docs] extra")


def test_code_and_tables_stay_inside_the_column(site):
    """docs/stylesheets/extra.css (code wraps, wide tables scroll inside the column) is on every page."""
    css = site / "stylesheets" / "extra.css"
    assert css.is_file()
    assert "pre-wrap" in css.read_text(encoding="utf-8")
    for html in (site / "index.html", site / "troubleshooting" / "index.html"):
        assert "stylesheets/extra.css" in html.read_text(encoding="utf-8"), html
