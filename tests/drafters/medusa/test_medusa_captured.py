"""Medusa under ``hfs.enable(model, compile=...)`` drafts a step in one region (``drafters/medusa/captured.py``): every
head and the choice of tokens, read once after. The drafts are eager drafting's, step for step, and the text greedy's.
(The compiled functions run eagerly here; the real ``torch.compile`` is the slow test at the end.)"""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core import regions, static_cache
from hf_speculative.core.policy import ChainLengthPolicy
from hf_speculative.core.state import forget
from hf_speculative.drafters.medusa import captured
from hf_speculative.drafters.medusa.drafter import MedusaCandidateGenerator
from tests.conftest import build_model, prompt_inputs, stock_generate
from tests.drafters.medusa.conftest import OracleHeads, random_heads

TREE = hfs.StaticTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)])
NEW = 30


@pytest.fixture(scope="module")
def target():
    model = build_model("llama", layers=4)
    yield model
    forget(model)


@pytest.fixture
def uncompiled(monkeypatch):
    """compile= takes the fixed-shape paths, the compiled functions run as they are; records the regions run."""
    ran = []
    monkeypatch.setattr(static_cache, "compiled_forward", lambda model, mode: model)
    monkeypatch.setattr(regions, "compile_region", lambda module, mode: module)
    for kind in (captured.ChainRegion, captured.TreeRegion):
        monkeypatch.setattr(kind, "forward", lambda self, *a, _forward=kind.forward:
                            ran.append(type(self).__name__) or _forward(self, *a))
    return ran


def record(monkeypatch) -> tuple[list, list]:
    """Every step's draft (tokens, parents) and every read after a region."""
    drafts, reads = [], []
    draft = MedusaCandidateGenerator.draft

    def recording(self, *args, **kwargs):
        tree = draft(self, *args, **kwargs)
        drafts.append((tree.tokens.tolist(), tree.parents.tolist()))
        return tree

    monkeypatch.setattr(MedusaCandidateGenerator, "draft", recording)
    for name in ("chain_from_read", "tree_from_paths"):
        original = getattr(captured, name)
        monkeypatch.setattr(captured, name, lambda *a, _original=original, **k: reads.append(1) or _original(*a, **k))
    return drafts, reads


def generate(model, strategy, compile: bool, **options):
    hfs.enable(model, compile=compile)
    try:
        settings = {"do_sample": False, "max_new_tokens": NEW, "eos_token_id": None, **options}
        out = model.generate(**prompt_inputs(), **settings, candidate_generator=strategy)
    finally:
        hfs.enable(model, compile=False)
    stats = hfs.last_stats(model)
    return out, (stats.drafted_tokens, stats.accepted_tokens)


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("oracle", [False, True], ids=["random", "oracle"])
def test_a_step_is_one_region_and_one_read_with_eager_drafting_s_drafts(target, shape, oracle, uncompiled, monkeypatch):
    text = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    heads = OracleHeads(target, text) if oracle else random_heads(target)
    strategy = hfs.Medusa(heads, tree=TREE if shape == "tree" else None, adaptive=False, confidence_threshold=0.0)
    drafts, reads = record(monkeypatch)
    eager, eager_counts = generate(target, strategy, compile=False)
    eager_drafts = list(drafts)
    assert uncompiled == []  # no region without compile=
    drafts.clear()
    reads.clear()
    fixed, fixed_counts = generate(target, strategy, compile=True)
    assert fixed.tolist() == eager.tolist() == text.tolist()
    assert drafts == eager_drafts and fixed_counts == eager_counts and fixed_counts[0] > 0
    if oracle:
        assert fixed_counts[1] > NEW // 2  # long accepted drafts: the features kept in step
        assert shape == "tree" or fixed_counts[1] == fixed_counts[0]
    name = {"chain": "ChainRegion", "tree": "TreeRegion"}[shape]
    # every step drafted in one region call and one read, but the first (before the prefill: no hidden state yet)
    assert uncompiled == [name] * len(reads) == [name] * (len(drafts) - 1), (uncompiled, len(drafts))


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("new", [3, 7])
def test_max_new_tokens_inside_an_accepted_draft(target, shape, new, uncompiled):
    text = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=new, eos_token_id=None)
    strategy = hfs.Medusa(OracleHeads(target, stock_generate(target, **prompt_inputs(), do_sample=False,
                                                             max_new_tokens=NEW, eos_token_id=None)),
                          tree=TREE if shape == "tree" else None, adaptive=False, confidence_threshold=0.0)
    out, _ = generate(target, strategy, compile=True, max_new_tokens=new)
    assert out.tolist() == text.tolist()
    assert uncompiled  # drafted in regions, cut by the loop


def test_eos_inside_an_accepted_draft(target, uncompiled):
    full = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    eos = int(full[0, prompt_inputs()["input_ids"].shape[1] + 5])  # the 6th new token ends the text
    text = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=eos)
    for tree in (None, TREE):
        strategy = hfs.Medusa(OracleHeads(target, full), tree=tree, adaptive=False, confidence_threshold=0.0)
        out, _ = generate(target, strategy, compile=True, eos_token_id=eos)
        assert out.tolist() == text.tolist()


def test_processors_choose_on_the_host_without_a_region(target, uncompiled):
    """A logits processor reads the host's sequence: the steps draft as before, no region is made."""
    text = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=None,
                          repetition_penalty=1.3)
    for tree in (None, TREE):
        strategy = hfs.Medusa(random_heads(target), tree=tree, adaptive=False, confidence_threshold=0.0)
        out, (drafted, _) = generate(target, strategy, compile=True, repetition_penalty=1.3)
        assert out.tolist() == text.tolist() and drafted > 0
    assert uncompiled == []


def test_cost_rules_replayed_after_the_longest_chain_where_regions_pay(target, uncompiled, monkeypatch):
    """Under the cost rules a CPU drafts head by head (a head is real work here): no chain region. Where a region's
    extra heads cost less than a read per head (CUDA; this CPU stands in for one), the longest chain is drafted in one
    region and the rules replayed on its confidences keep what the host would have kept: the same drafts."""
    # drafts whatever the machine's load: the gate before a chain and the price of each token read the measured
    # (padded) verify costs, which a loaded machine (a test queue beside it) made high enough to draft nothing;
    # a fixed, growing price per token keeps the rules' decisions (and their replay) load-free
    monkeypatch.setattr(ChainLengthPolicy, "could_pay", lambda self: True)
    monkeypatch.setattr(ChainLengthPolicy, "_verify_price", lambda self, i: 0.05 * i)
    text = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    strategy = hfs.Medusa(OracleHeads(target, text), confidence_threshold=0.3, draft_cost=0.01)  # adaptive
    out, counts = generate(target, strategy, compile=True)
    assert out.tolist() == text.tolist() and uncompiled == [] and counts[0] > 0
    monkeypatch.setattr(regions, "ADAPTIVE_CHAIN_DEVICES", ("cpu",))
    asked = []
    chain_from_read = captured.chain_from_read
    monkeypatch.setattr(captured, "chain_from_read", lambda plan, chain, ids, probs, length, ask=False: (
        asked.append(ask) or chain_from_read(plan, chain, ids, probs, length, ask)))
    out, counts = generate(target, strategy, compile=True)
    assert out.tolist() == text.tolist() and counts[0] > 0
    assert uncompiled and set(uncompiled) == {"ChainRegion"} and asked and all(asked)


def test_regions_are_shared_by_calls_one_at_a_time(target, uncompiled):
    """The regions live in the target's state: a later call reuses them (compiled once per shape); a call made while
    another holds them drafts with regions of its own, uncompiled."""
    heads = random_heads(target)
    first = captured.HeadsRegions(target, heads, "default", target.config.vocab_size)
    second = captured.HeadsRegions(target, heads, "default", target.config.vocab_size)
    try:
        assert first.regions.compiled and not second.regions.compiled
        assert first.regions.runs is not second.regions.runs
        run = first.regions.get(("chain", 2), lambda: captured.ChainRegion(heads, target.get_output_embeddings(),
                                                                          target.config.vocab_size, 2))
    finally:
        first.close()
        second.close()
    again = captured.HeadsRegions(target, heads, "default", target.config.vocab_size)
    try:
        assert again.regions.compiled and again.regions.runs.get(("chain", 2)) is run
    finally:
        again.close()
    forget(target)


def test_region_outputs_match_the_heads(target):
    """A chain region's tokens are each head's argmax over the target's vocabulary; a tree region's guesses are the
    rank path's token (``grow_paths_on_device``'s)."""
    from hf_speculative.core.tree_shapes import grow_paths_on_device

    heads, head, vocab = random_heads(target), target.get_output_embeddings(), target.config.vocab_size
    last = torch.randn(target.config.hidden_size)
    chain, readout = captured.ChainRegion(heads, head, vocab, 3)(last)
    expected = torch.stack([heads.head_logits(last, k, head).float() for k in range(3)])  # [3, V]
    assert chain.tolist() == expected.argmax(-1).tolist() == readout[0].long().tolist()
    assert torch.allclose(readout[1], torch.softmax(expected, -1).amax(-1).double())
    paths = tuple(TREE.paths)
    tokens, finite = captured.TreeRegion(heads, head, vocab, paths)(last)
    tree = grow_paths_on_device(list(paths), torch.stack([heads.head_logits(last, k, head) for k in range(4)]), 4)
    assert tokens.tolist() == tree.tokens.tolist() and finite.all()
