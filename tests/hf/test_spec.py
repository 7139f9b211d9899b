"""The model's default drafter saved in ``generation_config.json`` and restored by ``hfs.enable``.

Round trips for every method on a tiny model (the reloaded model drafts as the saved one, token-identical
to plain greedy), what the saved folder holds, a stock transformers loading it without hf_speculative,
and the errors of bad specs, each naming its field.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

import hf_speculative as hfs
from hf_speculative.hf import spec
from tests.conftest import AdversaryStrategy, build_model, prompt_inputs, random_eagle, random_exit_adapter, \
    sibling_model, stock_generate

GREEDY = dict(do_sample=False, max_new_tokens=30)
FIXED = dict(num_tokens=4, confidence_threshold=0.0, adaptive=False)  # drafts at every step, on any tiny model


def make_strategy(method: str, target, tmp_path):
    if method == "prompt-lookup":
        return hfs.PromptLookup(num_tokens=6, max_ngram=2, adaptive=False)
    if method == "early-exit":
        return hfs.EarlyExit(exit_layer=1, **FIXED)
    if method == "layer-skip":
        return hfs.LayerSkip(skip=[0], **FIXED)
    if method == "eagle":
        return hfs.Eagle(random_eagle(target), **FIXED)
    if method == "early-exit-adapter":
        return hfs.EarlyExit(adapter=random_exit_adapter(target, exit_layer=1), **FIXED)
    if method == "draft-model":
        sibling_model(target).save_pretrained(tmp_path / "model" / "draft")  # inside the model's folder
        draft = AutoModelForCausalLM.from_pretrained(tmp_path / "model" / "draft").eval()
        return hfs.DraftModel(draft, **FIXED)
    if method == "hybrid":
        return hfs.Hybrid(hfs.PromptLookup(min_ngram=3, max_ngram=3, num_tokens=4, adaptive=False),
                          hfs.Eagle(random_eagle(target), **FIXED))
    raise ValueError(method)


def saved_spec(directory) -> dict:
    return json.loads((directory / "generation_config.json").read_text())["candidate_generator"]


def reload(directory):
    return hfs.enable(AutoModelForCausalLM.from_pretrained(directory).eval())


@pytest.mark.parametrize("method", ["prompt-lookup", "early-exit", "layer-skip", "eagle", "early-exit-adapter",
                                    "draft-model", "hybrid"])
def test_round_trip(method, tmp_path):
    model = hfs.enable(build_model("llama"))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    strategy = make_strategy(method, model, tmp_path)
    model.generation_config.candidate_generator = strategy
    model.save_pretrained(tmp_path / "model")
    written = saved_spec(tmp_path / "model")
    assert written["method"] == method
    assert written == json.loads(json.dumps(strategy.save_pretrained(tmp_path / "model")))  # the same spec again

    # without enable, the spec is a plain dict that transformers carries along
    raw = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert raw.generation_config.candidate_generator == written
    reloaded = reload(tmp_path / "model")
    restored = reloaded.generation_config.candidate_generator
    assert type(restored) is type(strategy)
    assert spec.method_of(restored) == method
    if method != "hybrid":
        assert spec.options_of(restored) == spec.options_of(strategy)
    out = reloaded.generate(**prompt_inputs(), **GREEDY)
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(reloaded)
    assert stats is not None and stats.method == strategy.name and stats.drafted_tokens > 0, stats
    assert restored.to_dict() == written  # serializes as it was read: the config is unmodified
    # saved again elsewhere, it drafts the same way from there
    reloaded.save_pretrained(tmp_path / "again")
    again = reload(tmp_path / "again")
    assert again.generate(**prompt_inputs(), **GREEDY).tolist() == ref.tolist()
    assert hfs.last_stats(again).drafted_tokens > 0


def test_a_trained_drafter_is_saved_beside_the_model(tmp_path):
    model = hfs.enable(build_model("qwen2"))
    net = random_eagle(model)
    model.generation_config.candidate_generator = hfs.Eagle(net, num_tokens=5)
    model.save_pretrained(tmp_path)
    written = saved_spec(tmp_path)
    assert written["path"] == "eagle"
    assert written["options"] == {"num_tokens": 5, "confidence_threshold": 0.05, "adaptive": True, "draft_cost": None,
                                  "tree": None, "kernel_weights": "int8"}
    assert set(written["sha256"]) == {"config.json", "model.safetensors"}
    for name, digest in written["sha256"].items():
        assert spec.file_sha256(tmp_path / "eagle" / name) == digest
    assert json.loads((tmp_path / "generation_config.json").read_text())["_from_model_config"] is False
    restored = reload(tmp_path).generation_config.candidate_generator
    assert all(torch.equal(a, b) for a, b in zip(restored.drafter.state_dict().values(), net.state_dict().values()))


def test_shipped_drafters_are_named_not_copied(tmp_path):
    eagle = hfs.Eagle.from_pretrained("smollm2-135m-instruct")
    written = spec.save_strategy(eagle, tmp_path)
    assert written["path"] == "smollm2-135m-instruct" and "model.safetensors" in written["sha256"]
    adapter = hfs.EarlyExit(adapter="smollm2-135m-instruct")
    written = spec.save_strategy(adapter, tmp_path)
    assert written["method"] == "early-exit-adapter" and written["path"] == "smollm2-135m-instruct"
    assert written["options"]["exit_layer"] == 4
    assert list(tmp_path.iterdir()) == []


def test_a_stock_transformers_loads_the_folder(tmp_path):
    """In a process that never imports hf_speculative, the model and its GenerationConfig load, the spec is a
    dict, and generate() decodes as plain greedy."""
    model = hfs.enable(build_model("llama"))
    ref = stock_generate(model, **prompt_inputs(), max_new_tokens=8, do_sample=False)
    model.generation_config.candidate_generator = hfs.Eagle(random_eagle(model), num_tokens=3)
    model.save_pretrained(tmp_path)
    script = textwrap.dedent(f"""
        import json, sys, torch
        from transformers import AutoModelForCausalLM, GenerationConfig
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})
        config = GenerationConfig.from_pretrained({str(tmp_path)!r})
        ids = torch.tensor([{prompt_inputs()["input_ids"][0].tolist()}])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
        print(json.dumps({{"modules": sorted(m for m in sys.modules if m.startswith("hf_speculative")),
                          "model": model.generation_config.candidate_generator, "config": config.candidate_generator,
                          "out": out[0].tolist()}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["modules"] == []
    assert seen["model"] == seen["config"] == saved_spec(tmp_path)
    assert seen["out"] == ref[0].tolist()


def test_generation_config_from_the_folder_passed_to_generate(tmp_path):
    model = hfs.enable(build_model("llama"))
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    model.generation_config.candidate_generator = hfs.EarlyExit(exit_layer=1, **FIXED)
    model.save_pretrained(tmp_path)
    config = GenerationConfig.from_pretrained(tmp_path, **GREEDY)
    assert isinstance(config.candidate_generator, dict)
    other = hfs.enable(build_model("llama"))  # the same weights, no default of its own
    assert other.generate(**prompt_inputs(), generation_config=config).tolist() == ref.tolist()
    assert hfs.last_stats(other).method == "early-exit" and hfs.last_stats(other).drafted_tokens > 0
    assert isinstance(config.candidate_generator, dict)  # the user's config is left as it was


def test_saving_without_enable_does_not_crash(tmp_path):
    """transformers serializes the strategy through ``DraftStrategy.to_dict``: settings-only strategies round trip;
    a trained network is not written, and loading says what to do."""
    model = build_model("llama")
    model.generation_config.candidate_generator = hfs.PromptLookup(num_tokens=4)
    model.save_pretrained(tmp_path / "lookup")
    assert saved_spec(tmp_path / "lookup")["options"]["num_tokens"] == 4
    model.generation_config.candidate_generator = hfs.Eagle(random_eagle(model))
    model.save_pretrained(tmp_path / "eagle")
    assert "path" not in saved_spec(tmp_path / "eagle")
    # (not enabled when saved: transformers dropped the spec on load unless the mark is cleared)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "eagle")
    loaded.generation_config.candidate_generator = saved_spec(tmp_path / "eagle")
    with pytest.raises(ValueError, match=r"generation_config\.candidate_generator\.path: the eagle method needs the "
                                         r"drafter's folder"):
        hfs.enable(loaded)


# -- what cannot be saved ------------------------------------------------------------------------
def test_a_draft_model_without_a_name_is_refused(tmp_path):
    model = hfs.enable(build_model("llama"))
    model.generation_config.candidate_generator = hfs.DraftModel(sibling_model(model))  # built from a config
    with pytest.raises(ValueError, match=r"generation_config\.candidate_generator: DraftModel\(model=\.\.\.\) holds a "
                                         r"draft model that was not loaded from a folder"):
        model.save_pretrained(tmp_path)


def test_a_draft_model_outside_the_folder_is_copied_into_it(tmp_path):
    """A spec loads a draft model only from inside the model's folder (or a cached registry name): one loaded
    from elsewhere is saved into ``draft-model/`` and named relatively."""
    model = hfs.enable(build_model("llama"))
    sibling_model(model).save_pretrained(tmp_path / "elsewhere")
    draft = AutoModelForCausalLM.from_pretrained(tmp_path / "elsewhere").eval()
    model.generation_config.candidate_generator = hfs.DraftModel(draft, **FIXED)
    model.save_pretrained(tmp_path / "model")
    assert saved_spec(tmp_path / "model")["path"] == "draft-model"
    assert (tmp_path / "model" / "draft-model" / "config.json").is_file()
    restored = reload(tmp_path / "model").generation_config.candidate_generator
    assert restored.model.name_or_path == str((tmp_path / "model" / "draft-model").resolve())
    assert all(torch.equal(a, b) for a, b in zip(restored.model.state_dict().values(), draft.state_dict().values()))


def test_a_strategy_without_a_spec_is_refused(tmp_path):
    import dataclasses

    @dataclasses.dataclass
    class MyLookup(hfs.PromptLookup):
        pass

    model = hfs.enable(build_model("llama"))
    model.generation_config.candidate_generator = MyLookup()
    assert "MyLookup" in repr(model.generation_config)  # printable all the same
    with pytest.raises(ValueError, match="a MyLookup has no generation_config spec"):
        model.save_pretrained(tmp_path)
    model.generation_config.candidate_generator = AdversaryStrategy([3, 5])  # not a dataclass
    with pytest.raises(TypeError, match="a model's default drafter must be one of hf_speculative's strategies"):
        model.save_pretrained(tmp_path)


# -- bad specs ----------------------------------------------------------------------------------------------
@pytest.fixture
def eagle_folder(tmp_path):
    """A model folder whose default is a random EAGLE drafter saved beside it."""
    model = hfs.enable(build_model("llama"))
    model.generation_config.candidate_generator = hfs.Eagle(random_eagle(model))
    model.save_pretrained(tmp_path)
    return tmp_path


def with_spec(folder, edit) -> None:
    """Rewrite the spec of ``folder``'s generation_config.json with ``edit(spec)`` (returns the new spec)."""
    path = folder / "generation_config.json"
    data = json.loads(path.read_text())
    data["candidate_generator"] = edit(data["candidate_generator"])
    path.write_text(json.dumps(data))


BAD_SPECS = {
    "unknown method": (lambda s: {**s, "method": "nope"}, ValueError,
                       r"generation_config\.candidate_generator\.method: unknown method 'nope'; known: prompt-lookup"),
    "not an object": (lambda s: "eagle", ValueError, r"generation_config\.candidate_generator must be an object"),
    "unknown field": (lambda s: {**s, "weights": "x"}, ValueError,
                      r"generation_config\.candidate_generator: unknown field\(s\) \['weights'\]"),
    "missing folder": (lambda s: {**s, "path": "gone"}, FileNotFoundError,
                       r"generation_config\.candidate_generator\.path: no drafter folder 'gone' in the model's folder"),
    "absolute path": (lambda s: {**s, "path": "/tmp/eagle"}, ValueError,
                      r"generation_config\.candidate_generator\.path must be relative to the model's folder"),
    "path outside": (lambda s: {**s, "path": "../eagle"}, ValueError, r"\.path must be relative"),
    "no path": (lambda s: {k: v for k, v in s.items() if k != "path"}, ValueError,
                r"\.path: the eagle method needs the drafter's folder"),
    "sha mismatch": (lambda s: {**s, "sha256": {**s["sha256"], "model.safetensors": "0" * 64}}, ValueError,
                     r"generation_config\.candidate_generator\.sha256: .*model\.safetensors has sha256 [0-9a-f]{64}, "
                     r"the config expects 0{64}"),
    "sha of a missing file": (lambda s: {**s, "sha256": {"extra.bin": "0" * 64}}, FileNotFoundError,
                              r"\.sha256 lists extra\.bin, which is not in"),
    "sha not a map": (lambda s: {**s, "sha256": "abc"}, ValueError, r"\.sha256 must map file names"),
    "unknown option": (lambda s: {**s, "options": {"foo": 1}}, ValueError,
                       r"generation_config\.candidate_generator\.options: unknown option\(s\) \['foo'\] for the eagle "
                       r"method; known: num_tokens"),
    "option of the wrong type": (lambda s: {**s, "options": {"num_tokens": "ten"}}, ValueError,
                                 r"generation_config\.candidate_generator\.options\.num_tokens: expected int, "
                                 r"got 'ten'"),
    "bool for an int": (lambda s: {**s, "options": {"num_tokens": True}}, ValueError,
                        r"\.options\.num_tokens: expected int"),
    "bad option value": (lambda s: {**s, "options": {"num_tokens": 0}}, ValueError,
                         r"generation_config\.candidate_generator\.options are invalid: Eagle\(num_tokens=0\): "
                         r"must be an integer from 1 to 64\."),
    "oversize option value": (lambda s: {**s, "options": {"num_tokens": 10**9}}, ValueError,
                              r"\.options are invalid: Eagle\(num_tokens=1000000000\): must be an integer from 1 to 64"),
    "hybrid of too many": (lambda s: {"method": "hybrid", "members": [s] * 9}, ValueError,
                           r"\.members: at most 8 specs, got 9\."),
    "options not an object": (lambda s: {**s, "options": [1]}, ValueError, r"\.options must be an object"),
    "files for a method without": (lambda s: {"method": "prompt-lookup", "path": "eagle"}, ValueError,
                                   r"\.path: the prompt-lookup method loads no files"),
    "hybrid of one": (lambda s: {"method": "hybrid", "members": [s]}, ValueError,
                      r"\.members: the hybrid method needs a list of two or more specs"),
    "bad hybrid member": (lambda s: {"method": "hybrid", "members": [s, {"method": "nope"}]}, ValueError,
                          r"generation_config\.candidate_generator\.members\[1\]\.method: unknown method 'nope'"),
}


@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_bad_spec(case, eagle_folder):
    edit, error, message = BAD_SPECS[case]
    with_spec(eagle_folder, edit)
    model = AutoModelForCausalLM.from_pretrained(eagle_folder)  # a stock load never fails
    with pytest.raises(error, match=message):
        hfs.enable(model)
    assert not hfs.is_enabled(model)


def test_a_drafter_that_does_not_fit_the_model(eagle_folder, tmp_path):
    other = hfs.enable(build_model("llama", vocab_size=64))
    with pytest.raises(ValueError, match=r"generation_config\.candidate_generator\.path: cannot load the drafter "
                                         r"there: .*does not fit"):
        spec.from_spec(saved_spec(eagle_folder), other, eagle_folder)
    model = build_model("llama")
    written = spec.save_strategy(hfs.EarlyExit(adapter=random_exit_adapter(model)), tmp_path)
    with pytest.raises(ValueError, match=r"generation_config\.candidate_generator does not fit this model: .*exit "
                                         r"adapter"):
        spec.from_spec(written, other, tmp_path)


def test_spec_methods_are_registry_methods():
    from hf_speculative.tooling import methods

    from hf_speculative.drafters.registry import strategy_class
    from tests.drafters.test_registry import WITHOUT_METHODS

    for name in spec._methods():
        folder = strategy_class(name).__module__.rsplit(".", 1)[0]
        if name != "hybrid" and folder not in WITHOUT_METHODS:  # (drafters no registry model can run: see there)
            assert methods.get_method(name).kind == "hfs", name


# -- the real model -------------------------------------------------------------------------------------
@pytest.mark.integration
def test_smollm2_round_trip_with_the_shipped_eagle(integration, tmp_path):
    model, tokenizer = integration
    hfs.enable(model)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Explain how a bicycle's gears work."}],
                                         tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(text, return_tensors="pt")
    kwargs = dict(do_sample=False, max_new_tokens=32)
    ref = stock_generate(model, **inputs, **kwargs)
    model.generation_config.candidate_generator = hfs.Eagle.from_pretrained(
        "smollm2-135m-instruct", target=model, num_tokens=4, confidence_threshold=0.0, adaptive=False)
    try:
        model.save_pretrained(tmp_path)
    finally:
        del model.generation_config.candidate_generator  # the model is shared by the session
    written = saved_spec(tmp_path)
    assert written["method"] == "eagle" and written["path"] == "smollm2-135m-instruct"
    assert not (tmp_path / "eagle").exists()
    reloaded = reload(tmp_path)
    out = reloaded.generate(**inputs, **kwargs)
    assert out.tolist() == ref.tolist()
    stats = hfs.last_stats(reloaded)
    assert stats.method == "eagle" and stats.accepted_tokens > 0, stats


@pytest.mark.integration
def test_smollm2_draft_model_saved_by_its_registry_name(integration, tmp_path):
    model, _ = integration
    written = spec.save_strategy(hfs.DraftModel(model, num_tokens=3), tmp_path)
    assert written == {"method": "draft-model", "path": "smollm2-135m-instruct", "options": {
        "num_tokens": 3, "confidence_threshold": 0.3, "adaptive": True, "draft_cost": None, "tree": None,
        "kernel_weights": "exact"}}
    restored = spec.from_spec(written, model, tmp_path)  # (as big as the target: a check of the path only)
    assert restored.model is not model and restored.model.name_or_path == model.name_or_path
    assert restored.num_tokens == 3


def test_tree_shapes_round_trip_through_the_spec():
    from hf_speculative.hf import spec
    from hf_speculative.core import tree_shapes
    from tests.conftest import build_model

    target = build_model("llama")
    strategy = hfs.PromptLookup(tree=hfs.DynamicTree(nodes=12, depth=4, top_k=3))
    data = json.loads(json.dumps(strategy.to_dict()))
    assert data["options"]["tree"] == {"dynamic_tree": {"nodes": 12, "depth": 4, "top_k": 3}}
    assert spec.from_spec(data, target, None) == strategy
    static = hfs.StaticTree([(0,), (1,), (0, 0)])
    assert tree_shapes.shape_from_json(json.loads(json.dumps(tree_shapes.shape_to_json(static)))) == static
    bad = {"method": "prompt-lookup", "options": {"tree": {"dynamic_tree": {"nodes": 0}}}}
    with pytest.raises(spec.SpecError, match=r"options.tree: DynamicTree\(nodes=0\)"):
        spec.from_spec(bad, target, None)
    with pytest.raises(spec.SpecError, match="a tree shape is"):
        spec.from_spec({"method": "prompt-lookup", "options": {"tree": {"ring": 3}}}, target, None)


def test_draft_model_tree_round_trips_through_a_spec(tmp_path):
    """A draft model's tree shape is saved in the spec's options and read back."""
    target = build_model("llama")
    draft = build_model("llama", seed=5)
    draft.save_pretrained(tmp_path / "draft")
    draft = type(draft).from_pretrained(tmp_path / "draft")
    shape = hfs.DynamicTree(nodes=8, depth=4, top_k=3)
    written = spec.save_strategy(hfs.DraftModel(draft, tree=shape), tmp_path)
    assert written["options"]["tree"] == {"dynamic_tree": {"nodes": 8, "depth": 4, "top_k": 3}}
    restored = spec.from_spec(written, target, tmp_path)
    assert restored.tree == shape
