"""The app runs every method as the library does (issue 42): the same route (hf_speculative's own loop for every
strategy, chains and trees; transformers' assisted loop for its own drafters) and the same statistics as the direct
call ``model.generate(..., candidate_generator=strategy)`` on the same prompt, and the same draft shape.

The app once wrapped each strategy to watch its statistics, and the wrapper hid ``tree``: tree methods ran
as chains in the app only. Both runs here are observed from outside: the calls into our loop are counted
at ``core.entry.ladder``, and the figures come from each call's own statistics.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

import hf_speculative as hfs
from hf_speculative.core import entry as loop_entry
from hf_speculative.hf.checks import drafts_trees
from hf_speculative.app.cache import ModelCache
from hf_speculative.app.request import CompareRequest, Sources, selectable_methods
from hf_speculative.app.session import Comparison
from hf_speculative.tooling.methods import get_method, pad_token_id, run_method
from hf_speculative.tooling.prompting import encode_prompt
from tests.app.conftest import TINY_PROMPT

MAX_NEW = 24
# Methods that run on the tiny chat model; the others need the drafters trained for the real default model.
TINY = ["prompt-lookup", "draft-model", "early-exit", "layer-skip", "hf-prompt-lookup", "hf-assisted",
        "hf-early-exit", "suffix", "lookahead"]
REAL = ["eagle", "hybrid", "eagle-tree", "hybrid-tree", "early-exit-adapter", "medusa", "medusa-tree",
        "dflash", "dflash-tree"]
REAL_PROMPT = ("Rewrite this sentence in the plural: The cat sat on the mat and the dog sat on the mat, and the cat "
               "looked at the dog on the mat.")


def test_every_method_the_app_offers_is_checked_here():
    assert sorted(TINY + REAL) == sorted(selectable_methods()), "classify a new method in TINY or REAL"


@pytest.fixture
def loop_calls(monkeypatch):
    """How many calls entered hf_speculative's own loop (``core.entry.ladder``)."""
    calls = []
    original = loop_entry.ladder

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(loop_entry, "ladder", counting)
    return calls


def _no_eos_loader(name, device=None):
    from hf_speculative.registry.models import load_model

    model, tokenizer = load_model(name)
    # every run generates MAX_NEW tokens; transformers 4.x's own prompt lookup needs an EOS id (torch.isin(..., None)
    # fails there), so on 4.x the runs may stop at EOS: both routes of a method still make the same call
    if int(transformers.__version__.split(".")[0]) >= 5:
        model.generation_config.eos_token_id = None
    return model, tokenizer


def _options(name: str, target: str) -> dict:
    spec = get_method(name)
    options = {}
    if "draft_model" in spec.options:
        options["draft_model"] = target  # a separate copy of the target (the tiny model has no smaller sibling)
    if "exit_layer" in spec.options and target != hfs.models.DEFAULT_MODEL:
        options["exit_layer"] = 1
    if "adaptive" in spec.options:  # trees sized by the measured drafting time would differ from run to run
        options["adaptive"] = False
    return options


def _direct(name: str, loaded, options: dict, input_ids, cache: ModelCache, comparison: Comparison) -> dict:
    """The library's own call of ``name``: the strategy built by the method registry, passed to ``generate()``."""
    spec = get_method(name)
    model, tokenizer = loaded.model, loaded.tokenizer
    resolved = comparison._resolve_options(spec)  # the same draft model object and calibration file
    if spec.kind != "hfs":
        run = run_method(spec, model, tokenizer, input_ids, options=resolved, max_new_tokens=MAX_NEW)
        return {"ids": run.output_ids, "target_forwards": run.target_forwards}
    hfs.enable(model)
    strategy = spec.build(model, tokenizer, resolved)["candidate_generator"]
    if getattr(strategy, "history_tokens", 0):
        # the app turns SuffixDecoding's cross-call history off (a visitor must not see others' answers)
        strategy = dataclasses.replace(strategy, history_tokens=0)
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=MAX_NEW,
                             do_sample=False, pad_token_id=pad_token_id(model, tokenizer),
                             candidate_generator=strategy)
    stats = hfs.last_stats(model)
    return {"ids": out[0, input_ids.shape[1]:].tolist(), "target_forwards": stats.target_forwards,
            "drafted": stats.drafted_tokens, "accepted": stats.accepted_tokens, "tau": stats.tau,
            "trees": drafts_trees(strategy)}


def _app(name: str, loaded, cache: ModelCache, prompt: str, options: dict, sources: Sources) -> tuple:
    request = CompareRequest(prompt=prompt, model=loaded.name, methods=["greedy", name], max_new_tokens=MAX_NEW,
                             options={name: options} if options else {})
    comparison = Comparison(loaded, request, cache, 2048, sources)
    list(comparison.run(interval=0.01))
    trace = comparison.traces[1]
    assert trace.status == "done", trace.error
    return comparison, trace


def _check_same_as_the_library(name: str, cache: ModelCache, prompt: str, cheap_verification, loop_calls) -> None:
    loaded = cache.current
    cheap_verification(loaded.model, 64)  # adaptive drafters decide from fixed costs, not the wall clock
    sources = Sources.offered(loaded.name, allow_local_paths=True)
    options = _options(name, loaded.name)
    input_ids = encode_prompt(loaded.tokenizer, prompt)
    # first a run of the app's, so that per-model state (LayerSkip's calibration, drafters' measured step) settles
    comparison, _ = _app(name, loaded, cache, prompt, options, sources)
    loop_calls.clear()
    comparison, trace = _app(name, loaded, cache, prompt, options, sources)
    app_loop_calls = len(loop_calls)
    loop_calls.clear()
    direct = _direct(name, loaded, options, input_ids, cache, comparison)
    direct_loop_calls = len(loop_calls)

    assert trace.ids == direct["ids"] == comparison.traces[0].ids, "every route gives greedy's tokens"
    assert app_loop_calls == direct_loop_calls, (
        f"{name}: the app's call entered our loop {app_loop_calls} time(s), the library's {direct_loop_calls}")
    assert trace.target_forwards == direct["target_forwards"]
    if get_method(name).kind != "hfs":
        assert trace.route == "assisted" and trace.final_stats is None
        return
    assert trace.route == "ours" and direct_loop_calls == 1
    assert drafts_trees(comparison._extras[1]["candidate_generator"]) == direct["trees"]
    stats = trace.final_stats
    assert stats is trace.live_stats, "the live figures came from the call's own statistics"
    assert (stats.target_forwards, stats.drafted_tokens, stats.accepted_tokens) == (
        direct["target_forwards"], direct["drafted"], direct["accepted"])
    assert stats.tau == pytest.approx(direct["tau"]) and trace.tau == pytest.approx(direct["tau"])
    assert trace.drafted_tokens == direct["drafted"] and trace.accepted_tokens == direct["accepted"]


@pytest.fixture(scope="module")
def tiny_cache(tiny_chat_dir):
    cache = ModelCache(_no_eos_loader, device=torch.device("cpu"), warmup=False)
    cache.get(str(tiny_chat_dir))
    return cache


@pytest.mark.parametrize("name", TINY)
def test_the_app_runs_each_method_as_the_library_does(name, tiny_cache, cheap_verification, loop_calls):
    _check_same_as_the_library(name, tiny_cache, TINY_PROMPT, cheap_verification, loop_calls)


@pytest.fixture(scope="module")
def real_cache(integration):
    cache = ModelCache(_no_eos_loader, device=torch.device("cpu"), warmup=False)
    cache.get(hfs.models.DEFAULT_MODEL)
    return cache


# the real model's trees take 16-31 s each here: EAGLE's (the app's default) runs in the fast suite, the others are slow
# (their chains run in it, and every tree's strategy and options are the registry's: the test below, on tiny models)
SLOW_REAL = {"hybrid-tree", "medusa-tree", "dflash-tree"}


@pytest.mark.integration
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_REAL else n for n in REAL])
def test_the_app_runs_each_trained_drafter_as_the_library_does(name, real_cache, cheap_verification, loop_calls):
    _check_same_as_the_library(name, real_cache, REAL_PROMPT, cheap_verification, loop_calls)


def test_the_app_passes_the_registrys_strategy_itself(tiny_cache):
    """What the app passes to ``generate()`` is the registry's strategy, of its own class, with every attribute the
    library probes (``tree``, ``propose_tree``, ``reads_target``, ``num_tokens``, ``strategies``; the class checks of
    the batch and static-cache loops): no wrapper hides them. Only SuffixDecoding's cross-call history is off."""
    loaded = tiny_cache.current
    for name in [n for n in TINY if get_method(n).kind == "hfs"]:
        options = _options(name, loaded.name)
        request = CompareRequest(prompt=TINY_PROMPT, model=loaded.name, methods=["greedy", name], max_new_tokens=4,
                                 options={name: options} if options else {})
        comparison = Comparison(loaded, request, tiny_cache, 2048, Sources.offered(loaded.name, allow_local_paths=True))
        passed = comparison._extras[1]["candidate_generator"]
        built = get_method(name).build(loaded.model, loaded.tokenizer, comparison._resolve_options(get_method(name)))
        built = built["candidate_generator"]
        assert type(passed) is type(built), name
        expected = {**vars(built), "history_tokens": 0} if hasattr(built, "history_tokens") else vars(built)
        assert {k: v for k, v in vars(passed).items() if k != "model"} == {
            k: v for k, v in expected.items() if k != "model"}, name
        assert drafts_trees(passed) == drafts_trees(built), name
    assert drafts_trees(Comparison(
        loaded, CompareRequest(prompt=TINY_PROMPT, model=loaded.name, methods=["greedy", "suffix"], max_new_tokens=4,
                               options={}), tiny_cache, 2048)._extras[1]["candidate_generator"])
