"""``model.save_pretrained(dir)`` on an enabled model writes its default drafter's spec: the strategy writes its files
and returns its spec (``drafters/spec_writer.py``), transformers writes ``generation_config.json``, and the spec is
then written into that file, handed over explicitly (``hf.spec.keep_field_on_load``) rather than through a ContextVar
read by ``to_dict()`` while transformers saves. transformers uploads inside its own save (``push_to_hub=True``), before
that: a default drafter whose saved spec differs from what transformers serialized is refused with the fix."""

from __future__ import annotations

import json

import pytest

import hf_speculative as hfs
from hf_speculative.hf import spec
from tests.conftest import build_model, random_eagle


def _written(folder) -> dict:
    return json.loads((folder / "generation_config.json").read_text())


def test_the_saved_spec_is_written_into_the_file_transformers_wrote(tmp_path):
    model = hfs.enable(build_model("llama"))
    strategy = hfs.Eagle(random_eagle(model), num_tokens=3)
    model.generation_config.candidate_generator = strategy
    model.save_pretrained(tmp_path)
    written = _written(tmp_path)["candidate_generator"]
    assert written["path"] == "eagle" and set(written["sha256"]) == {"config.json", "model.safetensors"}
    assert "path" not in strategy.to_dict()  # what transformers serialized knows no files: the file holds the saved one


def test_keep_field_on_load_writes_the_spec_it_is_handed(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"candidate_generator": {"method": "x"},
                                                                  "_from_model_config": True}))
    spec.keep_field_on_load(tmp_path, {"method": "prompt-lookup", "options": {}})
    assert _written(tmp_path) == {"candidate_generator": {"method": "prompt-lookup", "options": {}},
                                  "_from_model_config": False}
    before = (tmp_path / "generation_config.json").stat().st_mtime_ns
    spec.keep_field_on_load(tmp_path, {"method": "prompt-lookup", "options": {}})  # nothing to change: not rewritten
    assert (tmp_path / "generation_config.json").stat().st_mtime_ns == before


def test_push_to_hub_with_a_drafter_that_keeps_files_is_refused_before_transformers_saves(tmp_path, monkeypatch):
    model = hfs.enable(build_model("llama"))
    model.generation_config.candidate_generator = hfs.Eagle(random_eagle(model), num_tokens=3)
    monkeypatch.setattr(type(model), "save_pretrained", lambda *a, **k: pytest.fail("transformers' save ran"))
    with pytest.raises(ValueError, match="push_to_hub=True\\) with a default Eagle: transformers uploads the folder "
                                         "before hf_speculative writes the drafter's spec"):
        model.save_pretrained(tmp_path, push_to_hub=True)


def test_push_to_hub_with_a_drafter_whose_spec_transformers_writes_goes_through(tmp_path, monkeypatch):
    model = hfs.enable(build_model("llama"))
    model.generation_config.candidate_generator = hfs.PromptLookup(num_tokens=4)
    seen = []

    def save(self, directory, *args, **kwargs):  # transformers' save, without the upload
        seen.append(kwargs.get("push_to_hub"))
        self.generation_config.save_pretrained(directory)

    monkeypatch.setattr(type(model), "save_pretrained", save)
    model.save_pretrained(tmp_path, push_to_hub=True)
    assert seen == [True]
    assert _written(tmp_path)["candidate_generator"] == hfs.PromptLookup(num_tokens=4).to_dict()
