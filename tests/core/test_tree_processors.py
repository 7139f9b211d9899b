"""Trees that draft what the call will accept (core/draft_guide.py): every node's guesses come from the drafter's
logits processed by the call's logits processors with the node's own branch as the context. Checked: the processing
(batched per depth, equal to one call per node), banned guesses dropped; outputs identical to
plain greedy and plain seeded sampling under repetition penalty, sequence bias, bad words, top-k / top-p, and to the
target's distribution under the rejection rule (chi-square); and, counted, more of the tree accepted than from the
raw distribution where the raw guesses are banned."""

from __future__ import annotations

import copy
import itertools
from collections import Counter

import pytest
import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
)

import hf_speculative as hfs
from hf_speculative.core import draft_guide
from hf_speculative.core.draft_guide import DraftGuide, branch_of
from hf_speculative.core.tree_shapes import DynamicTree, StaticTree, grow_paths, grow_static
from tests.conftest import PROMPT, build_model, make_drafter, prompt_inputs, stock_generate
from tests.core.test_sampling import (  # noqa: F401 - fixtures
    ALPHA, NEW, V, cell, close_drafter, goodness_of_fit, inputs, target, two_sample)
from tests.core.test_sampling import PROMPT as SMALL_PROMPT

VOCAB = 12


def table(seed: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


class PerRow:
    """A processor that is not one of transformers' row-wise ones (the guide calls it once per node): adds 5 to the
    token after the last one of the context, and counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        assert input_ids.shape[0] == 1
        out = scores.clone()
        out[0, (int(input_ids[0, -1]) + 1) % scores.shape[-1]] += 5.0
        return out


# -- the guide -------------------------------------------------------------------------------------
@pytest.mark.parametrize("processors", [
    [RepetitionPenaltyLogitsProcessor(2.0)],
    [NoRepeatNGramLogitsProcessor(2), TopKLogitsWarper(3)],
    [NoBadWordsLogitsProcessor([[4], [7, 8]], eos_token_id=None)],
    [PerRow()],
], ids=["repetition", "ngram+topk", "bad-words", "per-row"])
def test_each_node_is_processed_with_its_own_branch(processors):
    sequence = torch.tensor([[1, 2, 7, 3]])
    branches = [[5, 8], [5, 7], [9, 2]]
    logits = table(0, 3)
    guide = DraftGuide(LogitsProcessorList(processors), sequence)
    got = guide.logprobs(logits, branches)
    assert guide.contexts(branches).tolist() == [[1, 2, 7, 3, *b] for b in branches]
    for row, branch in enumerate(branches):
        context = torch.tensor([[1, 2, 7, 3, *branch]])
        want = torch.log_softmax(LogitsProcessorList(processors)(context, logits[row: row + 1].clone()), dim=-1)
        torch.testing.assert_close(got[row], want[0].masked_fill(want[0].isnan(), float("-inf")))
    assert guide.batched == (not isinstance(processors[0], PerRow))
    assert guide.calls == (3 if isinstance(processors[0], PerRow) else 1)  # one call per depth where rows batch


def test_a_processed_row_view_is_not_batched():
    """A batched call's per-row view of a processor (a tensor of one row) is processed one node at a time."""
    penalty = RepetitionPenaltyLogitsProcessor(2.0)
    penalty.prompt_ignore_length = torch.tensor([1])
    assert not draft_guide.batches_rows(penalty)
    assert draft_guide.batches_rows(RepetitionPenaltyLogitsProcessor(2.0))


def test_without_processors_nothing_is_called_and_guesses_are_the_top_ranks():
    guide = DraftGuide()
    logprobs = guide.logprobs(table(1, 2), [[1], [2]])
    assert guide.calls == 0
    values, order = guide.ranked(logprobs, 3)
    top = torch.log_softmax(table(1, 2), -1).topk(3)
    assert torch.equal(order, top.indices) and torch.allclose(values, top.values)


# -- growing trees ---------------------------------------------------------------------------------
def expander(seed: int):
    def expand(frontier, tokens, parents):
        return table(seed + len(frontier) + int(tokens.sum()), len(frontier))
    return expand


def test_a_dynamic_tree_never_guesses_a_banned_token_and_branches_see_their_ancestors():
    banned = [int(i) for i in torch.log_softmax(table(3, 1)[0], -1).topk(2).indices]  # the root's two best guesses
    shape = DynamicTree(nodes=12, depth=4, top_k=3)
    raw = shape.grow(table(3, 1)[0], expander(3))
    assert set(raw.tokens.tolist()) & set(banned)  # without the call's processors the banned ones are guessed
    no_repeat = NoRepeatNGramLogitsProcessor(1)  # no token twice in a text: a branch never repeats its ancestors
    sequence = torch.tensor([[0, 1]])
    guide = DraftGuide(LogitsProcessorList([NoBadWordsLogitsProcessor([[b] for b in banned], eos_token_id=None),
                                            no_repeat]), sequence)
    tree = shape.grow(table(3, 1)[0], expander(3), guide=guide)
    assert tree.size > 0 and not set(tree.tokens.tolist()) & set(banned)
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    for node in range(tree.size):
        branch = branch_of(tokens, parents, node)
        assert len(set(branch)) == len(branch) and not set(branch) & {0, 1}, branch
    assert guide.calls <= shape.depth  # one processor call per depth


def test_a_static_tree_drops_a_rank_the_processors_leave_no_guess_for():
    shape = StaticTree([(0,), (1,), (2,), (0, 0), (2, 0), (2, 0, 0)])
    # top-k of 2: rank 2 has no guess, and its subtree goes with it
    guide = DraftGuide(LogitsProcessorList([TopKLogitsWarper(2)]), torch.tensor([[0]]))
    tree = grow_static(shape, table(4, 1)[0], expander(4), max_depth=8, guide=guide)
    assert tree.size == 3 and tree.parents.tolist() == [-1, -1, 0]  # (0,), (1,) and (0, 0)
    plain = grow_paths(shape.paths, table(4, 1)[0], expander(4), max_depth=8)
    assert plain.size == 6


# -- generations -----------------------------------------------------------------------------------
TREES = ("draft-model-tree", "eagle-tree", "medusa-tree", "dflash-tree", "mtp-tree", "hybrid-tree")


def processor_settings(model) -> dict:
    """The greedy calls' processors: each one bans or lowers what the raw drafter would guess."""
    free = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=12, eos_token_id=None)
    common = sorted(Counter(free[0, len(PROMPT):].tolist()).items(), key=lambda item: -item[1])
    favourite, second = common[0][0], common[min(1, len(common) - 1)][0]
    return {
        "repetition_penalty": {"repetition_penalty": 3.0},
        "sequence_bias": {"sequence_bias": [[[favourite], -20.0], [[second], -20.0]]},
        "bad_words_ids": {"bad_words_ids": [[favourite], [second]]},
    }


@pytest.mark.parametrize("setting", ["repetition_penalty", "sequence_bias", "bad_words_ids"])
@pytest.mark.parametrize("name", TREES)
def test_trees_under_processors_write_greedy_text(name, setting):
    model = hfs.enable(build_model("llama"))
    kwargs = dict(**prompt_inputs(), do_sample=False, max_new_tokens=24, **processor_settings(model)[setting])
    expected = stock_generate(model, **kwargs)
    out = model.generate(**kwargs, candidate_generator=make_drafter(name, model, expected))
    assert out.tolist() == expected.tolist()
    assert hfs.last_stats(model).drafted_tokens > 0


SAMPLED = dict(do_sample=True, temperature=0.9, top_k=8, top_p=0.9, repetition_penalty=1.4, max_new_tokens=16)


@pytest.mark.parametrize("name", ("draft-model-tree", "eagle-tree", "medusa-tree", "mtp-tree"))
def test_trees_under_processors_write_plain_seeded_sampling_text(name):
    model = hfs.enable(build_model("llama"))
    kwargs = dict(**prompt_inputs(), **SAMPLED, bad_words_ids=[[5], [6]])
    for seed in (1, 2):
        expected = model.generate(**kwargs, sampling_seed=seed)
        out = model.generate(**kwargs, sampling_seed=seed, candidate_generator=make_drafter(name, model, expected))
        assert out.tolist() == expected.tolist(), seed


def exact_processed(target, prompt, processors: LogitsProcessorList) -> dict:
    """Exact P(t1, t2, t3) of the target under ``processors`` (each position processed with its own context)."""
    L, exact = len(prompt), Counter()
    with torch.no_grad():
        for t1, t2 in itertools.product(range(V), repeat=2):
            ids = torch.tensor([list(prompt) + [t1, t2]])
            logits = target(ids).logits[0].double()
            p = [torch.softmax(processors(ids[:, : L + i], logits[L - 1 + i][None].clone())[0], -1) for i in range(3)]
            for t3 in range(V):
                exact[(t1, t2, t3)] += float(p[0][t1] * p[1][t2] * p[2][t3])
    return {key: value for key, value in exact.items() if value > 0}


def test_a_sampled_tree_under_processors_keeps_the_target_distribution(target, close_drafter):
    """The rejection rule with guesses drawn from the processed drafter distribution: chi-square against the exact
    processed distribution and against plain sampling."""
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5), TopKLogitsWarper(4)])
    exact = exact_processed(target, SMALL_PROMPT, processors)
    settings = dict(do_sample=True, temperature=1.0, top_k=4, top_p=1.0, repetition_penalty=1.5, max_new_tokens=NEW)
    plain_out = stock_generate(target, **inputs(SMALL_PROMPT, 4000), **settings)
    plain = Counter(cell(row, None) for row in plain_out[:, len(SMALL_PROMPT):].tolist())
    assert goodness_of_fit(plain, exact) > ALPHA  # the exact reference is right
    strategy = hfs.DraftModel(close_drafter, tree=DynamicTree(nodes=6, depth=3, top_k=2), adaptive=False)
    torch.manual_seed(7)
    samples, drafted, accepted = Counter(), 0, 0
    for _ in range(500):
        out = target.generate(**inputs(SMALL_PROMPT), **settings, speculative_sampling="rejection",
                              candidate_generator=strategy)
        samples[cell(out[0, len(SMALL_PROMPT):].tolist(), None)] += 1
        drafted += hfs.last_stats(target).drafted_tokens
        accepted += hfs.last_stats(target).accepted_tokens
    assert 0 < accepted < drafted
    assert goodness_of_fit(samples, exact) > ALPHA and two_sample(samples, plain) > ALPHA


# -- what the guide buys, counted ------------------------------------------------------------------
def accepted_fraction(model, strategy, kwargs) -> tuple[float, int]:
    """(accepted / drafted tree nodes, target forwards) of one call, after checking it wrote plain greedy's text."""
    expected = stock_generate(model, **kwargs)
    out = model.generate(**kwargs, candidate_generator=strategy)
    assert out.tolist() == expected.tolist()
    stats = hfs.last_stats(model)
    return stats.accepted_tokens / stats.drafted_tokens, stats.target_forwards


def test_more_of_the_tree_is_accepted_when_the_raw_guesses_are_banned(monkeypatch):
    """A draft model that is the target itself, under bad words that ban the target's own favourite tokens: from the
    raw distribution most guesses are banned tokens, from the processed one the guesses are the target's choices."""
    model = hfs.enable(build_model("llama", init=1.0))  # peaked: deep paths score high enough to be kept
    drafter = copy.deepcopy(model)
    hfs.disable(drafter)
    free = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None)
    banned = sorted(set(free[0, len(PROMPT):].tolist()))  # everything the target writes unprocessed
    kwargs = dict(**prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None,
                  bad_words_ids=[[t] for t in banned])
    shape = DynamicTree(nodes=8, depth=4, top_k=2)
    processed = accepted_fraction(model, hfs.DraftModel(drafter, tree=shape, adaptive=False), kwargs)

    original = DraftGuide.__init__

    def raw(self, *args, **kwargs):  # the guesses of the raw distribution: the trees before the guide
        original(self, *args, **kwargs)
        self.processors = LogitsProcessorList()

    monkeypatch.setattr(DraftGuide, "__init__", raw)
    unprocessed = accepted_fraction(model, hfs.DraftModel(drafter, tree=shape, adaptive=False), kwargs)
    assert processed[0] > 0.4 and processed[0] > 2 * unprocessed[0], (processed, unprocessed)
    assert processed[1] < unprocessed[1], (processed, unprocessed)  # fewer target forwards
