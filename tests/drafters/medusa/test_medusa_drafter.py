"""``hfs.Medusa`` drafting chains (transformers' assisted loop) and static trees (our loop): identical to plain
greedy on the three tiny architectures, with EOS, ``max_new_tokens`` and stop strings inside accepted drafts;
heads that are always right are always kept, heads that are never right never; seeded sampling gives the
seed's text."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core.sampling import call_seed
from tests.conftest import PROMPT, build_model, prompt_inputs, recurring_token, stock_generate
from tests.drafters.medusa.conftest import OracleHeads, random_heads
from tests.hf.test_integration import check_identity

TREE = hfs.StaticTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)])
SHAPES = {"chain": None, "tree": TREE}
L = len(PROMPT)


def medusa(heads, shape):
    return hfs.Medusa(heads, tree=SHAPES[shape], adaptive=False, confidence_threshold=0.0)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("lm_head", ["per_head", "target", "shared"])
def test_random_heads_identical_to_greedy(model, shape, lm_head):
    _, _, stats = check_identity(model, "medusa", drafter=medusa(random_heads(model, lm_head=lm_head), shape),
                                 do_sample=False, max_new_tokens=40)
    # every step drafts (a fixed budget: chains keep their length and trees their 9 nodes, but near the end)
    assert stats.drafted_tokens >= (stats.target_forwards - 1) * (1 if shape == "chain" else 4)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_oracle_heads_are_always_kept(model, shape):
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None)
    _, _, stats = check_identity(model, "medusa", drafter=medusa(OracleHeads(model, ref), shape), do_sample=False,
                                 max_new_tokens=40, eos_token_id=None)
    if shape == "chain":
        assert stats.accepted_tokens == stats.drafted_tokens
    assert stats.tau > 4.0  # 4 heads right: 5 tokens per forward but for the prefill and the end


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_heads_never_right_are_never_kept(model, shape):
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None)
    heads = OracleHeads(model, ref, shift=1)
    tree = hfs.StaticTree([(0,), (0, 0), (0, 0, 0)]) if shape == "tree" else None  # rank 0 only: always wrong
    _, _, stats = check_identity(model, "medusa", drafter=hfs.Medusa(heads, tree=tree, adaptive=False,
                                                                     confidence_threshold=0.0),
                                 do_sample=False, max_new_tokens=40, eos_token_id=None)
    assert stats.accepted_tokens == 0 and stats.drafted_tokens > 0


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_eos_inside_an_accepted_draft(model, shape):
    prompt, token, step, free = recurring_token(model)
    eos = [token] + ([EOS_ID] if (EOS_ID := model.generation_config.eos_token_id) else [])
    ref, _, stats = check_identity(model, "medusa", drafter=medusa(OracleHeads(model, free), shape), prompt=prompt,
                                   do_sample=False, max_new_tokens=30, eos_token_id=eos)
    assert ref.shape[1] == len(prompt) + step + 1 and ref[0, -1] == token
    assert stats.accepted_tokens > 0


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("max_new_tokens", [5, 13, 22])
def test_max_new_tokens_inside_an_accepted_draft(model, shape, max_new_tokens):
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None)
    out, _, stats = check_identity(model, "medusa", drafter=medusa(OracleHeads(model, ref), shape),
                                   do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None)
    assert out.shape[1] == L + max_new_tokens and stats.accepted_tokens > 0


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_stop_strings_inside_an_accepted_draft(model, tokenizer, shape):
    prompt, token, step, free = recurring_token(model)
    stop = tokenizer.decode(free[0, len(prompt) + step - 1: len(prompt) + step + 1])
    ref, _, stats = check_identity(model, "medusa", drafter=medusa(OracleHeads(model, free), shape), prompt=prompt,
                                   do_sample=False, max_new_tokens=30, stop_strings=[stop], tokenizer=tokenizer)
    assert ref.shape[1] == len(prompt) + step + 1 and tokenizer.decode(ref[0, len(prompt):]).endswith(stop)
    assert stats.accepted_tokens > 0


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_seeded_sampling_gives_the_seed_s_text(shape):
    """The seeded text of plain decoding, whether the heads are random or know that very text (then kept)."""
    target = hfs.enable(build_model("llama"))
    sampling = dict(do_sample=True, temperature=0.8, top_k=40, max_new_tokens=24, eos_token_id=None)
    torch.manual_seed(5)
    seed = call_seed()
    expected = target.generate(**prompt_inputs(), **sampling, sampling_seed=seed)
    for heads in (random_heads(target), OracleHeads(target, expected)):
        torch.manual_seed(5)
        out = target.generate(**prompt_inputs(), **sampling, candidate_generator=medusa(heads, shape))
        assert out.tolist() == expected.tolist()
        stats = hfs.last_stats(target)
        assert stats.drafted_tokens > 0
    assert stats.tau > 3.0  # the heads that know the sampled text: kept under sampling too


def test_tree_nodes_come_from_the_heads_ranked_guesses():
    """Depth d of a rank path is head d - 1's guess of that rank, whatever the parent token."""
    target = build_model("llama")
    heads = random_heads(target)
    strategy = hfs.Medusa(heads, tree=TREE, adaptive=False)
    from hf_speculative.core.call import CallContext
    from hf_speculative.core.stats import SpeculativeStats
    from transformers import GenerationConfig

    ctx = CallContext(target, GenerationConfig(max_length=64, do_sample=False), None, None, SpeculativeStats())
    gen = strategy.open(ctx)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        target(input_ids=ids[:, :-1])
    from hf_speculative.core.tree import DraftTree, Verdict
    from tests.conftest import draft_once

    gen.observe(ids, DraftTree.empty(), Verdict((), 0), None)
    tree = draft_once(gen, ids, 8)
    hidden = gen.last
    gen.close()
    ranked = heads.logits(hidden).topk(3, dim=-1).indices  # [K, 3]
    assert tree.tokens.tolist() == [int(ranked[len(p) - 1, p[-1]]) for p in TREE.paths]
    assert tree.parents.tolist() == TREE.parents()
    with torch.no_grad():  # the state is the target's normed last hidden state before the newest token
        expected = target.model(input_ids=ids[:, :-1]).last_hidden_state[0, -1]
    torch.testing.assert_close(hidden, expected)


def test_heads_deeper_than_the_tree_allow_and_bad_options_are_named():
    target = build_model("llama")
    heads = random_heads(target, num_heads=2)
    with pytest.raises(ValueError, match="the tree is 4 deep but there are 2 heads"):
        hfs.Medusa(heads, tree=TREE)
    with pytest.raises(ValueError, match=r"Medusa\(tree=8\): use hfs.StaticTree"):
        hfs.Medusa(heads, tree=8)
    with pytest.raises(TypeError, match="needs MedusaHeads"):
        hfs.Medusa(object())
    with pytest.raises(ValueError, match="num_tokens"):
        hfs.Medusa(heads, num_tokens=0)
