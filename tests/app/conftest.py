"""Fixtures of the demo app's tests: tiny chat checkpoints on disk and the app served on a free port.

The app is launched in the test process (``prevent_thread_lock``), so tests can also look at its model
cache and at the generation threads. No test downloads anything.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.conftest import CHAT_WORDS, launch_local, make_chat_tokenizer

torch.set_num_threads(1)
gr = pytest.importorskip("gradio", reason="the demo app needs the `app` extra: pip install -e '.[app]'")

# Repetitive prompt words: the tiny model's greedy text loops, so prompt lookup gets drafts accepted.
TINY_PROMPT = "the cat sat on the mat and the dog sat on the mat and the cat ran to the house"


def save_tiny_chat_model(folder: Path, words: list[str], seed: int = 0) -> Path:
    """A word-level chat tokenizer over ``words`` and a seeded tiny Llama of exactly its vocabulary
    (every generated id decodes to a word), saved in ``folder``."""
    tokenizer = make_chat_tokenizer(words)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer.get_vocab()), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512,
    )
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_chat_dir(tmp_path_factory) -> Path:
    """The tiny chat checkpoint the app tests use as target (and as its own draft model)."""
    return save_tiny_chat_model(tmp_path_factory.mktemp("app-models") / "tiny-chat", CHAT_WORDS)


@pytest.fixture(scope="session")
def other_vocab_dir(tmp_path_factory) -> Path:
    """A tiny chat model with another vocabulary: a draft model that does not fit ``tiny_chat_dir``."""
    words = [w.upper() for w in CHAT_WORDS] + ["extra", "words", "here"]
    return save_tiny_chat_model(tmp_path_factory.mktemp("app-models") / "other-vocab", words, seed=1)


@pytest.fixture(scope="module")
def served_app(tiny_chat_dir):
    """``(url, demo, cache)``: the app with the tiny model as default, on a free localhost port."""
    from hf_speculative.app.cache import ModelCache
    from hf_speculative.app.ui import build_app

    from hf_speculative.core import policy

    cache = ModelCache(device=torch.device("cpu"))
    # The adaptive drafters decide from measured costs; fix them (cheap, GPU-like) so that under any
    # machine load prompt lookup drafts, and the highlighting has accepted drafts to show.
    policy.verify_costs_for(cache.get(str(tiny_chat_dir)).model, 32).fix([1.0 + 0.01 * k for k in range(33)])
    # local folders allowed (tests pass the tiny models' folders); test_fuzz.py serves the app without the flag
    demo = build_app(cache, default_model=str(tiny_chat_dir), max_new_tokens_limit=256, default_max_new_tokens=24,
                     allow_local_paths=True)
    url, _ = launch_local(demo)
    yield url, demo, cache
    demo.close()


@pytest.fixture(scope="module")
def client(served_app):
    from gradio_client import Client

    return Client(served_app[0], verbose=False)


def compare_args(prompt: str, model: str, methods: list[str], *, max_new_tokens: int = 24, sampling: bool = False,
                 temperature: float = 0.7, seed: int = 0, options: dict | None = None) -> list:
    """The ``/compare`` endpoint's positional arguments; ``options`` maps ``(method, key)`` to a value."""
    from hf_speculative.app.request import option_slots

    options = options or {}
    values = [options.get((s.method, s.key), s.default) for s in option_slots()]
    return [prompt, model, methods, max_new_tokens, sampling, temperature, seed, False, *values]


def generation_threads() -> list[threading.Thread]:
    """The app's generation threads that are still running."""
    from hf_speculative.app.session import THREAD_PREFIX

    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]


@contextlib.contextmanager
def slow_app(model_dir: Path, seconds_per_forward: float = 0.02, max_queue: int = 16, **options):
    """Serve an app whose model takes ``seconds_per_forward`` per forward and never stops by itself
    (no EOS): only a cancel ends a long generation early. Yields ``(url, forwards)``, ``forwards`` a
    list that grows by one per forward. ``options`` go to ``build_app`` (e.g. ``max_per_session``)."""
    from hf_speculative.app.cache import ModelCache
    from hf_speculative.app.ui import build_app
    from hf_speculative.registry.models import load_model

    forwards: list[int] = []

    def slow_forward(*_):  # returns None: the forward's inputs stay as they are
        forwards.append(1)
        time.sleep(seconds_per_forward)

    def loader(name, device=None):
        model, tokenizer = load_model(name)
        model.register_forward_pre_hook(slow_forward)
        model.generation_config.eos_token_id = None
        return model, tokenizer

    demo = build_app(ModelCache(loader, device=torch.device("cpu"), warmup=False), default_model=str(model_dir),
                     max_new_tokens_limit=512, default_max_new_tokens=400, default_methods=["hf-prompt-lookup"],
                     max_queue=max_queue, **options)
    url, _ = launch_local(demo)
    try:
        yield url, forwards
    finally:
        demo.close()


def wait_until(condition, timeout: float) -> bool:
    """Poll ``condition()`` every 50 ms for up to ``timeout`` seconds; its last value."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(condition())
