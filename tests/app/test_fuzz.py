"""The app's whole ``/compare`` API under hostile input (issue 30): every parameter, every kind of bad value.

The fuzz table (``tools/app_fuzz.py``, shared with ``tools/load_test.py``) throws oversize and negative
integers, floats, NaN, infinities, strings, None, lists, dicts, server paths and Hub ids at each
parameter in turn, ``<method>__<option>`` included. Each must get a clear message naming the field, or
be accepted within its documented range; the app keeps serving; no file appears outside the app's
cache. The table runs through the request checks (all of it), the request handler on a tiny model
(a sample), and a served app (a few, to see that gradio hands the values over as sent).
"""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import pytest
import torch

from hf_speculative.app.request import (
    INTEGER_RANGES,
    MAX_NAME_CHARS,
    MAX_SEED,
    TEMPERATURE_RANGE,
    AppError,
    CompareRequest,
    Sources,
    _short,
    check_exposure,
    option_slots,
    parse_request,
)
from tests.app.conftest import TINY_PROMPT, generation_threads, slow_app, wait_until
from tests.conftest import launch_local
from tools.app_fuzz import FIXED, JUNK, NUMBERS, PATHS, HUB_IDS, api_name, form, hostile_cases, parameter_kinds

MAX_NEW = 64
SLOTS = {api_name(s.method, s.key): s for s in option_slots()}


def _parse(args: list, default_model: str = "default-model", sources: Sources | None = None) -> CompareRequest:
    return parse_request(*args[:8], args[8:], slots=option_slots(), default_model=default_model,
                         max_new_tokens_limit=MAX_NEW, sources=sources or Sources.offered(default_model))


def _field(name: str) -> str:
    """The words a message about parameter ``name`` starts its field with."""
    from hf_speculative.tooling.methods import get_method

    if name in SLOTS:
        return f"{get_method(SLOTS[name].method).label}: {SLOTS[name].key}"
    return {"prompt": "The prompt", "model": "Model", "methods": "", "max_new_tokens": "Max new tokens",
            "sample": "Sample", "temperature": "Temperature", "seed": "Seed",
            "concurrent": "Run methods at the same time"}[name]


def _whole(value, low, high):
    """The independent oracle of a whole-number field: the int, or None when it must be refused."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip()) if len(value) <= 40 else None
        except ValueError:
            return None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        return None
    return int(value) if low <= value <= high else None


UNSET = object()


def _expected(name: str, kind: str, value):
    """What the checks must do with ``value`` in parameter ``name``: ``AppError``, ``UNSET`` (left to the
    default), or the value the request must hold."""
    blank = value is None or (isinstance(value, str) and not value.strip())
    if name == "prompt":
        if isinstance(value, str) and value.strip() and len(value) <= 20_000:
            return value
        return AppError
    if name in ("model",) or (name in SLOTS and SLOTS[name].widget in ("model", "drafter", "layers")):
        if blank and not isinstance(value, (list, dict)):
            return UNSET
        if name in SLOTS and SLOTS[name].widget == "layers":
            return AppError  # the table holds no valid layer list
        return AppError  # no path, Hub id or junk is offered
    if name == "methods":
        return ["prompt-lookup"] if value == "prompt-lookup" else AppError
    if kind == "flag" and name in SLOTS:  # a method's boolean option (e.g. adaptive): blank leaves its default
        if value is None or (isinstance(value, str) and not value.strip()):
            return UNSET
        return value if isinstance(value, bool) else AppError
    if kind == "flag":
        return bool(value) if value is None or isinstance(value, bool) else AppError
    if name == "max_new_tokens":
        return _whole(value, 1, MAX_NEW) or AppError
    if name == "seed":
        return UNSET if value is None else (AppError if _whole(value, 0, MAX_SEED) is None else _whole(value, 0, MAX_SEED))
    if name == "temperature":
        if value is None:
            return UNSET
        try:
            number = float(value) if not isinstance(value, bool) and (not isinstance(value, str) or len(value) <= 40) else None
        except (TypeError, ValueError):
            number = None
        ok = number is not None and math.isfinite(number) and TEMPERATURE_RANGE[0] <= number <= TEMPERATURE_RANGE[1]
        return number if ok else AppError
    slot = SLOTS[name]
    if blank and not isinstance(value, (list, dict)):
        return UNSET
    low, high = INTEGER_RANGES[slot.key]
    whole = _whole(value, low, high)
    return AppError if whole is None else whole


@pytest.mark.parametrize("name", list(parameter_kinds()))
def test_every_parameter_refuses_hostile_values_with_a_message_naming_it(name):
    kind = parameter_kinds()[name]
    slot = SLOTS.get(name)
    methods = [slot.method] if slot else ["prompt-lookup"]
    checked = 0
    for param, value in hostile_cases():
        if param != name:
            continue
        args = form({name: value, **({} if name == "methods" else {"methods": methods})})
        expected = _expected(name, kind, value)
        if expected is AppError:
            with pytest.raises(AppError) as caught:
                _parse(args)
            message = str(caught.value)
            assert message.startswith(_field(name)) or name == "methods", (name, value, message)
            assert len(message) < 700, "a hostile value is not echoed back in full"
            assert "Traceback" not in message
        else:
            request = _parse(args)
            if name == "prompt":
                assert request.prompt == value
            elif name == "model":
                assert request.model == "default-model"
            elif name == "methods":
                assert request.methods == ["greedy", *expected]
            elif name == "max_new_tokens":
                assert request.max_new_tokens == expected
            elif name in ("sample", "concurrent"):
                assert (request.sampling is not None if name == "sample" else request.concurrent) == expected
            elif name in ("temperature", "seed"):
                assert request.sampling is None  # not sampling: checked, not used
            else:
                held = request.options.get(slot.method, {}).get(slot.key, UNSET)
                assert held == expected, (name, value, held)
        checked += 1
    assert checked >= 10, f"the table has too few values for {name}"


def test_sampling_values_are_checked_and_kept():
    request = _parse(form({"sample": True, "temperature": "0.5", "seed": 2**63 - 1}))
    assert request.sampling == {"temperature": 0.5, "seed": 2**63 - 1}
    for seed, temperature in [(2**63, 0.7), (10**30, 0.7), (-1, 0.7), (1.5, 0.7), (0, math.nan), (0, 0.0), (0, 2.05)]:
        with pytest.raises(AppError, match="^(Seed|Temperature) must be"):
            _parse(form({"sample": True, "temperature": temperature, "seed": seed}))
    with pytest.raises(AppError, match=r"Seed must be a whole number from 0 to 2\*\*63 - 1, got 1000000000000"):
        _parse(form({"sample": True, "seed": 10**30}))


def test_names_are_chosen_from_lists_whatever_exists_on_disk(tmp_path):
    """Names are compared as strings: an existing folder, a file, a missing path get the same answer."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.json").write_text("{}")
    for name, key in [("model", None), *[(n, s.key) for n, s in SLOTS.items() if s.widget in ("model", "drafter")]]:
        messages = set()
        for path in (tmp_path / "folder", tmp_path / "file.json", tmp_path / "missing", Path("/etc")):
            methods = [SLOTS[name].method] if key else ["prompt-lookup"]
            with pytest.raises(AppError) as caught:
                _parse(form({name: str(path), "methods": methods}))
            messages.add(str(caught.value).replace(_short(str(path)), "PATH"))
        assert len(messages) == 1 and "is not offered here; pick one of:" in messages.pop()
    # the offered names pass: the registry's models, the operator's own model, the shipped drafters
    offered = Sources.offered("/operator/model")
    assert offered.models[0] == "/operator/model" and "smollm2-135m-instruct" in offered.models
    request = _parse(form({"model": "smollm2-135m-instruct", "eagle__eagle": offered.eagle[0],
                           "early_exit_adapter__adapter": offered.adapters[0], "draft_model__draft_model": "/operator/model",
                           "methods": ["eagle", "early-exit-adapter", "draft-model"]}), default_model="/operator/model",
                     # the registry model passes as a name whether or not it is on this disk (test_visitors.py checks
                     # that one not on disk is then refused, without --allow-downloads)
                     sources=Sources.offered("/operator/model", allow_downloads=True))
    assert request.model == "smollm2-135m-instruct"
    assert request.options == {"eagle": {"eagle": offered.eagle[0]}, "early-exit-adapter": {"adapter": offered.adapters[0]},
                               "draft-model": {"draft_model": "/operator/model", "adaptive": True}}


def test_paths_and_hub_ids_only_with_allow_local_paths():
    local = Sources.offered("default-model", allow_local_paths=True)
    request = _parse(form({"model": "/some/folder", "eagle__eagle": "org/eagle-drafter", "methods": ["eagle"]}),
                     sources=local)
    assert request.model == "/some/folder" and request.options == {"eagle": {"eagle": "org/eagle-drafter"}}
    for value in ["x" * (MAX_NAME_CHARS + 1), "a\x00b", 5, ["/etc"]]:
        with pytest.raises(AppError, match="^Model"):
            _parse(form({"model": value}), sources=local)


def test_the_calibration_file_is_not_a_parameter_of_the_api():
    assert "layer_skip__calibration_file" not in parameter_kinds()
    assert not any(s.key == "calibration_file" for s in option_slots())
    assert len(form()) == len(FIXED) + len(option_slots())


# -- the flag's rules --------------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2", None])
def test_allow_local_paths_is_accepted_on_localhost(host, monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    check_exposure(True, host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "example.org"])
def test_allow_local_paths_is_refused_beyond_localhost(host, monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    with pytest.raises(ValueError, match=r"--allow-local-paths is refused when the app listens beyond localhost"):
        check_exposure(True, host)
    check_exposure(False, host)  # without the flag any host is fine: only offered names are accepted
    monkeypatch.setenv("GRADIO_SERVER_NAME", host)
    with pytest.raises(ValueError, match="beyond localhost"):
        check_exposure(True, None)


def test_allow_local_paths_is_refused_on_a_space_and_with_a_share_link(monkeypatch):
    from hf_speculative.app.ui import build_app

    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    with pytest.raises(ValueError, match="public share link"):
        check_exposure(True, "127.0.0.1", share=True)
    monkeypatch.setenv("SPACE_ID", "someone/some-space")
    with pytest.raises(ValueError, match=r"--allow-local-paths is refused on a Hugging Face Space \(SPACE_ID is set\)"):
        build_app(allow_local_paths=True)
    build_app()  # the Space's normal start


def test_a_built_app_with_local_paths_refuses_to_launch_beyond_localhost(monkeypatch):
    from hf_speculative.app.ui import build_app

    monkeypatch.delenv("SPACE_ID", raising=False)
    demo = build_app(allow_local_paths=True)
    for kwargs in ({"server_name": "0.0.0.0"}, {"server_name": "127.0.0.1", "share": True}):
        with pytest.raises(ValueError, match="--allow-local-paths is refused"):
            demo.launch(prevent_thread_lock=True, **kwargs)


def test_app_py_refuses_the_flag_beyond_localhost_at_start(monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("hfs_app_main", Path(__file__).resolve().parents[2] / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    monkeypatch.delenv("SPACE_ID", raising=False)
    with pytest.raises(SystemExit, match="app.py: --allow-local-paths is refused when the app listens beyond localhost"):
        app.main(["--allow-local-paths", "--host", "0.0.0.0"])
    monkeypatch.setenv("SPACE_ID", "someone/some-space")
    with pytest.raises(SystemExit, match="refused on a Hugging Face Space"):
        app.main(["--allow-local-paths"])
    assert app._parse_args([]).allow_local_paths is False


# -- through the request handler, on a tiny model ----------------------------------------------------
def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")} if root.exists() else set()


def _outside(root: Path, cache_root: Path) -> set[Path]:
    """Files and folders under ``root`` that are not the package cache or in it."""
    return _files(root) - _files(cache_root) - {cache_root}


def _handle(cache, default_model: str, args: list, sources: Sources) -> tuple[str, dict]:
    from hf_speculative.app.ui import _run_comparison

    form_ = (*args[:8], list(args[8:]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gr.Warning outside a request warns
        outputs = list(_run_comparison(cache, option_slots(), default_model, MAX_NEW, 2048, form_, sources=sources))
    return outputs[-1][0], outputs[-1][-1]


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """An isolated package cache and working directory; yields ``(root, cache_root)``."""
    cache_root = tmp_path / "cache"
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(cache_root))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path, cache_root


def test_hostile_requests_through_the_handler_get_messages_and_the_app_keeps_serving(tiny_chat_dir, sandbox):
    from hf_speculative.app.cache import ModelCache

    root, cache_root = sandbox
    default = str(tiny_chat_dir)
    cache = ModelCache(device=torch.device("cpu"), warmup=False)
    sources = Sources.offered(default)
    probe = Path("/tmp/hfs-fuzz-probe.json")
    probe_existed = probe.exists()
    before = _outside(root, cache_root)
    # per parameter: paths, a Hub id, the worst numbers and junk (the full table runs through the checks above)
    picks = {repr(v) for v in PATHS[:4] + HUB_IDS[:1] + NUMBERS[:2] + NUMBERS[6:8] + JUNK[2:5] + JUNK[-3:]}
    seen = 0
    for name, value in hostile_cases():
        if repr(value) not in picks:
            continue
        slot = SLOTS.get(name)
        methods = [slot.method] if slot else ["prompt-lookup"]
        args = form({name: value, **({} if name == "methods" else {"methods": methods})}, prompt=TINY_PROMPT,
                    model=default, max_new_tokens=4)
        status, results = _handle(cache, default, args, sources)
        seen += 1
        assert status.startswith(("**⚠️", "Done:")), (name, value, status)
        assert "Traceback" not in status and "Unexpected error" not in status and len(status) < 900
        if status.startswith("**⚠️"):
            assert set(results) == {"error"} and results["error"] in status, (name, value)
    assert seen > 100
    status, results = _handle(cache, default, form(prompt=TINY_PROMPT, model=default, max_new_tokens=6), sources)
    assert status.startswith("Done: 2/2") and results["methods"][1]["identical_to_baseline"] is True
    assert cache.loads == 1 and cache.current.name == default, "no hostile request replaced the model"
    assert _outside(root, cache_root) == before, "no file may appear outside the app's cache"
    assert probe.exists() == probe_existed


def test_layer_skip_keeps_its_calibration_in_the_package_cache_only(tiny_chat_dir, sandbox):
    from hf_speculative.app.cache import ModelCache
    from hf_speculative.drafters.self_speculative.calibration import model_fingerprint

    from hf_speculative.registry.models import load_model

    def loader(name, device=None):  # no EOS: the call generates the 32 tokens LayerSkip calibrates on
        model, tokenizer = load_model(name)
        model.generation_config.eos_token_id = None
        return model, tokenizer

    root, cache_root = sandbox
    default = str(tiny_chat_dir)
    cache = ModelCache(loader, device=torch.device("cpu"), warmup=False)
    outside = _outside(root, cache_root)
    status, results = _handle(cache, default, form(prompt=TINY_PROMPT, model=default, methods=["layer-skip"],
                                                   max_new_tokens=48), Sources.offered(default))
    assert status.startswith("Done: 2/2"), status
    saved = cache_root / "calibrations" / "layer-skip" / f"{model_fingerprint(cache.current.model)}.json"
    assert saved.is_file(), "the 'auto' calibration is kept under the model's fingerprint"
    assert _outside(root, cache_root) == outside, "nothing written outside the package cache"
    assert results["methods"][1]["identical_to_baseline"] is True
    assert results["methods"][1]["hfs_stats"]["extra"]["layer-skip"]["source"] == "calibrated"
    # a later process (a fresh model object, same weights) reads it instead of calibrating again
    cache.clear()
    status, results = _handle(cache, default, form(prompt=TINY_PROMPT, model=default, methods=["layer-skip"],
                                                   max_new_tokens=8), Sources.offered(default))
    assert results["methods"][1]["hfs_stats"]["extra"]["layer-skip"]["source"] == "file", results["methods"][1]


def test_a_failed_switch_of_model_keeps_the_loaded_one(tiny_chat_dir, sandbox, tmp_path):
    from hf_speculative.app.cache import ModelCache

    default = str(tiny_chat_dir)
    cache = ModelCache(device=torch.device("cpu"), warmup=False)
    local = Sources.offered(default, allow_local_paths=True)
    assert _handle(cache, default, form(prompt=TINY_PROMPT, model=default, max_new_tokens=4), local)[0].startswith("Done")
    loaded = cache.current
    (tmp_path / "not-a-model").mkdir()
    for bad in (str(tmp_path / "not-a-model"), str(tmp_path / "missing")):
        status, results = _handle(cache, default, form(prompt=TINY_PROMPT, model=bad, max_new_tokens=4), local)
        assert status.startswith(f"**⚠️ Cannot load model {bad!r}"), status
        assert cache.current is loaded and cache.loads == 1, "the loaded model stays after a failed switch"
    status, _ = _handle(cache, default, form(prompt=TINY_PROMPT, model=default, max_new_tokens=4), local)
    assert status.startswith("Done: 2/2") and cache.loads == 1


def test_layer_options_are_checked_against_the_loaded_model(tiny_chat_dir, sandbox):
    from hf_speculative.app.cache import ModelCache

    default = str(tiny_chat_dir)  # 2 layers
    cache = ModelCache(device=torch.device("cpu"), warmup=False)
    sources = Sources.offered(default)
    cases = [({"early_exit__exit_layer": 2, "methods": ["early-exit"]}, "Early exit (hfs): exit_layer must be from 1 to 1"),
             ({"hf_early_exit__exit_layer": 500, "methods": ["hf-early-exit"]}, "exit_layer must be from 1 to 1 for"),
             ({"layer_skip__skip": "0,1", "methods": ["layer-skip"]}, "skip must list fewer than 2 distinct layers"),
             ({"layer_skip__skip": "7", "methods": ["layer-skip"]}, "skip must list fewer than 2 distinct layers")]
    for overrides, message in cases:
        status, _ = _handle(cache, default, form(overrides, prompt=TINY_PROMPT, model=default), sources)
        assert message in status, status
    status, results = _handle(cache, default, form({"early_exit__exit_layer": 1, "methods": ["early-exit"]},
                                                   prompt=TINY_PROMPT, model=default, max_new_tokens=8), sources)
    assert status.startswith("Done: 2/2") and results["methods"][1]["status"] == "done"


# -- through a served app ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def restricted_app(tiny_chat_dir):
    """The app as a Space serves it: no flag, the tiny model as the operator's model."""
    from gradio_client import Client

    from hf_speculative.app.cache import ModelCache
    from hf_speculative.app.ui import build_app

    cache = ModelCache(device=torch.device("cpu"), warmup=False)
    demo = build_app(cache, default_model=str(tiny_chat_dir), max_new_tokens_limit=MAX_NEW)
    url, _ = launch_local(demo)
    yield Client(url, verbose=False), cache
    demo.close()


def test_the_served_api_hands_values_over_as_sent_and_answers_with_the_apps_messages(restricted_app, tiny_chat_dir):
    client, cache = restricted_app
    default = str(tiny_chat_dir)
    params = [p["parameter_name"] for p in client.view_api(return_format="dict")["named_endpoints"]["/compare"]["parameters"]]
    assert params == list(parameter_kinds()), "one API parameter per form field, calibration_file not among them"
    cases = [({"model": "/etc"}, "Model '/etc' is not offered here"),
             ({"model": "openai-community/gpt2"}, "Model 'openai-community/gpt2' is not offered here"),
             ({"eagle__eagle": "/etc/shadow", "methods": ["eagle"]}, "EAGLE (hfs): eagle '/etc/shadow' is not offered"),
             ({"prompt_lookup__num_tokens": 10**9}, "num_tokens must be a whole number from 1 to 64, got 1000000000."),
             ({"sample": True, "seed": 10**30}, "Seed must be a whole number from 0 to 2**63 - 1"),
             ({"methods": ["no-such", "/etc"]}, "Unknown method(s): 'no-such', '/etc'."),
             ({"max_new_tokens": "lots"}, "Max new tokens must be a whole number from 1 to 64, got 'lots'."),
             ({"temperature": "hot"}, "Temperature must be a number from 0.05 to 2.0, got 'hot'."),
             ({"sample": "yes"}, "Sample must be true or false, got 'yes'.")]
    for overrides, message in cases:
        out = client.predict(*form(overrides, prompt=TINY_PROMPT, model=default), api_name="/compare")
        assert message in out[0] and message in out[-1]["error"], (overrides, out[0])
    out = client.predict(*form(prompt=TINY_PROMPT, model=default, max_new_tokens=6), api_name="/compare")
    assert out[0].startswith("Done: 2/2") and cache.loads == 1


def test_past_the_queue_bound_the_app_answers_queue_full_and_cancelled_runs_stop(tiny_chat_dir):
    from gradio_client import Client

    # no per-client share here (test_queue_share.py checks it): one client meets the queue's own bound
    with slow_app(tiny_chat_dir, max_queue=1, max_per_session=0, max_per_address=0) as (url, forwards):
        client = Client(url, verbose=False)
        jobs = [client.submit(*form(prompt=TINY_PROMPT, model=str(tiny_chat_dir), methods=["hf-prompt-lookup"],
                                    max_new_tokens=400), api_name="/compare") for _ in range(4)]
        assert wait_until(generation_threads, 30), "the first request never started"
        # one runs and one waits at most: the others are answered at once, "queue is full"
        assert wait_until(lambda: sum(job.done() for job in jobs) >= 2, 10)
        refused = [job for job in jobs if job.done()]
        for job in refused:
            with pytest.raises(Exception, match="(?i)queue is full"):
                job.result(timeout=1)
        for job in jobs:
            job.cancel()
        assert wait_until(lambda: not generation_threads() and all(job.done() for job in jobs), 10), \
            "a cancelled generation kept running"
        stopped = len(forwards)
        start_cpu, start = time.process_time(), time.monotonic()
        time.sleep(1.0)
        assert len(forwards) == stopped, "no forward after the cancel"
        assert (time.process_time() - start_cpu) / (time.monotonic() - start) < 0.5, "the CPU went back to idle"
