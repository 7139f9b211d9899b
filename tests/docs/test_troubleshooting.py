"""docs/troubleshooting.md explains every error message the package raises (and every warning it logs).

The package's source is parsed (``ast``) for message sites: ``raise SomeError("...")``, the CLI's
``_fail("...")``, ``typer.BadParameter("...")``, ``logger.warning("...")`` and ``warnings.warn("...")``.
Each message becomes a template, its literal text with ``{…}`` where values are formatted in.
Sites whose message is not literal (``_fail(str(err))``, re-raises) pass on a message raised, and
covered, elsewhere.

The page quotes messages in its ``###`` headings, as code spans: a distinctive fragment, with ``…``
for the parts that vary (``DraftModel(num_tokens=…): must be >= 1.``). A site is covered when one
quote's pieces appear in its template, in order. So a new ``raise`` anywhere in the package fails
this test until the page says what the message means and how to fix it, and a quote that no longer
matches any message (the message changed or went away) fails it too.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from docblocks import DOCS, ROOT

PACKAGE = ROOT / "hf_speculative"
PAGE = DOCS / "troubleshooting.md"
HOLE = "{…}"
MIN_QUOTE = 12  # characters of literal text a quote needs to be distinctive
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


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def message_sites(package: Path = PACKAGE, root: Path = ROOT) -> list[Site]:
    sites = []
    for path in sorted(package.rglob("*.py")):
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
            template = _template(_resolve(call.args[0], node, scopes))
            if template is None or not template.replace(HOLE, "").strip():
                continue
            sites.append(Site(str(path.relative_to(root)), node.lineno, kind, template))
    return sorted(sites, key=lambda site: (site.path, site.line))


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def page_quotes(page: Path = PAGE) -> list[str]:
    """Code spans in the page's ``###``/``####`` headings."""
    quotes = []
    for line in page.read_text(encoding="utf-8").splitlines():
        if re.match(r"^#{3,4} ", line):
            for match in re.finditer(r"(`+)(.+?)\1", line):
                quote = match[2]
                if quote.startswith(" ") and quote.endswith(" "):
                    quote = quote[1:-1]
                quotes.append(quote)
    return quotes


def _matches(quote: str, template: str) -> bool:
    pieces = [_normalise(p) for p in quote.split("…") if p.strip()]
    pattern = ".*?".join(re.escape(p) for p in pieces)
    return bool(pieces) and re.search(pattern, _normalise(template), re.S) is not None


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
    )
    sites = message_sites(tmp_path / "pkg", root=tmp_path)
    assert [s.template for s in sites] == ["Thing(n={…}): must be >= 1.", "pip failed (exit {…}) for {…}",
                                           "cannot load model {…}: {…}", "Cannot read {…}; it is corrupt.",
                                           "No widget at {…}: give a folder."]
    assert _matches("Thing(n=…): must be >= 1.", sites[0].template)
    assert not _matches("Other(n=…): must be >= 1.", sites[0].template)
    assert _matches("pip failed (exit …) for", sites[1].template)
