"""Our verification loop under greedy decoding: token-identical to plain ``generate`` for trees that are always,
sometimes and never accepted, with EOS, the length limit and stop strings falling inside an accepted path,
and with logits processors applied to every node in its own branch's context."""

from __future__ import annotations

import random

import pytest
import torch
from tests.conftest import ARCHS, PROMPT, build_model, char_tokenizer, stock_generate
from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor
from transformers.generation.stopping_criteria import (EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList,
                                                       StopStringCriteria)

from hf_speculative.core.budget import FIXED
from hf_speculative.core.loop import accept_greedy
from tests.core.loop_harness import run
from hf_speculative.core.tree import DraftTree, Verdict


class OracleTree:
    """Trees of random shape holding the true greedy continuation on one random branch (the rest random),
    or, with ``wrong=True``, no true token at all. Records what it saw, to check the loop's bookkeeping."""

    def __init__(self, reference: list[int], width: int = 3, depth: int = 5, seed: int = 0, wrong: bool = False,
                 vocab: int = 96):
        self.reference, self.width, self.depth, self.wrong, self.vocab = reference, width, depth, wrong, vocab
        self.rng = random.Random(seed)
        self.verdicts: list[Verdict] = []

    def _other(self, true: int | None) -> int:
        token = self.rng.randrange(4, self.vocab)
        return token if token != true else (token + 1) % self.vocab

    sizing = FIXED  # no sizing of its own: it drafts what it drafts

    def draft(self, sequence, plan):
        max_depth = plan.depth
        at = sequence.shape[1]
        truth = self.reference[at: at + min(self.depth, max_depth)]
        tokens, parents, parent = [], [], -1
        for d in range(min(self.depth, max_depth)):
            true = truth[d] if d < len(truth) else None
            siblings = [self._other(true) for _ in range(self.rng.randrange(1, self.width + 1))]
            if true is not None and not self.wrong:
                siblings[self.rng.randrange(len(siblings))] = true
            first = len(tokens)
            tokens += siblings
            parents += [parent] * len(siblings)
            parent = first + (siblings.index(true) if true in siblings else 0)  # go on below the true one
        return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))

    def close(self):
        pass

    def observe(self, sequence, tree, verdict, scores):
        self.verdicts.append(verdict)


def criteria(max_length: int, eos=None, stop_strings=None, tokenizer=None) -> StoppingCriteriaList:
    out = StoppingCriteriaList([MaxLengthCriteria(max_length)])
    if eos is not None:
        out.append(EosTokenCriteria(eos))
    if stop_strings:
        out.append(StopStringCriteria(tokenizer, stop_strings))
    return out


def greedy(model, prompt, max_new_tokens, eos="model", **kwargs) -> list[int]:
    eos_id = model.generation_config.eos_token_id if eos == "model" else eos
    ids = torch.tensor([prompt])
    out = stock_generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=eos_id, **kwargs)
    return out[0].tolist()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("wrong", [False, True])
@pytest.mark.parametrize("width", [1, 3])  # 1: chains, verified on the model's own causal path
def test_identical_to_greedy_with_trees_always_or_never_accepted(arch, wrong, width):
    model = build_model(arch)
    expected = greedy(model, PROMPT, 30, eos=None)
    drafter = OracleTree(expected, wrong=wrong, seed=len(arch), width=width)
    result = run(model, torch.tensor([PROMPT]), drafter, stopping_criteria=criteria(len(PROMPT) + 30))
    assert result.sequences[0].tolist() == expected
    accepted = [v.num_accepted for v in drafter.verdicts]
    if wrong:
        assert accepted == [0] * 30 and result.stats.target_forwards == 30
    else:  # 5 kept + the target's own per forward, except where the reference ran out
        assert max(accepted) == 5 and result.stats.target_forwards <= 6
    assert result.stats.new_tokens == 30 and len(result.scores) == 30


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 13])
def test_length_limit_inside_an_accepted_path(arch, max_new_tokens):
    model = build_model(arch)
    reference = greedy(model, PROMPT, 40, eos=None)
    expected = reference[: len(PROMPT) + max_new_tokens]
    drafter = OracleTree(reference, depth=6, width=2)
    result = run(model, torch.tensor([PROMPT]), drafter,
                 stopping_criteria=criteria(len(PROMPT) + max_new_tokens))
    assert result.sequences[0].tolist() == expected


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "qwen2"])  # qwen2's tiny model has no EOS
def test_eos_inside_an_accepted_path(arch):
    model = build_model(arch)
    free = greedy(model, PROMPT, 40, eos=None)
    eos = free[len(PROMPT) + 4]  # make the 5th new token the EOS: it lies inside the first accepted path
    expected = greedy(model, PROMPT, 40, eos=eos)
    assert expected[-1] == eos and len(expected) <= len(PROMPT) + 5
    drafter = OracleTree(free, depth=8, width=2)
    result = run(model, torch.tensor([PROMPT]), drafter, stopping_criteria=criteria(len(PROMPT) + 40, eos=eos))
    assert result.sequences[0].tolist() == expected
    assert drafter.verdicts[0].num_accepted >= 4  # the stop came from inside a path, not at its end


@pytest.mark.parametrize("arch", ARCHS)
def test_stop_string_inside_an_accepted_path(arch):
    model, tokenizer = build_model(arch), char_tokenizer()
    free = greedy(model, PROMPT, 40, eos=None)
    stop = tokenizer.decode(free[len(PROMPT) + 5: len(PROMPT) + 7])
    expected = greedy(model, PROMPT, 40, eos=None, stop_strings=[stop], tokenizer=tokenizer)
    assert len(expected) < len(free)
    drafter = OracleTree(free, depth=10, width=2)
    result = run(model, torch.tensor([PROMPT]), drafter,
                 stopping_criteria=criteria(len(PROMPT) + 40, stop_strings=[stop], tokenizer=tokenizer))
    assert result.sequences[0].tolist() == expected


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_processors_see_each_branch(arch):
    model = build_model(arch)
    expected = greedy(model, PROMPT, 25, eos=None, repetition_penalty=1.5)
    free = greedy(model, PROMPT, 25, eos=None)
    assert expected != free  # the penalty changes the text, so a processor run on the wrong context shows
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)])
    drafter = OracleTree(expected, depth=5, width=3)
    result = run(model, torch.tensor([PROMPT]), drafter, stopping_criteria=criteria(len(PROMPT) + 25),
                 logits_processor=processors)
    assert result.sequences[0].tolist() == expected
    assert sum(v.num_accepted for v in drafter.verdicts) > 10


def test_accept_greedy_walks_the_argmax_branch():
    #          root -> 0 (tok 5), 1 (tok 6); 0 -> 2 (tok 7); 1 -> 3 (tok 8)
    tree = DraftTree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, -1, 0, 1]))
    scores = torch.full((5, 10), -1.0)
    for row, token in enumerate([6, 1, 8, 3, 4]):  # root picks 6 (node 1), node 1 picks 8 (node 3), node 3 4
        scores[row, token] = 1.0
    assert accept_greedy(tree, scores) == Verdict(path=(1, 3), next_token=4)
    scores[0] = 0
    scores[0, 9] = 1.0  # the root's argmax is drafted nowhere
    assert accept_greedy(tree, scores) == Verdict(path=(), next_token=9)
    assert accept_greedy(DraftTree.empty(), scores[:1]) == Verdict(path=(), next_token=9)
