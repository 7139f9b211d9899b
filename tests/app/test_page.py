"""What the page says (issue 42): which methods can run on a model and why not, at most three ticked, a stopped
run called stopped, slowdowns explained, sampling named as such, whole plot axes."""

from __future__ import annotations

import pytest
import torch

from hf_speculative.app.cache import ModelCache
from hf_speculative.app.highlight import LEGEND_HTML
from hf_speculative.app.offer import draft_models, method_problems
from hf_speculative.app.plots import comparison_figure
from hf_speculative.app.request import CompareRequest, Sources, selectable_methods
from hf_speculative.app.session import Comparison
from hf_speculative.app.streaming import MethodTrace
from hf_speculative.app.ui import _at_most, _pane_html, _stopped_status, pane_note
from hf_speculative.tooling.methods import get_method
from hf_speculative.core.stats import SpeculativeStats
from tests.app.conftest import TINY_PROMPT


@pytest.fixture(scope="module")
def loaded(tiny_chat_dir):
    from hf_speculative.registry.models import load_model

    def loader(name, device=None):  # no EOS: a run lasts its max_new_tokens (the Stop comes before the end)
        model, tokenizer = load_model(name)
        model.generation_config.eos_token_id = None
        return model, tokenizer

    cache = ModelCache(loader, device=torch.device("cpu"), warmup=False)
    return cache, cache.get(str(tiny_chat_dir))


def test_methods_a_model_cannot_run_are_named_with_the_reason(tiny_chat_dir, other_vocab_dir):
    sources = Sources(models=(str(tiny_chat_dir), str(other_vocab_dir)))
    problems = method_problems(str(tiny_chat_dir), sources)
    # no other model here shares the tiny model's tokenizer: no draft model can ever work
    assert draft_models(str(tiny_chat_dir), sources) == []
    for name in ("draft-model", "hf-assisted"):
        assert "needs a smaller model with tiny-chat's tokenizer on this server" in problems[name]
    for name in ("eagle", "eagle-tree", "early-exit-adapter", "medusa", "medusa-tree"):
        assert "ships for tiny-chat (shipped for: smollm2-135m-instruct)" in problems[name], problems.get(name)
    assert not {"prompt-lookup", "hf-prompt-lookup", "suffix", "lookahead", "early-exit", "layer-skip"} & set(problems)
    assert all("--" not in reason and "option draft_model" not in reason for reason in problems.values())
    # a second copy of the tiny model (same tokenizer) is a draft model for it
    copy = Sources(models=(str(tiny_chat_dir), str(tiny_chat_dir.parent / "copy")))
    (tiny_chat_dir.parent / "copy").mkdir(exist_ok=True)
    for file in tiny_chat_dir.iterdir():
        target = tiny_chat_dir.parent / "copy" / file.name
        if not target.exists():
            target.symlink_to(file)
    assert draft_models(str(tiny_chat_dir), copy) == [str(tiny_chat_dir.parent / "copy")]
    assert "draft-model" not in method_problems(str(tiny_chat_dir), copy)


@pytest.mark.integration
def test_on_the_default_model_no_draft_model_method_is_offered(integration):
    from hf_speculative.registry.models import DEFAULT_MODEL

    problems = method_problems(DEFAULT_MODEL, Sources.offered(DEFAULT_MODEL))
    assert set(problems) == {"draft-model", "hf-assisted"}, problems
    assert "smollm2-135m-instruct's tokenizer" in problems["draft-model"]


def test_a_method_that_cannot_run_is_refused_before_greedy_runs(loaded, tiny_chat_dir):
    cache, model = loaded
    forwards = []
    handle = model.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    request = CompareRequest(prompt=TINY_PROMPT, model=model.name, methods=["greedy", "prompt-lookup", "draft-model"],
                             max_new_tokens=8, options={})
    try:
        with pytest.raises(Exception, match=r"Draft model \(hfs\) cannot run on .*tiny-chat's tokenizer"):
            Comparison(model, request, cache, 2048, Sources(models=(str(tiny_chat_dir),)))
    finally:
        handle.remove()
    assert forwards == []


def test_a_fourth_method_is_unticked_at_once():
    picked = selectable_methods()[:4]
    with pytest.warns(UserWarning, match="At most 3 methods"):
        update = _at_most(picked)
    assert update["value"] == picked[:3]
    assert _at_most(picked[:3]) != {"value": picked[:3]} and "value" not in _at_most(picked[:3])


def test_a_stopped_run_says_stopped(loaded, tiny_chat_dir):
    cache, model = loaded
    request = CompareRequest(prompt=TINY_PROMPT, model=model.name, methods=["greedy", "prompt-lookup", "suffix"],
                             max_new_tokens=200, options={})
    comparison = Comparison(model, request, cache, 2048)
    runner = comparison.run(interval=0.01)
    next(runner)  # greedy runs
    comparison.cancel(stopped=True)
    list(runner)
    comparison.refresh_texts(final=True)
    status = _stopped_status(comparison)
    assert comparison.stopped and [t.status for t in comparison.traces] == ["cancelled"] * 3
    assert status.startswith("**Stopped.** 0/3 methods finished"), status
    assert "cut short: Greedy (baseline) (" in status and "not run: Prompt lookup (hfs), SuffixDecoding (hfs)" in status
    assert "stopped after" in _pane_html(comparison, 0)
    for i in (1, 2):
        pane = _pane_html(comparison, i)
        assert 'data-status="cancelled"' in pane and "stopped before it ran" in pane and "waiting" not in pane


def test_a_finished_run_is_not_called_stopped(loaded):
    cache, model = loaded
    request = CompareRequest(prompt=TINY_PROMPT, model=model.name, methods=["greedy", "prompt-lookup"],
                             max_new_tokens=4, options={})
    comparison = Comparison(model, request, cache, 2048)
    list(comparison.run(interval=0.01))
    comparison.cancel(stopped=True)  # a Stop that arrives after the end
    assert not comparison.stopped


def _trace(name: str, stats: SpeculativeStats, status: str = "done") -> MethodTrace:
    trace = MethodTrace(get_method(name), 32)
    trace.status, trace.final_stats = status, stats
    return trace


def test_slowdowns_are_explained_from_the_stats():
    calibrating = SpeculativeStats(target_forwards=32, new_tokens=32,
                                   extra={"layer-skip": {"source": "calibrated", "drafting": True}})
    assert pane_note(_trace("layer-skip", calibrating)).startswith("calibrating (first call on this model)")
    # what smollm2-135m-instruct's first LayerSkip call on a 2-core CPU reported (0.30x, τ 1.00)
    calibrated_idle = SpeculativeStats(target_forwards=64, new_tokens=64, extra={"layer-skip": {
        "source": "calibrated", "calibration_s": 27.4, "drafting": False, "expected_speedup": 1.0}})
    note = pane_note(_trace("layer-skip", calibrated_idle))
    assert note.startswith("calibrating (first call on this model, 27 s of this call)") and "drafts nothing" in note
    waiting = SpeculativeStats(target_forwards=8, new_tokens=8,
                               extra={"layer-skip": {"source": "waiting", "calibration_tokens": 32}})
    assert pane_note(_trace("layer-skip", waiting)).startswith("calibrating (first call on this model)")
    idle = SpeculativeStats(target_forwards=8, new_tokens=8,
                            extra={"layer-skip": {"source": "cached", "drafting": False}})
    assert pane_note(_trace("layer-skip", idle)).startswith("no drafts:")
    nothing = SpeculativeStats(target_forwards=16, new_tokens=16)
    assert pane_note(_trace("early-exit", nothing)) == (
        "no drafts: verification too dear on this device (the cost model found no draft worth it)")
    assert pane_note(_trace("prompt-lookup", nothing)).startswith("no drafts: nothing in the text matched")
    # early exit on smollm2 (0.76x, "acceptance 0%"): a few tokens drafted early, none accepted, then none
    rare = SpeculativeStats(new_tokens=64)
    for n in [0, 2, 2, 0, 2, 0, 0, 1] + [0] * 56:
        rare.record_draft(n, 0.0)
        rare.record_verify(0, 0.0)
    assert pane_note(_trace("early-exit", rare)).startswith(
        "few drafts: it drafted at 4 of 64 target forwards (0 of 7 draft tokens accepted)")
    assert pane_note(_trace("prompt-lookup", rare)) == "", "a lookup drafts where the text repeats: nothing to explain"
    drafted = SpeculativeStats(new_tokens=16)
    for n, kept in [(3, 2), (3, 3), (2, 0), (3, 1)]:
        drafted.record_draft(n, 0.0)
        drafted.record_verify(kept, 0.0)
    assert pane_note(_trace("early-exit", drafted)) == ""
    assert pane_note(_trace("layer-skip", SpeculativeStats(extra={"layer-skip": {"source": "cached",
                                                                                 "drafting": True}}))) == ""


def test_sampling_is_named_plain_sampling(loaded):
    cache, model = loaded
    request = CompareRequest(prompt=TINY_PROMPT, model=model.name, methods=["greedy", "prompt-lookup"],
                             max_new_tokens=6, options={}, sampling={"temperature": 1.0, "seed": 3})
    comparison = Comparison(model, request, cache, 2048)
    list(comparison.run(interval=0.01))
    assert "Plain sampling (baseline)" in _pane_html(comparison, 0) and "Greedy" not in _pane_html(comparison, 0)
    assert "identical to plain sampling ✓" in _pane_html(comparison, 1) and "greedy" not in _pane_html(comparison, 1)


def test_an_acceptance_dash_says_why():
    """A transformers method's pane showed "acceptance —" beside τ 6.86: transformers reports no drafted count."""
    from hf_speculative.app.ui import acceptance_figure

    hf = MethodTrace(get_method("hf-prompt-lookup"), 32)
    for block in ([1, 2, 3, 4, 5, 6, 7], [8]):
        hf.add_block(block, 0.0)
    assert hf.tau == 4.0 and acceptance_figure(hf) == "acceptance — (transformers does not report its drafted tokens)"
    assert acceptance_figure(_trace("prompt-lookup", SpeculativeStats(new_tokens=8))) == "acceptance — (nothing drafted)"
    drafted = SpeculativeStats(new_tokens=8)
    drafted.record_draft(4, 0.0)
    drafted.record_verify(3, 0.0)
    assert acceptance_figure(_trace("prompt-lookup", drafted)) == "acceptance 75%"
    assert acceptance_figure(MethodTrace(get_method("greedy"), 4)) == "acceptance — (no drafts)"
    assert "unknown (—) for transformers' own methods" in LEGEND_HTML


def test_the_legend_reads_as_sentences():
    text = LEGEND_HTML.replace("</span>", "").split(">")
    words = " ".join(" ".join(part.split("<")[0] for part in text).split())
    assert "accepted draft tokens tokens the target" not in words
    assert "draft tokens the target accepted" in words and "tokens the target produced itself" in words


def test_plot_axes_start_at_zero_even_when_nothing_was_accepted():
    greedy = MethodTrace(get_method("greedy"), 4)
    greedy.started = 0.0
    for i in range(4):
        greedy.add_block([i], 0.1 * (i + 1))
    over_time, per_step = comparison_figure([greedy]).axes
    low, high = per_step.get_ylim()
    assert low <= 0 and high >= 1, (low, high)
    assert over_time.get_ylim()[0] == 0


def test_the_plot_names_the_baseline_as_its_pane_does(loaded):
    from hf_speculative.app.ui import _figure, _final_status

    cache, model = loaded
    request = CompareRequest(prompt=TINY_PROMPT, model=model.name, methods=["greedy", "prompt-lookup"],
                             max_new_tokens=6, options={}, sampling={"temperature": 1.0, "seed": 3})
    comparison = Comparison(model, request, cache, 2048)
    list(comparison.run(interval=0.01))
    over_time, _ = _figure(comparison).axes
    assert [line.get_label() for line in over_time.get_lines()] == ["Plain sampling", "Prompt lookup (hfs)"]
    assert "sampling at temperature 1, seed 3" in _final_status(comparison)


def test_choosing_a_model_updates_the_methods_it_can_run(tiny_chat_dir):
    from hf_speculative.app.ui import _on_model

    sources = Sources(models=(str(tiny_chat_dir),))
    methods, off, *drafts = _on_model(str(tiny_chat_dir), ["prompt-lookup", "draft-model", "medusa"], sources)
    values = [value for _, value in methods["choices"]]
    assert "prompt-lookup" in values and "draft-model" not in values and "medusa" not in values
    assert methods["value"] == ["prompt-lookup"], "a ticked method the model cannot run is unticked"
    assert off["visible"] and "Draft model (hfs)" in off["value"] and "disabled" in off["value"]
    assert drafts and all(update["choices"] == [] for update in drafts)
