"""``hfs.MTP`` in hf_speculative's loop on the tiny Llama, Qwen2 and Gemma3 targets (random MTP layers built by
transformers' own ``MtpModel`` constructor): identical to plain greedy for chains (the last layer reused), trees,
batches and the static cache, with EOS, ``max_new_tokens`` and stop strings inside accepted drafts; seeded sampling
gives the seed's text and the rejection rule keeps the target's distribution."""

from __future__ import annotations

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core.sampling import call_seed
from tests.conftest import PROMPT, build_model, prompt_inputs, recurring_token, stock_generate
from tests.core.test_batch import PROMPTS, left_padded
from tests.drafters.mtp.conftest import needs_mtp
from tests.hf.test_integration import check_identity

pytestmark = needs_mtp

TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
L = len(PROMPT)


def mtp(model, shape="chain", layers=2, num_tokens=3, **options):
    from hf_speculative.drafters.mtp.modules import random_modules

    tree = hfs.StaticTree(TREE) if shape == "tree" else None
    return hfs.MTP(random_modules(model, layers, scale=0.3), tree=tree, num_tokens=num_tokens, adaptive=False,
                   confidence_threshold=0.0, **options)


@pytest.fixture
def oracle(monkeypatch):
    """Make the MTP layers' guesses the reference text's tokens (``text`` `[1, T]`; ``shift=1``: always wrong) while
    everything else runs: the layers, their caches, the catch-up on verified rows. Records each draft's
    ``(verified length, drafted depth)``."""
    from hf_speculative.drafters.mtp.drafter import MTPCandidateGenerator

    seen = []

    def install(text, shift: int = 0, sharp: float = 30.0, table=None):
        """``table`` `[V, V]`: instead, the first guess's logits are ``table[newest verified token]``."""
        ref = text[0].tolist()
        original, draft = MTPCandidateGenerator._logits, MTPCandidateGenerator.draft

        def logits(self, out):
            real = original(self, out)  # [V] (the layers ran)
            at = self._length + len(self._drafts)
            seen.append((self._length, len(self._drafts)))
            if table is not None and not self._drafts:
                return table[int(self._sequence[0, -1])].float()
            guess = torch.full_like(real, -sharp)
            guess[((ref[at] if at < len(ref) else 4) + shift) % real.numel()] = 0.0
            return guess

        def remember(self, sequence, plan):
            self._sequence = sequence
            return draft(self, sequence, plan)

        monkeypatch.setattr(MTPCandidateGenerator, "_logits", logits)
        monkeypatch.setattr(MTPCandidateGenerator, "draft", remember)
        return seen

    return install


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_random_layers_identical_to_greedy(model, shape):
    _, _, stats = check_identity(model, "mtp", drafter=mtp(model, shape, layers=1 if shape == "tree" else 2),
                                 do_sample=False, max_new_tokens=30)
    assert stats.drafted_tokens >= stats.target_forwards - 1  # every step after the prefill drafts


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_right_guesses_are_kept_wrong_ones_never(model, shape, oracle):
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None)
    seen = oracle(ref)
    _, _, stats = check_identity(model, "mtp", drafter=mtp(model, shape), do_sample=False, max_new_tokens=40,
                                 eos_token_id=None)
    assert stats.tau > 3.0 and stats.target_forwards <= 40 // 4 + 2, stats  # 3 right guesses per forward
    assert {depth for _, depth in seen} == {0, 1, 2}  # both layers and the recursion drafted
    seen.clear()
    wrong = ref.clone()
    oracle(wrong, shift=1)
    _, _, stats = check_identity(model, "mtp", drafter=mtp(model, shape), do_sample=False, max_new_tokens=20,
                                 eos_token_id=None)
    assert stats.accepted_tokens == 0 and stats.drafted_tokens > 0


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_eos_and_stop_strings_inside_an_accepted_draft(model, tokenizer, shape, oracle):
    prompt, token, step, free = recurring_token(model)
    oracle(free)
    eos = [token] + ([e] if (e := model.generation_config.eos_token_id) is not None else [])
    ref, _, stats = check_identity(model, "mtp", drafter=mtp(model, shape), prompt=prompt, do_sample=False,
                                   max_new_tokens=30, eos_token_id=eos)
    assert ref.shape[1] == len(prompt) + step + 1 and ref[0, -1] == token and stats.accepted_tokens > 0
    stop = tokenizer.decode(free[0, len(prompt) + step - 1: len(prompt) + step + 1])
    ref, _, stats = check_identity(model, "mtp", drafter=mtp(model, shape), prompt=prompt, do_sample=False,
                                   max_new_tokens=30, stop_strings=[stop], tokenizer=tokenizer, eos_token_id=None)
    assert ref.shape[1] <= len(prompt) + step + 1 and stats.accepted_tokens > 0


@pytest.mark.parametrize("max_new_tokens", [3, 5, 13])  # (1: the prefill alone, no draft)
def test_max_new_tokens_inside_an_accepted_draft(max_new_tokens, oracle):
    model = hfs.enable(build_model("llama"))
    ref = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None)
    oracle(ref)
    for shape in ("chain", "tree"):
        out, _, _ = check_identity(model, "mtp", drafter=mtp(model, shape), do_sample=False,
                                   max_new_tokens=max_new_tokens, eos_token_id=None)
        assert out.shape[1] == L + max_new_tokens


def test_several_prompts_and_a_one_token_prompt():
    model = hfs.enable(build_model("qwen2"))
    for prompt in ([3], [3, 4], PROMPT[:5], (PROMPT * 3)[:37]):
        check_identity(model, "mtp", drafter=mtp(model, layers=3, num_tokens=4), prompt=prompt, do_sample=False,
                       max_new_tokens=12)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_a_left_padded_batch_equals_batched_greedy(shape, oracle):
    from hf_speculative.core.batch_costs import batch_costs_for, forget_batch_costs

    model = hfs.enable(build_model("llama", eos=None))
    batch_costs_for(model).fix(overhead=10.0, per_token=0.01)  # (drafts pay whatever the machine's load)
    try:
        inputs = left_padded(PROMPTS[:2])
        ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=20)
        out = model.generate(**inputs, do_sample=False, max_new_tokens=20, candidate_generator=mtp(model, shape))
        assert out.tolist() == ref.tolist() and hfs.last_stats(model).drafted_tokens > 0
    finally:
        forget_batch_costs(model)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_static_cache(shape, oracle):
    model = hfs.enable(build_model("qwen2"))  # (the house's static cache takes no sliding-window target)
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None)
    oracle(expected)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None,
                         candidate_generator=mtp(model, shape), cache_implementation="static")
    assert out.tolist() == expected.tolist() and hfs.last_stats(model).target_forwards < 15


SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "max_new_tokens": 16}


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_seeded_sampling_gives_the_seed_s_text(shape):
    model = hfs.enable(build_model("llama", init=0.3))
    strategy = mtp(model, shape)
    torch.manual_seed(5)
    expected = model.generate(**prompt_inputs(), **SAMPLING, sampling_seed=call_seed())
    for _ in range(2):
        torch.manual_seed(5)
        assert model.generate(**prompt_inputs(), **SAMPLING, candidate_generator=strategy).tolist() == \
            expected.tolist()
        assert hfs.last_stats(model).drafted_tokens > 0
    other = model.generate(**prompt_inputs(), **SAMPLING, sampling_seed=4, candidate_generator=strategy)
    assert other.tolist() == model.generate(**prompt_inputs(), **SAMPLING, sampling_seed=4).tolist()


@pytest.mark.parametrize("shape", ["chain", pytest.param("tree", marks=pytest.mark.slow)])
def test_rejection_rule_keeps_the_target_distribution(shape, oracle):
    """Chi-square of the second new token (the first one a draft can give: MTP drafts from the prefill's hidden
    states) against its exact marginal under the target, over seeded calls; drafts near the greedy text (q has full
    support) are accepted often enough to reach the rule's accept branch."""
    from scipy.stats import chisquare

    model = hfs.enable(build_model("llama", init=0.3))
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        p1 = torch.softmax(model(ids).logits[0, -1].double(), -1)  # [V]
        vocab = p1.numel()
        both = torch.cat([ids.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)  # [V, L + 1]
        second = model(both).logits[:, -1].double()  # [V, V]: the target's logits after each first token
        p2 = (p1[:, None] * torch.softmax(second, -1)).sum(0)  # [V] marginal of the second token
    oracle(ids, table=0.7 * second)  # q: the target's distribution, flattened (q != p, same support)
    strategy, seconds, accepted, runs = mtp(model, shape), [], 0, 500
    for seed in range(runs):
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                             top_k=0, top_p=1.0, max_new_tokens=3, eos_token_id=None,
                             speculative_sampling="rejection", candidate_generator=strategy)
        seconds.append(int(out[0, L + 1]))
        accepted += hfs.last_stats(model).accepted_tokens
    assert accepted > runs // 4
    keep = p2 * runs >= 5
    counts = torch.bincount(torch.tensor(seconds), minlength=vocab).double()
    observed = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    assert chisquare(observed.numpy(), (torch.cat([p2[keep], p2[~keep].sum(0, keepdim=True)]) * runs).numpy()
                     ).pvalue > 1e-3
    shifted = torch.roll(p2, 1)  # negative control
    assert chisquare(observed.numpy(), (torch.cat([shifted[keep], shifted[~keep].sum(0, keepdim=True)]) * runs
                                        ).numpy()).pvalue < 1e-3


def test_recursion_chains_the_last_layer_s_normed_output():
    """With one layer and ``num_tokens=3``, the second and third guesses come from the same layer reading its own
    previous output (after post_norm) and the drafted token, at the next positions; its cache is cropped back to the
    verified rows after every draft."""
    from hf_speculative.core.tree import DraftTree, Verdict
    from hf_speculative.drafters.mtp.drafter import MTPCandidateGenerator
    from tests.conftest import draft_once

    model = hfs.enable(build_model("llama"))
    strategy = mtp(model, layers=1, num_tokens=3)
    runs = []
    original = MTPCandidateGenerator._run

    def spy(self, k, layer, hidden, tokens):
        out = original(self, k, layer, hidden, tokens)
        runs.append((k, tokens.shape[1], hidden, out))
        return out

    generator = strategy.open(_context(model))
    try:
        ids = torch.tensor([PROMPT])
        with torch.no_grad():
            model(ids)  # the prefill the tap records
        ids = torch.tensor([PROMPT + [5]])  # and its token
        generator.observe(ids, DraftTree.empty(), Verdict((), 5), None)
        MTPCandidateGenerator._run = spy
        tree = draft_once(generator, ids, 3)
        assert generator.fed == [L] and generator.cache.get_seq_length(0) == L  # drafted rows cropped
    finally:
        MTPCandidateGenerator._run = original
        generator.close()
    assert tree.size == 3 and [(k, r) for k, r, _, _ in runs] == [(0, L), (0, 1), (0, 1)]
    assert torch.equal(runs[1][2], runs[0][3][:, -1:]) and torch.equal(runs[2][2], runs[1][3])


def _context(model):
    from hf_speculative.core.call import CallContext
    from hf_speculative.core.stats import SpeculativeStats

    return CallContext(model, model.generation_config, [], None, SpeculativeStats())


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("layers", [1, 2])
def test_without_processors_the_draft_is_made_on_the_device_as_the_host_makes_it(model, shape, layers, monkeypatch):
    """A fixed chain is fed back as device tensors (``draft_chain(on_device=True)``) and a tree's spine and nodes are
    taken on the device (``_device_tree``), one read a step: the host path's drafts, step for step."""
    from hf_speculative.core import chain_drafting
    from hf_speculative.drafters.mtp import drafter as mtp_drafter

    drafts = []
    draft = mtp_drafter.MTPCandidateGenerator.draft
    monkeypatch.setattr(mtp_drafter.MTPCandidateGenerator, "draft",
                        lambda self, *a: (lambda tree: drafts.append((tree.tokens.tolist(), tree.parents.tolist()))
                                          or tree)(draft(self, *a)))
    strategy = mtp(model, shape, layers=layers)
    run = dict(**prompt_inputs(), do_sample=False, max_new_tokens=24, eos_token_id=None, candidate_generator=strategy)
    on_device = model.generate(**run).tolist()
    device_drafts = list(drafts)
    drafts.clear()
    monkeypatch.setattr(mtp_drafter, "host_chooses", lambda ctx: True)  # the host's spine and grow_paths
    monkeypatch.setattr(chain_drafting, "device_chain_length", lambda plan, ctx, limit: None)  # token by token
    on_host = model.generate(**run).tolist()
    assert on_device == on_host == stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=24,
                                                  eos_token_id=None).tolist()
    assert device_drafts == drafts and any(tokens for tokens, _ in drafts)
