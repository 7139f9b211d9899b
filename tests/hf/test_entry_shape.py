"""The shape of one call through the entry (issue 68): frames from ``model.generate`` to the acceptance rule, the
package functions a call runs outside its steps (setup and teardown), one call object, one ContextVar."""

from __future__ import annotations

import ast
import sys
import traceback
from pathlib import Path

import torch

import hf_speculative as hfs
from hf_speculative.core import accept
from tests.conftest import build_model

PACKAGE = Path(hfs.__file__).parent
PROMPT = torch.tensor([[1, 5, 9, 11, 3, 4, 5, 9, 11]])
# torch's and transformers' decorators around transformers' generate (no_grad, deprecated-kwarg renames): frames of
# their wrappers, not of a step of the call
WRAPPERS = {"decorate_context", "wrapped_func"}
# Before issue 68 (commit 4f49192): 9 frames from the enabled model's generate to accept_greedy, 265 package functions
# run per call outside the ladder, 79 distinct ones in 21 files (a 4-token prompt-lookup call on a tiny Llama, counted
# as below)
FRAMES_BEFORE, SETUP_CALLS_BEFORE = 9, 115


def frames_to_rule(model, **kwargs) -> list[str]:
    """The frames from the enabled model's ``generate`` to the greedy rule, wrappers left out."""
    seen = []
    original = accept.accept_greedy

    def spy(*args, **kw):
        seen.append(traceback.extract_stack()[:-1])
        return original(*args, **kw)

    accept.accept_greedy = spy
    try:
        model.generate(PROMPT, max_new_tokens=4, do_sample=False, **kwargs)
    finally:
        accept.accept_greedy = original
    stack = seen[0]
    start = max(i for i, f in enumerate(stack) if f.name == "_generate" and f.filename.endswith("integration.py"))
    return [f"{Path(f.filename).name}:{f.name}" for f in stack[start:] if f.name not in WRAPPERS] + ["accept_greedy"]


def setup_calls(model, strategy) -> int:
    """Package functions a call runs outside the ladder (sys.setprofile): its setup and teardown."""
    depth, count = [0], [0]

    def profile(frame, event, arg):
        code = frame.f_code
        is_ladder = code.co_name == "ladder" and code.co_filename.endswith("core/loop.py")
        if event == "call":
            if is_ladder:
                depth[0] += 1
            elif depth[0] == 0 and str(PACKAGE) in code.co_filename:
                count[0] += 1
        elif event == "return" and is_ladder:
            depth[0] -= 1

    sys.setprofile(profile)
    try:
        model.generate(PROMPT, max_new_tokens=4, do_sample=False, candidate_generator=strategy)
    finally:
        sys.setprofile(None)
    return count[0]


def test_six_frames_from_generate_to_the_rule():
    model = hfs.enable(build_model("llama"))
    for strategy in (hfs.PromptLookup(), hfs.PromptLookup(tree=hfs.DynamicTree(nodes=4, depth=2))):
        frames = frames_to_rule(model, candidate_generator=strategy)
        assert len(frames) <= 6 < FRAMES_BEFORE, frames
        assert frames[:1] == ["integration.py:_generate"] and frames[-3:] == [
            "loop.py:ladder", "loop.py:verify_step", "accept_greedy"], frames


def test_a_call_runs_half_the_setup_functions_it_did():
    model = hfs.enable(build_model("llama"))
    setup_calls(model, hfs.PromptLookup())  # warm: first-use imports and caches
    count = setup_calls(model, hfs.PromptLookup())
    assert 0 < count <= SETUP_CALLS_BEFORE // 2, count


def test_one_call_object_and_one_context_variable():
    """The package defines one call class and creates one ContextVar (the hooks transformers calls back read it)."""
    call_classes, context_vars = [], []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name.lstrip("_") in ("Call", "CallContext"):
                call_classes.append(f"{path.relative_to(PACKAGE)}:{node.name}")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "ContextVar":
                context_vars.append(str(path.relative_to(PACKAGE)))
    assert call_classes == ["core/call.py:Call"]
    assert context_vars == ["hf/loop_hooks.py"]
