"""``export-eagle --format openvino``: an EAGLE-3 drafter as OpenVINO GenAI's draft model.

The fast tests (no OpenVINO needed) check the folder optimum-intel exports from: SafeAILab's
``LlamaForCausalLMEagle3`` config with the target's token ids, the weights in optimum-intel's names, the
draft vocabulary carried, GenAI's layer ids, and the refusals. The ``openvino`` tests (``-m openvino``, in
the venv of ``make install-openvino``; skipped elsewhere) export the shipped drafter and the real
smollm2-135m-instruct from the offline registry through the command line, then run OpenVINO GenAI's plain
greedy decoding and its EAGLE-3 speculative decoding (f32 inference, one thread) on three chat prompts and
require the same tokens, and drafted tokens accepted (``extended_perf_metrics.get_num_accepted_tokens()``).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import transformers
from typer.testing import CliRunner

from hf_speculative.cli.main import app
from hf_speculative.drafters.checkpoints import CheckpointError
from hf_speculative.drafters.eagle.config import EagleConfig, default_target_layers
from hf_speculative.drafters.eagle.model import EagleDraftModel
from hf_speculative.drafters.eagle.openvino_export import draft_folder, export_openvino, hidden_layers_list

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
PIP = 'pip install "hf-speculative[openvino]"'
H, V, L, DRAFT_V = 64, 100, 12, 40


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # the parent package is missing
        return False


OPENVINO = _importable("openvino_genai") and _importable("optimum.intel")
needs_openvino = pytest.mark.skipif(
    not OPENVINO, reason="needs openvino_genai and optimum-intel: the [openvino] extra, in a venv of its own "
    "(make install-openvino; .venv-ov/bin/python -m pytest -m openvino)")


def target_config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                    num_hidden_layers=L, vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=3)


def drafter(version: int = 3, **overrides) -> EagleDraftModel:
    draft = DRAFT_V if version == 3 else None
    config = EagleConfig.for_target(target_config(), version=version, draft_vocab_size=draft, **overrides)
    torch.manual_seed(0)
    model = EagleDraftModel(config)
    if version == 3:
        ids = torch.randperm(V)[:DRAFT_V].sort().values
        model.d2t.copy_(ids - torch.arange(DRAFT_V))
    return model.eval()


# -- the folder optimum-intel exports from (no OpenVINO needed) --------------------------------------------------
def test_draft_folder_is_safeailab_eagle3_in_optimum_intel_names():
    model = drafter()
    state = model.state_dict()
    cfg, weights = draft_folder(model.config, state, target_config())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["draft_vocab_size"] == DRAFT_V and cfg["vocab_size"] == V and cfg["num_hidden_layers"] == 1
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 3)  # GenAI reads the draft's
    assert "torch_dtype" not in cfg
    assert set(weights) == {f"model.{key}" for key in state}  # LlamaEagle3ForCausalLM.model.*
    assert torch.equal(weights["model.d2t"], model.d2t) and weights["model.fc.weight"].shape == (H, 3 * H)
    assert not torch.equal(model.d2t, torch.zeros_like(model.d2t))  # a real reduced vocabulary, carried


def test_hidden_layers_list_is_ours_not_genai_default():
    """GenAI taps the output of layer i for i in hidden_layers_list (our target_layers convention); its default
    {2, L/2, L-3} is one layer later than SafeAILab's (our default), so the export always writes the list."""
    config = drafter().config
    assert config.target_layers == default_target_layers(L) == [1, L // 2 - 1, L - 4]
    assert hidden_layers_list(config) == [1, 5, 8] != [2, L // 2, L - 3]
    assert hidden_layers_list(drafter(target_layers=[0, 4, 10]).config) == [0, 4, 10]


@pytest.mark.parametrize("kind, overrides, message", [
    ("eagle1", {"version": 1}, "EAGLE-3 drafters only"),
    ("attention bias", {"attention_bias": True}, "has attention biases"),
    ("normed residual", {"norm_before_residual": True}, "starts its residual from the normed feature"),
    ("exit adapter", {"exit_layer": 4, "target_layers": [3]}, "not an EAGLE drafter"),
])
def test_draft_folder_refuses_what_optimum_intel_cannot_hold(kind, overrides, message):
    model = drafter(**overrides)
    with pytest.raises(CheckpointError, match=message):
        draft_folder(model.config, model.state_dict(), target_config())


def test_missing_packages_name_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    with pytest.raises(ImportError, match="hf-speculative\\[openvino\\]"):
        export_openvino(drafter(), tmp_path / "draft")
    result = CliRunner().invoke(app, ["export-eagle", "smollm2-135m-instruct", "--format", "openvino", "--out",
                                      str(tmp_path / "d")], env=ENV)
    assert result.exit_code == 2 and PIP in result.output, result.output


def test_openvino_options_need_the_openvino_format(tmp_path):
    result = CliRunner().invoke(app, ["export-eagle", "smollm2-135m-instruct", "--format", "vllm", "--out",
                                      str(tmp_path / "d"), "--target-out", str(tmp_path / "t")], env=ENV)
    assert result.exit_code == 2 and "go with --format openvino" in result.output, result.output


def test_weight_format_is_checked_first(tmp_path):
    with pytest.raises(ValueError, match="weight_format='int4': use one of fp16, fp32"):
        export_openvino(drafter(), tmp_path / "d", weight_format="int4")


# -- OpenVINO GenAI on the real model ----------------------------------------------------------------------------
PROMPTS = ["What is the capital of France?", "Write a haiku about autumn.", "Explain photosynthesis in two sentences."]
PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``(draft folder, target folder)``: the shipped drafter and its target, exported by the command line."""
    from hf_speculative.registry.models import resolve

    target = resolve("smollm2-135m-instruct")  # the registry's cached folder (fetched once, never from the Hub)
    out = tmp_path_factory.mktemp("openvino")
    args = ["export-eagle", "smollm2-135m-instruct", "--format", "openvino", "--out", out / "draft",
            "--target", target, "--target-out", out / "target"]
    result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return out / "draft", out / "target"


@pytest.mark.openvino
@pytest.mark.slow
@needs_openvino
def test_draft_ir_carries_the_eagle3_mark_layers_and_draft_vocabulary(exported):
    import openvino as ov

    from hf_speculative.drafters.eagle.drafter import PRETRAINED_DIR
    from hf_speculative.drafters.eagle.checkpoints import load_drafter

    draft, target = exported
    assert {"openvino_tokenizer.xml", "openvino_detokenizer.xml", "openvino_model.xml"} <= {
        p.name for p in target.iterdir()}
    model = ov.Core().read_model(str(draft / "openvino_model.xml"))
    assert model.get_rt_info("eagle3_mode").astype(str) in ("True", "true")
    assert model.get_rt_info("hidden_layers_list").astype(str).split() == ["1", "14", "26"]
    outputs = {o.get_any_name(): o for o in model.outputs}
    assert outputs["logits"].get_partial_shape()[2].get_length() == 8192
    d2t = outputs["d2t"].get_node().input_value(0).get_node().get_data()  # a constant, as GenAI expects
    ours = load_drafter(PRETRAINED_DIR / "smollm2-135m-instruct").d2t
    assert torch.equal(torch.as_tensor(d2t).long(), ours) and int(ours.abs().sum()) > 0


@pytest.mark.openvino
@pytest.mark.slow
@needs_openvino
def test_optimum_intel_class_has_exactly_our_weights():
    from optimum.exporters.openvino.model_patcher import LlamaEagle3ForCausalLM

    model = drafter()
    cfg, weights = draft_folder(model.config, model.state_dict(), target_config())
    with torch.device("meta"):
        theirs = LlamaEagle3ForCausalLM(transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    shapes = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert shapes == {**{k: tuple(v.shape) for k, v in weights.items()}, "model.embed_tokens.weight": (V, H)}


@pytest.mark.openvino
@pytest.mark.slow
@needs_openvino
def test_speculative_greedy_is_token_identical_to_plain_greedy(exported):
    import openvino_genai as og

    draft, target = exported
    tokenizer = og.Tokenizer(str(target))
    inputs = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                                             add_generation_prompt=True), add_special_tokens=False)
              for p in PROMPTS]
    plain = og.LLMPipeline(str(target), "CPU", **PROPERTIES)
    expected = [plain.generate(x, og.GenerationConfig(max_new_tokens=32, do_sample=False)).tokens[0] for x in inputs]
    del plain
    speculative = og.LLMPipeline(str(target), "CPU", draft_model=og.draft_model(str(draft), "CPU", **PROPERTIES),
                                 **PROPERTIES)
    config = og.GenerationConfig(max_new_tokens=32, do_sample=False, num_assistant_tokens=5)
    accepted = drafted = 0
    for x, want in zip(inputs, expected):
        result = speculative.generate(x, config)
        assert result.tokens[0] == want, tokenizer.decode(want) + " | " + tokenizer.decode(result.tokens[0])
        metrics = result.extended_perf_metrics
        accepted, drafted = accepted + metrics.get_num_accepted_tokens(), drafted + metrics.get_num_draft_tokens()
    print(f"OpenVINO GenAI EAGLE-3: {accepted} of {drafted} drafted tokens accepted, "
          f"{sum(map(len, expected))} tokens generated")
    assert accepted >= 5  # it drafted, and the target kept drafts (24 of ~100 on this CPU, 2026.4.1)
