"""``model.generate()`` on an enabled model runs tree strategies in our loop, with everything generate prepares:
stop strings, EOS, the length limit, logits processors, streamers (one block per target forward),
``return_dict_in_generate`` / ``output_scores``, ``last_stats``; identical to plain greedy."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.streamers import BaseStreamer

import hf_speculative as hfs
from hf_speculative.core.tree_shapes import DynamicTree, StaticTree
from tests.conftest import ARCHS, EOS, build_model, char_tokenizer, prompt_inputs, random_eagle, stock_generate

TREE = DynamicTree(nodes=8, depth=4, top_k=3)


def strategies(model):
    return {"lookup-tree": hfs.PromptLookup(tree=TREE, adaptive=False),
            "eagle-dynamic": hfs.Eagle(random_eagle(model), tree=TREE, adaptive=False),
            "eagle-static": hfs.Eagle(random_eagle(model, version=1), adaptive=False,
                                      tree=StaticTree([(0,), (1,), (0, 0), (0, 0, 0)]))}


class Blocks(BaseStreamer):
    def __init__(self):
        self.blocks, self.ended = [], False

    def put(self, value):
        self.blocks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["lookup-tree", "eagle-dynamic", "eagle-static"])
def test_generate_with_trees_equals_greedy(arch, name, monkeypatch):
    from hf_speculative.core import loop

    runs = []
    monkeypatch.setattr("hf_speculative.core.entry.ladder", lambda *a, **k: runs.append(1) or loop.ladder(*a, **k))
    model = hfs.enable(build_model(arch))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30,
                         candidate_generator=strategies(model)[name])
    assert out.tolist() == expected.tolist() and runs == [1]  # through our loop
    stats = hfs.last_stats(model)
    assert stats.new_tokens == expected.shape[1] - prompt_inputs()["input_ids"].shape[1]
    assert stats.drafted_tokens > 0 and stats.target_forwards >= 1


@pytest.mark.parametrize("arch", ARCHS)
def test_streamer_gets_the_prompt_then_one_block_per_forward(arch):
    model = hfs.enable(build_model(arch))
    streamer = Blocks()
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=20, streamer=streamer,
                         candidate_generator=hfs.PromptLookup(tree=TREE, adaptive=False))
    assert streamer.ended and streamer.blocks[0] == prompt_inputs()["input_ids"][0].tolist()
    assert sum(streamer.blocks[1:], []) == out[0, prompt_inputs()["input_ids"].shape[1]:].tolist()
    assert len(streamer.blocks) - 1 == hfs.last_stats(model).target_forwards


@pytest.mark.parametrize("arch", ARCHS)
def test_scores_and_logits_match_plain_generate(arch):
    model = hfs.enable(build_model(arch))
    kwargs = dict(**prompt_inputs(), do_sample=False, max_new_tokens=12, return_dict_in_generate=True,
                  output_scores=True, output_logits=True, repetition_penalty=1.3)
    expected = stock_generate(model, **kwargs)
    out = model.generate(**kwargs, candidate_generator=hfs.PromptLookup(tree=TREE, adaptive=False))
    assert out.sequences.tolist() == expected.sequences.tolist()
    assert len(out.scores) == len(expected.scores) == len(out.logits)
    for got, want in zip(out.scores, expected.scores):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for got, want in zip(out.logits, expected.logits):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_stop_strings_and_eos_inside_accepted_paths(arch):
    model, tokenizer = hfs.enable(build_model(arch)), char_tokenizer()
    free = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None)
    start = prompt_inputs()["input_ids"].shape[1]
    stop = tokenizer.decode(free[0, start + 6: start + 8])
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None,
                              stop_strings=[stop], tokenizer=tokenizer)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=None,
                         stop_strings=[stop], tokenizer=tokenizer,
                         candidate_generator=hfs.Eagle(random_eagle(model), tree=TREE, adaptive=False))
    assert out.tolist() == expected.tolist()
    if EOS[arch] is not None:
        eos = int(free[0, start + 4])
        expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=eos)
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, eos_token_id=eos,
                             candidate_generator=hfs.PromptLookup(tree=TREE, adaptive=False))
        assert out.tolist() == expected.tolist()


def test_every_call_runs_in_our_loop_unless_transformers_loop_is_asked_for(monkeypatch):
    from hf_speculative.core import loop

    model = hfs.enable(build_model("llama"))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=5)
    runs = []
    original = loop.ladder
    monkeypatch.setattr("hf_speculative.core.entry.ladder", lambda *a, **k: runs.append(1) or original(*a, **k))
    for strategy in (hfs.PromptLookup(), hfs.PromptLookup(tree=TREE)):
        out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=5, candidate_generator=strategy)
        assert out.tolist() == expected.tolist()
    assert runs == [1, 1]
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=5, candidate_generator=hfs.PromptLookup(),
                         speculative_loop="transformers")
    assert out.tolist() == expected.tolist() and runs == [1, 1]  # transformers' assisted loop verified it
    with pytest.raises(ValueError, match="speculative_loop='transformers' verifies chains only"):
        model.generate(**prompt_inputs(), max_new_tokens=5, candidate_generator=hfs.PromptLookup(tree=TREE),
                       speculative_loop="transformers")
    with pytest.raises(ValueError, match="speculative_loop='transformer': choose one of 'hf_speculative', 'transform"):
        model.generate(**prompt_inputs(), max_new_tokens=5, candidate_generator=hfs.PromptLookup(),
                       speculative_loop="transformer")


def test_before_4_57_chains_keep_transformers_loop_and_trees_name_the_version(monkeypatch):
    """transformers < 4.57 takes no custom_generate callable, the way into our loop: there chains run in transformers'
    assisted loop by default (identical to greedy), and what only our loop runs is refused naming the version."""
    from hf_speculative import compat

    model = hfs.enable(build_model("llama"))
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=8)
    monkeypatch.setattr(compat, "SUPPORTS_CUSTOM_GENERATE_CALLABLE", False)
    runs = []
    monkeypatch.setattr("hf_speculative.core.entry.ladder", lambda *a, **k: runs.append(1))
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=8,
                         candidate_generator=hfs.PromptLookup(adaptive=False))
    assert out.tolist() == expected.tolist() and runs == [] and hfs.last_stats(model).target_forwards > 0
    with pytest.raises(ValueError, match=r"hf_speculative's loop \(draft trees\) needs transformers >= 4.57"):
        model.generate(**prompt_inputs(), max_new_tokens=8, candidate_generator=hfs.PromptLookup(tree=TREE))


@pytest.mark.parametrize("strategy", [hfs.PromptLookup(adaptive=False), hfs.PromptLookup(tree=TREE)],
                         ids=["chain", "tree"])
def test_a_left_padded_row_is_its_unpadded_text(strategy):
    """One row, left-padded: the loop leaves the padding out of its forwards and puts it back in front; the ids
    are transformers' own greedy ones for the padded row (max_length counts the padding, as there)."""
    model = hfs.enable(build_model("llama"))
    inputs = prompt_inputs()
    pad = torch.full((1, 3), 0, dtype=torch.long)
    padded = {"input_ids": torch.cat([pad, inputs["input_ids"]], dim=-1),
              "attention_mask": torch.cat([torch.zeros_like(pad), inputs["attention_mask"]], dim=-1)}
    expected = stock_generate(model, **padded, do_sample=False, max_length=padded["input_ids"].shape[1] + 12)
    out = model.generate(**padded, do_sample=False, max_length=padded["input_ids"].shape[1] + 12,
                         candidate_generator=strategy)
    assert out.tolist() == expected.tolist()
    assert hfs.last_stats(model).drafted_tokens > 0


def test_a_prompt_padded_other_than_on_the_left_is_refused():
    model = hfs.enable(build_model("llama"))
    inputs = prompt_inputs()
    inputs["attention_mask"][0, 2] = 0
    with pytest.raises(ValueError, match=r"needs left-padded prompts.*padding_side = 'left'"):
        model.generate(**inputs, do_sample=False, max_new_tokens=5, candidate_generator=hfs.PromptLookup(tree=TREE))


def test_custom_generate_route_runs_trees_in_our_loop():
    model = build_model("llama")  # not enabled
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=20)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=20,
                         custom_generate=hfs.speculative_generate, candidate_generator=hfs.PromptLookup(tree=TREE))
    assert out.tolist() == expected.tolist()
