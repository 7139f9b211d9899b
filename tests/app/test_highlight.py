"""Draft/target segments of the streamed text and the pane's HTML."""

from __future__ import annotations

import html
import re

from hf_speculative.app.highlight import DRAFT, TARGET, Segment, SourcedText, render_pane, segments_html


def test_segments_follow_blocks_and_join_to_the_decoded_text(chat_tokenizer):
    words = "the cat sat on the mat and ran".split()
    ids = chat_tokenizer.convert_tokens_to_ids(words)
    text = SourcedText(chat_tokenizer)
    text.add_block(ids[:1], 0)  # the target's own token
    text.add_block(ids[1:4], 2)  # two accepted drafts + the target's token
    text.add_block(ids[4:8], 3)
    text.finish()
    expected = chat_tokenizer.decode(ids, skip_special_tokens=True)
    assert "".join(s.text for s in text.segments) == text.text == expected
    assert [s.source for s in text.segments] == [TARGET, DRAFT, TARGET, DRAFT, TARGET]
    assert text.segments[1].text.split() == ["cat", "sat"]
    assert text.segments[-1].text.split() == ["ran"]


class _BytesTokenizer:
    """Decodes ids as UTF-8 bytes, like byte-level BPE: a character may span several tokens."""

    def decode(self, ids, **kwargs):
        return bytes(ids).decode("utf-8", errors="replace")


def test_an_incomplete_character_is_held_back_until_complete():
    text = SourcedText(_BytesTokenizer())
    euro = list("€".encode())  # 3 bytes
    text.add_block([ord("a"), euro[0]], 1)  # 'a' drafted, first byte of € the target's
    assert text.text == "a" and "\ufffd" not in "".join(s.text for s in text.segments)
    text.add_block(euro[1:], 1)
    text.finish()
    assert text.text == "a€" and [s.text for s in text.segments] == ["a", "€"]


def test_pane_html_escapes_and_marks_sources():
    pane = render_pane(order=2, method="prompt-lookup", label="Prompt <lookup>", status="done", status_text="done",
                       figures="1.0 tok/s", segments=[Segment("<b>x</b>", DRAFT), Segment(" y", TARGET)],
                       badge=("yes", "identical to greedy ✓"))
    assert 'data-method="prompt-lookup"' in pane and 'data-status="done"' in pane and 'data-identical="yes"' in pane
    assert "<b>x</b>" not in pane and html.escape("<b>x</b>") in pane
    assert re.search(r'<span class="hfs-draft">&lt;b&gt;x&lt;/b&gt;</span><span class="hfs-target"> y</span>', pane)
    assert segments_html([]) == ""
    error_pane = render_pane(order=3, method="m", label="M", status="error", error="bad <vocab>")
    assert "bad &lt;vocab&gt;" in error_pane and "hfs-text" not in error_pane
