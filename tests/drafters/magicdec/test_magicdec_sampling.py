"""``hfs.MagicDec`` under sampling: the seeded rule gives the seed's plain text whatever was drafted, and both rules
draw from the target's own distribution (chi-square against its exact marginals, with a negative control that must
fail: the same counts against a distribution one token off; and a drafter that misreports its ``q`` fails it)."""

from __future__ import annotations

import pytest
import torch

from hf_speculative.drafters.magicdec import group as group_module
from hf_speculative.drafters.magicdec.choosing import Choice
from tests.drafters.magicdec.conftest import evicting
from tests.drafters.tree_battery import check_sampling_distribution, check_seeded_sampling


def test_seeded_sampling_gives_the_seed_s_text():
    check_seeded_sampling(evicting)


@pytest.mark.parametrize("rule, seeds", [("rejection", 400), pytest.param("seeded", 800, marks=pytest.mark.slow)])
def test_sampling_keeps_the_target_distribution(rule, seeds):
    # PROMPT is 14 tokens, the cache 2 sinks and a window of 4: the second token, the first a draft decides, is
    # drafted over a cache that evicted
    accepted = check_sampling_distribution(evicting, seeds=seeds, rule=rule)
    assert accepted > seeds // 10  # the rule's accept branch was reached often


@pytest.mark.slow
def test_a_drafter_misreporting_its_q_fails_the_check(monkeypatch):
    """The check has the power to see a wrong rule: drafts drawn from the drafter's q but reported as drawn from a
    sharper one are kept too often."""
    real = group_module.choose

    def misreported(processors, sampler, sequence, logits):
        choice = real(processors, sampler, sequence, logits)
        if choice is None or choice.q is None:
            return choice
        sharper = torch.softmax(4.0 * torch.log(choice.q.clamp_min(1e-30)), dim=-1)  # [V]
        return Choice(choice.peak, choice.token, choice.p, sharper)

    monkeypatch.setattr(group_module, "choose", misreported)
    with pytest.raises(AssertionError):
        check_sampling_distribution(evicting, seeds=500, rule="rejection")
