"""The app served on a free port, driven through its API with gradio_client (as a visitor's page does)."""

from __future__ import annotations

import html
import re
import time

import pytest
import torch

from hf_speculative.app.request import selectable_methods
from hf_speculative.tooling.methods import get_method
from hf_speculative.bench.runner import encode_prompt
from tests.app.conftest import TINY_PROMPT, compare_args, generation_threads, slow_app, wait_until

# Methods that must run on the tiny model; the others (trained drafters shipped for other models) must be refused
# before anything runs, with the reason.
MUST_RUN = {"prompt-lookup", "draft-model", "early-exit", "layer-skip", "hf-prompt-lookup", "hf-assisted",
            "hf-early-exit", "suffix", "lookahead"}


def _value(output):
    """An HTML output's value (the API returns ``gr.update`` dicts for them)."""
    return output.get("value") if isinstance(output, dict) else output


def _pane_text(pane_html: str) -> str:
    body = re.search(r'<div class="hfs-text">(.*)</div></div>$', pane_html, re.S).group(1)
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def _options_for(tiny_chat_dir) -> dict:
    return {(m, "draft_model"): str(tiny_chat_dir) for m in selectable_methods()} | {
        (m, "exit_layer"): 1 for m in selectable_methods()}


def _compare(client, *args, **kwargs):
    return client.predict(*compare_args(*args, **kwargs), api_name="/compare")


def test_every_method_streams_greedy_text_with_consistent_figures(client, tiny_chat_dir):
    names = selectable_methods()
    by_method, panes, greedy_tps, refused = {}, {}, {}, {}
    for name in names:  # each alone first: a method that cannot run is refused before anything runs
        out = _compare(client, TINY_PROMPT, str(tiny_chat_dir), [name], options=_options_for(tiny_chat_dir))
        if not out[0].startswith("Done:"):
            refused[name] = out[0]
    assert MUST_RUN & set(refused) == set(), refused
    for name, status in refused.items():
        assert f"{get_method(name).label} cannot run on" in status and "ships for tiny-chat" in status, status
        assert "Traceback" not in status and "--" not in status, "in words for a web page, not the command line's"
    runnable = [n for n in names if n not in refused]
    for start in range(0, len(runnable), 3):  # greedy + three methods per page
        group = runnable[start:start + 3]
        out = _compare(client, TINY_PROMPT, str(tiny_chat_dir), group, options=_options_for(tiny_chat_dir))
        status, pane_outputs, results = out[0], out[1:5], out[-1]
        assert status.startswith("Done:"), status
        for record, pane in zip(results["methods"], pane_outputs):
            by_method.setdefault(record["method"], record)
            panes.setdefault(record["method"], _value(pane))
            greedy_tps.setdefault(record["method"], results["methods"][0]["tokens_per_s"])  # this page's greedy
    greedy = by_method["greedy"]
    assert greedy["status"] == "done" and greedy["new_tokens"] > 0 and greedy["tau"] == 1.0
    assert greedy["target_forwards"] == greedy["new_tokens"]
    for name in runnable:
        record, pane = by_method[name], panes[name]
        assert f'data-method="{name}"' in pane
        assert record["status"] == "done", record["error"]
        assert record["output_ids"] == greedy["output_ids"] and record["text"] == greedy["text"]
        assert record["identical_to_baseline"] is True and 'data-identical="yes"' in pane
        assert _pane_text(pane) == record["text"]
        assert record["tau"] == pytest.approx(record["new_tokens"] / record["target_forwards"])
        assert record["accepted_tokens"] == sum(record["accepted_lengths"])
        assert len(record["accepted_lengths"]) == record["target_forwards"]
        assert record["tokens_per_s"] == pytest.approx(record["new_tokens"] / record["seconds"])
        assert record["speedup"] == pytest.approx(record["tokens_per_s"] / greedy_tps[name])
        assert f"speedup {record['speedup']:.2f}×" in pane
        assert f"τ {record['tau']:.2f}" in pane
        if record["kind"] == "hfs":
            stats = record["hfs_stats"]
            assert stats["target_forwards"] == record["target_forwards"]
            assert stats["accepted_tokens"] == record["accepted_tokens"]
            assert record["acceptance_rate"] == pytest.approx(stats["acceptance_rate"]) or not stats["drafted_tokens"]
    assert by_method["prompt-lookup"]["accepted_tokens"] > 0, "the repetitive prompt must give accepted drafts"
    assert 'class="hfs-draft"' in panes["prompt-lookup"]


def test_the_baseline_is_transformers_greedy(client, served_app, tiny_chat_dir):
    out = _compare(client, TINY_PROMPT, str(tiny_chat_dir), ["prompt-lookup"], max_new_tokens=20)
    greedy = out[-1]["methods"][0]
    loaded = served_app[2].get(str(tiny_chat_dir))
    ids = encode_prompt(loaded.tokenizer, TINY_PROMPT)
    with torch.inference_mode():
        reference = type(loaded.model).generate(loaded.model, ids, attention_mask=torch.ones_like(ids),
                                                max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert greedy["output_ids"] == reference[0, ids.shape[1]:].tolist()
    assert served_app[2].loads == 1, "the model is loaded once and reused by every request"


def test_sampling_runs_and_every_pane_writes_the_seed_s_sample(client, tiny_chat_dir):
    """Under sampling every pane (greedy's, hf_speculative's, transformers' own) draws with the request's seed,
    so all write the same sample and the page checks it token for token."""
    out = _compare(client, TINY_PROMPT, str(tiny_chat_dir), ["prompt-lookup", "hf-prompt-lookup"], sampling=True,
                   temperature=1.0, seed=3)
    results = out[-1]
    assert results["sampling"] == {"temperature": 1.0, "seed": 3}
    assert all(m["status"] == "done" and m["new_tokens"] > 0 for m in results["methods"])
    assert len({tuple(m["output_ids"]) for m in results["methods"]}) == 1
    assert all(m["identical_to_baseline"] for m in results["methods"][1:])
    again = _compare(client, TINY_PROMPT, str(tiny_chat_dir), ["prompt-lookup"], sampling=True, temperature=1.0,
                     seed=3)[-1]
    assert again["methods"][1]["output_ids"] == results["methods"][1]["output_ids"]


@pytest.mark.parametrize(
    ("prompt", "model", "message"),
    [
        ("   ", None, "The prompt is empty"),
        (" ".join(["cat"] * 3000), None, "The prompt is too long"),
        ("hello", "./no-such-model-folder", "Cannot load model './no-such-model-folder'"),  # the app allows paths
    ],
)
def test_bad_requests_show_a_message_and_the_app_keeps_serving(client, tiny_chat_dir, prompt, model, message):
    out = _compare(client, prompt, model or str(tiny_chat_dir), ["prompt-lookup"])
    assert message in out[0] and "Traceback" not in out[0]
    assert message in out[-1]["error"]
    again = _compare(client, TINY_PROMPT, str(tiny_chat_dir), ["prompt-lookup"], max_new_tokens=8)
    assert again[0].startswith("Done: 2/2")


def test_a_drafter_that_does_not_fit_is_refused_before_anything_runs(client, served_app, tiny_chat_dir,
                                                                     other_vocab_dir):
    options = {("draft-model", "draft_model"): str(other_vocab_dir), ("hf-assisted", "draft_model"): str(other_vocab_dir)}
    forwards = []
    handle = served_app[2].get(str(tiny_chat_dir)).model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        out = _compare(client, TINY_PROMPT, str(tiny_chat_dir), ["draft-model", "hf-assisted", "prompt-lookup"],
                       options=options, max_new_tokens=8)
    finally:
        handle.remove()
    status = out[0]
    assert status.startswith("**⚠️") and out[-1] == {"error": status.strip("*⚠️ ")}, status
    for label in ("Draft model (hfs) cannot run on", "Assisted (transformers) cannot run on"):
        assert label in status, status
    assert "tokenizers" in status.lower() and "Traceback" not in status
    assert forwards == [], "nothing ran: not even greedy"


def test_queue_is_bounded_with_a_concurrency_limit(served_app):
    demo = served_app[1]
    assert demo._queue.max_size == 16
    assert demo._queue.default_concurrency_limit == 1  # CPU: one comparison at a time, fair timings


def test_cancelling_a_request_stops_its_generation(tiny_chat_dir):
    """A visitor who leaves (or presses Stop) cancels the event: the generation thread must end."""
    from gradio_client import Client

    with slow_app(tiny_chat_dir) as (url, forwards):
        job = Client(url, verbose=False).submit(
            *compare_args(TINY_PROMPT, str(tiny_chat_dir), ["hf-prompt-lookup"], max_new_tokens=400),
            api_name="/compare")
        assert wait_until(generation_threads, 30), f"the generation never started: {job.status()}"
        job.cancel()
        # greedy alone takes 400 x 20 ms = 8 s: a thread still alive after 3 s was not stopped
        assert wait_until(lambda: not generation_threads(), 3), "the generation kept running after the cancel"
        stopped_at = len(forwards)
        assert stopped_at < 200, "stopped long before the end"
        time.sleep(0.3)
        assert len(forwards) == stopped_at


def test_an_unexpected_failure_before_the_run_is_a_message_too(tiny_chat_dir):
    from hf_speculative.app.cache import ModelCache
    from hf_speculative.app.request import option_slots
    from hf_speculative.app.ui import _run_comparison
    from tests.conftest import build_model

    class BrokenTokenizer:
        chat_template = None
        eos_token_id = pad_token_id = 0

        def __call__(self, *args, **kwargs):
            raise RuntimeError("this tokenizer cannot encode")

    cache = ModelCache(lambda name, device=None: (build_model("llama"), BrokenTokenizer()), warmup=False,
                       device=torch.device("cpu"))
    form = compare_args("hello", "any", ["prompt-lookup"])
    form = (*form[:8], form[8:])
    with pytest.warns(UserWarning, match="this tokenizer cannot encode"):
        outputs = list(_run_comparison(cache, option_slots(), "any", 64, 2048, form))
    status, results = outputs[-1][0], outputs[-1][-1]
    assert status == "**⚠️ Unexpected error: this tokenizer cannot encode**"
    assert results == {"error": "Unexpected error: this tokenizer cannot encode"}


def test_api_parameter_names_are_identifiers_for_any_method_name():
    import inspect

    from hf_speculative.app.request import option_slots
    from hf_speculative.app.ui import _api_signature, _identifier

    assert _identifier("eagle+lookup__eagle") == "eagle_plus_lookup__eagle"
    assert _identifier("prompt-lookup__num_tokens") == "prompt_lookup__num_tokens"
    assert _identifier("9x.y__k").isidentifier()

    def compare(prompt, *option_values):
        return None

    names = list(_api_signature(compare, option_slots()).parameters)
    assert "hybrid__eagle" in names and len(names) == len(set(names))
    assert all(name.isidentifier() for name in names)
    inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
