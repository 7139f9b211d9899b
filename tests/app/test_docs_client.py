"""docs/app.md's gradio_client example, run as written against an app served here (the docs tests cannot start one:
the block is marked not-run there). Only its URL is replaced, by the served app's."""

from __future__ import annotations

import contextlib
import io

from tests.docs.docblocks import DOCS, parse

DOCS_URL = "http://127.0.0.1:7860/"


def _client_example() -> str:
    blocks = [b for b in parse(DOCS / "app.md") if b.lang == "python" and "gradio_client" in b.code]
    assert len(blocks) == 1, "docs/app.md has one gradio_client example"
    assert DOCS_URL in blocks[0].code and "tests/app/test_docs_client.py" in blocks[0].value
    return blocks[0].code


def test_the_docs_gradio_client_example_runs_as_written(served_app):
    code = _client_example().replace(DOCS_URL, served_app[0])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/app.md", "exec"), {})  # noqa: S102 - the page's own example
    lines = [line for line in printed.getvalue().splitlines() if not line.startswith("Loaded as API:")]
    assert lines[0].startswith("Done: 3/3 methods"), lines
    rows = [line.split() for line in lines[1:]]
    assert [row[0] for row in rows] == ["greedy", "prompt-lookup", "hf-prompt-lookup"]
    assert all(row[-1] == "True" for row in rows[1:]), "both methods wrote greedy's text"
