"""What the hostile-folder battery refuses, seen from the side of legitimate use: confined paths still work,
the suffix history keeps its byte budget, strategies stay valid after assignment, load_model verifies.

(The refusals themselves are in ``test_hostile_folder.py``.)"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

import hf_speculative as hfs
from hf_speculative.registry import integrity, models
from hf_speculative import options
from hf_speculative.hf import spec
from hf_speculative.drafters.suffix import history as suffix_history
from hf_speculative.drafters.self_speculative.calibration import SkipCalibration
from hf_speculative.drafters.suffix.history import SuffixHistory
from tests.conftest import build_model, char_tokenizer, prompt_inputs, random_eagle, sibling_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# -- paths -------------------------------------------------------------------------------------------------
def test_confined_accepts_names_inside_and_links_within(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.json").write_text("{}")
    os.symlink(tmp_path / "sub" / "a.json", tmp_path / "link.json")  # a link that stays inside
    assert integrity.confined(tmp_path, "sub/a.json", "f") == (tmp_path / "sub" / "a.json").resolve()
    assert integrity.confined(tmp_path, "link.json", "f") == (tmp_path / "sub" / "a.json").resolve()
    assert integrity.confined(tmp_path, "not-yet.json", "f") == (tmp_path / "not-yet.json").resolve()


def test_a_hub_cache_snapshot_may_link_into_its_blobs(tmp_path):
    """The Hub cache stores a snapshot's files as links to ``../../blobs/``: inside the repository's folder."""
    repo = tmp_path / "models--someone--model"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_text("{}")
    snapshot = repo / "snapshots" / "0123"
    (snapshot / "eagle").mkdir(parents=True)
    os.symlink("../../../blobs/abc", snapshot / "eagle" / "config.json")
    assert integrity.confined(snapshot / "eagle", "config.json", "f") == (repo / "blobs" / "abc").resolve()
    (tmp_path / "elsewhere").write_text("{}")
    os.symlink(tmp_path / "elsewhere", snapshot / "eagle" / "other.json")
    with pytest.raises(integrity.FileRefused, match="symlink that leads out"):
        integrity.confined(snapshot / "eagle", "other.json", "f")


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "~/x", "a\\b", "", "x" * 2000, 5, None])
def test_confined_refuses(tmp_path, name):
    with pytest.raises(integrity.FileRefused, match="the field"):
        integrity.confined(tmp_path, name, "the field")


def test_read_capped_reads_at_most_the_cap(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert integrity.read_capped(path, 10, "f") == b"x" * 10
    with pytest.raises(integrity.FileRefused, match="f: .* has 10 bytes, over the limit of 9 bytes"):
        integrity.read_capped(path, 9, "f")
    with pytest.raises(integrity.FileRefused, match="is a device"):
        integrity.read_capped("/dev/zero", 10, "f")
    with pytest.raises(integrity.FileRefused, match="is a folder"):
        integrity.read_capped(tmp_path, 10, "f")


# -- files of a spec go to the cache ---------------------------------------------------------------------------
def test_a_spec_calibration_file_is_read_from_the_folder_and_kept_in_the_cache(tmp_path, cache):
    model = hfs.enable(build_model("llama"))
    model.save_pretrained(tmp_path / "model")
    SkipCalibration(skip=[0], num_layers=2, model="tiny").save(tmp_path / "model" / "cal.json")
    restored = spec.from_spec({"method": "layer-skip", "options": {"calibration_file": "cal.json"}}, model,
                              tmp_path / "model")
    kept = restored.calibration_file
    assert kept.startswith(str(cache / "spec-files")) and os.path.isfile(kept)
    assert json.loads(Path(kept).read_text())["skip"] == [0]
    assert restored.drafted_layers(model) == [1]
    # a fresh load of the same spec reads the kept file, not the folder's (which may be read-only)
    (tmp_path / "model" / "cal.json").unlink()
    again = spec.from_spec({"method": "layer-skip", "options": {"calibration_file": "cal.json"}}, model,
                           tmp_path / "model")
    assert again.calibration_file == kept


def test_saving_copies_a_history_file_into_the_folder(tmp_path, cache):
    model = hfs.enable(build_model("llama"))
    strategy = hfs.SuffixDecoding(history_file=str(tmp_path / "mine.json"))
    strategy.history(model).add([4, 5, 6])
    written = spec.save_strategy(strategy, tmp_path / "saved")
    assert written["options"]["history_file"] == "suffix-history.json"
    assert (tmp_path / "saved" / "suffix-history.json").read_bytes() == (tmp_path / "mine.json").read_bytes()


# -- the suffix history's byte budget --------------------------------------------------------------------------
def test_the_history_keeps_its_byte_budget_oldest_out_first():
    depth = 4
    budget = 40 * depth * suffix_history.HISTORY_NODE_BYTES  # room for about 40 tokens of distinct text
    history = SuffixHistory(depth, max_tokens=10_000, max_bytes=budget)
    for start in range(0, 400, 10):  # 40 outputs of 10 distinct tokens each
        history.add(list(range(start, start + 10)))
        assert history.bytes <= budget
    kept = [output[0] for output in history.outputs]
    assert kept == sorted(kept) and kept[-1] == 390  # the newest stayed, the oldest went
    assert history.tokens < 400
    # one output longer than the budget keeps its newest tokens only
    history.add(list(range(1000, 2000)))
    assert history.bytes <= budget and list(history.outputs)[-1][-1] == 1999


def test_a_history_file_indexes_only_its_newest_outputs(tmp_path, monkeypatch):
    """A file of many outputs costs what the bound keeps, not what the file holds: only the newest outputs
    within ``max_tokens`` are put in the trie (each costs ``depth`` node steps per token)."""
    from hf_speculative.drafters.suffix.tree import SuffixTrie

    path = tmp_path / "h.json"
    outputs = [[i, i + 1, i + 2] for i in range(0, 3000, 3)]
    path.write_text(json.dumps({"format": suffix_history.FORMAT, "version": 1, "outputs": outputs}))
    indexed = []
    real_add = SuffixTrie.add
    monkeypatch.setattr(SuffixTrie, "add", lambda self, tokens: (indexed.append(len(tokens)), real_add(self, tokens)))
    history = SuffixHistory(8, max_tokens=30, path=path)
    assert list(history.outputs) == outputs[-10:]
    assert sum(indexed) == 30


# -- strategies stay valid after assignment --------------------------------------------------------------------
def test_assignment_is_checked_and_a_refusal_changes_nothing():
    lookup = hfs.PromptLookup(num_tokens=6)
    lookup.num_tokens = 9
    assert lookup.num_tokens == 9
    with pytest.raises(options.OptionError, match=r"PromptLookup\(max_ngram=100000\)"):
        lookup.max_ngram = 10**5
    assert (lookup.max_ngram, lookup.num_tokens) == (3, 9)
    with pytest.raises(ValueError, match="min_ngram"):
        lookup.min_ngram = 5  # above max_ngram = 3: the constructor's cross-field check
    assert lookup.min_ngram == 1
    model = hfs.enable(build_model("llama"))  # and the strategy, changed, still drafts
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=8, candidate_generator=lookup)
    assert out.shape[1] == prompt_inputs()["input_ids"].shape[1] + 8


def test_a_strategy_read_from_a_spec_serializes_anew_once_changed():
    model = build_model("llama")
    restored = spec.from_spec({"method": "prompt-lookup", "options": {"num_tokens": 4}}, model, None)
    assert restored.to_dict() == {"method": "prompt-lookup", "options": {"num_tokens": 4}}
    restored.num_tokens = 7
    assert restored.to_dict()["options"]["num_tokens"] == 7


# -- load_model ------------------------------------------------------------------------------------------------
def test_load_model_verifies_a_folder_with_a_manifest(tmp_path):
    folder = tmp_path / "m"
    build_model("llama").save_pretrained(folder)
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    (folder / "sha256sums.json").write_text(json.dumps({"sha256": digests}))
    models._check_folder(folder, True)  # every file matches: no error
    with open(folder / "config.json", "a") as handle:
        handle.write(" ")
    with pytest.raises(models.RegistryError, match=r"config\.json has sha256"):
        models._check_folder(folder, True)
    models._check_folder(folder, False)  # without verify, a folder that is not a registry entry is not hashed


def test_load_model_of_a_registry_cache_folder_is_checked(tmp_path, cache):
    entry = models.model_path("smollm2-135m-instruct")
    build_model("llama").save_pretrained(entry)
    files = {p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in entry.iterdir()}
    (entry / models.MARKER).write_text(json.dumps({"files": files}))
    assert models.registry_entry(entry) == "smollm2-135m-instruct"
    models._check_folder(entry, False)  # as recorded
    data = bytearray((entry / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (entry / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(models.RegistryError, match="failed its integrity check"):
        models._check_folder(entry, False)
    with pytest.raises(models.RegistryError, match="failed its integrity check"):
        hfs.load_model(str(entry))


def test_a_spec_names_the_field_of_an_over_long_integer(tmp_path):
    folder = tmp_path / "m"
    build_model("llama").save_pretrained(folder)
    path = folder / "generation_config.json"
    path.write_text(path.read_text()[:-2] + ', "candidate_generator": {"options": {"x": ' + "7" * 5000 + "}}}")
    with pytest.raises(spec.SpecError, match=r"generation_config\.candidate_generator\.options\.x: an integer of 5000"):
        models.check_generation_config(folder)


def test_check_bounds_accepts_every_saved_spec_shape():
    shape = {"static_tree": [[i] for i in range(16)] + [[0, i] for i in range(16)]}
    spec.check_bounds({"method": "hybrid", "members": [
        {"method": "prompt-lookup", "options": {"tree": shape, "num_tokens": 8}},
        {"method": "eagle", "path": "eagle", "options": {"num_tokens": 8, "draft_cost": None}, "sha256": {
            "config.json": "0" * 64}}]})


# -- the documented bounds of a drafter's config and files ------------------------------------------------------
EAGLE_BOUNDS = {"hidden_size": 65_536, "intermediate_size": 262_144, "vocab_size": 1 << 20,
                "num_attention_heads": 1024, "num_key_value_heads": 1024, "head_dim": 4096,
                "max_position_embeddings": 1 << 24, "target_num_layers": 1024}


@pytest.mark.parametrize("field", list(EAGLE_BOUNDS))
def test_every_eagle_config_size_is_bounded(field):
    from hf_speculative.drafters.eagle.config import EagleConfig

    fields = {"version": 1, "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2,
              "num_key_value_heads": 2, "vocab_size": 32, "head_dim": 4}
    EagleConfig(**{**fields, field: EAGLE_BOUNDS[field] if field != "num_key_value_heads" else 2})
    with pytest.raises(options.OptionError, match=rf"EagleConfig\({field}={EAGLE_BOUNDS[field] + 1}\): must be an "
                                                  rf"integer from 1 to {EAGLE_BOUNDS[field]}"):
        EagleConfig(**{**fields, field: EAGLE_BOUNDS[field] + 1})


@pytest.mark.parametrize("field, bound, low", [("num_heads", 64, 1), ("num_layers", 16, 0), ("hidden_size", 65_536, 1),
                                               ("vocab_size", 1 << 20, 1)])
def test_every_medusa_config_size_is_bounded(field, bound, low):
    from hf_speculative.drafters.medusa.config import MedusaConfig

    fields = {"num_heads": 4, "hidden_size": 8, "vocab_size": 32}
    MedusaConfig(**{**fields, field: bound})
    with pytest.raises(options.OptionError, match=rf"MedusaConfig\({field}={bound + 1}\): must be an integer from "
                                                  rf"{low} to {bound}"):
        MedusaConfig(**{**fields, field: bound + 1})


def test_a_drafter_json_file_over_4_mib_is_not_read(tmp_path):
    from hf_speculative.drafters.eagle.checkpoints import CheckpointError, load_checkpoint

    (tmp_path / "config.json").write_text("{}")
    with open(tmp_path / "config.json", "r+b") as handle:
        handle.truncate((4 << 20) + 1)  # sparse
    with pytest.raises(CheckpointError, match=r"config\.json: .* has 4194305 bytes, over the limit of 4194304"):
        load_checkpoint(tmp_path)


def test_a_hashed_file_is_read_up_to_its_cap(tmp_path):
    path = tmp_path / "w"
    path.write_bytes(b"x" * 100)
    assert integrity.sha256_file(path, cap=100) == hashlib.sha256(b"x" * 100).hexdigest()
    with pytest.raises(integrity.FileRefused, match="has 100 bytes, over the limit of 99"):
        integrity.sha256_file(path, cap=99)
    assert integrity.MAX_HASHED_BYTES == 64 << 30


# -- the files a loader opens: links that stay inside still load (the refusals: test_hostile_folder.py's "linked out")
def _link_inside(folder: Path, name: str) -> None:
    """``folder/name`` becomes a relative link to the same file moved to ``folder/blobs/`` (inside the folder)."""
    (folder / "blobs").mkdir(exist_ok=True)
    (folder / name).rename(folder / "blobs" / name)
    os.symlink(Path("blobs") / name, folder / name)


CHECKPOINT_LABELS = {"eagle": "eagle3", "medusa": "medusa", "dflash": "dflash",
                     "early-exit-adapter": "early-exit-adapter"}


@pytest.mark.parametrize("method", list(CHECKPOINT_LABELS))
def test_a_drafter_folder_linking_inside_itself_loads(tmp_path, cache, method):
    from hf_speculative.drafters.registry import example

    target = build_model("llama")
    saved = spec.save_strategy(example(CHECKPOINT_LABELS[method], target), tmp_path / "model")
    folder = tmp_path / "model" / saved["path"]
    manifest = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in
                ("config.json", "model.safetensors")}
    for name in ("config.json", "model.safetensors"):
        _link_inside(folder, name)
    (folder / "sha256sums.json").write_text(json.dumps({"sha256": manifest}))
    _link_inside(folder, "sha256sums.json")
    restored = spec.from_spec(saved, target, tmp_path / "model")  # the spec's digests too: the files are inside
    assert restored.spec_network() is not None
    loaders = {"eagle": lambda: hfs.Eagle.from_pretrained(folder, target=target),
               "medusa": lambda: hfs.Medusa.from_pretrained(folder, target=target),
               "dflash": lambda: hfs.DFlash.from_pretrained(folder, target=target),
               "early-exit-adapter": lambda: hfs.EarlyExit(exit_layer=1, adapter=str(folder))}
    assert loaders[method]() is not None


def test_a_drafter_in_a_hub_cache_snapshot_loads(tmp_path, cache):
    """The Hub cache keeps a snapshot's files as links into the repository's ``blobs/``: inside."""
    target = build_model("llama")
    saved = spec.save_strategy(hfs.Eagle(random_eagle(target)), tmp_path / "model")
    repo = tmp_path / "models--someone--drafter"
    snapshot = repo / "snapshots" / "0123"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in (tmp_path / "model" / saved["path"]).iterdir():
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        path.rename(blob)
        os.symlink(Path("..", "..", "blobs", blob.name), snapshot / path.name)
    strategy = hfs.Eagle.from_pretrained(snapshot, target=target, sha256=saved["sha256"])
    assert strategy.drafter.config.hidden_size == target.config.hidden_size


def test_a_draft_model_folder_linking_inside_itself_loads(tmp_path, cache):
    target = build_model("llama")
    target.save_pretrained(tmp_path / "model")
    char_tokenizer().save_pretrained(tmp_path / "model")
    draft = tmp_path / "model" / "draft"
    sibling_model(target).save_pretrained(draft)
    char_tokenizer().save_pretrained(draft)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        _link_inside(draft, name)
    restored = spec.from_spec({"method": "draft-model", "path": "draft"}, target, tmp_path / "model")
    assert restored.model.config.hidden_size == target.config.hidden_size
    from hf_speculative.drafters.draft_model.drafter import _local_tokenizer

    assert len(_local_tokenizer(restored.model).get_vocab()) == len(char_tokenizer().get_vocab())  # read, not refused


def test_the_vocabulary_check_reads_a_draft_models_own_tokenizer_only(tmp_path):
    """A ``tokenizer_config.json`` key naming a file elsewhere (``tokenizer_file``) is not followed: the check of
    a draft model's vocabulary reads the tokenizer of its folder."""
    from hf_speculative.drafters.draft_model.drafter import _local_tokenizer

    char_tokenizer(50).save_pretrained(tmp_path / "elsewhere")
    model = build_model("llama")
    model.save_pretrained(tmp_path / "draft")
    char_tokenizer().save_pretrained(tmp_path / "draft")
    config = json.loads((tmp_path / "draft" / "tokenizer_config.json").read_text())
    config["tokenizer_file"] = str(tmp_path / "elsewhere" / "tokenizer.json")
    (tmp_path / "draft" / "tokenizer_config.json").write_text(json.dumps(config))
    model.name_or_path = str(tmp_path / "draft")
    assert len(_local_tokenizer(model).get_vocab()) == len(char_tokenizer().get_vocab())
    (tmp_path / "draft" / "tokenizer.json").unlink()
    os.symlink(tmp_path / "elsewhere" / "tokenizer.json", tmp_path / "draft" / "tokenizer.json")
    assert _local_tokenizer(model) is None  # a link out is not read: no evidence, the sizes are compared instead


def test_an_assistant_folder_linking_inside_itself_loads(tmp_path):
    try:
        from transformers import Gemma4AssistantForCausalLM  # noqa: F401
    except ImportError:
        pytest.skip("transformers before Gemma 4: no assistant")
    from hf_speculative.drafters.assistant.tiny import tiny_assistant, tiny_target

    tiny_assistant(tiny_target()).save_pretrained(tmp_path / "assistant")
    for name in ("config.json", "model.safetensors"):
        _link_inside(tmp_path / "assistant", name)
    assert hfs.Assistant.from_pretrained(tmp_path / "assistant").assistant is not None


def test_only_a_file_checked_against_a_digest_must_have_one_link(tmp_path, monkeypatch):
    """A hard link's other name may be a file elsewhere: a digest of it is not computed (nor shown), but a file
    that is only read (a config, weights without a digest) may be a hard link; the package's own files too."""
    (tmp_path / "elsewhere").write_text("{}")
    os.link(tmp_path / "elsewhere", tmp_path / "config.json")
    assert integrity.folder_file(tmp_path, "config.json", "f") == tmp_path / "config.json"
    with pytest.raises(integrity.FileRefused, match=r"f: 'config\.json' in the folder .* has 2 hard links"):
        integrity.folder_file(tmp_path, "config.json", "f", hashed=True)
    monkeypatch.setattr(integrity, "PACKAGE_DIR", tmp_path)  # (an installer may hard-link the package's files)
    assert integrity.folder_file(tmp_path, "config.json", "f", hashed=True) == tmp_path / "config.json"


def test_folder_file_refuses_before_opening_and_returns_a_missing_name(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(integrity.FileRefused, match=r"fifo\.json is a FIFO") as refused:
        integrity.folder_file(tmp_path, "fifo.json", "f")  # (an open would block: no writer)
    assert refused.value.reason.startswith("is a FIFO")
    (tmp_path / "sub").mkdir()
    with pytest.raises(integrity.FileRefused, match="is a folder"):
        integrity.folder_file(tmp_path, "sub", "f")
    os.symlink(tmp_path / "sub" / "nothing", tmp_path / "dangling.json")
    assert integrity.folder_file(tmp_path, "missing.json", "f") == tmp_path / "missing.json"
    assert integrity.folder_file(tmp_path, "dangling.json", "f") == tmp_path / "dangling.json"
    with pytest.raises(integrity.FileRefused, match="leaves the folder"):
        integrity.folder_file(tmp_path, "../x", "f")


def test_escaped_writes_what_a_terminal_would_obey():
    assert options.escaped("a\x1b[2J\r\x00\u202eb/c.json") == "a\\x1b[2J\\r\\x00\\u202eb/c.json"
    assert options.escaped(Path("/m/é/config.json")) == "/m/é/config.json"
    assert options.escaped(ValueError("x\ny")) == "x\\ny"
    assert options.escaped("x" * 10, limit=4) == "xxxx..."
