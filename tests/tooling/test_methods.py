"""The decoding-method registry and :func:`run_method` on tiny random models."""

import sys
import types

import pytest
import transformers
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_speculative.tooling import methods
from hf_speculative.tooling.methods import MethodSpec, available_methods, get_method, register_method, run_method

NEEDS_EARLY_EXIT = pytest.mark.skipif(
    not hasattr(transformers.GenerationConfig(), "assistant_early_exit"),
    reason="transformers' assistant_early_exit arrived in 4.47",
)
BUILTIN = ["greedy", "prompt-lookup", "draft-model", "eagle", "hybrid", "eagle-tree", "hybrid-tree", "early-exit", "early-exit-adapter", "layer-skip",
           "hf-prompt-lookup", "hf-assisted", "hf-early-exit"]
# A prompt that repeats itself, so that prompt lookup finds n-grams to draft from.
PROMPT = torch.tensor([[1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]])


def tiny_llama(seed: int, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry, so tests can register methods freely."""
    monkeypatch.setattr(methods, "_REGISTRY", dict(methods._REGISTRY))


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, layers=4)


@pytest.fixture(scope="module")
def draft():
    return tiny_llama(1)


def test_builtin_methods_are_registered_in_order():
    assert available_methods()[: len(BUILTIN)] == BUILTIN
    kinds = {name: get_method(name).kind for name in BUILTIN}
    assert kinds == {
        "greedy": "baseline",
        "prompt-lookup": "hfs",
        "draft-model": "hfs",
        "eagle": "hfs",
        "hybrid": "hfs",
        "eagle-tree": "hfs",
        "hybrid-tree": "hfs",
        "early-exit": "hfs",
        "early-exit-adapter": "hfs",
        "layer-skip": "hfs",
        "hf-prompt-lookup": "transformers",
        "hf-assisted": "transformers",
        "hf-early-exit": "transformers",
    }
    assert [n for n in BUILTIN if get_method(n).needs_draft_model] == ["draft-model", "hf-assisted"]


def test_unknown_method_lists_known_names():
    with pytest.raises(ValueError, match="unknown method 'nope'") as info:
        get_method("nope")
    for name in BUILTIN:
        assert name in str(info.value)


def test_register_method(registry):
    spec = MethodSpec("mine", "Mine", "a test method", "transformers", lambda m, t, o: {"prompt_lookup_num_tokens": 3})
    assert register_method(spec) is spec
    assert get_method("mine") is spec and available_methods()[-1] == "mine"
    with pytest.raises(ValueError, match="already registered"):
        register_method(spec)
    other = MethodSpec("mine", "Mine 2", "replaced", "baseline", lambda m, t, o: {})
    register_method(other, replace=True)
    assert get_method("mine") is other
    with pytest.raises(ValueError, match="unknown method kind"):
        register_method(MethodSpec("bad", "Bad", "", "other", lambda m, t, o: {}))  # type: ignore[arg-type]


def test_transformers_builds_defaults_and_options(draft):
    build = lambda name, options: get_method(name).build(None, None, options)  # noqa: E731
    assert build("greedy", {}) == {}
    assert build("hf-prompt-lookup", {}) == {"prompt_lookup_num_tokens": 10}
    assert build("hf-prompt-lookup", {"num_tokens": 4, "max_ngram": 2}) == {
        "prompt_lookup_num_tokens": 4,
        "max_matching_ngram_size": 2,
    }
    assert build("hf-early-exit", {}) == {"assistant_early_exit": 8}
    assert build("hf-early-exit", {"exit_layer": 3, "num_tokens": 5}) == {
        "assistant_early_exit": 3,
        "num_assistant_tokens": 5,
    }
    assert build("hf-assisted", {"draft_model": draft}) == {"assistant_model": draft}
    with pytest.raises(ValueError, match="needs a draft model"):
        build("hf-assisted", {})


def test_draft_model_name_is_loaded_once_and_cached(monkeypatch, draft):
    calls = []

    def load_model(name, dtype=None, device=None):
        calls.append(name)
        return draft, None

    monkeypatch.setitem(sys.modules, "hf_speculative.registry.models", types.SimpleNamespace(load_model=load_model))
    options = {"draft_model": "some-registry-name"}
    spec = get_method("hf-assisted")
    assert spec.build(None, None, options) == {"assistant_model": draft}
    assert spec.build(None, None, options) == {"assistant_model": draft}
    assert calls == ["some-registry-name"] and options["draft_model"] is draft


def test_greedy_counts_one_forward_per_token(target):
    run = run_method("greedy", target, None, PROMPT, max_new_tokens=12)
    assert run.new_tokens == 12 and run.target_forwards == 12 and run.tau == 1.0
    assert run.drafted is None and run.acceptance_rate is None
    assert run.seconds > 0 and run.tokens_per_s > 0


@pytest.mark.parametrize(
    "name, options",
    [
        ("hf-prompt-lookup", {}),
        ("hf-assisted", {"draft_model": "draft"}),
        pytest.param("hf-early-exit", {"exit_layer": 1}, marks=NEEDS_EARLY_EXIT),
    ],
)
def test_transformers_methods_match_greedy(target, draft, name, options):
    options = {k: (draft if v == "draft" else v) for k, v in options.items()}
    greedy = run_method("greedy", target, None, PROMPT, max_new_tokens=24)
    run = run_method(name, target, None, PROMPT, options=options, max_new_tokens=24)
    assert run.output_ids == greedy.output_ids
    assert 1 <= run.target_forwards <= greedy.target_forwards
    assert run.tau == pytest.approx(run.new_tokens / run.target_forwards)
    assert run.acceptance_rate is None


@NEEDS_EARLY_EXIT
def test_early_exit_drafting_forwards_are_not_counted(target):
    """The self-drafting forwards of hf-early-exit run through the target too but are not counted."""
    calls = []
    handle = target.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        run = run_method("hf-early-exit", target, None, PROMPT, options={"exit_layer": 1}, max_new_tokens=24)
    finally:
        handle.remove()
    assert run.target_forwards < len(calls)


@pytest.mark.parametrize("name", ["prompt-lookup", "draft-model"])
def test_hfs_methods_match_greedy_and_report_stats(target, draft, name):
    greedy = run_method("greedy", target, None, PROMPT, max_new_tokens=24)
    run = run_method(name, target, None, PROMPT, options={"draft_model": draft, "num_tokens": 4}, max_new_tokens=24)
    assert run.output_ids == greedy.output_ids
    assert run.target_forwards >= 1 and run.tau == pytest.approx(run.new_tokens / run.target_forwards)
    assert run.drafted is not None and run.accepted is not None and run.accepted <= run.drafted
    assert 0.0 <= run.acceptance_rate <= 1.0


def test_early_exit_adapter_method(target, tmp_path):
    from hf_speculative.drafters.eagle import checkpoints
    from tests.conftest import random_exit_adapter

    with pytest.raises(ValueError, match="--adapter PATH"):
        run_method("early-exit-adapter", target, None, PROMPT, max_new_tokens=8)
    checkpoints.save_pretrained(random_exit_adapter(target, exit_layer=1), tmp_path / "adapter")
    greedy = run_method("greedy", target, None, PROMPT, max_new_tokens=24)
    options = {"adapter": str(tmp_path / "adapter"), "num_tokens": 3}
    run = run_method("early-exit-adapter", target, None, PROMPT, options=options, max_new_tokens=24)
    assert run.output_ids == greedy.output_ids
    assert run.extra["early-exit"]["adapter"] == str(tmp_path / "adapter")


def test_eagle_lookup_method(target, tmp_path):
    from hf_speculative.drafters.eagle import checkpoints
    from tests.conftest import random_eagle

    with pytest.raises(ValueError, match="--eagle PATH"):
        run_method("hybrid", target, None, PROMPT, max_new_tokens=8)
    checkpoints.save_pretrained(random_eagle(target), tmp_path / "eagle")
    greedy = run_method("greedy", target, None, PROMPT, max_new_tokens=24)
    options = {"eagle": str(tmp_path / "eagle"), "num_tokens": 3, "max_ngram": 2}
    run = run_method("hybrid", target, None, PROMPT, options=options, max_new_tokens=24)
    again = run_method("hybrid", target, None, PROMPT, options=options, max_new_tokens=24)
    assert run.output_ids == again.output_ids == greedy.output_ids
    assert set(run.extra["hybrid"]) == {"prompt-lookup", "eagle"}
    assert len(options["_eagle_strategies"]) == 1  # the drafter is loaded once for all calls
    strategy = get_method("hybrid").build(target, None, options)["candidate_generator"]
    lookup, eagle = strategy.strategies
    assert (lookup.max_ngram, eagle.num_tokens) == (2, 3)


def test_tree_methods_run_in_our_loop_and_equal_greedy(target, tmp_path, monkeypatch):
    from hf_speculative.core import loop
    from hf_speculative.drafters.eagle import checkpoints
    from tests.conftest import random_eagle

    runs = []
    monkeypatch.setattr("hf_speculative.core.entry.ladder", lambda *a, **k: runs.append(1) or loop.ladder(*a, **k))
    checkpoints.save_pretrained(random_eagle(target), tmp_path / "eagle")
    greedy = run_method("greedy", target, None, PROMPT, max_new_tokens=24)
    options = {"eagle": str(tmp_path / "eagle"), "tree_nodes": 8, "max_ngram": 2}
    for name in ("eagle-tree", "hybrid-tree"):
        run = run_method(name, target, None, PROMPT, options=options, max_new_tokens=24)
        assert run.output_ids == greedy.output_ids, name
    assert len(runs) == 2 and len(options["_eagle_tree_strategies"]) == 1  # one drafter load for both methods
    tree = get_method("eagle-tree").build(target, None, options)["candidate_generator"]
    assert (tree.tree.nodes, tree.tree.depth, tree.tree.top_k) == (8, 3, 8) and tree.adaptive
    lookup, eagle = get_method("hybrid-tree").build(target, None, options)["candidate_generator"].strategies
    assert lookup.tree.nodes == eagle.tree.nodes == 8 and lookup.max_ngram == 2
    fixed = get_method("hybrid-tree").build(target, None, {**options, "adaptive": False})["candidate_generator"]
    assert not any(member.adaptive for member in fixed.strategies) and tree.adaptive
    with pytest.raises(ValueError, match="tree_nodes"):
        get_method("eagle-tree").build(target, None, {**options, "tree_nodes": 65})


# -- options checked by name, close matches, and which methods run on a model (issue 42) -------------------------
def test_a_typo_in_an_option_names_the_close_match(target):
    from hf_speculative.tooling.methods import check_options

    message = r"unknown option 'num_token' for prompt-lookup; did you mean 'num_tokens'\? \(options of prompt-lookup: "
    with pytest.raises(ValueError, match=message):
        check_options(["prompt-lookup"], {"num_token": 3})
    with pytest.raises(ValueError, match=message):  # was silently ignored: the run drafted with the default
        run_method("prompt-lookup", target, None, PROMPT, options={"num_token": 3}, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"unknown option 'bogus' for greedy \(options of greedy: none\)"):
        check_options(["greedy"], {"bogus": 1})


def test_options_shared_by_several_methods(target):
    """The CLI and the benchmark pass one dict to every method: a key another method reads is fine there, and refused
    when the methods are asked about strictly."""
    from hf_speculative.tooling.methods import check_options

    options = {"max_ngram": 2, "_eagle_strategies": {}}  # "_..." keys are the builders' caches, not options
    check_options(["draft-model"], options, shared=True)
    run_method("greedy", target, None, PROMPT, options=options, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"option 'max_ngram' is not read by draft-model \(options of draft-model: "
                                         r"draft_model, num_tokens, adaptive, kernel_weights\); prompt-lookup, "
                                         r".*hf-prompt-lookup.* read it"):
        check_options(["draft-model"], options)
    check_options(["prompt-lookup", "draft-model"], options)
    check_options(["medusa", "medusa-tree"], {"medusa": "heads/"})  # read, though no form offers it
    assert get_method("medusa").option_names == ["num_tokens", "medusa"]


def test_a_typo_in_a_method_name_names_the_close_match():
    with pytest.raises(ValueError, match=r"unknown method 'prompt_lookup'; did you mean 'prompt-lookup'\? Known "
                                         r"methods: greedy, prompt-lookup"):
        get_method("prompt_lookup")


def test_problem_on_a_model_says_why_not(target, draft):
    from hf_speculative.tooling.methods import problem_on

    assert problem_on("greedy", target) is None and problem_on("prompt-lookup", target) is None
    assert problem_on("hf-prompt-lookup", target) is None and problem_on("suffix", target) is None
    assert "needs a draft model" in problem_on("draft-model", target) and "--draft-model" in problem_on("hf-assisted",
                                                                                                       target)
    assert problem_on("draft-model", target, None, {"draft_model": draft}) is None
    assert "no EAGLE drafter ships for" in problem_on("eagle", target)  # a random model: nothing ships for it
    assert "no Medusa heads" in problem_on("medusa", target)
    assert problem_on("hf-early-exit", target) == ("exit_layer 8 must be below the model's 4 layers (--exit-layer N, "
                                                   "option exit_layer)")
    assert problem_on("hf-early-exit", target, None, {"exit_layer": 2}) is None
    assert "exit_layer" in problem_on("early-exit", target)  # EarlyExit's own check of its 8 layers on 4
    assert problem_on("early-exit", target, None, {"exit_layer": 2}) is None
    with pytest.raises(ValueError, match="did you mean 'exit_layer'"):
        problem_on("early-exit", target, None, {"exit_layers": 2})
