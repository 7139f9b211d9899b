"""hfs.DraftModel with a drafter whose tokenizer is not the target's (universal assisted generation).

The target reads characters (conftest's character tokenizer). The drafters read a *shifted* character vocabulary
(every id differs, one character per token) or the shifted one with merges of character pairs (token boundaries
differ from the target's). Drafters: the target itself seen through the shifted vocabulary (always right), the same
extended to the merged tokens (mostly right, and its boundaries move as the text grows), a random model (mostly
wrong), and one that always drafts a character the target never writes (always wrong).
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections import Counter

import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

import hf_speculative as hfs
from hf_speculative.drafters.draft_model.other_tokenizer import OtherTokenizerCandidateGenerator
from hf_speculative.tooling.methods import _ForwardCounter, get_method, run_method
from tests.conftest import PROMPT, VOCAB, build_model, char_tokenizer, prompt_inputs, stock_generate

SHIFT = 17
PROMPTS = [PROMPT, [3, 40, 41, 42, 40, 41, 42, 50, 9, 9, 12], [60, 61, 62, 63, 64, 65, 66, 67]]
NEW = 40


def shifted_tokenizer(merges: list[tuple[str, str]] = (), vocab_size: int = VOCAB,
                      shift: int = SHIFT) -> PreTrainedTokenizerFast:
    """conftest's characters under other ids (character ``i`` of the target is id ``(i - shift) % V`` here), then one
    token per merged pair, BPE-merged in the order given."""
    chars = [chr(32 + i) for i in range(vocab_size - 1)] + ["\n"]
    shift = shift % vocab_size
    vocab = {c: i for i, c in enumerate(chars[shift:] + chars[:shift])}
    applied = []
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
            applied.append((a, b))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=applied))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=" ")


def seen_through(target, draft_tokenizer, target_tokenizer, padding: int = 0):
    """``target``'s weights under the drafter's vocabulary: a character's rows are the target's rows of that
    character; a merged pair is embedded as its last character and never predicted (a zero lm_head row); ``padding``
    more rows (zero) past the tokenizer's."""
    config = copy.deepcopy(target.config)
    config.vocab_size = len(draft_tokenizer) + padding
    torch.manual_seed(0)
    model = type(target)(config).eval()
    model.load_state_dict({k: v for k, v in target.state_dict().items() if "embed_tokens" not in k
                           and "lm_head" not in k}, strict=False)
    target_vocab = target_tokenizer.get_vocab()
    with torch.no_grad():
        model.lm_head.weight.zero_()
        for token, i in draft_tokenizer.get_vocab().items():
            model.model.embed_tokens.weight[i] = target.model.embed_tokens.weight[target_vocab[token[-1]]]
            if len(token) == 1:
                model.lm_head.weight[i] = target.lm_head.weight[target_vocab[token]]
    model.generation_config = copy.deepcopy(target.generation_config)
    return model


@pytest.fixture(scope="module")
def tt():
    return char_tokenizer()


@pytest.fixture(scope="module")
def target():
    return hfs.enable(build_model("llama"))


@pytest.fixture(scope="module")
def references(target):
    return {tuple(p): stock_generate(target, **prompt_inputs(p), do_sample=False, max_new_tokens=NEW) for p in PROMPTS}


@pytest.fixture(scope="module")
def merged(tt, references):
    """The shifted vocabulary with merges of pairs that occur in the greedy texts (every third pair), so that its
    tokens split those texts elsewhere than the target's."""
    pairs = []
    for ids in references.values():
        text = tt.decode(ids[0])
        pairs += [(text[i], text[i + 1]) for i in range(0, len(text) - 1, 3)]
    return shifted_tokenizer(pairs)


@pytest.fixture(scope="module")
def drafters(target, tt, merged, references):
    shifted = shifted_tokenizer()
    written = {t for ids in references.values() for t in ids[0].tolist()}
    unused = next(t for t in range(4, VOCAB) if t not in written)
    wrong = build_model("llama", seed=9, vocab_size=VOCAB)
    with torch.no_grad():
        wrong.lm_head.weight.zero_()  # every logit 0: it always drafts its id 0, a character the target never writes
    return {
        "right": (seen_through(target, shifted, tt), shifted),
        "mostly-right": (seen_through(target, merged, tt), merged),
        "random": (build_model("llama", seed=5, vocab_size=len(merged)), merged),
        "wrong": (wrong, shifted_tokenizer(shift=unused)),
    }


def strategy(drafters, tt, name, **options):
    model, tokenizer = drafters[name]
    return hfs.DraftModel(model, tokenizer=tokenizer, target_tokenizer=tt,
                          **{"adaptive": False, "confidence_threshold": 0.0, "num_tokens": 5, **options})


# -- identity with greedy --------------------------------------------------------------------------
@pytest.mark.parametrize("loop", ["hf_speculative", "transformers"])
@pytest.mark.parametrize("name", ["right", "mostly-right", "random", "wrong"])
def test_greedy_identity(target, tt, drafters, references, name, loop):
    s = strategy(drafters, tt, name)
    total = Counter()
    for prompt in PROMPTS:
        out = target.generate(**prompt_inputs(prompt), do_sample=False, max_new_tokens=NEW, candidate_generator=s,
                              speculative_loop=loop)
        assert out.tolist() == references[tuple(prompt)].tolist(), (name, prompt)
        stats = hfs.last_stats(target)
        total.update(drafted=stats.drafted_tokens, accepted=stats.accepted_tokens, forwards=stats.target_forwards)
    assert total["drafted"] > 0
    if name == "right":  # every draft accepted: five tokens and the target's own per forward
        assert total["accepted"] == total["drafted"] and total["forwards"] <= len(PROMPTS) * (NEW // 6 + 1)
    elif name == "mostly-right":
        assert 0.3 * total["drafted"] < total["accepted"] < total["drafted"], total
    elif name == "wrong":
        assert total["accepted"] == 0, total


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 13])
def test_max_new_tokens(target, tt, drafters, max_new_tokens):
    ref = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=max_new_tokens)
    for name in ("right", "mostly-right"):
        out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=max_new_tokens,
                              candidate_generator=strategy(drafters, tt, name))
        assert out.tolist() == ref.tolist(), name


def test_eos_inside_an_accepted_chain(target, tt, drafters, references):
    """A character the greedy text writes first after 7 or more new ones is taken as EOS: the always-right drafter
    drafts it inside a chain."""
    new = references[tuple(PROMPT)][0, len(PROMPT):].tolist()
    k = next(k for k in range(7, NEW) if new[k] not in new[:k])
    ref = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=new[k])
    assert ref.shape[1] == len(PROMPT) + k + 1
    eos = new[k]
    for loop in ("hf_speculative", "transformers"):
        out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=eos,
                              candidate_generator=strategy(drafters, tt, "right"), speculative_loop=loop)
        assert out.tolist() == ref.tolist(), loop
        assert hfs.last_stats(target).accepted_tokens > 0


def test_stop_string_inside_an_accepted_chain(target, tt, drafters, references):
    free = tt.decode(references[tuple(PROMPT)][0, len(PROMPT):])
    k = next(k for k in range(7, NEW - 2) if free[k:k + 2] not in free[:k + 1])  # first written at k
    stop = free[k:k + 2]
    ref = stock_generate(target, **prompt_inputs(), do_sample=False, max_new_tokens=NEW, stop_strings=[stop],
                         tokenizer=tt)
    assert ref.shape[1] < len(PROMPT) + NEW
    out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=NEW, stop_strings=[stop], tokenizer=tt,
                          candidate_generator=strategy(drafters, tt, "right"))
    assert out.tolist() == ref.tolist()
    assert hfs.last_stats(target).accepted_tokens > 0


def test_static_cache(target, tt, drafters, references):
    out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=NEW, cache_implementation="static",
                          candidate_generator=strategy(drafters, tt, "mostly-right"))
    assert out.tolist() == references[tuple(PROMPT)].tolist()
    assert hfs.last_stats(target).accepted_tokens > 0


def test_batch_with_left_padding(target, tt, drafters, references):
    a, b = PROMPTS[0], PROMPTS[2]
    ids = torch.tensor([a, [0] * (len(a) - len(b)) + b])
    mask = torch.tensor([[1] * len(a), [0] * (len(a) - len(b)) + [1] * len(b)])
    ref = stock_generate(target, input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                          candidate_generator=strategy(drafters, tt, "mostly-right"))
    assert out.tolist() == ref.tolist()
    assert hfs.last_stats(target).accepted_tokens > 0


# -- the drafter's own sequence ------------------------------------------------------------------------
def test_the_drafter_sequence_is_the_text_encoded_anew(target, tt, drafters, references, monkeypatch):
    """After every step the drafter's tokens are exactly its tokenizer's encoding of the verified text (the windowed
    re-encoding never drifts), and boundaries the new text moved were redone (its cache cropped behind the verified
    end)."""
    merged = drafters["mostly-right"][1]
    seen, redone = [], []
    sync = OtherTokenizerCandidateGenerator._sync

    def checked(self, target_ids):
        fed = list(self.fed)
        ids = sync(self, target_ids)
        seen.append(ids == merged(tt.decode(target_ids), add_special_tokens=False)["input_ids"])
        redone.append(any(x != y for x, y in zip(fed, ids)))
        return ids

    monkeypatch.setattr(OtherTokenizerCandidateGenerator, "_sync", checked)
    for prompt in PROMPTS:
        out = target.generate(**prompt_inputs(prompt), do_sample=False, max_new_tokens=NEW,
                              candidate_generator=strategy(drafters, tt, "mostly-right"))
        assert out.tolist() == references[tuple(prompt)].tolist()
    assert len(seen) > 10 and all(seen)
    assert any(redone)


# -- sampling ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mostly-right", "random"])
def test_seeded_sampling_is_plain_seeded_sampling(target, tt, drafters, name):
    accepted = 0
    for seed in range(4):
        plain = target.generate(**prompt_inputs(), do_sample=True, max_new_tokens=20, sampling_seed=seed,
                                candidate_generator=None)
        out = target.generate(**prompt_inputs(), do_sample=True, max_new_tokens=20, sampling_seed=seed,
                              candidate_generator=strategy(drafters, tt, name))
        assert out.tolist() == plain.tolist()
        accepted += hfs.last_stats(target).accepted_tokens
    assert name == "random" or accepted > 0


def test_rejection_rule_keeps_the_target_distribution():
    """The rejection rule with point-mass chains keeps the target's distribution (the peaked tiny target and its
    flattened copy of tests/core/test_sampling.py, the copy seen through a shifted character vocabulary)."""
    from tests.core.test_rejection_sampling import N_E2E
    from tests.core.test_sampling import PROMPT as SAMPLING_PROMPT
    from tests.core.test_sampling import V, assert_same_distribution, inputs, references, tiny

    target = hfs.enable(tiny(0, init=1.0))
    tt = char_tokenizer(V)
    draft_tok = shifted_tokenizer(vocab_size=V)
    close = seen_through(target, draft_tok, tt)
    with torch.no_grad():
        close.lm_head.weight.mul_(0.5)
    s = hfs.DraftModel(close, tokenizer=draft_tok, target_tokenizer=tt, adaptive=False, confidence_threshold=0.0,
                       num_tokens=3)
    exact, plain = references(target, SAMPLING_PROMPT)
    torch.manual_seed(5)
    counts, total = Counter(), Counter()
    for _ in range(N_E2E):
        out = target.generate(**inputs(SAMPLING_PROMPT), do_sample=True, temperature=1.0, max_new_tokens=3,
                              candidate_generator=s, speculative_sampling="rejection")
        counts[tuple(out[0, len(SAMPLING_PROMPT):].tolist())] += 1
        st = hfs.last_stats(target)
        total.update(drafted=st.drafted_tokens, accepted=st.accepted_tokens)
    assert 0.2 * total["drafted"] < total["accepted"] < 0.95 * total["drafted"], total
    assert_same_distribution(counts, exact, plain)


# -- transformers' own universal assisted generation ---------------------------------------------------
@pytest.mark.parametrize("name", ["right", "mostly-right", "random"])
def test_same_output_as_transformers_uag(target, tt, drafters, references, name):
    """transformers' AssistedCandidateGeneratorDifferentTokenizers on the same weights (its own copy of the
    assistant): the same text; target forwards counted with a hook in both runs."""
    model, tokenizer = drafters[name]
    if name == "right":  # transformers takes equal vocabulary sizes for one tokenizer: pad the drafter's lm_head
        model = seen_through(target, tokenizer, tt, padding=8)
        drafters = {name: (model, tokenizer)}
    ours = theirs = 0
    for prompt in PROMPTS:
        counter = _ForwardCounter(target)
        try:
            out = stock_generate(target, **prompt_inputs(prompt), do_sample=False, max_new_tokens=NEW,
                                 assistant_model=copy.deepcopy(model), tokenizer=tt, assistant_tokenizer=tokenizer)
        finally:
            counter.remove()
        assert out.tolist() == references[tuple(prompt)].tolist()
        theirs += counter.count
        counter = _ForwardCounter(target)
        try:
            out = target.generate(**prompt_inputs(prompt), do_sample=False, max_new_tokens=NEW,
                                  candidate_generator=strategy(drafters, tt, name))
        finally:
            counter.remove()
        assert out.tolist() == references[tuple(prompt)].tolist()
        ours += counter.count
    assert ours >= len(PROMPTS) and theirs >= len(PROMPTS)
    if name == "right":  # both accept every draft of the always-right drafter
        assert ours <= theirs, (ours, theirs)


# -- the configuration and its errors -------------------------------------------------------------------
def test_same_tokenizers_draft_as_before(target, tt, references):
    """Both tokenizers given and equal: the drafter's ids are the target's (no text round trip)."""
    s = hfs.DraftModel(build_model("llama", seed=4), tokenizer=tt, target_tokenizer=char_tokenizer())
    assert s.other_tokenizer() is None
    out = target.generate(**prompt_inputs(), do_sample=False, max_new_tokens=NEW, candidate_generator=s)
    assert out.tolist() == references[tuple(PROMPT)].tolist()


def test_trees_are_declared_off_and_refused(drafters, tt):
    s = strategy(drafters, tt, "mostly-right")
    assert s.other_tokenizer() is not None and s.declared().trees is False
    with pytest.raises(ValueError, match=r"tree=.*tokenizer differs from the target's.*chains \(tree=None\)"):
        strategy(drafters, tt, "mostly-right", tree=hfs.DynamicTree(nodes=4, depth=2, top_k=2))


def test_error_other_vocabulary_without_tokenizers(target, drafters):
    model, _ = drafters["mostly-right"]
    with pytest.raises(ValueError, match=rf"differ in size \({VOCAB} vs {model.config.vocab_size}\): pass both "
                                         r"tokenizers, DraftModel\(\.\.\., tokenizer=draft_tok, target_tokenizer="):
        target.generate(**prompt_inputs(), max_new_tokens=4, candidate_generator=hfs.DraftModel(model))


def test_error_only_the_drafter_tokenizer(target, drafters):
    model, tokenizer = drafters["mostly-right"]
    with pytest.raises(ValueError, match="pass both tokenizers"):
        target.generate(**prompt_inputs(), max_new_tokens=4,
                        candidate_generator=hfs.DraftModel(model, tokenizer=tokenizer))


@pytest.mark.parametrize("field", ["tokenizer", "target_tokenizer"])
def test_error_not_a_tokenizer(drafters, tt, field):
    model, tokenizer = drafters["mostly-right"]
    given = {"tokenizer": tokenizer, "target_tokenizer": tt, field: {"a": 1}}
    with pytest.raises(TypeError, match=rf"DraftModel\({field}=\.\.\.\) takes a transformers tokenizer.*dict.*decode"):
        hfs.DraftModel(model, **given)


# -- the command line's and the benchmark's methods -------------------------------------------------------
def test_methods_match_greedy(target, tt, drafters, tmp_path):
    """``draft-model-uag`` and ``hf-assisted-uag`` on a draft model named by its folder (its tokenizer beside it)."""
    model, tokenizer = drafters["mostly-right"]
    model.save_pretrained(tmp_path / "draft")
    tokenizer.save_pretrained(tmp_path / "draft")
    prompt = torch.tensor([PROMPT])
    greedy = run_method("greedy", target, tt, prompt, max_new_tokens=24)
    options = {"draft_model": str(tmp_path / "draft"), "num_tokens": 4}
    ours = run_method("draft-model-uag", target, tt, prompt, options=options, max_new_tokens=24)
    theirs = run_method("hf-assisted-uag", target, tt, prompt, options=options, max_new_tokens=24)
    assert ours.output_ids == theirs.output_ids == greedy.output_ids
    # (with its defaults the drafter measures itself as dear as the tiny target, and rightly drafts little)
    assert ours.drafted is not None and theirs.target_forwards < 24
    built = get_method("draft-model-uag").build(target, tt, options)["candidate_generator"]
    assert built.other_tokenizer() is not None and built.num_tokens == 4
    assert get_method("draft-model-uag").kind == "hfs" and get_method("hf-assisted-uag").kind == "transformers"


# -- saved with the model as its default drafter (hf/spec.py, saved_tokenizers.py) ---------------------------------
def _saved(drafters, tt, tmp_path, name="mostly-right"):
    """A fresh target (the fixture's weights) saved with the drafter as its default into ``tmp_path / "model"``; the
    drafter is first loaded from a folder elsewhere (a spec names a draft model, and copies it into ``draft-model/``)."""
    from transformers import AutoModelForCausalLM

    model, tokenizer = drafters[name]
    model.save_pretrained(tmp_path / "elsewhere")
    draft = AutoModelForCausalLM.from_pretrained(tmp_path / "elsewhere").eval()
    target = hfs.enable(build_model("llama"))
    target.generation_config.candidate_generator = hfs.DraftModel(
        draft, tokenizer=tokenizer, target_tokenizer=tt, adaptive=False, confidence_threshold=0.0, num_tokens=5)
    target.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def _reload(folder):
    from transformers import AutoModelForCausalLM

    return hfs.enable(AutoModelForCausalLM.from_pretrained(folder).eval())


def test_saved_and_reloaded_it_drafts_across_tokenizers(drafters, tt, references, tmp_path):
    folder = _saved(drafters, tt, tmp_path)
    spec = json.loads((folder / "generation_config.json").read_text())["candidate_generator"]
    assert spec["path"] == "draft-model" and spec["options"]["across_tokenizers"] is True
    assert (folder / "draft-model" / "tokenizer_config.json").is_file() and (folder / "tokenizer_config.json").is_file()
    reloaded = _reload(folder)
    restored = reloaded.generation_config.candidate_generator
    assert restored.other_tokenizer() is not None
    assert restored.tokenizer.get_vocab() == drafters["mostly-right"][1].get_vocab()
    assert restored.target_tokenizer.get_vocab() == tt.get_vocab()
    drafted = accepted = 0
    for prompt in PROMPTS:  # the model's own default drafter: no candidate_generator= given
        out = reloaded.generate(**prompt_inputs(prompt), do_sample=False, max_new_tokens=NEW)
        assert out.tolist() == references[tuple(prompt)].tolist(), prompt
        drafted += hfs.last_stats(reloaded).drafted_tokens
        accepted += hfs.last_stats(reloaded).accepted_tokens
    assert drafted > 0 and accepted > 0
    # saved again from the reloaded model into another folder: the same spec, both tokenizers again
    reloaded.save_pretrained(tmp_path / "again")
    again = _reload(tmp_path / "again").generation_config.candidate_generator
    assert again.other_tokenizer() is not None and (tmp_path / "again" / "draft-model" / "tokenizer.json").is_file()


def test_a_tokenizer_already_beside_the_model_is_kept(drafters, tt, tmp_path):
    """The target's tokenizer is written only where the model's folder has none (the one found there is kept)."""
    (tmp_path / "model").mkdir()
    tt.save_pretrained(tmp_path / "model")
    marker = tmp_path / "model" / "tokenizer_config.json"
    config = json.loads(marker.read_text())
    marker.write_text(json.dumps({**config, "model_max_length": 77}))
    folder = _saved(drafters, tt, tmp_path)
    assert _reload(folder).generation_config.candidate_generator.target_tokenizer.model_max_length == 77


@pytest.mark.parametrize("where", ["draft-model", "."])
def test_a_missing_tokenizer_is_named(drafters, tt, tmp_path, where):
    folder = _saved(drafters, tt, tmp_path)
    (folder / where / "tokenizer_config.json").unlink()
    whose, fix = (r"the drafter's tokenizer", r"draft_tok\.save_pretrained") if where == "draft-model" else \
        (r"the target's tokenizer", r"target_tok\.save_pretrained")
    expected = str((folder / where).resolve() / "tokenizer_config.json")
    with pytest.raises(ValueError, match=rf"across_tokenizers \({whose}\): {re.escape(expected)} is missing; .*{fix}"):
        _reload(folder)


def test_a_tokenizer_file_outside_the_folder_is_refused(drafters, tt, tmp_path):
    """A tokenizer file that links out of its folder is refused; a tokenizer_config.json naming a file elsewhere
    (``tokenizer_file``: the target's) is read without that key, so the drafter's own tokenizer.json is the one read."""
    folder = _saved(drafters, tt, tmp_path)
    config_path = folder / "draft-model" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "tokenizer_file": str((folder / "tokenizer.json").resolve()),
                                       "auto_map": {"AutoTokenizer": ["evil.Tok", None]}}))
    restored = _reload(folder).generation_config.candidate_generator
    assert restored.tokenizer.get_vocab() == drafters["mostly-right"][1].get_vocab()
    own = folder / "draft-model" / "tokenizer.json"
    own.unlink()
    os.symlink(folder / "tokenizer.json", own)  # the target's, outside the draft model's folder
    with pytest.raises(ValueError, match=r"tokenizer\.json.*is a symlink that leads out of the folder"):
        _reload(folder)


def test_a_registry_draft_model_brings_its_tokenizer_from_the_cache(drafters, tt, references, tmp_path, monkeypatch):
    """A draft model named by a registry name: its tokenizer is its cached folder's (nothing written there)."""
    from transformers import AutoModelForCausalLM

    from hf_speculative.registry import models

    name = next(iter(models.REGISTRY))
    monkeypatch.setattr(models, "model_path", lambda n: tmp_path / "cache" / n)
    monkeypatch.setattr(models, "_check_entry", lambda path, mode="sizes": {})  # (a fake cache entry: no marker)
    model, tokenizer = drafters["mostly-right"]
    model.save_pretrained(tmp_path / "cache" / name)
    tokenizer.save_pretrained(tmp_path / "cache" / name)
    target = hfs.enable(build_model("llama"))
    target.generation_config.candidate_generator = hfs.DraftModel(
        AutoModelForCausalLM.from_pretrained(tmp_path / "cache" / name).eval(), tokenizer=tokenizer,
        target_tokenizer=tt, adaptive=False, confidence_threshold=0.0, num_tokens=5)
    target.save_pretrained(tmp_path / "model")
    spec = json.loads((tmp_path / "model" / "generation_config.json").read_text())["candidate_generator"]
    assert spec["path"] == name and spec["options"]["across_tokenizers"] is True
    assert not (tmp_path / "model" / "draft-model").exists()
    reloaded = _reload(tmp_path / "model")
    out = reloaded.generate(**prompt_inputs(), do_sample=False, max_new_tokens=NEW)
    assert out.tolist() == references[tuple(PROMPT)].tolist()
    assert hfs.last_stats(reloaded).drafted_tokens > 0
    (tmp_path / "cache" / name / "tokenizer_config.json").unlink()
    with pytest.raises(ValueError, match=rf"the drafter's tokenizer\): .*{re.escape(name)}.*tokenizer_config\.json "
                                         r"is missing"):
        _reload(tmp_path / "model")
