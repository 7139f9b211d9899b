"""The ``medusa`` and ``medusa-tree`` methods of the registry (benchmark, app): shipped heads or ``options["medusa"]``,
the calibrated tree cut to ``tree_nodes``, identical to greedy; a model without heads gets the fix."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.drafters.medusa.checkpoints import save_pretrained
from hf_speculative.tooling.methods import available_methods, get_method, run_method
from tests.conftest import PROMPT, build_model
from tests.drafters.medusa.conftest import random_heads


def test_methods_are_registered():
    assert {"medusa", "medusa-tree"} <= set(available_methods())
    assert get_method("medusa-tree").kind == "hfs"


def test_methods_equal_greedy_with_the_calibrated_tree(tmp_path):
    target = build_model("llama")
    save_pretrained(random_heads(target), tmp_path)
    hfs.StaticTree([(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0)]).save(tmp_path / "tree.json")
    prompt = torch.tensor([PROMPT])
    greedy = run_method("greedy", target, None, prompt, max_new_tokens=24)
    options = {"medusa": str(tmp_path), "tree_nodes": 4}
    for name in ("medusa", "medusa-tree"):
        run = run_method(name, target, None, prompt, options=options, max_new_tokens=24)
        assert run.output_ids == greedy.output_ids, name
    tree = get_method("medusa-tree").build(target, None, options)["candidate_generator"].tree
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1))  # the first 4 paths, parents first
    fixed = get_method("medusa-tree").build(target, None, {**options, "tree_nodes": 5, "adaptive": False})
    assert fixed["candidate_generator"].tree.size == 5 and not fixed["candidate_generator"].adaptive
    assert get_method("medusa").build(target, None, options)["candidate_generator"].tree is None
    with pytest.raises(ValueError, match="tree_nodes"):
        get_method("medusa-tree").build(target, None, {**options, "tree_nodes": 65})


def test_a_model_without_heads_gets_the_fix():
    with pytest.raises(ValueError, match="no Medusa heads ships for .*train-medusa"):
        get_method("medusa").build(build_model("llama"), None, {})
