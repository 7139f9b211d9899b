"""The two tokenizers of a :class:`DraftModel` that drafts across tokenizers, kept with a saved model.

A spec (hf/spec.py) names the draft model: its folder inside the saved model's folder, or a registry name. When the
drafter drafts across tokenizers, saving also writes

- the drafter's tokenizer beside the draft model, in its folder (a registry model's cached folder holds its own
  already, and is never written to);
- the target's tokenizer into the saved model's folder, unless a tokenizer is there already (it is then the one
  kept: the tokenizer that ``AutoTokenizer.from_pretrained(folder)`` gives everyone);

and records ``"across_tokenizers": true`` among the spec's options. Loading such a spec reads both back from those
two folders only. A model folder is untrusted input: the tokenizer's files are copied (regular files under their
caps, confined to their folder, a link out of it refused) into a fresh temporary folder, the tokenizer's
``tokenizer_config.json`` loses its file-naming keys and ``auto_map`` there, and transformers reads that copy with
``local_files_only=True`` and no remote code: it reads no file it was not handed and downloads nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ...options import escaped
from ...registry import integrity
from ...registry.spec_bounds import SpecError

SPEC_OPTION = "across_tokenizers"  # the spec's option saying that both tokenizers are kept with the model
CONFIG = "tokenizer_config.json"
# what a saved tokenizer is made of (the names transformers writes and reads; anything else in the folder is left)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json")
MAX_TOKENIZER_FILE_BYTES = 64 << 20  # one file (Gemma 3's tokenizer.json is 33 MB)
MAX_TOKENIZER_BYTES = 128 << 20  # all of a tokenizer's files


def _error(message: str) -> Exception:
    return SpecError(message)  # as every other file a spec reads fails


def has_tokenizer(folder: Path) -> bool:
    return any((folder / name).exists() for name in (CONFIG, "tokenizer.json"))


def draft_folder(path: str, directory: Path, what: str) -> tuple[Path, bool]:
    """The folder of the draft model a spec names by ``path`` and whether it is a registry model's cached folder (a
    registry name), else ``directory / path`` confined to ``directory``."""
    from ...registry import models

    if path in models.REGISTRY:
        return models.model_path(path), True
    folder = integrity.confined(directory, path, what)
    if folder == Path(directory).resolve():
        raise _error(f"{what}: the draft model is the saved model's folder itself ({path!r}), where its tokenizer and "
                     "the target's would overwrite each other. Save the draft model into a subfolder of its own.")
    return folder, False


def save_tokenizers(strategy: Any, directory: Path, path: str, what: str) -> dict:
    """Write both tokenizers of ``strategy`` (drafting across tokenizers) beside the model saved in ``directory``,
    whose spec names the draft model by ``path``; the options the spec records for them."""
    folder, registered = draft_folder(path, directory, what)
    if registered:
        if not has_tokenizer(folder):
            raise _error(f"{what}: the registry model {path!r} has no tokenizer in its cached folder {folder} "
                         f"({CONFIG}); fetch it again (`hf-speculative models fetch {path} --force`).")
    else:
        strategy.tokenizer.save_pretrained(folder)
    if not has_tokenizer(directory):
        strategy.target_tokenizer.save_pretrained(directory)
    return {SPEC_OPTION: True}


def load_tokenizers(options: dict, path: str, base_dir: Any, where: str) -> dict:
    """``options`` of a spec, with the two tokenizers read back when it records ``across_tokenizers`` (the drafter's
    from the draft model's folder, the target's from ``base_dir``, the model's folder), without that option."""
    options = dict(options)
    if not options.pop(SPEC_OPTION, False):
        return options
    what = f"{where}.options.{SPEC_OPTION}"
    if base_dir is None:
        raise _error(f"{what}: the drafter drafts across tokenizers, read from the model's folder, and this model was "
                     "not loaded from a local folder. Pass them: DraftModel(draft, tokenizer=draft_tok, "
                     "target_tokenizer=target_tok).")
    base = Path(base_dir)
    folder, _ = draft_folder(path, base, f"{where}.path")
    options["tokenizer"] = read_tokenizer(folder, f"{what} (the drafter's tokenizer)",
                                          "save it there: draft_tok.save_pretrained(that folder)")
    options["target_tokenizer"] = read_tokenizer(base, f"{what} (the target's tokenizer)",
                                                 "save it beside the model: target_tok.save_pretrained(the model's "
                                                 "folder)")
    return options


def read_tokenizer(folder: Path, what: str, fix: str) -> Any:
    """The tokenizer saved in ``folder``, read through a checked copy of its files (see the module's docstring).

    Raises:
        SpecError: no ``tokenizer_config.json`` there, or transformers cannot read the copy. FileRefused: a file
            that is a link out of ``folder``, not a regular file, or over its cap.
    """
    from transformers import AutoTokenizer

    folder = Path(folder).resolve()
    if not (folder / CONFIG).exists():
        raise _error(f"{what}: {folder / CONFIG} is missing; {fix}, or save the model again from the strategy holding "
                     "both tokenizers.")
    total = 0
    with tempfile.TemporaryDirectory(prefix="hfs-tokenizer-") as copy:
        for name in TOKENIZER_FILES:
            if not os.path.lexists(folder / name):
                continue
            source = integrity.folder_file(folder, name, f"{what} {name}")
            data = integrity.read_capped(source, MAX_TOKENIZER_FILE_BYTES, f"{what} {name}")
            total += len(data)
            if total > MAX_TOKENIZER_BYTES:
                raise integrity.FileRefused(f"{what}: the tokenizer's files in {folder} hold more than "
                                            f"{MAX_TOKENIZER_BYTES} bytes, so they are not read; use the tokenizer "
                                            "saved with the model.")
            if name == CONFIG:
                data = _without_file_names(data, f"{what} {name}")
            (Path(copy) / name).write_bytes(data)
        try:
            return AutoTokenizer.from_pretrained(copy, local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError, TypeError, KeyError, ImportError) as error:
            raise _error(f"{what}: cannot read the tokenizer saved in {escaped(folder)} ({type(error).__name__}: "
                         f"{escaped(error, 300)}); {fix}.") from error


def _without_file_names(data: bytes, what: str) -> bytes:
    """A ``tokenizer_config.json`` without the keys that name files (``vocab_file``, ``tokenizer_file``...: such a key
    would make transformers read that path instead of the copy) or remote code (``auto_map``)."""
    try:
        config = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise integrity.FileRefused(f"{what} is not valid JSON ({type(error).__name__}); save the tokenizer "
                                    "again.") from None
    if not isinstance(config, dict):
        raise integrity.FileRefused(f"{what} holds no JSON object; save the tokenizer again.")
    kept = {k: v for k, v in config.items() if k != "auto_map" and not k.endswith(("_file", "_files"))}
    return json.dumps(kept).encode()
