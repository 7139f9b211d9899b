"""A DFlash drafter's reduced draft vocabulary: only its ids are drafted (the lm_head's rows of those ids, nothing
else), generation stays identical to greedy, it travels in ``draft_vocab.safetensors`` beside z-lab's files, and a
file that is not a draft vocabulary, or one for another tokenizer, is refused by name before it is used."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

import hf_speculative as hfs
from hf_speculative.drafters.dflash import checkpoints
from hf_speculative.drafters.dflash.checkpoints import CheckpointError
from hf_speculative.drafters.generator import to_target_vocab
from hf_speculative.drafters.dflash.drafter import (DFlash, DFlashCandidateGenerator,
                                                     random_network)
from tests.conftest import ARCHS, build_model, prompt_inputs, stock_generate

VOCAB = torch.tensor([3, 5, 8, 13, 21, 34, 55, 89] + list(range(60, 80)))  # 28 of the tiny targets' 96 ids


@pytest.fixture
def target():
    return build_model("llama", layers=4)


def vocab_network(target, ids=VOCAB):
    net = random_network(target)
    net.set_draft_vocab(ids)
    return net


def test_logits_are_the_lm_head_rows_of_the_vocabulary_only(target):
    net = vocab_network(target)
    head = target.get_output_embeddings()
    hidden = torch.randn(1, 5, net.config.hidden_size)
    with torch.no_grad():
        reduced = net.draft_logits(hidden, head)  # [1, 4, N]
        torch.testing.assert_close(reduced, head(hidden[:, 1:])[..., VOCAB])
        head.weight.mul_(2.0)  # the rows follow an in-place change of the head
        torch.testing.assert_close(net.draft_logits(hidden, head), head(hidden[:, 1:])[..., VOCAB])
    assert reduced.shape == (1, 4, VOCAB.numel())


class VocabOracle(DFlashCandidateGenerator):
    """The real drafting forward (its reduced lm_head included), then the known greedy text's next tokens as logits over
    the draft vocabulary, placed at their target ids by the library's own mapping: what a drafter that always guesses
    right within its vocabulary drafts."""

    def window_logits(self, sequence, depth=None, full=None):
        logits = super().window_logits(sequence, depth, full)
        if logits is None:
            return None
        text, length, ids = self.config.text, sequence.shape[1], self.net.draft_vocab
        reduced = torch.full((logits.shape[0], ids.numel()), -10.0)
        for d in range(logits.shape[0]):
            if length + d < len(text) and list(text[:length]) == sequence[0].tolist():
                reduced[d, ids == text[length + d]] = 10.0
        return to_target_vocab(reduced, logits.shape[1], ids)


@dataclasses.dataclass(eq=False)
class VocabOracleDFlash(DFlash):
    text: tuple = ()

    def open(self, ctx):
        return VocabOracle(ctx, self)


@pytest.mark.parametrize("tree", [None, hfs.DynamicTree(nodes=8, depth=4, top_k=2)], ids=["chain", "tree"])
@pytest.mark.parametrize("arch", ARCHS)
def test_identical_to_greedy_and_only_vocabulary_ids_are_drafted(arch, tree, monkeypatch):
    drafted = []
    original = DFlashCandidateGenerator.window_logits

    def watched(self, sequence, *args):
        logits = original(self, sequence, *args)
        if logits is not None:
            drafted.append(torch.isfinite(logits).nonzero()[:, 1].unique())
        return logits

    monkeypatch.setattr(DFlashCandidateGenerator, "window_logits", watched)
    settings = dict(tree=tree, num_tokens=5, confidence_threshold=0.0, adaptive=False)
    model = hfs.enable(build_model(arch))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40)
    # the greedy text's tokens but for every third one (those are never drafted), and a few others
    text = expected[0, prompt_inputs()["input_ids"].shape[1]:].unique().tolist()
    ids = torch.tensor(sorted(set(text[::3] + text[1::3]) | {1, 2}))
    for make, accepted in ((lambda: DFlash(vocab_network(model, ids), **settings), False),
                           (lambda: VocabOracleDFlash(vocab_network(model, ids), text=tuple(expected[0].tolist()),
                                                      **settings), True)):
        strategy = make()
        for _ in range(2):
            out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=40, candidate_generator=strategy)
            assert out.tolist() == expected.tolist()
            stats = hfs.last_stats(model)
            assert stats.drafted_tokens > 0
        if accepted:  # the oracle's guesses inside the vocabulary are kept, those outside it cannot be drafted
            assert 1.3 < stats.tau
    assert drafted and set(torch.cat(drafted).tolist()) <= set(ids.tolist())


def test_the_vocabulary_travels_with_the_folder_and_leaves_with_it(target, tmp_path):
    folder = DFlash(vocab_network(target)).save_pretrained_network(tmp_path / "d")
    assert (folder / checkpoints.DRAFT_VOCAB).exists()
    loaded = hfs.DFlash.from_pretrained(folder, target=target, adaptive=False)
    assert loaded.network.draft_vocab.tolist() == VOCAB.tolist()
    model = hfs.enable(target)
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=12)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=12, candidate_generator=loaded)
    assert out.tolist() == expected.tolist()
    loaded.network.set_draft_vocab(None)
    DFlash(loaded.network).save_pretrained_network(folder)  # written again without one: the old file goes
    assert not (folder / checkpoints.DRAFT_VOCAB).exists()
    assert hfs.DFlash.from_pretrained(folder, target=target).network.draft_vocab is None


def _write(folder, tensors):
    save_file(tensors, str(folder / checkpoints.DRAFT_VOCAB))


BAD = {
    "two tensors": (lambda f: _write(f, {"d2t": torch.zeros(3, dtype=torch.long), "t2d": torch.ones(3)}),
                    "must hold exactly one tensor, d2t"),
    "float": (lambda f: _write(f, {"d2t": torch.zeros(3)}), "must hold exactly one tensor, d2t"),
    "2-D": (lambda f: _write(f, {"d2t": torch.zeros(2, 2, dtype=torch.long)}), "must hold exactly one tensor, d2t"),
    "repeated": (lambda f: _write(f, {"d2t": torch.tensor([5, 4, 3])}), "must be distinct and non-negative"),
    "negative": (lambda f: _write(f, {"d2t": torch.tensor([-1, 0])}), "must be distinct and non-negative"),
    "huge": (lambda f: (f / checkpoints.DRAFT_VOCAB).write_bytes(b"\0" * (8 * checkpoints.MAX_DRAFT_VOCAB + 70000)),
             "more than a draft vocabulary"),
    "not safetensors": (lambda f: (f / checkpoints.DRAFT_VOCAB).write_bytes(b"not a safetensors file"),
                        "corrupt or truncated"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_file_that_is_not_a_draft_vocabulary_is_refused(target, tmp_path, case):
    folder = DFlash(random_network(target)).save_pretrained_network(tmp_path / "d")
    write, message = BAD[case]
    write(folder)
    with pytest.raises(CheckpointError, match=message):
        hfs.DFlash.from_pretrained(folder, target=target)


def test_a_vocabulary_outside_the_folder_or_the_tokenizer_is_refused(target, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    save_file({"d2t": torch.zeros(3, dtype=torch.long)}, str(outside))
    folder = DFlash(random_network(target)).save_pretrained_network(tmp_path / "d")
    (folder / checkpoints.DRAFT_VOCAB).symlink_to(outside)
    with pytest.raises(CheckpointError, match="leads out of the folder"):
        hfs.DFlash.from_pretrained(folder, target=target)
    (folder / checkpoints.DRAFT_VOCAB).unlink()
    _write(folder, {"d2t": torch.tensor([0, 200])})  # ids 0 and 201: the target has 96
    with pytest.raises(CheckpointError, match="the target id 201, outside the vocabulary of 96"):
        hfs.DFlash.from_pretrained(folder)  # its config.json gives the vocabulary: refused at load
    config = json.loads((folder / "config.json").read_text())
    config.pop("vocab_size")
    (folder / "config.json").write_text(json.dumps(config))
    strategy = hfs.DFlash.from_pretrained(folder)  # no vocabulary known before the target: refused at attach
    with pytest.raises(ValueError, match="holds the id 201, outside the target's vocabulary of 96"):
        hfs.enable(target).generate(**prompt_inputs(), max_new_tokens=3, do_sample=False, candidate_generator=strategy)
    with pytest.raises(ValueError, match="distinct and non-negative"):
        random_network(target).set_draft_vocab(torch.tensor([1, 1]))
