"""``hfs.DFlash`` in hf_speculative's loop: identical to plain greedy on the three tiny architectures (chains and
trees; EOS, ``max_new_tokens`` and stop strings inside accepted blocks; a left-padded batch; the static cache), seeded
sampling gives the seed's text, the rejection rule keeps the target's distribution, and the drafter's context follows
the accepted path exactly."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.drafters.dflash.drafter import DFlash, DFlashCandidateGenerator, random_network
from tests.conftest import ARCHS, build_model, prompt_inputs, stock_generate
from tests.drafters import tree_battery as battery

TREE = hfs.StaticTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)])
SHAPES = {"chain": None, "tree": TREE, "dynamic": hfs.DynamicTree(nodes=8, depth=4, top_k=2)}


class OracleGenerator(DFlashCandidateGenerator):
    """The real drafter's forward (its cache kept in step), its logits replaced by the known greedy text's."""

    def window_logits(self, sequence, depth=None, full=None):
        logits = super().window_logits(sequence, depth, full)
        if logits is None:
            return None
        text, length = self.config.text, sequence.shape[1]
        oracle = torch.full_like(logits, -10.0)
        for d in range(logits.shape[0]):
            if length + d < len(text) and list(text[:length]) == sequence[0].tolist():
                oracle[d, text[length + d]] = 10.0
        return oracle


@dataclasses.dataclass(eq=False)
class OracleDFlash(DFlash):
    text: tuple = ()

    def open(self, ctx):
        return OracleGenerator(ctx, self)


def make(arch, shape, oracle=False, **options):
    target = build_model(arch)  # the battery's model: same seed, same weights
    settings = dict(tree=SHAPES[shape], num_tokens=5, confidence_threshold=0.0, adaptive=False, **options)
    if not oracle:
        return lambda: DFlash(random_network(target), **settings)
    free = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=60, eos_token_id=None)
    return lambda: OracleDFlash(random_network(target), text=tuple(free[0].tolist()), **settings)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("arch", ARCHS)
def test_random_network_identical_to_greedy(arch, shape):
    stats = battery.check_greedy(make(arch, shape, oracle=True), arch)
    assert stats.tau > 3.0  # the oracle's blocks are kept
    model = hfs.enable(build_model(arch))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=make(arch, shape)())
    assert out.tolist() == expected.tolist() and hfs.last_stats(model).drafted_tokens > 0


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("arch", ARCHS)
def test_stops_inside_accepted_blocks(arch, shape):
    battery.check_max_new_tokens(make(arch, shape, oracle=True), arch)
    battery.check_eos_inside_paths(make(arch, shape, oracle=True), arch)
    battery.check_stop_strings(make(arch, shape, oracle=True), arch)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_static_cache(shape):
    battery.check_static_cache(make("llama", shape, oracle=True), "llama")


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_left_padded_batch_equals_batched_greedy(shape):
    model = hfs.enable(build_model("qwen2"))
    ids = torch.tensor([[0, 0, 0, 3, 5, 6, 7, 8, 9, 5], [3, 5, 6, 7, 8, 9, 5, 6, 7, 8]])
    mask = (torch.arange(10) >= torch.tensor([[3], [0]])).long()
    expected = stock_generate(model, input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                         candidate_generator=make("qwen2", shape)())
    assert out.tolist() == expected.tolist() and hfs.last_stats(model).drafted_tokens > 0


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_seeded_sampling_gives_the_seed_s_text(shape):
    battery.check_seeded_sampling(make("llama", shape), "llama")


@pytest.mark.parametrize("shape", ["chain", "dynamic"])
def test_rejection_rule_keeps_the_target_distribution(shape):
    target = build_model("llama", init=0.3)
    strategy = DFlash(random_network(target), tree=SHAPES[shape], num_tokens=3, confidence_threshold=0.0,
                      adaptive=False)
    accepted = battery.check_sampling_distribution(lambda: strategy, seeds=600, rule="rejection", target=target)
    assert accepted > 0


# that the check can fail is the battery's property, whatever transformers' version (the check itself runs on both)
@pytest.mark.single_version
def test_negative_control_a_wrong_q_is_caught(monkeypatch):
    """The same check fails when the drafts record another q than the one they were drawn from (a flat one): the
    check above can fail."""
    import dataclasses

    from hf_speculative.drafters.dflash.drafter import DFlashCandidateGenerator

    original = DFlashCandidateGenerator.draft

    def flat_q(self, sequence, plan):
        tree = original(self, sequence, plan)
        return tree if tree.q is None else dataclasses.replace(tree, q=torch.full_like(tree.q, 1.0 / tree.q.shape[-1]))

    monkeypatch.setattr(DFlashCandidateGenerator, "draft", flat_q)
    target = build_model("llama", init=0.3)
    strategy = DFlash(random_network(target), num_tokens=3, confidence_threshold=0.0, adaptive=False)
    with pytest.raises(AssertionError):
        battery.check_sampling_distribution(lambda: strategy, seeds=600, rule="rejection", target=target)


def test_lm_head_runs_over_the_positions_a_step_uses():
    """A chain of at most 2 puts 2 of the block's 5 positions through the target's lm_head, in one call (a CPU reads
    the lm_head's weight once per call, so fewer rows in one call is what saves, not rows one by one)."""
    model = hfs.enable(build_model("llama"))
    strategy = DFlash(random_network(model), num_tokens=2, confidence_threshold=0.0, adaptive=False)
    rows = []
    original = DFlashCandidateGenerator.window_logits

    def spy(self, sequence, depth=None, full=None):
        out = original(self, sequence, depth, full)
        rows.append(None if out is None else out.shape[0])
        return out

    DFlashCandidateGenerator.window_logits = spy
    try:
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=12, candidate_generator=strategy)
    finally:
        DFlashCandidateGenerator.window_logits = original
    # 1 only where the call had room for one more token
    assert rows and set(rows) <= {1, 2} and rows.count(2) >= len(rows) - 1, rows
    plain = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=12)
    assert out.tolist() == plain.tolist()


def test_context_is_the_accepted_path_s_features():
    """After a tree verify, the drafter's context cache equals one built from scratch on the verified text."""
    from hf_speculative.core.features import tapped_features

    model = hfs.enable(build_model("gemma3", layers=4))
    strategy = DFlash(random_network(model), tree=TREE, num_tokens=5, confidence_threshold=0.0, adaptive=False)
    seen = []
    original = DFlashCandidateGenerator.window_logits

    def spy(self, sequence, depth=None, full=None):
        out = original(self, sequence, depth, full)
        seen.append((sequence.clone(), [layer.k[:, :, : layer.length].clone() for layer in self.cache.layers]))
        return out

    DFlashCandidateGenerator.window_logits = spy
    try:
        model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=20, candidate_generator=strategy)
    finally:
        DFlashCandidateGenerator.window_logits = original
    sequence, keys = seen[-1]
    net = strategy.network
    features = tapped_features(model, net.config.target_layer_ids, sequence[:, :-1])  # [1, L - 1, F]
    fresh = net.new_cache()
    window = torch.zeros(1, net.config.block_size, net.config.hidden_size)
    with torch.no_grad():
        net(window, features, torch.arange(sequence.shape[1] - 1 + net.config.block_size)[None], fresh)
    for got, layer in zip(keys, fresh.layers):
        torch.testing.assert_close(got, layer.k[:, :, : layer.length], rtol=1e-4, atol=1e-5)


def test_options_and_targets_are_checked():
    target = build_model("llama")
    net = random_network(target)
    with pytest.raises(TypeError, match="needs a DFlashDraftModel"):
        DFlash(network=object())
    with pytest.raises(ValueError, match="the tree is 6 deep but the network drafts 5"):
        DFlash(net, tree=hfs.StaticTree([(0,) * i for i in range(1, 7)]))
    with pytest.raises(ValueError, match="num_tokens"):
        DFlash(net, num_tokens=0)
    deeper = build_model("llama", layers=4)
    wide = build_model("llama", hidden=64)
    with pytest.raises(ValueError, match="hidden size: drafter 32, target 64"):
        DFlash(net).validate_target(wide)
    with pytest.raises(ValueError, match="depth: drafter trained for 2 target layers, target 4"):
        DFlash(net).validate_target(deeper)
    last = random_network(deeper, target_layer_ids=[0, 3], num_target_layers=None)
    with pytest.raises(ValueError, match=r"read the target's last layer 3"):
        DFlash(last).validate_target(deeper)


def test_examples_need_a_layer_before_the_last():
    from hf_speculative.drafters.registry import ExampleNotApplicable

    with pytest.raises(ExampleNotApplicable, match="has one"):
        DFlash.example(build_model("llama", layers=1))
