"""``hfs.optimize_for_cpu``: same values and parameters in another memory layout, and every drafter
still token-identical to plain greedy on the re-laid-out model."""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.cpu import layout as cpu_layout_module
from hf_speculative.cpu.layout import PackedLinear, apply_layout, cpu_layout
from hf_speculative.core.costs import verify_costs_for
from tests.conftest import PROMPT, build_model, make_drafter, prompt_inputs, stock_generate

GREEDY = dict(do_sample=False, max_new_tokens=40)


def _linears(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def convert_keeping_parameters(model, layer_class: type, layout: str, **options) -> int:
    """``optimize_for_cpu(model, **options)``, checked: every linear layer changed to
    ``layer_class``, ``cpu_layout`` reports ``layout``, parameters and state-dict keys are kept."""
    params = dict(model.named_parameters())
    keys = list(model.state_dict())
    changed = hfs.optimize_for_cpu(model, **options)
    assert changed == len(_linears(model))
    assert cpu_layout(model) == layout
    assert all(type(m) is layer_class for m in _linears(model))
    assert dict(model.named_parameters()) == params and list(model.state_dict()) == keys
    return changed


def restore_row_major(model, changed: int) -> None:
    """``optimize_for_cpu(model, enable=False)`` undoes the ``changed`` layers: plain ``nn.Linear`` again."""
    assert hfs.optimize_for_cpu(model, enable=False) == changed
    assert cpu_layout(model) == "none"
    assert all(type(m) is torch.nn.Linear for m in _linears(model))


def test_values_parameters_and_output_are_kept(arch):
    model = build_model(arch)
    ids = prompt_inputs()["input_ids"]
    with torch.no_grad():
        before = model(ids).logits
    params = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}

    changed = hfs.optimize_for_cpu(model, kernel=False)

    assert changed == len(_linears(model)) > 0
    assert cpu_layout(model) == "all"
    for name, p in model.named_parameters():
        kept, value = params[name]
        assert p is kept, f"{name} was replaced instead of re-laid out"
        assert torch.equal(p, value), name
    for m in _linears(model):
        assert m.weight.stride() == (1, m.weight.shape[0])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)
    assert hfs.optimize_for_cpu(model, kernel=False) == 0  # already done

    assert hfs.optimize_for_cpu(model, enable=False) == changed
    assert cpu_layout(model) == "none"
    assert all(m.weight.is_contiguous() for m in _linears(model))


def test_tied_embeddings_stay_tied():
    model = build_model("llama")
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    ids = prompt_inputs()["input_ids"]
    with torch.no_grad():
        before = model(ids).logits
    hfs.optimize_for_cpu(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.stride() == (1, model.lm_head.weight.shape[0])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("drafter_name", ["prompt-lookup", "draft-model", "eagle3", "early-exit", "layer-skip",
                                          "oracle", "adversary"])
def test_drafters_identical_to_greedy_on_the_new_layout(arch, drafter_name):
    model = hfs.enable(build_model(arch))
    hfs.optimize_for_cpu(model)
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    drafter = make_drafter(drafter_name, model, ref)
    torch.manual_seed(0)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=drafter)
    assert out.tolist() == ref.tolist()
    assert ref.shape[1] > len(PROMPT)


def test_save_and_reload_after_optimizing(tmp_path):
    model = build_model("llama")
    hfs.optimize_for_cpu(model)
    model.save_pretrained(tmp_path)
    again = type(model).from_pretrained(tmp_path)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_other_dtypes_are_left_alone():
    model = build_model("llama").to(torch.float16)  # bf16: tests/cpu/test_bf16_kernel.py
    assert hfs.optimize_for_cpu(model) == 0
    assert cpu_layout(model) == "none"
    assert all(m.weight.is_contiguous() for m in _linears(model))


def test_measured_verify_costs_are_forgotten():
    model = build_model("llama")
    costs = verify_costs_for(model, 8)
    costs.observe(0, 0.01)
    assert verify_costs_for(model, 8) is costs
    hfs.optimize_for_cpu(model)
    fresh = verify_costs_for(model, 8)
    assert fresh is not costs and fresh.seconds(0) is None


def test_output_layer_only_and_bad_option():
    model = build_model("qwen2")
    assert hfs.optimize_for_cpu(model, layers="output", kernel=False) == 1
    assert cpu_layout(model) == "output"
    assert model.lm_head.weight.stride() == (1, model.lm_head.weight.shape[0])
    assert all(m.weight.is_contiguous() for m in _linears(model) if m is not model.lm_head)
    assert hfs.optimize_for_cpu(model, kernel=False) == len(_linears(model)) - 1
    assert cpu_layout(model) == "all"
    model.model.layers[0].mlp.up_proj.weight.data = model.model.layers[0].mlp.up_proj.weight.data.contiguous()
    assert cpu_layout(model) == "mixed"
    with pytest.raises(ValueError, match="use one of"):
        hfs.optimize_for_cpu(model, layers="mlp")
    for name in ("all+fast", "mlp", "output+"):
        with pytest.raises(ValueError, match=r"Unknown CPU layout .*: use one of none, output, all, output\+packed"):
            apply_layout(model, name)
    assert apply_layout(model, "none") == 0 and cpu_layout(model) == "mixed"  # "none": left as it is


# --- pack=True: oneDNN-packed products of several rows (PackedLinear) -------------------------


def test_packed_keeps_parameters_state_dict_and_outputs(arch):
    model = build_model(arch)
    ids = prompt_inputs()["input_ids"]
    with torch.no_grad():
        before, one_row = model(ids).logits, model(ids[:, :1]).logits

    changed = convert_keeping_parameters(model, PackedLinear, "all+packed", pack=True)

    assert all(m._hfs_packed.tensor is not None for m in _linears(model))  # packed now, not in a verification
    calls = []
    with torch.no_grad(), _counting_packed_products(calls):
        torch.testing.assert_close(model(ids[:, :1]).logits, one_row, rtol=1e-5, atol=1e-5)
        assert not calls  # one row: F.linear
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)
    assert len(calls) == len(_linears(model))  # several rows: the packed copies

    restore_row_major(model, changed)
    assert not any(hasattr(m, "_hfs_packed") for m in _linears(model))


@contextlib.contextmanager
def _counting_packed_products(calls: list):
    original = cpu_layout_module._Packed.get

    def counted(self, weight):
        calls.append(weight.shape)
        return original(self, weight)

    cpu_layout_module._Packed.get = counted
    try:
        yield
    finally:
        cpu_layout_module._Packed.get = original


def test_packed_copy_follows_in_place_weight_changes():
    layer = torch.nn.Linear(16, 8)
    hfs.optimize_for_cpu(layer, pack=True)
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        layer.weight.mul_(-2.0)  # e.g. an optimizer step or load_state_dict
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        layer.load_state_dict({"weight": torch.randn(8, 16), "bias": torch.zeros(8)})
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_packed_layers_still_train():
    model = build_model("llama")
    hfs.optimize_for_cpu(model, pack=True)
    ids = prompt_inputs()["input_ids"]
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for m in _linears(model))


def test_packed_model_copies_saves_and_pickles(tmp_path):
    model = build_model("qwen2")
    hfs.optimize_for_cpu(model, pack=True)
    ids = prompt_inputs()["input_ids"]
    with torch.no_grad():
        expected = model(ids).logits
    twin = copy.deepcopy(model)
    assert cpu_layout(twin) == "all+packed" and twin.lm_head._hfs_packed.tensor is None
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    model.save_pretrained(tmp_path / "hf")
    again = type(model).from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        for other in (twin, loaded, again):
            torch.testing.assert_close(other(ids).logits, expected, rtol=1e-5, atol=1e-5)


def test_output_layer_packed_only():
    model = build_model("llama")
    assert hfs.optimize_for_cpu(model, layers="output", pack=True) == 1
    assert cpu_layout(model) == "output+packed"
    assert type(model.lm_head) is PackedLinear
    assert all(type(m) is torch.nn.Linear for m in _linears(model) if m is not model.lm_head)


def test_pack_without_onednn_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(cpu_layout_module, "_can_pack", lambda: False)
    model = build_model("llama")
    with pytest.raises(RuntimeError, match="without pack"):
        hfs.optimize_for_cpu(model, pack=True)
    assert cpu_layout(model) == "none"


@pytest.mark.parametrize("drafter_name", ["prompt-lookup", "draft-model", "eagle3", "early-exit", "oracle",
                                          "adversary"])
def test_drafters_identical_to_greedy_when_packed(arch, drafter_name):
    model = hfs.enable(build_model(arch))
    hfs.optimize_for_cpu(model, pack=True)
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    drafter = make_drafter(drafter_name, model, ref)
    torch.manual_seed(0)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=drafter)
    assert out.tolist() == ref.tolist()
    calls = []
    with _counting_packed_products(calls):
        torch.manual_seed(0)
        model.generate(**prompt_inputs(), **GREEDY, candidate_generator=make_drafter(drafter_name, model, ref))
    assert calls  # verification ran on the packed weights


@pytest.mark.parametrize("layout", ["none", "output", "all", "all+packed", "all+kernel"])
def test_a_loaded_eagle_drafter_follows_the_targets_layout(tmp_path, layout):
    """``Eagle.from_pretrained(..., target=model)`` lays the drafter out as the target is (its
    drafting steps are one-row products too), and it still drafts exactly."""
    from hf_speculative.cpu import kernel as cpu_kernel
    from hf_speculative.drafters.eagle import checkpoints
    from tests.conftest import random_eagle

    if layout.endswith("kernel") and not cpu_kernel.cpu_supports_kernel():
        pytest.skip("the kernel needs AVX2 and FMA")
    target = hfs.enable(build_model("llama"))
    checkpoints.save_pretrained(random_eagle(target), tmp_path / "eagle")
    ref = stock_generate(target, **prompt_inputs(), **GREEDY)
    apply_layout(target, layout)
    eagle = hfs.Eagle.from_pretrained(tmp_path / "eagle", target=target, num_tokens=4, confidence_threshold=0.0,
                                      adaptive=False)
    expected = {"none": "none", "output": "all"}.get(layout, layout)  # the drafter has no "output" of its own
    assert cpu_layout(eagle.drafter) == expected
    assert hfs.Eagle.from_pretrained(tmp_path / "eagle").drafter.fc.weight.is_contiguous()  # no target: as stored
    out = target.generate(**prompt_inputs(), **GREEDY, candidate_generator=eagle)
    assert out.tolist() == ref.tolist()
    assert hfs.last_stats(target).drafted_tokens > 0


@pytest.mark.parametrize("layout", ["none", "all", "all+kernel"])
def test_a_draft_model_follows_the_targets_layout(layout):
    """After ``hfs.optimize_for_cpu(target)`` a ``DraftModel``'s drafter is laid out as the target at the call (its
    steps are one-row products, as the target's decoding), and the call stays exact."""
    from hf_speculative.cpu import kernel as cpu_kernel
    from tests.conftest import sibling_model

    if layout.endswith("kernel") and not cpu_kernel.cpu_supports_kernel():
        pytest.skip("the kernel needs AVX2 and FMA")
    target = hfs.enable(build_model("llama"))
    drafter = sibling_model(target)
    ref = stock_generate(target, **prompt_inputs(), **GREEDY)
    apply_layout(target, layout)
    assert cpu_layout(drafter) == "none"
    out = target.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.DraftModel(drafter, adaptive=False))
    assert out.tolist() == ref.tolist() and hfs.last_stats(target).drafted_tokens > 0
    assert cpu_layout(drafter) == layout
    from hf_speculative.cpu.layout import follow_layout

    assert follow_layout(drafter, target) == 0  # the next call's: nothing left to change


def test_the_default_runs_the_kernel_where_it_runs_else_the_layout_saying_why(monkeypatch):
    """``kernel=None`` (the default): the kernel where this CPU and toolchain run it; without a compiler (simulated),
    the column-major layout alone and a warning that names the missing piece, while ``kernel=True`` still raises;
    on a CPU without AVX2 (simulated), the layout without a word. Outputs keep their values in every case."""
    from hf_speculative.cpu import kernel as cpu_kernel

    ids = prompt_inputs()["input_ids"]
    reference = build_model("llama")
    with torch.no_grad():
        before = reference(ids).logits
    if cpu_kernel.cpu_supports_kernel():
        model = copy.deepcopy(reference)
        hfs.optimize_for_cpu(model)
        assert cpu_layout(model) == "all+kernel"
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)

    def no_compiler():
        raise RuntimeError("optimize_for_cpu(kernel=True) could not compile its CPU kernel (no g++).")

    monkeypatch.setattr(cpu_layout_module, "cpu_supports_kernel", lambda: True)
    monkeypatch.setattr(cpu_layout_module, "load_kernel", no_compiler)
    model = copy.deepcopy(reference)
    with pytest.warns(UserWarning, match=r"the CPU kernel is not used, only the column-major layout: .*no g\+\+"):
        assert hfs.optimize_for_cpu(model) == len(_linears(model))
    assert cpu_layout(model) == "all"
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="could not compile"):
        hfs.optimize_for_cpu(copy.deepcopy(reference), kernel=True)
    assert hfs.optimize_for_cpu(build_model("llama").to(torch.bfloat16)) == 0  # nothing to lay out: nothing tried

    monkeypatch.setattr(cpu_layout_module, "cpu_supports_kernel", lambda: False)
    model = copy.deepcopy(reference)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hfs.optimize_for_cpu(model)
    assert cpu_layout(model) == "all"
