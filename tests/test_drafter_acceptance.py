"""benchmarks/drafter_acceptance.py's teacher-forced first guesses must be the guesses the drafter
makes while drafting: the token it proposes for position ``t`` right after the target verified
everything before ``t - 1``, bucketed by the target's probability of its own token."""

from __future__ import annotations

import collections

import pytest
import torch

from hf_speculative.drafters.eagle.model import DraftKVCache
from hf_speculative.core.features import FeatureTap
from tests.conftest import build_model, fit_eagle, load_benchmark, random_eagle


def _script():
    return load_benchmark("drafter_acceptance")


def _expected(target, net, sequence, prompt_length, sure, buckets) -> collections.Counter:
    """The drafting path, one anchor at a time: true pairs up to anchor ``p`` into a fresh cache,
    then the drafter's argmax (mapped to target ids) for the token at ``p + 2``."""
    tap = FeatureTap(target, net.config.target_layers)
    with torch.no_grad():
        target(input_ids=sequence)
    features = tap.take()
    tap.remove()
    embed = target.get_input_embeddings()
    counts: collections.Counter = collections.Counter()
    for i, t in enumerate(range(prompt_length, sequence.shape[1])):
        p = t - 2
        with torch.no_grad():
            hidden = net(embed(sequence[:, 1 : p + 2]), features[:, : p + 1], torch.arange(p + 1)[None], DraftKVCache())
            guess = int(net.to_target_ids(net.draft_logits(hidden[0, -1], target.get_output_embeddings()).argmax()))
        label = next(name for name, low in buckets if sure[i] >= low)
        counts[label, "tokens"] += 1
        counts[label, "kept"] += int(guess == int(sequence[0, t]))
    return counts


@pytest.mark.parametrize("drafter", ["fitted", "reduced-vocabulary"])
def test_first_guesses_by_confidence_are_the_drafting_guesses(drafter):
    script = _script()
    target = build_model("llama", layers=3, init=0.3)  # peaked and flat tokens: more than one bucket
    prompt = torch.tensor([[5, 17, 9, 33, 2, 41, 8]])
    out = target.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                          output_scores=True, return_dict_in_generate=True)
    sequence = out.sequences
    sure = torch.softmax(torch.cat(out.scores).float(), dim=-1).max(-1).values  # [T]
    if drafter == "fitted":  # trained on this very sequence: many guesses kept, not all
        net, _, _ = fit_eagle(target, 3, sequence, iterations=25, unroll=1)
        net.eval().requires_grad_(False)
    else:
        net = random_eagle(target)
    counts = script._first_guess_by_confidence(target, net, sequence, prompt.shape[1], sure)
    assert counts == _expected(target, net, sequence, prompt.shape[1], sure.tolist(), script.BUCKETS)
    assert sum(n for (_, kind), n in counts.items() if kind == "tokens") == sequence.shape[1] - prompt.shape[1]
    if drafter == "fitted":
        kept = sum(n for (_, kind), n in counts.items() if kind == "kept")
        assert 0 < kept, counts
