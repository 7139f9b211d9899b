"""Malformed API calls get a message (issue 67, item 6), not gradio's ``{"error": null}`` or a bare 500; and the
API's outputs have names. Through gradio's HTTP API directly: gradio_client fills in what a raw call may lack.
"""

from __future__ import annotations

import httpx
import pytest

from tests.app.conftest import compare_args


def _call(url: str, data) -> tuple[str, str]:
    """POST ``data`` to /gradio_api/call/compare and read the event's stream: ``(event kind, its data)``."""
    posted = httpx.post(f"{url}gradio_api/call/compare", json={"data": data}, timeout=30)
    assert posted.status_code == 200, posted.text[:300]
    stream = httpx.get(f"{url}gradio_api/call/compare/{posted.json()['event_id']}", timeout=60).text
    events = [line.split(": ", 1)[1] for line in stream.splitlines() if line.startswith("event: ")]
    data = [line.split(": ", 1)[1] for line in stream.splitlines() if line.startswith("data: ")]
    return events[-1], data[-1]


def test_too_few_values_name_what_the_call_takes(served_app):
    from hf_speculative.app.request import option_slots

    url, options = served_app[0], len(option_slots())
    kind, data = _call(url, ["hello", None])
    assert kind == "error" and '"error": null' not in data
    assert (f"The call to /compare sent 2 values; it takes {8 + options}, in this order: prompt, model, methods, "
            f"max_new_tokens, sample, temperature, seed, concurrent and {options} more") in data, data


def test_a_value_shaped_like_an_unuploaded_file_is_refused_with_the_reason(served_app, tiny_chat_dir):
    url = served_app[0]
    data = compare_args("hello", str(tiny_chat_dir), ["prompt-lookup"], max_new_tokens=2)
    data[0] = {"path": "/etc/passwd\x1b[2J", "meta": {"_type": "gradio.FileData"}}
    kind, text = _call(url, data)
    assert kind == "error" and "The call to /compare could not be read: " in text, text
    assert "\\\\x1b[2J" in text and "\x1b" not in text, "the client's own text comes back escaped"


def test_an_unknown_handler_or_endpoint_is_named_with_the_apps_api(served_app):
    url = served_app[0]
    joined = httpx.post(f"{url}gradio_api/queue/join", json={"data": [], "fn_index": 999, "session_hash": "s"})
    assert joined.status_code == 400
    assert joined.json()["detail"].startswith("No event handler has fn_index 999. This app's API: /compare;")
    called = httpx.post(f"{url}gradio_api/call/nope", json={"data": []})
    assert called.status_code == 404
    assert called.json()["detail"] == ("No API endpoint at /gradio_api/call/nope. This app's API: /compare "
                                       "(GET /gradio_api/info describes it).")


def test_the_api_outputs_have_names(served_app):
    from hf_speculative.app.request import MAX_PANES

    info = httpx.get(f"{served_app[0]}gradio_api/info").json()["named_endpoints"]["/compare"]
    names = [r["label"] for r in info["returns"]]
    assert names == ["status", "pane_1_baseline", *[f"pane_{i}" for i in range(2, MAX_PANES + 1)],
                     "Tokens over time and accepted length per step", "results"]


@pytest.mark.parametrize("got", [0, 7])
def test_the_message_counts_what_was_sent(got):
    import gradio as gr

    from hf_speculative.app.calls import check_count

    class Fn:
        api_name, inputs, api_visibility = "compare", [None] * 50, "public"

        @staticmethod
        def fn(request, prompt, model):
            pass

    with pytest.raises(gr.Error) as caught:
        check_count(Fn, got)
    assert caught.value.message.startswith(
        f"The call to /compare sent {got} values; it takes 50, in this order: prompt, model (GET /gradio_api/info")
    Fn.api_visibility = "private"
    with pytest.raises(gr.Error) as caught:
        check_count(Fn, got)
    assert "gradio_client" not in caught.value.message, "a page helper is no API: no client advice"
    check_count(Fn, 50)  # all there
