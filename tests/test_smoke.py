"""The smoke suite (`make test-fast`, `pytest -m smoke`): every registered method, the app and the command
line once each, on the real default model, in a few minutes.

Every method the registry knows (``hf_speculative.tooling.methods.available_methods()``: a new one joins by being
registered) runs one short greedy call through the same route as the CLI, the app and the benchmark
(``run_method``) and must give greedy's tokens exactly. The verification costs are fixed to cheap,
GPU-like ones so that the adaptive drafters do draft whatever this machine's speed or load, and each of
our drafters must then have drafted: a smoke test that drafted nothing would check nothing.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.tooling.methods import available_methods, get_method, run_method

pytestmark = [pytest.mark.smoke, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 20
# A task the default model answers by copying from the prompt, so that the lookup drafters find matches.
PROMPT = ("Rewrite this sentence with 'cat' in place of 'dog': The dog sat on the mat, and the dog slept there all "
          "afternoon.")


@pytest.fixture(scope="module")
def target(integration):
    from tests.conftest import fix_cheap_costs

    model, tokenizer = integration
    hfs.enable(model)
    fix_cheap_costs(model)  # cheap verification: drafting pays
    return model, tokenizer


@pytest.fixture(scope="module")
def prompt_ids(target):
    from hf_speculative.bench.runner import encode_prompt

    return encode_prompt(target[1], PROMPT)


@pytest.fixture(scope="module")
def greedy(target, prompt_ids):
    model, _ = target
    with torch.inference_mode():  # transformers' own greedy, not through anything hf_speculative installed
        out = type(model).generate(model, prompt_ids, attention_mask=torch.ones_like(prompt_ids),
                                   max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, prompt_ids.shape[1]:].tolist()


@pytest.fixture(scope="module")
def draft_copy(target):
    """A plain copy of the target as the draft model (the default model has no smaller sibling)."""
    clone = copy.deepcopy(target[0])
    hfs.disable(clone)
    return clone


def _options(name: str, draft_copy) -> dict:
    spec = get_method(name)
    options: dict = {}
    if spec.needs_draft_model:
        options["draft_model"] = draft_copy
    if name == "layer-skip":
        options["skip"] = "10,20"  # calibration (20-36 s on this CPU) is the full suite's business
    if name in ("draft-model", "draft-model-uag", "layer-skip"):
        # a drafter as costly as the target (the copy; 28 of 30 layers) never pays, so the cost rule would not run it
        # at all (tests/drafters/test_draft_model.py); here its drafting path is what is checked
        options["adaptive"] = False
    if name == "magicdec":
        # the smoke prompt (~60 tokens) fits in the default window of 512, where MagicDec rightly drafts nothing
        options.update(window=8, adaptive=False)
    return options


@pytest.mark.parametrize("name", [m for m in available_methods() if m != "greedy"])
def test_every_registered_method_equals_greedy(target, prompt_ids, greedy, draft_copy, name):
    model, tokenizer = target
    if name == "hf-assisted-uag":  # the only cached model is the target: its draft copy shares its tokenizer
        with pytest.raises(ValueError, match="shares the target's tokenizer: use method 'hf-assisted'"):
            run_method(name, model, tokenizer, prompt_ids, options=_options(name, draft_copy), max_new_tokens=4)
        return
    run = run_method(name, model, tokenizer, prompt_ids, options=_options(name, draft_copy), max_new_tokens=NEW_TOKENS)
    assert run.output_ids == greedy, f"{name} differs from greedy"
    if get_method(name).kind == "hfs":
        assert run.drafted and run.drafted > 0, f"{name} drafted nothing: {run}"
        assert run.target_forwards < NEW_TOKENS or run.accepted == 0, run


# in `make test-fast` (-m smoke), out of the default: CI's fresh-machine check sends this request through the same
# client to the app served from `make demo` and from the Spaces files, and tests/app/test_browser.py runs the page on
# the default model
@pytest.mark.slow
def test_the_app_answers_one_request(target):
    """The app on the default model, one visitor's request through gradio_client (the CI script's client)."""
    from hf_speculative.app.cache import ModelCache
    from hf_speculative.app.ui import build_app
    from tests.conftest import launch_local
    from tools.ci.first_request import main as first_request

    cache = ModelCache(device=torch.device("cpu"))
    demo = build_app(cache)
    url, _ = launch_local(demo)
    try:
        assert first_request([url, "--max-new-tokens", "12", "--timeout", "300"]) == 0
    finally:
        demo.close()


def test_the_command_line_compares_once():
    out = subprocess.run(
        [sys.executable, "-m", "hf_speculative", "compare", "--prompt", PROMPT, "--method", "prompt-lookup",
         "--max-new-tokens", "12", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    methods = [r["method"] for r in report["results"]]
    assert methods == ["greedy", "prompt-lookup"]
    assert all(r["identical_to_greedy"] for r in report["results"]) and report["results"][0]["new_tokens"] == 12
