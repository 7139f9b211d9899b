"""Dynamic trees grown on the device (core/tree_shapes.py ``grow_dynamic_on_device``, issue 69): the tree
``DynamicTree.grow`` grows, node for node, with one read of the device; EAGLE's dynamic trees take it where nothing
reads the host's branches (no processors, greedy), drafting what the host path drafts, step for step. Static trees
of branch-independent guesses (Medusa's heads, DFlash's block) likewise (``grow_paths_on_device``)."""

from __future__ import annotations

import importlib

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core.tree_shapes import (DynamicTree, grow_dynamic_on_device, grow_dynamic_tensors, grow_paths,
                                             grow_paths_on_device, tree_from_device)
from hf_speculative.drafters.eagle import drafter as eagle_drafter
from tests.conftest import build_model, prompt_inputs, random_eagle, stock_generate

V = 23


def table(seed: int, nan_row: int | None = None) -> torch.Tensor:
    """``[V, V]`` logits of the token after each token (a node's guesses depend on its own token)."""
    out = torch.randn(V, V, generator=torch.Generator().manual_seed(seed))
    if nan_row is not None:
        out[nan_row] = float("nan")
    return out


def grown(shape: DynamicTree, logits: torch.Tensor, root: torch.Tensor, nodes: int, max_depth: int, device: bool):
    if device:
        return grow_dynamic_on_device(shape, root, lambda f, tokens, parents, level: logits[tokens], nodes, max_depth)
    return shape.grow(root, lambda f, tokens, parents: logits[tokens], nodes=nodes, depth=max_depth)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("nodes,depth,top_k", [(8, 4, 3), (32, 6, 8), (5, 2, 4), (1, 3, 2), (40, 5, 5)])
def test_the_device_grows_the_tree_dynamic_tree_grow_grows(seed, nodes, depth, top_k):
    shape = DynamicTree(nodes=nodes, depth=depth, top_k=top_k)
    logits, root = table(seed), torch.randn(V, generator=torch.Generator().manual_seed(100 + seed))
    for budget, max_depth in ((nodes, depth), (max(nodes // 2, 1), depth), (nodes, 2), (nodes, 1)):
        host = grown(shape, logits, root, budget, max_depth, device=False)
        device = grown(shape, logits, root, budget, max_depth, device=True)
        assert (device.tokens.tolist(), device.parents.tolist()) == (host.tokens.tolist(), host.parents.tolist())
        assert device.token_list() == host.token_list() and device.parent_list() == host.parent_list()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("nodes,depth,top_k", [(8, 4, 3), (32, 6, 8), (40, 5, 5)])
def test_a_tree_grown_deeper_but_kept_to_fewer_levels_is_the_tree_grown_to_them(seed, nodes, depth, top_k):
    """A compiled region grows the levels of a step away from the call's end; a last step, with less room, passes
    the levels it keeps as a tensor (no new graph): its nodes are the ones a tree grown to that depth keeps."""
    shape = DynamicTree(nodes=nodes, depth=depth, top_k=top_k)
    logits, root = table(seed), torch.randn(V, generator=torch.Generator().manual_seed(200 + seed))
    expand = lambda f, tokens, parents, level: logits[tokens]  # noqa: E731
    cuts = []
    for keep in range(1, depth + 1):
        cut = tree_from_device(*grow_dynamic_tensors(shape, root, expand, nodes, depth, keep_levels=torch.tensor(keep)))
        own = grown(shape, logits, root, nodes, keep, device=False)
        assert (cut.token_list(), cut.parent_list()) == (own.token_list(), own.parent_list()), keep
        assert max(cut.depths().tolist()) < keep
        cuts.append((cut.token_list(), cut.parent_list()))
    whole = grown(shape, logits, root, nodes, depth, device=True)
    assert cuts[-1] == (whole.token_list(), whole.parent_list())
    assert len(set(map(str, cuts))) > 1  # the levels kept changed the tree


def test_nodes_with_no_probability_are_dropped_with_their_descendants():
    shape = DynamicTree(nodes=20, depth=4, top_k=3)
    root = torch.randn(V, generator=torch.Generator().manual_seed(5))
    bad = int(root.topk(2).indices[1])  # the root's second guess: its children have no probability
    logits = table(1, nan_row=bad)
    host = grown(shape, logits, root, 20, 4, device=False)
    device = grown(shape, logits, root, 20, 4, device=True)
    assert device.size and bad in device.token_list()  # the guess itself is kept, as grow keeps it
    assert (device.tokens.tolist(), device.parents.tolist()) == (host.tokens.tolist(), host.parents.tolist())


def test_an_empty_budget_drafts_nothing():
    shape = DynamicTree(nodes=8, depth=3, top_k=2)
    assert grow_dynamic_on_device(shape, torch.randn(V), lambda *a: None, 0, 3).size == 0


def _eagle_trees(monkeypatch, target, strategy, host: bool, **kwargs):
    used, trees = [], []
    with monkeypatch.context() as patch:
        original = eagle_drafter.grow_dynamic_on_device
        if host:
            patch.setattr(eagle_drafter.EagleCandidateGenerator, "_device_tree_ok", lambda self: False,
                          raising=False)
        patch.setattr(eagle_drafter, "grow_dynamic_on_device", lambda *a: used.append(1) or original(*a))
        draft = eagle_drafter.EagleCandidateGenerator.draft

        def recording(self, *args):
            tree = draft(self, *args)
            trees.append((tree.tokens.tolist(), tree.parents.tolist()))
            return tree

        patch.setattr(eagle_drafter.EagleCandidateGenerator, "draft", recording)
        out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None,
                              candidate_generator=strategy, **kwargs)
    return out.tolist(), trees, len(used)


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("version", [1, 3])
def test_eagle_dynamic_trees_on_the_device_equal_the_host_path_and_greedy(version, adaptive, monkeypatch):
    target = hfs.enable(build_model("llama", layers=4))
    reference = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=30,
                               eos_token_id=None).tolist()
    strategy = hfs.Eagle(random_eagle(target, version=version), tree=DynamicTree(nodes=12, depth=4, top_k=3),
                         adaptive=adaptive)
    host = _eagle_trees(monkeypatch, target, strategy, host=True)
    device = _eagle_trees(monkeypatch, target, strategy, host=False)
    assert host[0] == device[0] == reference
    assert host[2] == 0
    if adaptive:  # the cost model chooses the node counts from measured times: the trees follow the machine, and it
        # may draft the drafter's own chain instead (the tree budget's chain option), which grows no tree: every
        # drafted tree that branches grew on the device
        branching = sum(1 for tokens, parents in device[1] if tokens and parents != list(range(-1, len(parents) - 1)))
        assert device[2] >= branching, device  # (the fixed budget above checks that trees grow there at all)
    else:
        assert host[1] == device[1] and device[2] > 0 and any(tokens for tokens, _ in device[1])


def test_eagle_trees_under_processors_grow_on_the_host(monkeypatch):
    target = hfs.enable(build_model("llama", layers=4))
    strategy = hfs.Eagle(random_eagle(target), tree=DynamicTree(nodes=12, depth=4, top_k=3), adaptive=False)
    reference = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None,
                               repetition_penalty=1.3).tolist()
    out, trees, used = _eagle_trees(monkeypatch, target, strategy, host=False, repetition_penalty=1.3)
    assert out == reference and used == 0 and any(tokens for tokens, _ in trees)


PATHS = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (2, 3), (0, 0, 0, 0)]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("max_depth", [1, 2, 4])
def test_static_trees_of_level_logits_grow_on_the_device_as_grow_paths_grows_them(seed, max_depth):
    """Every level's logits the same under each of its nodes: the device's tree is ``grow_paths``' node for node,
    banned (-inf), NaN and overflowing (+inf) guesses dropped with the nodes under them, ranks past the vocabulary
    too."""
    vocab = 5  # rank 3 under (2,) exists, a fifth guess would not
    levels = torch.randn(4, vocab, generator=torch.Generator().manual_seed(seed))
    if seed % 3 == 0:
        levels[1, torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:3]] = float("-inf")
    if seed % 4 == 1:
        levels[0] = float("nan")
    if seed % 5 == 2:
        levels[2, 1] = float("inf")
    depth = iter(range(1, 4))
    host = grow_paths(PATHS + [(1, 5)], levels[0], lambda frontier, tokens, parents: levels[next(depth)].expand(
        len(frontier), -1), max_depth)
    device = grow_paths_on_device(PATHS + [(1, 5)], levels, max_depth)
    assert device.token_list() == host.tokens.tolist() and device.parent_list() == host.parents.tolist()
    assert device.tokens.tolist() == host.tokens.tolist() and device.parents.tolist() == host.parents.tolist()
    if seed % 4 == 1:
        assert device.size == 0  # the root's guesses have no probability: no tree


@pytest.mark.parametrize("label", ["medusa-tree", "dflash-tree"])
def test_medusa_and_dflash_static_trees_read_the_device_once_a_step(label, monkeypatch):
    """Without processors their trees grow on the device: the host path's drafts, one read, greedy's text."""
    from hf_speculative.core import tree_shapes
    from hf_speculative.drafters import registry

    target = hfs.enable(build_model("llama", layers=4))
    reference = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=24, eos_token_id=None)
    grown_on_device, original = [], tree_shapes.grow_paths_on_device
    module = importlib.import_module(f"hf_speculative.drafters.{label.split('-')[0]}.drafter")
    monkeypatch.setattr(module, "grow_paths_on_device", lambda *a: grown_on_device.append(1) or original(*a))
    out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24, eos_token_id=None,
                          candidate_generator=registry.examples()[label].example(target, label))
    assert out.tolist() == reference.tolist() and grown_on_device
