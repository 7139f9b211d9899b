"""Text of a streaming output split by where its tokens came from, and the HTML of one pane.

Every target forward of speculative decoding appends one block of tokens: the ``n`` draft tokens it
accepted followed by one token the target chose itself. :class:`SourcedText` turns those blocks into
text segments tagged ``"draft"`` or ``"target"``; :func:`render_pane` draws them with two colours.
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any

DRAFT, TARGET = "draft", "target"
_REPLACEMENT = "\ufffd"

PANE_CSS = """
.hfs-pane { border: 1px solid #d0d4dc; border-radius: 8px; padding: 8px 10px; min-height: 120px; }
.hfs-head { display: flex; flex-wrap: wrap; gap: 6px; align-items: center; margin-bottom: 4px; }
.hfs-order { background: #334155; color: #fff; border-radius: 10px; padding: 0 7px; font-size: 0.8em; }
.hfs-status { color: #64748b; font-size: 0.85em; }
.hfs-badge { border-radius: 6px; padding: 1px 6px; font-size: 0.8em; font-weight: 600; }
.hfs-badge-yes { background: #dcfce7; color: #166534; }
.hfs-badge-no { background: #fee2e2; color: #991b1b; }
.hfs-badge-info { background: #e0e7ff; color: #3730a3; }
.hfs-figures { font-family: ui-monospace, monospace; font-size: 0.82em; color: #334155; margin-bottom: 6px; }
.hfs-text { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 0.85em; line-height: 1.45; }
.hfs-draft { background: #bbf7d0; color: #14532d; border-radius: 2px; }
.hfs-target { background: transparent; }
.hfs-legend .hfs-target { border-bottom: 1px dotted #64748b; }
.hfs-error { color: #991b1b; white-space: pre-wrap; }
.hfs-note { font-size: 0.82em; color: #92400e; background: #fef3c7; border-radius: 4px; padding: 1px 6px;
            margin-bottom: 6px; display: inline-block; }
.hfs-off { font-size: 0.85em; color: #64748b; margin: 2px 0 6px; }
.hfs-off-title { font-weight: 600; margin-bottom: 2px; }
.hfs-off-item { display: inline-block; margin-right: 14px; opacity: 0.75; cursor: not-allowed; }
.hfs-off-item input { cursor: not-allowed; }
"""
"""Styles of the panes (given to each pane's ``gr.HTML(css_template=...)``)."""


@dataclasses.dataclass
class Segment:
    """A run of text and where its tokens came from (:data:`DRAFT` or :data:`TARGET`)."""

    text: str
    source: str


class SourcedText:
    """Incrementally decoded output text, split into draft-accepted and target-produced segments.

    Text is decoded from all ids so far (``skip_special_tokens=True``), so multi-token characters
    and leading-space rules come out as ``tokenizer.decode`` gives them; a piece of text whose last
    character is still incomplete (U+FFFD) is held back until the next tokens complete it.

    Args:
        tokenizer: the target's tokenizer.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.segments: list[Segment] = []
        self._text = ""

    @property
    def text(self) -> str:
        return self._text

    def add_block(self, ids: list[int], accepted: int) -> None:
        """Append one verification block: its first ``accepted`` ids were drafted, the rest the target's."""
        if accepted > 0:
            self._extend(ids[:accepted], DRAFT)
        if len(ids) > accepted:
            self._extend(ids[accepted:], TARGET)

    def finish(self) -> None:
        """Emit text still held back (an incomplete character at the very end)."""
        self._emit(TARGET, final=True)

    def _extend(self, ids: list[int], source: str) -> None:
        self.ids.extend(int(i) for i in ids)
        self._emit(source)

    def _emit(self, source: str, final: bool = False) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if text.endswith(_REPLACEMENT) and not final:
            return  # wait for the rest of the character
        if text.startswith(self._text):
            new = text[len(self._text):]
        else:
            # Decoding more ids rewrote earlier text (rare tokenizer rules): keep what was shown and
            # attribute the difference from the first changed character on.
            common = _common_prefix(text, self._text)
            self._truncate(common)
            new = text[common:]
        if new:
            if self.segments and self.segments[-1].source == source:
                self.segments[-1].text += new
            else:
                self.segments.append(Segment(new, source))
        self._text = text

    def _truncate(self, length: int) -> None:
        kept, total = [], 0
        for seg in self.segments:
            if total + len(seg.text) <= length:
                kept.append(seg)
                total += len(seg.text)
            else:
                if length > total:
                    kept.append(Segment(seg.text[: length - total], seg.source))
                break
        self.segments = kept


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def segments_html(segments: list[Segment]) -> str:
    """The segments as escaped ``<span class="hfs-draft|hfs-target">`` elements."""
    return "".join(f'<span class="hfs-{seg.source}">{html.escape(seg.text)}</span>' for seg in segments)


def render_pane(
    *,
    order: int,
    method: str,
    label: str,
    status: str,
    status_text: str | None = None,
    figures: str = "",
    segments: list[Segment] | None = None,
    badge: tuple[str, str] | None = None,
    error: str | None = None,
    note: str = "",
) -> str:
    """The HTML of one output pane.

    Args:
        order (`int`): position of the method in the run (1 = the baseline, which runs first).
        method (`str`): registry name (kept in ``data-method`` for tests and scripts).
        label (`str`): human readable name.
        status (`str`): ``"waiting"``, ``"running"``, ``"done"``, ``"error"`` or ``"cancelled"``.
        status_text (`str`, *optional*): what the page says about the status (default: ``status``).
        figures (`str`): the live figures line.
        segments (`list[Segment]`): the text so far.
        badge (`tuple[str, str]`, *optional*): ``(kind, text)`` with kind ``"yes"``, ``"no"`` or ``"info"``.
        error (`str`, *optional*): a message shown instead of the text.
        note (`str`): why the method ran as it did (e.g. calibrating), shown under the figures.
    """
    badge_html = ""
    if badge is not None:
        badge_html = f'<span class="hfs-badge hfs-badge-{badge[0]}" data-identical="{badge[0]}">{html.escape(badge[1])}</span>'
    body = (
        f'<div class="hfs-error">{html.escape(error)}</div>'
        if error
        else f'<div class="hfs-text">{segments_html(segments or [])}</div>'
    )
    return (
        f'<div class="hfs-pane" data-method="{html.escape(method)}" data-status="{status}">'
        f'<div class="hfs-head"><span class="hfs-order">{order}</span><b>{html.escape(label)}</b>'
        f'<span class="hfs-status">{html.escape(status_text or status)}</span>{badge_html}</div>'
        f'<div class="hfs-figures">{html.escape(figures)}</div>'
        f'{f"<div class=hfs-note>{html.escape(note)}</div>" if note else ""}{body}</div>'
    )


LEGEND_HTML = (
    '<div class="hfs-legend"><span class="hfs-draft">Highlighted text</span>: draft tokens the target accepted. '
    '<span class="hfs-target">Plain text</span>: tokens the target produced itself (one per target forward). '
    "τ = new tokens per target forward; speedup = tokens/s against the baseline (the first pane); acceptance = "
    "accepted over drafted tokens, unknown (—) for transformers' own methods, which report only what they "
    "accepted.</div>"
)
