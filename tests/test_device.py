"""The device battery (issue 32, ``make gpu-check``): every route of speculative decoding against transformers' own
greedy ``generate`` on one device and dtype, for the tiny Llama, Qwen2 and Gemma3 models:

(a) chains through transformers' assisted loop, (b) trees in our loop, (c) our loop on a static cache
(``cache_implementation="static"``; Gemma3's sliding layers are refused), (d) a compiled target
(``hfs.enable(model, compile=True)``, slow); drafters: prompt lookup, a sibling draft model, a copy of the model
as draft model, random EAGLE-1/3 (chains and trees), the oracle (always accepted) and the adversary (never
accepted); EOS and the length limit inside an accepted path; seeded sampling equals the plain seeded call.

Device and dtype come from the environment (defaults: the CPU in float32, part of the normal suite)::

    HFS_TEST_DEVICE=cuda HFS_TEST_DTYPE=float32 python -m pytest -q tests/test_device.py
    HFS_TEST_DEVICE=cuda HFS_TEST_DTYPE=bfloat16 HFS_TEST_REPORT=near_ties.json python -m pytest -q tests/test_device.py

float32 must be token-identical. In bfloat16/float16 the target's verifying forward over many tokens may round
differently from the one-token forwards of plain generate, so the texts may part at a near-tie: at the first
differing position the reference's logits are recomputed and the two tokens must be within ``TIE_ULPS`` ulps of
each other and of the top (else the test fails; ``HFS_TEST_TIE_ULPS`` overrides the 2). Every near-tie is printed
at the end and, with ``HFS_TEST_REPORT`` set, written to that JSON file.
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

import pytest
import torch

import hf_speculative as hfs
from hf_speculative.core.sampling import SeededSampler
from hf_speculative.core.state import forget, state_of
from tests.conftest import (ARCHS, OracleCandidateGenerator, build_model, make_drafter, prompt_inputs, random_eagle,
                            stock_generate)

DEVICE = os.environ.get("HFS_TEST_DEVICE", "cpu")
DTYPE_NAME = os.environ.get("HFS_TEST_DTYPE", "float32")
if DTYPE_NAME not in ("float32", "bfloat16", "float16"):
    raise ValueError(f"HFS_TEST_DTYPE={DTYPE_NAME!r}: use float32, bfloat16 or float16")
DTYPE = getattr(torch, DTYPE_NAME)
EXACT = DTYPE == torch.float32  # token-identical; otherwise a divergence must be a near-tie
if torch.device(DEVICE).type == "cuda" and not torch.cuda.is_available():
    pytest.skip(f"HFS_TEST_DEVICE={DEVICE} but torch.cuda.is_available() is False (torch {torch.__version__})",
                allow_module_level=True)

# A near-tie: the two tokens' logits differ by at most 2 ulps of the dtype at the logits' magnitude (bfloat16 keeps
# 8 significant bits: 1 ulp of a logit x is 2**(floor(log2|x|) - 7)), and both are that close to the top logit.
# Rounding the logits to the dtype alone moves each by half an ulp; a hidden state rounded differently by the
# verifying forward's kernels moves them by about as much again. Seen on an H100 in bfloat16 (torch 2.11,
# transformers 5.17): eager routes none; compiled (inductor's fused kernels) 1 ulp on Llama, 2 on Qwen2.
# HFS_TEST_TIE_ULPS overrides it.
TIE_ULPS = float(os.environ.get("HFS_TEST_TIE_ULPS", 2))
TREE = hfs.DynamicTree(nodes=8, depth=4, top_k=3)
NEW = 30  # tokens per call
CHAINS = ("prompt-lookup-fixed", "draft-model", "draft-model-copy", "eagle1", "eagle3", "oracle", "adversary")
TREES = ("lookup-tree", "eagle1-tree", "eagle3-tree")
STATIC_ARCHS = ("llama", "qwen2")  # full attention; Gemma3's sliding layers are refused
SAMPLING = dict(do_sample=True, temperature=0.8, sampling_seed=11)
NEAR_TIES: list[dict] = []
COMPARED: list[str] = []


# -- models, references and drafters on the device -------------------------------------------------
def target(arch: str):
    """A fresh enabled tiny model of ``arch`` on the device, in the dtype (the same weights on every build)."""
    return hfs.enable(build_model(arch).to(DEVICE, DTYPE))


def inputs() -> dict:
    return {name: value.to(DEVICE) for name, value in prompt_inputs().items()}


@functools.cache
def references(arch: str) -> dict:
    """Plain calls on ``target(arch)``: greedy (``NEW`` tokens), greedy without EOS (``free``), the seeded sample."""
    model = target(arch)
    return {"greedy": stock_generate(model, **inputs(), do_sample=False, max_new_tokens=NEW),
            "free": stock_generate(model, **inputs(), do_sample=False, max_new_tokens=NEW, eos_token_id=None),
            "sample": model.generate(**inputs(), max_new_tokens=NEW, **SAMPLING)}


def drafter(name: str, model, reference):
    """The drafter ``name`` (``CHAINS``: conftest's ``make_drafter``; ``TREES``) with its networks on the device."""
    if name in TREES:
        if name == "lookup-tree":
            return hfs.PromptLookup(tree=TREE, adaptive=False)
        return hfs.Eagle(random_eagle(model, version=int(name[5])).to(DEVICE), tree=TREE, adaptive=False)
    strategy = make_drafter(name, model, reference)
    for net in (getattr(strategy, "model", None), getattr(strategy, "drafter", None)):
        if isinstance(net, torch.nn.Module):
            net.to(DEVICE, DTYPE)  # (EAGLE's id maps are integer buffers: .to(dtype) leaves them)
    return strategy


@pytest.fixture
def loops(monkeypatch) -> list:
    """The verifier of each run of our loop in this test (``None``: the dynamic cache)."""
    from hf_speculative.core import loop

    runs = []
    monkeypatch.setattr("hf_speculative.core.entry.ladder",
                        lambda *a, **k: runs.append(a[1]) or loop.ladder(*a, **k))
    return runs


# -- the comparison ---------------------------------------------------------------------------------
def assert_same(model, out, expected, case: str, sampled: bool = False) -> bool:
    """``out`` equals ``expected`` (both ``[1, L]``); in a low-precision dtype they may part at a near-tie (recorded).
    Returns whether they are identical. ``sampled``: both are seeded samples (``SAMPLING``), not greedy."""
    got, want = out[0].tolist(), expected[0].tolist()
    COMPARED.append(case)
    if got == want:
        return True
    assert not EXACT, f"{case}: not token-identical\n  got  {got}\n  want {want}"
    start = prompt_inputs()["input_ids"].shape[1]
    p = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert p is not None and p >= start, f"{case}: one text ends early\n  got  {got}\n  want {want}"
    with torch.no_grad():
        logits = model(input_ids=expected[:, :p], attention_mask=torch.ones_like(expected[:, :p])).logits[0, -1]
    logits = logits.float()
    a, b = want[p], got[p]
    ulp = torch.finfo(DTYPE).eps * 2.0 ** math.floor(math.log2(max(abs(logits[a].item()), abs(logits[b].item()),
                                                                   1e-30)))
    if sampled:  # the draw is argmax(log_softmax(logits / T) + noise): compare in logit units
        T = SAMPLING["temperature"]
        scores = logits / T + SeededSampler(SAMPLING["sampling_seed"]).noise(0, p, logits.shape[-1], logits.device)
        gap, below_top = abs(scores[a] - scores[b]).item() * T, 0.0
    else:
        gap, below_top = abs(logits[a] - logits[b]).item(), (logits.max() - torch.maximum(logits[a], logits[b])).item()
    tie = dict(case=case, dtype=DTYPE_NAME, device=DEVICE, position=p - start, reference_token=a, token=b, gap=gap,
               gap_ulps=gap / ulp, below_top_ulps=below_top / ulp)
    assert gap <= TIE_ULPS * ulp and below_top <= TIE_ULPS * ulp, \
        f"{case}: differs at new token {p - start} without a near-tie: {tie}\n  got  {got}\n  want {want}"
    NEAR_TIES.append(tie)
    return False


class _Summary:
    """Prints the near-ties in pytest's terminal summary (fixture teardown output would be captured)."""

    @staticmethod
    def pytest_terminal_summary(terminalreporter):
        if NEAR_TIES or not EXACT:
            terminalreporter.write_sep("-", f"test_device: {len(COMPARED)} outputs compared on {DEVICE}/{DTYPE_NAME}, "
                                            f"{len(NEAR_TIES)} near-ties")
            for tie in NEAR_TIES:
                terminalreporter.write_line(f"  {tie['case']}: new token {tie['position']}, tokens "
                                            f"{tie['reference_token']} / {tie['token']}, gap {tie['gap']:.3g} "
                                            f"({tie['gap_ulps']:.2f} ulps)")


@pytest.fixture(scope="module", autouse=True)
def near_tie_report(request):
    """The near-ties: in the terminal summary, and at the end in ``HFS_TEST_REPORT`` (``<name>.<worker>`` under
    xdist)."""
    if not request.config.pluginmanager.has_plugin("hfs-device-summary"):
        request.config.pluginmanager.register(_Summary(), "hfs-device-summary")
    yield
    if os.environ.get("HFS_TEST_REPORT"):
        import transformers

        report = dict(device=DEVICE, dtype=DTYPE_NAME, torch=torch.__version__, transformers=transformers.__version__,
                      gpu=torch.cuda.get_device_name(0) if torch.device(DEVICE).type == "cuda" else None,
                      tie_ulps=TIE_ULPS, compared=len(COMPARED), near_ties=NEAR_TIES)
        path = Path(os.environ["HFS_TEST_REPORT"])
        if os.environ.get("PYTEST_XDIST_WORKER"):
            path = path.with_name(f"{path.name}.{os.environ['PYTEST_XDIST_WORKER']}")
        path.write_text(json.dumps(report, indent=1) + "\n")


def check_stats(model, name: str, identical: bool) -> None:
    stats = hfs.last_stats(model)
    assert stats.drafted_tokens > 0, f"{name} never drafted: {stats}"
    if (identical and name == "oracle") or (EXACT and name == "draft-model-copy"):
        assert stats.accepted_tokens == stats.drafted_tokens, stats
    if identical and name == "adversary":
        assert stats.accepted_tokens == 0, stats


# -- (a), (b), (c): chains and trees in our loop, chains in transformers' loop, our loop on a static cache ------
CASES = ([(arch, "chain", name) for arch in ARCHS for name in CHAINS]
         + [(arch, "transformers", name) for arch in ARCHS for name in CHAINS]
         + [(arch, "tree", name) for arch in ARCHS for name in TREES]
         + [(arch, "static", name) for arch in ARCHS if arch in STATIC_ARCHS for name in CHAINS + TREES])


@pytest.mark.parametrize("arch,route,name", CASES)
def test_route_equals_greedy(arch, route, name, loops):
    model, expected = target(arch), references(arch)["greedy"]
    strategy = drafter(name, model, expected)
    static = {"cache_implementation": "static"} if route == "static" else {}
    if route == "transformers":
        static = {"speculative_loop": "transformers"}
    if route == "static" and name == "oracle":
        hfs.enable(model, static_budget=6)  # a raw CandidateGenerator does not say how long its drafts are
    out = model.generate(**inputs(), do_sample=False, max_new_tokens=NEW, candidate_generator=strategy, **static)
    identical = assert_same(model, out, expected, f"{arch}/{route}/{name}")
    check_stats(model, name, identical)
    from hf_speculative.core.static_cache import StaticVerifier

    if route == "transformers":
        assert loops == []  # transformers' assisted loop
    else:
        assert len(loops) == 1 and isinstance(loops[0], StaticVerifier) == (route == "static")
    forget(model)


def test_static_cache_refuses_sliding_layers():
    from hf_speculative.core.static_cache import StaticCacheError

    if "gemma3" not in ARCHS:
        pytest.skip("Gemma3 needs transformers >= 4.50")
    model = target("gemma3")
    with pytest.raises(StaticCacheError, match="sliding-window layers"):
        model.generate(**inputs(), do_sample=False, max_new_tokens=5, cache_implementation="static",
                       candidate_generator=hfs.PromptLookup(tree=TREE, adaptive=False))
    with pytest.raises(StaticCacheError, match="sliding-window layers"):
        hfs.enable(model, compile=True)


# -- stops inside accepted paths, seeded sampling -----------------------------------------------------
ROUTES = [(arch, route) for arch in ARCHS for route in ("chain", "tree", "static")
          if route != "static" or arch in STATIC_ARCHS]


@pytest.mark.parametrize("arch,route", ROUTES)
def test_eos_and_length_limit_inside_accepted_paths(arch, route):
    """The oracle's drafts (chains; trees: prompt lookup over the repeating text) run past EOS and the limit."""
    model, free = target(arch), references(arch)["free"]
    start = prompt_inputs()["input_ids"].shape[1]
    eos = int(free[0, start + 4])
    static = {"cache_implementation": "static"} if route == "static" else {}
    if route == "transformers":
        static = {"speculative_loop": "transformers"}
    if route == "static":
        hfs.enable(model, static_budget=6)
    for case, kwargs in ((f"{arch}/{route}/eos", dict(max_new_tokens=NEW, eos_token_id=eos)),
                         (f"{arch}/{route}/max-new-tokens", dict(max_new_tokens=9, eos_token_id=None))):
        expected = stock_generate(model, **inputs(), do_sample=False, **kwargs)
        strategy = (hfs.PromptLookup(tree=TREE, adaptive=False) if route == "tree"
                    else OracleCandidateGenerator(free, num_tokens=6))
        out = model.generate(**inputs(), do_sample=False, candidate_generator=strategy, **static, **kwargs)
        assert_same(model, out, expected, case)
    forget(model)


@pytest.mark.parametrize("arch,route", ROUTES)
def test_seeded_sampling_equals_the_plain_seeded_call(arch, route):
    model = target(arch)
    strategy = {"chain": lambda: hfs.PromptLookup(adaptive=False),
                "tree": lambda: hfs.Eagle(random_eagle(model).to(DEVICE), tree=TREE, adaptive=False),
                "static": lambda: hfs.PromptLookup(tree=TREE, adaptive=False)}[route]()
    static = {"cache_implementation": "static"} if route == "static" else {}
    if route == "transformers":
        static = {"speculative_loop": "transformers"}
    out = model.generate(**inputs(), max_new_tokens=NEW, candidate_generator=strategy, **SAMPLING, **static)
    assert_same(model, out, references(arch)["sample"], f"{arch}/{route}/seeded-sampling", sampled=True)
    forget(model)


# -- (d) a compiled target ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("arch", STATIC_ARCHS)
def test_compiled_target_equals_greedy(arch):
    """``compile=True``: CUDA graphs (``reduce-overhead``) on CUDA, inductor elsewhere; the second call reuses the
    graph."""
    model = hfs.enable(target(arch), compile=True)
    try:
        for call in range(2):
            out = model.generate(**inputs(), do_sample=False, max_new_tokens=NEW,
                                 candidate_generator=hfs.PromptLookup(tree=TREE, adaptive=False))
            assert_same(model, out, references(arch)["greedy"], f"{arch}/compiled/lookup-tree#{call}")
            assert hfs.last_stats(model).drafted_tokens > 0
        assert state_of(model).compiled[0] == ("reduce-overhead" if torch.device(DEVICE).type == "cuda" else "default")
    finally:
        hfs.enable(model, compile=False)
        forget(model)
