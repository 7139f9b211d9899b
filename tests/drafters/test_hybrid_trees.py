"""hfs.Hybrid with draft trees (hf_speculative's own loop): members with ``tree=`` propose trees, the others chains;
each member learns from the verdicts of its own drafts and follows every other forward along the accepted path.
The drafter battery (greedy identity, EOS / max length / stop strings inside a draft, sampling) runs on
``"hybrid-tree"`` through ``tests/conftest.py``; these tests check what is particular to trees."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.drafters.generator import SpeculativeCandidateGenerator
from hf_speculative.core.tree import DraftTree
from tests.conftest import ARCHS, build_model, prompt_inputs, random_eagle, stock_generate
from tests.drafters.test_hybrid import GREEDY, eagle_state, trained  # noqa: F401 (fixtures)

TREE = hfs.DynamicTree(nodes=8, depth=4, top_k=3)


class EveryOtherTree(hfs.DraftStrategy):
    """At every other step a tree whose first branch is wrong and whose second holds the true continuation, so
    the accepted path is not the forward's first rows; nothing in between (the next member drafts there)."""

    name = "every-other-tree"
    tree = TREE  # (a tree member: the call runs in our loop)

    def __init__(self, reference, depth: int = 3):
        self.reference = [int(t) for t in torch.as_tensor(reference).reshape(-1)]
        self.depth = depth

    def open(self, ctx):
        return _EveryOtherTreeGenerator(ctx, self)


class _EveryOtherTreeGenerator(SpeculativeCandidateGenerator):
    def __init__(self, ctx, config):
        super().__init__(ctx)
        self.config, self.asked, self.verdicts = config, 0, []

    def draft(self, input_ids, plan):
        assert not plan.chain_only, "a tree member is asked for trees in our loop"
        self.asked += 1
        max_depth = plan.depth
        length = input_ids.shape[1]
        true = self.config.reference[length: length + min(self.config.depth, max_depth)]
        if self.asked % 2 or not true:
            return DraftTree.empty(input_ids.device)
        wrong = (true[0] + 1) % 96
        tokens = [wrong, *true, wrong]  # wrong ─ ; true[0] ─ true[1] ─ ... ; a wrong child of true[0]
        parents = [-1, -1, *range(1, len(true)), 1]
        self.mine = DraftTree(torch.tensor(tokens), torch.tensor(parents))
        return self.mine

    def observe(self, input_ids, tree, verdict, scores):
        if tree is getattr(self, "mine", None):  # (every member observes every forward)
            self.verdicts.append((tree.size, list(verdict.path)))


def _spy_trees(strategy, events, label):
    """``strategy`` whose generators append ``(label, length, tokens, parents)`` at every tree proposal."""
    open_ = strategy.open

    def opened(ctx):
        generator = open_(ctx)
        grow = generator.draft

        def spy(input_ids, plan):
            tree = grow(input_ids, plan)
            events.append((label, input_ids.shape[1], tree.tokens.tolist(), tree.parents.tolist()))
            return tree

        generator.draft = spy
        return generator

    object.__setattr__(strategy, "open", opened)
    return strategy


def test_eagle_trees_follow_another_members_tree_paths(trained, eagle_state, monkeypatch):  # noqa: F811
    """After forwards that verified another member's tree (its accepted path off the first rows), EAGLE's trees are
    exactly those it grows right after a prefill of the same text: its features follow the accepted rows."""
    from hf_speculative.core import loop

    runs = []
    monkeypatch.setattr("hf_speculative.core.entry.ladder", lambda *a, **k: runs.append(1) or loop.ladder(*a, **k))
    target, net, text = trained
    events = []
    eagle = _spy_trees(hfs.Eagle(net, tree=TREE, adaptive=False), events, "eagle")
    out = target.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.Hybrid(EveryOtherTree(text), eagle))
    stats = hfs.last_stats(target)
    assert out.tolist() == text.tolist() and runs == [1]
    members = stats.extra["hybrid"]
    assert members["every-other-tree"]["drafts"] > 0 and members["eagle"]["drafts"] > 0, members
    assert stats.drafted_tokens == sum(m["drafted"] for m in members.values())
    assert stats.accepted_tokens == sum(m["accepted"] for m in members.values())
    in_hybrid = [(length, tokens, parents) for _, length, tokens, parents in events if tokens]
    assert len(in_hybrid) >= 3
    for length, tokens, parents in in_hybrid:
        events.clear()
        prefix = text[:, : length - 1]  # its prefill, then the target's own token: the same `length`
        target.generate(input_ids=prefix, attention_mask=torch.ones_like(prefix), do_sample=False, max_new_tokens=10,
                        eos_token_id=None, candidate_generator=eagle)
        fresh = next((t, p) for _, at, t, p in events if at == length)
        assert (tokens, parents) == fresh, length
    assert eagle_state and not any(eagle_state)  # never lost track of the target's forwards


def test_the_drafting_member_observes_its_own_verdicts(trained):  # noqa: F811
    target, net, text = trained
    member = EveryOtherTree(text)
    seen = []
    open_ = member.open
    member.open = lambda ctx: seen.append(open_(ctx)) or seen[-1]
    target.generate(**prompt_inputs(), **GREEDY, candidate_generator=hfs.Hybrid(member, hfs.Eagle(net, adaptive=False)))
    verdicts = seen[0].verdicts
    assert verdicts and all(size >= 3 and path[0] == 1 for size, path in verdicts)  # the second branch, each time


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("members", ["tree+tree", "tree+chain", "chain+tree"])
def test_tree_and_chain_members_equal_greedy(arch, members):
    model = hfs.enable(build_model(arch))
    lookup_tree = "tree" in members.split("+")[0]
    eagle_tree = "tree" in members.split("+")[1]
    lookup = hfs.PromptLookup(min_ngram=3, max_ngram=3, adaptive=False, tree=TREE if lookup_tree else None)
    eagle = hfs.Eagle(random_eagle(model), adaptive=False, confidence_threshold=0.0,
                      tree=TREE if eagle_tree else None)
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30,
                         candidate_generator=hfs.Hybrid(lookup, eagle))
    assert out.tolist() == expected.tolist()
    stats = hfs.last_stats(model)
    assert stats.extra["hybrid"]["prompt-lookup"]["drafts"] > 0 and stats.extra["hybrid"]["eagle"]["drafts"] > 0


def test_chain_members_on_a_static_cache_run_in_our_loop():
    """A static cache sends chains to our loop too: a Hybrid of chain members drafts there through the same
    interface (its members' chains as one-branch trees)."""
    model = hfs.enable(build_model("llama"))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=24)
    hybrid = hfs.Hybrid(hfs.PromptLookup(min_ngram=3, max_ngram=3, adaptive=False),
                        hfs.Eagle(random_eagle(model), adaptive=False, confidence_threshold=0.0, num_tokens=4))
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24, candidate_generator=hybrid,
                         cache_implementation="static")
    assert out.tolist() == expected.tolist()
    assert hfs.last_stats(model).extra["hybrid"]["eagle"]["drafts"] > 0


def test_a_tree_member_sends_the_call_to_our_loop():
    assert hfs.Hybrid(hfs.PromptLookup(), hfs.PromptLookup(max_ngram=2)).tree is None
    assert hfs.Hybrid(hfs.PromptLookup(), hfs.PromptLookup(max_ngram=2, tree=TREE)).tree is TREE


def test_members_that_draft_on_the_targets_cache_are_refused_beside_trees():
    with pytest.raises(ValueError, match="cannot draft .*drop tree= from the other members"):
        hfs.Hybrid(hfs.PromptLookup(tree=TREE), hfs.EarlyExit(exit_layer=1))
    hfs.Hybrid(hfs.PromptLookup(), hfs.EarlyExit(exit_layer=1))  # chains: transformers' loop keeps its cache


