"""Draft trees: their structure, the tree attention mask through stock models, the KV gather after a verdict.

Every node's logits from one tree forward must equal the logits of a plain causal forward over the prefix,
the root and the node's own branch; after keeping a path, the cache must equal one computed from scratch on
the prefix, the root and the path's tokens (fp32, 1e-5).
"""

from __future__ import annotations

import copy

import pytest
import torch
from tests.conftest import ARCHS, build_model

from hf_speculative import compat
from hf_speculative.core import kv_cache
from hf_speculative.core.tree import ROOT, DraftTree, Verdict, position_ids, visibility
from hf_speculative.core.verify import TreeAttentionError, check_tree_attention, forward_tree, keep_path

# A tree of width 3 and depth 4: root -> 0, 1, 2; 0 -> 3, 4; 1 -> 5; 3 -> 6; 5 -> 7; 6 -> 8
PARENTS = [-1, -1, -1, 0, 0, 1, 3, 5, 6]
PROMPT = [3, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 10, 11, 12]  # longer than Gemma3's window of 8


def mistral(window: int = 8):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=window,
                           max_position_embeddings=256, tie_word_embeddings=False)
    return MistralForCausalLM(config).eval()


MODELS = {arch: (lambda arch=arch: build_model(arch)) for arch in ARCHS} | {"mistral": mistral}


def branch(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's child down to ``node``."""
    path = []
    while node != -1:
        path.append(node)
        node = parents[node]
    return path[::-1]


def reference(model, ids: list[int]):
    """Logits ``[T, V]`` and the full-attention cache of one plain causal forward over ``ids``."""
    cache = kv_cache.new_dynamic_cache()
    out = model(input_ids=torch.tensor([ids]), use_cache=True, **{compat.cache_kwarg(): cache})
    return out.logits[0], cache


def cache_tensors(cache) -> list[torch.Tensor]:
    return compat.cache_tensors(cache)


def test_chain_is_a_tree_with_one_branch():
    chain = DraftTree.chain([4, 5, 6])
    assert chain.parents.tolist() == [-1, 0, 1] and chain.is_chain()
    assert chain.depths().tolist() == [0, 1, 2]
    assert position_ids(chain, 10).tolist() == [[10, 11, 12, 13]]
    tree = DraftTree(torch.arange(9), torch.tensor(PARENTS))
    assert not tree.is_chain()
    assert tree.depths().tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 3]
    assert tree.children(-1) == [0, 1, 2] and tree.children(0) == [3, 4]
    assert tree.ancestors()[8].nonzero().flatten().tolist() == [0, 3, 6, 8]
    assert DraftTree.empty().size == 0


def test_within_keeps_the_nodes_as_deep_as_a_room_in_their_order():
    #        a(0) ─ b(1) ─ c(3)        depths 1, 2, 1, 3, 2
    #        d(2) ─ e(4)
    tree = DraftTree(torch.tensor([10, 11, 12, 13, 14]), torch.tensor([ROOT, 0, ROOT, 1, 2]), q=torch.eye(5))
    two = tree.within(2)
    assert (two.token_list(), two.parent_list()) == ([10, 11, 12, 14], [ROOT, 0, ROOT, 2])
    assert two.parents.tolist() == [ROOT, 0, ROOT, 2] and two.q.tolist() == torch.eye(5)[[0, 1, 2, 4]].tolist()
    one = tree.within(1)
    assert (one.token_list(), one.parent_list()) == ([10, 12], [ROOT, ROOT])
    assert tree.within(3) is tree and tree.within(9) is tree
    assert tree.within(0).size == 0
    chain = DraftTree.from_tokens([4, 5, 6])
    assert chain.within(2).token_list() == [4, 5] and chain.within(2).is_chain()


def test_visibility_is_prefix_root_and_ancestors():
    tree = DraftTree(torch.arange(9), torch.tensor(PARENTS))
    seen = visibility(tree, prefix_length=4)
    assert seen.shape == (10, 14)
    assert seen[:, :5].all()  # prefix and root for everyone
    assert seen[1 + 8, 5:].nonzero().flatten().tolist() == [0, 3, 6, 8]  # node 8: its branch
    assert seen[0, 5:].sum() == 0  # the root sees no node
    windowed = visibility(tree, prefix_length=4, window=3)  # node 8 at position 4 + 1 + 3 = 8 sees > 5
    assert windowed[1 + 8].nonzero().flatten().tolist() == [4 + 1 + 3, 4 + 1 + 6, 4 + 1 + 8]


@pytest.mark.parametrize("bad, message", [
    (dict(tokens=torch.tensor([1, 2]), parents=torch.tensor([-1, 1])), "before its child"),
    (dict(tokens=torch.tensor([1, 2]), parents=torch.tensor([-1, -2])), "before its child"),
    (dict(tokens=torch.tensor([1, 2]), parents=torch.tensor([-1])), "one length"),
    (dict(tokens=torch.tensor([1.0]), parents=torch.tensor([-1])), "int64"),
])
def test_bad_trees_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        DraftTree(**bad)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tree_forward_equals_each_branch_alone(name):
    model = MODELS[name]()
    torch.manual_seed(1)
    tokens = torch.randint(4, 96, (len(PARENTS),))
    tree = DraftTree(tokens, torch.tensor(PARENTS))
    cache = kv_cache.new_dynamic_cache()
    with torch.no_grad():
        model(input_ids=torch.tensor([PROMPT[:-1]]), use_cache=True, **{compat.cache_kwarg(): cache})
        logits = forward_tree(model, cache, PROMPT[-1], tree)  # [1 + n, V]
        assert kv_cache.cache_length(cache) == len(PROMPT) + tree.size
        root_logits, _ = reference(model, PROMPT)
        torch.testing.assert_close(logits[0], root_logits[-1], atol=1e-5, rtol=1e-5)
        for node in range(tree.size):
            ids = PROMPT + tree.path_tokens(branch(PARENTS, node))
            expected, _ = reference(model, ids)
            torch.testing.assert_close(logits[1 + node], expected[-1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("path", [[], [0], [0, 3, 6, 8], [1, 5, 7], [2]])
def test_kept_cache_equals_one_built_from_scratch(name, path):
    model = MODELS[name]()
    torch.manual_seed(2)
    tree = DraftTree(torch.randint(4, 96, (len(PARENTS),)), torch.tensor(PARENTS))
    cache = kv_cache.new_dynamic_cache()
    with torch.no_grad():
        model(input_ids=torch.tensor([PROMPT[:-1]]), use_cache=True, **{compat.cache_kwarg(): cache})
        forward_tree(model, cache, PROMPT[-1], tree)
        keep_path(cache, len(PROMPT) - 1, tree, path)
        _, expected = reference(model, PROMPT + tree.path_tokens(path))
        # and the next step runs on the gathered cache exactly like on the fresh one
        following = forward_tree(model, cache, 7, DraftTree.chain([8, 9]))
        fresh = forward_tree(model, expected, 7, DraftTree.chain([8, 9]))
    assert kv_cache.cache_length(cache) == len(PROMPT) + len(path) + 3
    for got, want in zip(cache_tensors(cache), cache_tensors(expected), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(following, fresh, atol=1e-5, rtol=1e-5)


def test_verdict_counts_the_accepted_path():
    assert Verdict(path=(1, 5), next_token=7).num_accepted == 2


def test_attention_that_cannot_take_a_tree_mask_is_named():
    model = build_model("llama")
    config = copy.copy(model.config)
    config._attn_implementation = "flash_attention_2"
    holder = torch.nn.Module()
    holder.config = config
    with pytest.raises(TreeAttentionError, match="attn_implementation='flash_attention_2'.*sdpa"):
        check_tree_attention(holder)
    check_tree_attention(model)  # sdpa / eager pass


@pytest.mark.parametrize("name", sorted(MODELS))
def test_first_forward_prefills_the_prompt_with_the_tree(name):
    """The prompt's tokens (uncached) and the tree in one forward give the same logits and cache as a
    prefill followed by the tree."""
    model = MODELS[name]()
    torch.manual_seed(3)
    tree = DraftTree(torch.randint(4, 96, (len(PARENTS),)), torch.tensor(PARENTS))
    with torch.no_grad():
        split = kv_cache.new_dynamic_cache()
        model(input_ids=torch.tensor([PROMPT[:-1]]), use_cache=True, **{compat.cache_kwarg(): split})
        expected = forward_tree(model, split, PROMPT[-1], tree)
        joint = kv_cache.new_dynamic_cache()
        model(input_ids=torch.tensor([PROMPT[:3]]), use_cache=True, **{compat.cache_kwarg(): joint})
        got = forward_tree(model, joint, torch.tensor(PROMPT[3:]), tree)
        empty = kv_cache.new_dynamic_cache()
        whole = forward_tree(model, empty, torch.tensor(PROMPT), tree)  # nothing cached before
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(whole, expected, atol=1e-5, rtol=1e-5)
    for a, b in zip(cache_tensors(joint), cache_tensors(split), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_chains_take_the_models_own_causal_path(name):
    """A chain is verified without a custom mask; its logits equal the tree path's (same chain as a tree of
    one branch, forced through the mask) and the plain forward's."""
    model = MODELS[name]()
    chain = DraftTree.chain(torch.tensor([20, 30, 40, 50]))
    as_tree = DraftTree(chain.tokens, chain.parents.clone())
    with torch.no_grad():
        plain = kv_cache.new_dynamic_cache()
        got = forward_tree(model, plain, torch.tensor(PROMPT), chain)
        masked = kv_cache.new_dynamic_cache()
        from hf_speculative.core import verify
        out = model(input_ids=torch.tensor([PROMPT + [20, 30, 40, 50]]),
                    position_ids=position_ids(as_tree, len(PROMPT) - 1, len(PROMPT) - 1),
                    attention_mask=verify.tree_masks(model, as_tree, len(PROMPT) - 1, torch.float32, len(PROMPT) - 1),
                    use_cache=True, **{compat.cache_kwarg(): masked})
        expected, _ = reference(model, PROMPT + [20, 30, 40, 50])
    torch.testing.assert_close(got, expected[-5:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logits[0, -5:], expected[-5:], atol=1e-5, rtol=1e-5)


def test_ancestors_match_the_parent_walk_on_random_trees():
    """The host-built mask against the definition: ``[i, j]`` iff ``j`` is on the path from the root to ``i``."""
    generator = torch.Generator().manual_seed(3)
    for n in (1, 2, 7, 33):
        parents = [ROOT] + [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(1, n)]
        tree = DraftTree(torch.arange(n), torch.tensor(parents))
        expected = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            node = i
            while node != ROOT:
                expected[i, node] = True
                node = parents[node]
        assert torch.equal(tree.ancestors(), expected)
    assert DraftTree.empty().ancestors().shape == (0, 0)
