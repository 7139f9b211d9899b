"""MkDocs hooks of this site (``hooks:`` in mkdocs.yml); not a page.

Pages written by another issue may land after the pages that link to them. Until one does, its
nav entry is dropped and links to it become plain text, so that ``mkdocs build --strict`` keeps
passing; once the file exists, nothing here changes anything.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.optional_pages")

# page (relative to docs/) -> the issue that writes it
OPTIONAL_PAGES = {"spaces.md": "issue 5, the Gradio app"}


def _missing(config) -> set[str]:
    docs = Path(config["docs_dir"])
    return {page for page in OPTIONAL_PAGES if not (docs / page).is_file()}


def _prune(nav, missing: set[str]):
    out = []
    for item in nav:
        if isinstance(item, dict):
            (title, value), = item.items()
            if isinstance(value, list):
                value = _prune(value, missing)
                if value:
                    out.append({title: value})
            elif value not in missing:
                out.append(item)
        elif item not in missing:
            out.append(item)
    return out


def on_config(config):
    missing = _missing(config)
    for page in sorted(missing):
        log.info("docs/%s is not written yet (%s): left out of the nav", page, OPTIONAL_PAGES[page])
    if missing and config.get("nav"):
        config["nav"] = _prune(config["nav"], missing)
    return config


def on_page_markdown(markdown, page, config, files):
    for target in _missing(config):
        # [text](spaces.md) or [text](../spaces.md#anchor) -> text (the page is not there yet)
        pattern = r"\[([^\]]+)\]\((?:\.\./)*" + re.escape(target) + r"(?:#[^)]*)?\)"
        markdown = re.sub(pattern, r"\1", markdown)
    return markdown
