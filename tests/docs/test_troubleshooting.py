"""docs/troubleshooting.md explains every error message the package raises (and every warning it logs).

The package's source (and ``make gpu-check``'s runner, ``tools/gpu/``) is parsed (``ast``) for message sites:
``raise SomeError("...")``, the CLI's ``_fail("...")``, ``typer.BadParameter("...")``, ``logger.warning("...")``
and ``warnings.warn("...")``.
Each message becomes a template, its literal text with ``{…}`` where values are formatted in.
Sites whose message is not literal (``_fail(str(err))``, re-raises), or whose literal text is shorter than
a quote may be (``f"{where}.members: {error}"``), pass on a message raised, and covered, elsewhere.

The page quotes messages in its ``###`` headings, as code spans: a distinctive fragment, with ``…``
for the parts that vary (``DraftModel(num_tokens=…): must be >= 1.``). A site is covered when one
quote's pieces appear in its template, in order. So a new ``raise`` anywhere in the package fails
this test until the page says what the message means and how to fix it, and a quote that no longer
matches any message (the message changed or went away) fails it too.

An entry is one or more ``###`` headings followed by its text, which says ``Cause:`` and then
``Fix:``. A few entries quote a message of transformers itself that users of the package meet (a
heading ending in ``(transformers)``); each is reproduced or found in transformers' source here, so
that it stays the real text. Set-up entries may quote pip or the shell (a heading ending in ``(pip)``
or ``(shell)``): those messages are neither the package's nor checked against it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from pathlib import Path

import pytest
from docblocks import DOCS, ROOT

import hf_speculative as hfs
from tests.conftest import build_model, prompt_inputs

PACKAGE = ROOT / "hf_speculative"
# the package, and the runner of `make gpu-check` (docs/gpu.md), which lives outside it beside the tests it runs
SOURCES = (PACKAGE, ROOT / "tools" / "gpu")
PAGE = DOCS / "troubleshooting.md"
HOLE = "{…}"
MIN_QUOTE = 12  # characters of literal text a quote needs to be distinctive
FOREIGN = " (transformers)"  # a heading quoting transformers' own message ends so
OUTSIDE = (" (pip)", " (shell)")  # headings quoting pip or the shell (setting up), checked against nothing
_MESSAGE_CALLS = {"_fail", "BadParameter", "warning", "warn", "error", "exception"}
# helpers that raise a message their caller writes, passed by keyword
_MESSAGE_KEYWORDS = {"find_folder": "missing"}


@dataclasses.dataclass
class Site:
    path: str
    line: int
    kind: str
    template: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.kind}: {self.template!r}"


def _template(node: ast.AST) -> str | None:
    """The literal text of a message expression with ``{…}`` for formatted values; None if dynamic."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is None and right is None:
            return None
        return (left or HOLE) + (right or HOLE)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = _template(node.left)
        return None if left is None else re.sub(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfx]", HOLE, left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        base = _template(node.func.value)
        return None if base is None else re.sub(r"\{[^{}]*\}", HOLE, base)
    return None


def _resolve(arg: ast.AST, site: ast.AST, scopes: list[ast.AST]) -> ast.AST:
    """A message passed as a variable (``message = f"..."; raise Error(message)``): the last
    assignment to that name before the site in the innermost function around it."""
    if not isinstance(arg, ast.Name):
        return arg
    around = [f for f in scopes if f.lineno <= site.lineno <= (f.end_lineno or f.lineno)]
    if not around:
        return arg
    function = max(around, key=lambda f: f.lineno)
    values = [n.value for n in ast.walk(function) if isinstance(n, ast.Assign) and n.lineno < site.lineno
              and any(isinstance(t, ast.Name) and t.id == arg.id for t in n.targets)]
    return max(values, key=lambda v: v.lineno) if values else arg


def _message_template(arg: ast.AST, site: ast.AST, scopes: list[ast.AST]) -> str | None:
    """The template of a message argument: a variable resolved as in :func:`_resolve`, and in an f-string
    the variables formatted into it that hold a message of their own (``raise Error(f"{message} ({known})")``
    after ``message = f"unknown option {key!r} ..."``) replaced by their templates."""
    node = _resolve(arg, site, scopes)
    if not isinstance(node, ast.JoinedStr):
        return _template(node)
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(value.value)
            continue
        inner = value.value if isinstance(value, ast.FormattedValue) else None
        resolved = _resolve(inner, site, scopes) if isinstance(inner, ast.Name) else None
        text = _template(resolved) if resolved is not None and resolved is not inner else None
        parts.append(text if text is not None else HOLE)
    return "".join(parts)


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def message_sites(sources: Path | tuple[Path, ...] = SOURCES, root: Path = ROOT) -> list[Site]:
    sites = []
    folders = [sources] if isinstance(sources, Path) else sources
    for path in sorted(p for folder in folders for p in folder.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                call, kind = node.exc, _call_name(node.exc)
            elif isinstance(node, ast.Call) and _call_name(node) in _MESSAGE_CALLS and node.args:
                call, kind = node, _call_name(node)
                if kind == "BadParameter":
                    continue  # seen as a raise
            elif isinstance(node, ast.Call) and _call_name(node) in _MESSAGE_KEYWORDS:
                keyword = next((k for k in node.keywords if k.arg == _MESSAGE_KEYWORDS[_call_name(node)]), None)
                if keyword is None:
                    continue
                call, kind = ast.Call(func=node.func, args=[keyword.value], keywords=[]), _call_name(node)
            else:
                continue
            template = _message_template(call.args[0], node, scopes)
            if template is None or len(template.replace(HOLE, "").strip()) < MIN_QUOTE:
                continue  # a message formatted from others (``f"{where}: {error}"``) passes theirs on
            sites.append(Site(str(path.relative_to(root)), node.lineno, kind, template))
    return sorted(sites, key=lambda site: (site.path, site.line))


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _heading_quotes(line: str) -> list[str]:
    quotes = []
    for match in re.finditer(r"(`+)(.+?)\1", line):
        quote = match[2]
        if quote.startswith(" ") and quote.endswith(" "):
            quote = quote[1:-1]
        quotes.append(quote)
    return quotes


def page_quotes(page: Path = PAGE, foreign: bool = False) -> list[str]:
    """Code spans in the page's ``###``/``####`` headings: the package's messages, or with
    ``foreign=True`` those of the headings that quote transformers."""
    quotes = []
    for line in page.read_text(encoding="utf-8").splitlines():
        if not re.match(r"^#{3,4} ", line) or line.rstrip().endswith(OUTSIDE):
            continue
        if line.rstrip().endswith(FOREIGN) == foreign:
            quotes.extend(_heading_quotes(line))
    return quotes


@dataclasses.dataclass
class Entry:
    headings: list[str]
    text: str
    line: int


def page_entries(page: Path = PAGE) -> list[Entry]:
    """The page's entries: consecutive ``###`` headings (one text may explain several messages) and
    the text up to the next heading."""
    entries: list[Entry] = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("### "):
            if entries and not entries[-1].text.strip():
                entries[-1].headings.append(line)
            else:
                entries.append(Entry([line], "", number))
        elif line.startswith(("# ", "## ")):
            entries.append(Entry([], "", number))  # ends the entry before it
        elif entries:
            entries[-1].text += line + "\n"
    return [e for e in entries if e.headings]


@functools.cache
def _quote_pattern(quote: str) -> re.Pattern | None:
    # compiled once per quote: every quote meets every message site (hundreds by hundreds), past re's own cache
    pieces = [_normalise(p) for p in quote.split("…") if p.strip()]
    return re.compile(".*?".join(re.escape(p) for p in pieces), re.S) if pieces else None


@functools.cache
def _normalised(template: str) -> str:
    return _normalise(template)


def _matches(quote: str, template: str) -> bool:
    pattern = _quote_pattern(quote)
    return pattern is not None and pattern.search(_normalised(template)) is not None


def test_every_message_is_explained():
    quotes = page_quotes()
    sites = message_sites()
    assert len(sites) > 40, "the parser found too few messages; has it broken?"
    missing = [str(site) for site in sites if not any(_matches(q, site.template) for q in quotes)]
    assert not missing, (
        f"{len(missing)} message(s) of the package are not explained in docs/troubleshooting.md. Add a "
        "`### `fragment of the message`` heading (… for the variable parts) with its meaning and the fix:\n"
        + "\n".join(missing)
    )


def test_every_quote_is_a_real_message():
    templates = [site.template for site in message_sites()]
    problems = []
    for quote in page_quotes():
        if len(quote.replace("…", "").strip()) < MIN_QUOTE:
            problems.append(f"{quote!r}: too short to be distinctive (at least {MIN_QUOTE} characters)")
        elif not any(_matches(quote, t) for t in templates):
            problems.append(f"{quote!r}: matches no message of the package (changed or removed?)")
    assert not problems, "docs/troubleshooting.md:\n" + "\n".join(problems)


def test_every_entry_says_cause_and_fix():
    problems = []
    for entry in page_entries():
        where = f"line {entry.line} ({entry.headings[0]})"
        if any(not _heading_quotes(h) for h in entry.headings):
            problems.append(f"{where}: a ### heading quotes no message (a `code span`)")
        cause, fix = re.search(r"\bCause:", entry.text), re.search(r"\bFix:", entry.text)
        if not cause or not fix or fix.start() < cause.start():
            problems.append(f"{where}: the text must say Cause: ... then Fix: ...")
    assert not problems, "docs/troubleshooting.md:\n" + "\n".join(problems)


def test_forgetting_enable_is_the_first_entry_quoting_transformers_own_words():
    """Passing ``candidate_generator=`` to a model that was not enabled fails inside transformers, with
    its words: the page quotes them exactly, first."""
    foreign = page_quotes(foreign=True)
    assert page_entries()[0].headings[0].rstrip().endswith(FOREIGN), "the first entry is the forgotten enable()"
    model = build_model("llama")
    with pytest.raises(ValueError) as raised:
        model.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=hfs.PromptLookup())
    assert [q for q in foreign if _matches(q, str(raised.value))] == foreign[:1], str(raised.value)
    assert foreign[1:] == list(TRANSFORMERS_SOURCES), "a new (transformers) entry needs its own check in this test"


# transformers' messages quoted by the page after the first: the module whose source raises each, and the
# transformers versions that have it
TRANSFORMERS_SOURCES = {
    "accelerate is required when loading a GGUF file": ("transformers.modeling_utils", "5"),
}


def test_other_transformers_messages_are_transformers_own_words():
    """Messages of transformers that the package cannot easily provoke (accelerate missing while reading a
    GGUF file) are looked up in transformers' own source, where the installed version raises them."""
    import importlib
    import inspect

    import transformers
    from packaging.version import Version

    checked = 0
    for quote, (module, since) in TRANSFORMERS_SOURCES.items():
        if Version(transformers.__version__) < Version(since):
            continue
        source = inspect.getsource(importlib.import_module(module))
        assert _matches(quote, source), f"{module} of transformers {transformers.__version__} no longer says {quote!r}"
        checked += 1
    if not checked:
        pytest.skip(f"transformers {transformers.__version__} raises none of these messages")


def test_entries_are_parsed_with_their_headings(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# T\n\n## A\n\n### `first message`\n\n### `second message`\n\nCause: x\n\nFix: y\n\n"
                    "## B\n\n### `third message` (transformers)\n\nonly text\n\n"
                    "### `fourth: command not found` (shell)\n\nCause: x\n\nFix: y\n")
    entries = page_entries(page)
    assert [len(e.headings) for e in entries] == [2, 1, 1]
    assert "Fix: y" in entries[0].text and entries[1].text.strip() == "only text"
    assert page_quotes(page) == ["first message", "second message"]
    assert page_quotes(page, foreign=True) == ["third message"]


def test_templates_and_matching(tmp_path):
    source = tmp_path / "pkg" / "m.py"
    source.parent.mkdir()
    source.write_text(
        "def f(x, err):\n"
        "    if x:\n"
        "        raise ValueError(f'Thing(n={x}): must be >= 1.')\n"
        "    if err:\n"
        "        raise RuntimeError(str(err))\n"
        "    raise OSError('pip failed (exit %s) for %s' % (1, 2))\n"
        "    _fail(f'cannot load model {x!r}: ' + str(err))\n"
        "def g(path):\n"
        "    message = f'Cannot read {path}; it is corrupt.'\n"
        "    raise KeyError(message)\n"
        "def h(name):\n"
        "    return find_folder(name, DIR, missing=f'No widget at {name!r}: give a folder.')\n"
        "def k(key, known):\n"
        "    message = f'unknown option {key!r}'\n"
        "    raise ValueError(f'{message} ({known})')\n"
    )
    sites = message_sites(tmp_path / "pkg", root=tmp_path)
    assert [s.template for s in sites] == ["Thing(n={…}): must be >= 1.", "pip failed (exit {…}) for {…}",
                                           "cannot load model {…}: {…}", "Cannot read {…}; it is corrupt.",
                                           "No widget at {…}: give a folder.", "unknown option {…} ({…})"]
    assert _matches("Thing(n=…): must be >= 1.", sites[0].template)
    assert not _matches("Other(n=…): must be >= 1.", sites[0].template)
    assert _matches("pip failed (exit …) for", sites[1].template)
