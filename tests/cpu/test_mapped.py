"""``optimize_for_cpu`` lets a memory-mapped checkpoint go: no parameter or buffer is left a view of the file, so
the file's pages the layout read stop counting in the process's memory (``hf_speculative.cpu.mapped``)."""

from __future__ import annotations

import gc
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_speculative as hfs
from hf_speculative.cpu.mapped import copy_off_files, file_backed_ranges
from tests.conftest import build_model, prompt_inputs, stock_generate

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")


def _mapped(path) -> bool:
    """Whether this process maps a file under ``path``."""
    with open("/proc/self/maps") as maps:
        return any(str(path) in line for line in maps)


def _in_files(model) -> list[str]:
    ranges = file_backed_ranges()
    return [name for name, t in (*model.named_parameters(), *model.named_buffers())
            if any(a <= t.untyped_storage().data_ptr() < b for a, b in ranges)]


@pytest.fixture
def loaded(tmp_path):
    """A tiny Llama saved as safetensors and loaded back, so its parameters are views of the file's mapping."""
    build_model("llama").save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    if not _in_files(model):
        pytest.skip("this transformers version does not memory-map the checkpoint")
    return model, tmp_path


def test_optimize_for_cpu_lets_the_checkpoint_go(loaded):
    model, folder = loaded
    want = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=12)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    hfs.optimize_for_cpu(model, kernel=False)  # the layout alone copies the linear weights; the norms stay views
    gc.collect()
    assert _in_files(model) == []
    assert not _mapped(folder / "model.safetensors")
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    assert torch.equal(stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=12), want)


def test_negative_control_the_views_keep_the_mapping(loaded):
    """Without the copy, the norms alone keep the file mapped (what the copy is for)."""
    model, folder = loaded
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.data = module.weight.data.clone()
    gc.collect()
    views = _in_files(model)
    assert views and _mapped(folder / "model.safetensors")
    assert copy_off_files(model) == len(views)
    gc.collect()
    assert _in_files(model) == [] and not _mapped(folder / "model.safetensors")


def test_nothing_to_copy_for_a_model_built_in_memory():
    model = build_model("llama")
    before = {name: t.data_ptr() for name, t in model.named_parameters()}
    assert copy_off_files(model) == 0
    assert {name: t.data_ptr() for name, t in model.named_parameters()} == before
