"""Every code block of the docs site and of the README is executed, or says why it is not.

See ``docblocks.py`` for the rules. Examples use registry models from the local cache (``make test``
fetches smollm2-135m-instruct before pytest), never the Hugging Face Hub.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import types

import pytest
import torch

from docblocks import PYTHON, ROOT, SHELL, all_blocks, pages, parse, unmet

torch.set_num_threads(1)

MODEL_WORDS = re.compile(r"load_model|from_pretrained|compare|bench|fetch|train-eagle|self-distill")


def test_every_block_is_run_or_says_why():
    problems = []
    for block in all_blocks():
        if block.marker == "not-run":
            if len(block.value.split()) < 2:
                problems.append(f"{block.where}: <!-- not-run: ... --> needs a reason of a few words")
            continue
        if not block.executable:
            what = "a shell command other than hf-speculative" if block.lang in SHELL else f"a {block.lang or 'plain'} block"
            problems.append(f"{block.where}: {what} that is not run: run it, or mark it <!-- not-run: why -->")
        if block.marker == "needs":
            if not block.requirements:
                problems.append(f"{block.where}: <!-- needs: --> lists no requirement")
            for requirement in block.requirements:
                try:
                    unmet(requirement)
                except ValueError as err:
                    problems.append(f"{block.where}: {err}")
    assert not problems, "\n".join(problems)


SAME_COMMAND = "runs this same command"  # a not-run reason: another page's block runs it (one run is enough)


def test_a_block_left_to_another_page_is_that_page_s_command():
    """A block not run because another page runs the same command (``<!-- not-run: ... runs this same command -->``)
    still is that command: its commands are those of a block that runs."""
    blocks = all_blocks()
    run = [b.cli_args for b in blocks if b.marker != "not-run" and b.executable and b.lang in SHELL]
    left = [b for b in blocks if b.marker == "not-run" and SAME_COMMAND in b.value]
    assert left  # docs/getting-started.md's showcase, run by README.md
    for block in left:
        assert block.cli_args and block.cli_args in run, f"{block.where}: no block that runs runs {block.cli_args}"


def test_the_parser_sees_markers_and_commands(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text(
        "Text\n\n```python\nx = 1\n```\n\n<!-- not-run: needs 8 GPUs -->\n```bash\naccelerate launch x\n```\n\n"
        "<!-- needs: gpu, transformers>=4.57 -->\n\n```bash\nhf-speculative compare \\\n  --model m  # the model\n"
        "python -m hf_speculative models list\n.venv/bin/hf-speculative models verify\n"
        ".venv/bin/python -m hf_speculative --help\n```\n\n```text\nout\n```\n"
    )
    monkeypatch.setattr("docblocks.ROOT", tmp_path)
    blocks = parse(page)
    assert [b.lang for b in blocks] == ["python", "bash", "bash", "text"]
    assert [b.marker for b in blocks] == [None, "not-run", "needs", None]
    assert blocks[1].value == "needs 8 GPUs" and not blocks[1].executable
    assert blocks[2].requirements == ["gpu", "transformers>=4.57"]
    assert blocks[2].cli_args == [["compare", "--model", "m"], ["models", "list"], ["models", "verify"], ["--help"]]
    assert blocks[0].executable and not blocks[3].executable


# the pages whose examples CI runs on both transformers versions: a newcomer's first steps. The others (a page per
# drafter, recipe, benchmark... 5-70 s each) run on 5.x only: they reach the library through the entry points that
# tests/hf, core, drafters and training check on both versions (Makefile: VERSION_GROUPS)
BOTH_VERSIONS_PAGES = {"README.md", "docs/getting-started.md"}


def _runnable_pages():
    out = []
    for page in pages():
        blocks = [b for b in parse(page) if b.marker != "not-run" and b.executable]
        if not blocks:
            continue
        code = "\n".join(b.code for b in blocks)
        marks = [pytest.mark.integration] if MODEL_WORDS.search(code) else []
        if str(page.relative_to(ROOT)) not in BOTH_VERSIONS_PAGES:
            marks.append(pytest.mark.single_version)
        out.append(pytest.param(page, id=str(page.relative_to(ROOT)), marks=marks))
    return out


@pytest.mark.parametrize("page", _runnable_pages())
def test_page_examples_run(page, tmp_path, monkeypatch):
    """The page's python blocks and hf-speculative commands, in page order, in a scratch folder laid
    out like the repository, with one torch thread."""
    from typer.testing import CliRunner

    from hf_speculative.cli.main import app

    work = tmp_path / "main"
    work.mkdir()
    monkeypatch.chdir(work)
    saved_env = dict(os.environ)
    # a real module, so that what the examples define (dataclasses, pickling) finds its module
    module = types.ModuleType("docs_example_" + re.sub(r"\W", "_", page.stem))
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    runner = CliRunner()
    ran, skipped = 0, []
    try:
        for block in parse(page):
            if block.marker == "not-run" or not block.executable:
                continue
            reasons = list(dict.fromkeys(r for r in (unmet(req) for req in block.requirements) if r))
            if reasons:
                skipped.append(f"{block.where}: {'; '.join(reasons)}")
                continue
            if block.lang in PYTHON:
                code = compile("\n" * block.line + block.code, str(ROOT / block.page), "exec")
                exec(code, namespace)  # noqa: S102 - the docs' own examples
            else:
                for args in block.cli_args:
                    result = runner.invoke(app, args, env={"COLUMNS": "200", "NO_COLOR": "1"})
                    if result.exit_code != 0:
                        raise AssertionError(
                            f"{block.where}: `hf-speculative {' '.join(args)}` exited {result.exit_code}:\n"
                            f"{result.output}\n{result.exception!r}"
                        ) from result.exception
            ran += 1
            torch.set_num_threads(1)  # a command may have changed it
    finally:
        sys.modules.pop(module.__name__, None)
        os.environ.clear()
        os.environ.update(saved_env)
        shutil.rmtree(work, ignore_errors=True)
    if not ran:
        pytest.skip("; ".join(skipped))
    if skipped:
        print("skipped blocks:\n" + "\n".join(skipped))
