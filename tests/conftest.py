"""Shared fixtures: tiny random models built from configs (no downloads), a character tokenizer for
them, reference drafters (oracle, adversary) and the real smollm2 for ``@pytest.mark.integration``.

Every drafter test compares token for token with transformers' own greedy ``generate`` on the same
model; the references are computed with the *stock* method (``type(model).generate``), never through
anything hf_speculative installed.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import os
from pathlib import Path

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.generation.candidate_generator import CandidateGenerator

import hf_speculative as hfs
from hf_speculative import compat
from hf_speculative.drafters.generator import SpeculativeCandidateGenerator
from hf_speculative.drafters.registry import ExampleNotApplicable, example, examples
from hf_speculative.core.tree import DraftTree

# Tiny models run faster on one thread than on several (thread start-up dominates), and the CI has 2 cores.
torch.set_num_threads(1)
# `bench` and `profile` measure this machine's read bandwidth over 1 GiB on CPU runs (hf_speculative/bench/bandwidth.py):
# seconds and memory a test of anything else should not spend. tests/bench/test_bandwidth.py unsets it to measure.
os.environ.setdefault("HFS_READ_BANDWIDTH_GBS", "20")


def pytest_collection_finish(session):
    """What the collection imported (torch, transformers, gradio, the test modules: ~400-550k objects) lives as long as
    the process: frozen out of the garbage collector's walks, which took ~0.75 s per full collection in tests/app (35 s
    of its run) and 0.3-0.5 s elsewhere. Objects made later, the tests' models and caches included, are collected as
    before."""
    gc.freeze()


def _seed_cpu(seed: int) -> torch.Generator:
    """``torch.manual_seed`` where no accelerator exists: the CPU generator, seeded alike. torch's own also queues a
    seeding of CUDA, XPU and MTIA for their first use, each with a formatted stack of the caller (3 ms a call here),
    and the tests seed thousands of times (every model built, every reference generated)."""
    return torch.default_generator.manual_seed(int(seed))


if not (torch.cuda.is_available() or torch.backends.mps.is_available()
        or (hasattr(torch, "xpu") and torch.xpu.is_available())):
    torch.manual_seed = _seed_cpu  # (the tests' process only; the same draws on a CPU)

VOCAB = 96
try:  # Gemma3 arrived in transformers 4.50; older supported versions test Llama and Qwen2 only
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    ARCHS = ("llama", "qwen2", "gemma3")
except ImportError:
    ARCHS = ("llama", "qwen2")
# Llama and Gemma3 have an EOS token; Qwen2 has none (a model without EOS must work).
EOS = {"llama": 2, "qwen2": None, "gemma3": 1}
# Seeds whose greedy text loops over several tokens (seed 0 of this Gemma3 repeats one token).
SEEDS = {"llama": 0, "qwen2": 0, "gemma3": 3}
SLIDING_WINDOW = 8
# Repeated n-grams, so that prompt lookup has matches from the first step; no EOS token in it.
PROMPT = [3, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
# The identity matrix: every registered drafter's examples (each class declares them: registry.examples), then the
# reference drafters of these tests (a raw CandidateGenerator that is always right, a strategy that is always wrong).
DRAFTERS = (*examples(), "oracle", "adversary")
_UNSET = object()


# -- models ------------------------------------------------------------------------------------
def build_model(arch: str, seed: int | None = None, *, vocab_size: int = VOCAB, eos=_UNSET, layers: int | None = None,
                hidden: int = 32, init: float = 0.02, max_positions: int = 256):
    """A tiny random ``...ForCausalLM`` of ``arch`` in eval mode, seeded with ``seed``."""
    eos = EOS[arch] if eos is _UNSET else eos
    seed = SEEDS[arch] if seed is None else seed
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=init,
        eos_token_id=eos,
        pad_token_id=0,
        bos_token_id=3,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers or 2, **common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=layers or 2, **common))
    elif arch == "gemma3":
        # Two sliding-window layers and one global layer; prompts + generations are longer than the window.
        layers = layers or 3
        types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
        config = Gemma3TextConfig(num_hidden_layers=layers, head_dim=hidden // 4, sliding_window=SLIDING_WINDOW,
                                  layer_types=types, **common)
        model = Gemma3ForCausalLM(config)
    else:
        raise ValueError(arch)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    model.generation_config.bos_token_id = 3
    return model.eval()


def sibling_model(target, seed: int = 100, **overrides):
    """Another random model with ``target``'s architecture and vocabulary (a real, mostly wrong drafter)."""
    from hf_speculative.drafters.draft_model.drafter import random_sibling

    return random_sibling(target, seed, **overrides)


def prompt_inputs(prompt=PROMPT) -> dict:
    """``input_ids`` and ``attention_mask`` of batch size 1."""
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def stock_generate(model, **kwargs):
    """transformers' own ``generate`` (bypassing anything ``hfs.enable`` installed), seeded with 0.

    The tiny models are rebuilt from a seed for every test, so most tests ask again for a reference computed before:
    a reference is reused when the model's class, weights (their bytes), config, generation config and the arguments
    (plain values and tensors) are all the same; anything else (a logits processor, a streamer, a model of more than
    :data:`CACHED_PARAMS` parameters) generates anew. Generating the references was a third of the identity tests'
    time."""
    try:
        key = _reference_key(model, kwargs)
    except Exception:  # noqa: BLE001  (_Uncacheable, or a model whose weights or configs do not serialize: no reuse)
        key = None
    if key is not None and key in _REFERENCES:
        return _REFERENCES[key].clone()
    torch.manual_seed(0)
    out = type(model).generate(model, **kwargs)
    if key is not None and isinstance(out, torch.Tensor):
        _REFERENCES[key] = out.clone()
    return out


CACHED_PARAMS = 5_000_000  # the tiny models; the real one's weights cost more to hash than to run
_REFERENCES: dict = {}


class _Uncacheable(Exception):
    pass


def _reference_key(model, kwargs: dict) -> tuple:
    """What the reference depends on. A module with a patched forward or a hook, or a global hook, is not reused (a
    test changing what the model computes without changing its weights); a class whose forward a test patched has
    another key."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        raise _Uncacheable
    kinds = set()
    for m in model.modules():
        if "forward" in vars(m) or m._forward_hooks or m._forward_pre_hooks:
            raise _Uncacheable
        kinds.add((type(m).__module__, type(m).__qualname__, id(type(m).forward)))
    overrides = tuple(sorted(name for name, value in vars(model).items() if callable(value)))
    state = model.state_dict()
    if sum(t.numel() for t in state.values()) > CACHED_PARAMS:
        raise _Uncacheable
    digest = hashlib.sha256()
    for name, tensor in state.items():
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return (type(model).__qualname__, id(type(model).generate), tuple(sorted(kinds)), overrides, model.training,
            torch.get_default_dtype(), torch.get_num_threads(), digest.hexdigest(), model.config.to_json_string(),
            getattr(model.config, "_attn_implementation", None), model.generation_config.to_json_string(),
            tuple(sorted((name, _plain(value)) for name, value in kwargs.items())))


def _plain(value):
    """``value`` as a hashable key: plain values, tensors by content, lists and tuples of them; else uncacheable."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), tuple(value.flatten().tolist()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_plain(v) for v in value))
    raise _Uncacheable


def recurring_token(model):
    """Set-up for "a stopping token in the middle of a draft".

    Returns ``(prompt, token, step, free)``: ``prompt`` is ``PROMPT`` plus the start of the model's own
    greedy text, whose greedy continuation produces ``token`` first as its new token number ``step``
    (>= 2); the 4 tokens ending with that ``token`` already occur in ``prompt``, so drafters that follow
    the text (prompt lookup included) propose ``token`` inside a draft. ``free`` is the greedy text
    without any EOS (``prompt`` + continuation).
    """
    free = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=40, eos_token_id=None)
    text = free[0].tolist()
    eos = model.generation_config.eos_token_id
    for p in range(len(PROMPT) + 6, len(PROMPT) + 25):
        for step in range(2, 10):
            token = text[p + step]
            # (a prompt that already ends with the stopping token is another test: see test_integration.py)
            if token == eos or token in text[p - 1: p + step] or eos in text[p: p + step]:
                continue
            block = text[p + step - 3: p + step + 1]
            if any(text[i: i + 4] == block for i in range(p - 3)):
                return text[:p], token, step, free
    raise AssertionError(f"no usable repetition in the greedy text {text}")


def free_port() -> int:
    """A localhost port free a moment ago (another process may take it before it is bound: see
    :func:`launch_local`)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(demo, attempts: int = 3) -> tuple[str, int]:
    """``(url, port)`` of ``demo`` launched on a free localhost port, not blocking. Tried again on another port when
    the launch fails: in CI the test groups run side by side, so a port free a moment ago can be taken before gradio
    binds it, and a loaded machine can answer gradio's own check of the page (a few seconds) too late. The last
    failure is raised."""
    for attempt in range(attempts):
        port = free_port()
        try:
            _, url, _ = demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
            return url, port
        except (TypeError, AttributeError):  # a wrong call: no retry
            raise
        except Exception:  # gradio: OSError for a taken port, ValueError / Exception for a page it could not reach
            if attempt == attempts - 1:
                raise
            demo.close()
    raise AssertionError("unreachable")


@pytest.fixture(params=ARCHS)
def arch(request) -> str:
    return request.param


@pytest.fixture
def model(arch):
    """A fresh tiny model of every architecture, enabled."""
    return hfs.enable(build_model(arch))


# -- tokenizer -------------------------------------------------------------------------------
def char_tokenizer(vocab_size: int = VOCAB) -> PreTrainedTokenizerFast:
    """One printable character per id (id i -> chr(32 + i), the last one "\\n"), decoded by concatenation,
    so that ``stop_strings`` can be matched."""
    from tokenizers import Tokenizer, decoders, models

    chars = [chr(32 + i) for i in range(vocab_size - 1)] + ["\n"]
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=" ")


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return char_tokenizer()


# -- reference drafters ----------------------------------------------------------------------
class OracleCandidateGenerator(CandidateGenerator):
    """A raw transformers ``CandidateGenerator`` that proposes the true greedy continuation.

    Args:
        reference: the full greedy sequence (prompt included) computed beforehand with plain generate.
        num_tokens: draft length; the draft is always ``num_tokens`` long: past the end of ``reference``
            it is padded with ``tail`` (e.g. EOS tokens), so it can run past ``max_new_tokens``.
    """

    def __init__(self, reference, num_tokens: int = 6, tail: int | None = None):
        self.reference = [int(t) for t in torch.as_tensor(reference).reshape(-1)]
        self.num_tokens = num_tokens
        self.tail = tail
        self.proposals: list[list[int]] = []
        self.asked_at: list[int] = []  # sequence length at each proposal
        self.updates: list[int] = []
        self.diverged = False

    def get_candidates(self, input_ids, *args, **kwargs):
        seq = input_ids[0].tolist()
        if seq != self.reference[: len(seq)]:
            self.diverged = True  # the verified text left the greedy path: the comparison will fail
            return input_ids, None
        draft = self.reference[len(seq): len(seq) + self.num_tokens]
        if self.tail is not None:
            draft += [self.tail] * (self.num_tokens - len(draft))
        self.proposals.append(draft)
        self.asked_at.append(len(seq))
        if not draft:
            return input_ids, None
        return torch.cat([input_ids, input_ids.new_tensor([draft])], dim=-1), None

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        self.updates.append(int(num_matches))


class AdversaryStrategy(hfs.DraftStrategy):
    """A ``DraftStrategy`` proposing ``num_tokens`` tokens that are all wrong (never accepted): each
    differs from the greedy continuation at its position, and none is an EOS token."""

    name = "adversary"

    def __init__(self, reference, num_tokens: int = 4, vocab_size: int = VOCAB, avoid=()):
        self.reference = [int(t) for t in torch.as_tensor(reference).reshape(-1)]
        self.num_tokens = num_tokens
        self.vocab_size = vocab_size
        self.avoid = set(avoid)

    def open(self, ctx):
        return _AdversaryGenerator(ctx, self)

    def draft_budget(self):  # a strategy of one's own that is not a dataclass says how long its drafts are
        return self.num_tokens


class _AdversaryGenerator(SpeculativeCandidateGenerator):
    def __init__(self, ctx, config: AdversaryStrategy):
        super().__init__(ctx)
        self.config = config

    def draft(self, input_ids, plan):
        ref, length = self.config.reference, input_ids.shape[1]
        avoid = self.config.avoid | set(compat.eos_token_ids(self.ctx.generation_config))
        draft = []
        for j in range(min(self.config.num_tokens, plan.depth)):
            true = ref[length + j] if length + j < len(ref) else None
            token = 4
            while token == true or token in avoid:
                token = (token + 7) % self.config.vocab_size
            draft.append(token)
        return DraftTree.from_tokens(draft, input_ids.device)


def make_drafter(name: str, target, reference):
    """The drafter ``name`` (one of ``DRAFTERS``, or ``"draft-model-defaults"``) for ``target``; ``reference`` is the
    plain greedy output of the same call (for the oracle and the adversary). The registered drafters' examples draft at
    every step on a tiny random model (``adaptive=False``, no confidence cut: random tiny models are never
    "confident", so an adaptive drafter would rightly stop drafting, and these tests need drafts to check)."""
    if name == "oracle":
        return OracleCandidateGenerator(reference, num_tokens=6)
    if name == "adversary":
        return AdversaryStrategy(reference, vocab_size=target.config.vocab_size)
    if name == "draft-model-defaults":  # the drafter's own defaults (it may rightly decide drafting does not pay)
        return example("draft-model", target, adaptive=True)
    if name == "prompt-lookup":
        # The adaptive policy decides from measured costs: fix them (cheap, GPU-like) so that under
        # any machine load it drafts and the identity test checks something.
        fix_cheap_costs(target)
    try:
        return example(name, target)
    except ExampleNotApplicable as why:  # a drafter for some targets only (a Gemma-4 assistant): its own tests run it
        pytest.skip(f"{name} on {type(target).__name__}: {why}")


def random_eagle(target, version: int = 3, seed: int = 7, draft_vocab_size: int | None = None):
    """A random EAGLE drafter shaped for ``target`` (EAGLE-3 with a reduced vocabulary of the
    target's even ids by default: the id map is exercised by every test)."""
    from hf_speculative.drafters.eagle.drafter import random_drafter

    return random_drafter(target, version=version, seed=seed, draft_vocab_size=draft_vocab_size)


def random_exit_adapter(target, exit_layer: int = 1, seed: int = 7, draft_vocab_size: int | None = None):
    """A random exit adapter for ``target``'s first ``exit_layer`` layers (reduced vocabulary of the
    target's even ids by default, as ``random_eagle``)."""
    from hf_speculative.drafters.eagle.drafter import random_drafter

    return random_drafter(target, seed=seed, draft_vocab_size=draft_vocab_size or None, exit_layer=exit_layer)


def fit_eagle(target, version: int, ids, iterations: int, unroll: int, lr: float = 3e-3):
    """A random full-vocabulary EAGLE drafter for ``target`` trained ``iterations`` Adam steps on the
    target's features over ``ids`` `[1, T]`, every position learnt. Returns ``(net, before, last)``:
    the step metrics before training and of the last training step."""
    from hf_speculative.core.features import FeatureTap
    from hf_speculative.training.losses import eagle_loss

    net = random_eagle(target, version=version, draft_vocab_size=target.config.vocab_size if version == 3 else None)
    net.requires_grad_(True).train()
    taps = FeatureTap(target, net.config.target_layers), FeatureTap(target, [])
    with torch.no_grad():
        target(input_ids=ids)
    features, final = taps[0].take(), taps[1].take()
    for tap in taps:
        tap.remove()
    embed, head = target.get_input_embeddings(), target.get_output_embeddings().weight
    mask = torch.ones_like(ids)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    _, before = eagle_loss(net, embed, head, ids, mask, features, final, steps=unroll)
    last = before
    for _ in range(iterations):
        loss, last = eagle_loss(net, embed, head, ids, mask, features, final, steps=unroll)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return net, before, last


def _plain_copy(model):
    """A deep copy of ``model`` without anything ``hfs.enable`` installed on it."""
    clone = copy.deepcopy(model)
    hfs.disable(clone)
    return clone


@pytest.fixture(params=DRAFTERS)
def drafter_name(request) -> str:
    return request.param


def assert_drafter_worked(name: str, drafter, stats) -> None:
    """The checks that make an identity test meaningful: the drafter did draft, and the always-right
    ones were always accepted, the always-wrong one never."""
    assert stats is not None
    assert stats.new_tokens > 0
    # drafts only once calibrated, after 4 generated tokens: the next two leave no room for a draft
    calibrating = name == "layer-skip-auto" and stats.new_tokens <= 6
    if name != "draft-model-defaults" and not calibrating:  # (defaults may rightly decide drafting does not pay)
        assert stats.drafted_tokens > 0, f"{name} never drafted: {stats}"
    if name in ("oracle", "draft-model-copy"):
        assert stats.accepted_tokens == stats.drafted_tokens, stats
    if name == "oracle":
        assert not drafter.diverged
    if name == "adversary":
        assert stats.accepted_tokens == 0, stats


# -- the real model --------------------------------------------------------------------------
INTEGRATION_MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def integration():
    """``(model, tokenizer)`` of the real smollm2-135m-instruct (session-wide). Loading errors fail the
    tests, they are not skipped."""
    model, tokenizer = hfs.models.load_model(INTEGRATION_MODEL)
    return model, tokenizer


def drafts_exactly_on_real_model(model, tokenizer, strategy, prompt: str = "What is photosynthesis?",
                                 new_tokens: int = 40) -> hfs.SpeculativeStats:
    """``strategy`` on the real model (``integration``) for one chat prompt gives transformers' greedy tokens;
    returns the call's statistics."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    ids = {k: ids[k] for k in ("input_ids", "attention_mask")}
    ref = type(model).generate(model, **ids, max_new_tokens=new_tokens, do_sample=False)
    out = model.generate(**ids, max_new_tokens=new_tokens, do_sample=False, candidate_generator=strategy)
    assert out.tolist() == ref.tolist()
    return hfs.last_stats(model)


# -- a tiny chat checkpoint (word-level tokenizer with a chat template) for the CLI and the bench --
CHAT_WORDS = "the a cat dog sat on mat and ran to house big small red blue code def return value x y".split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_chat_tokenizer(words=CHAT_WORDS) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``words`` with BOS/EOS/PAD and a chat template (no downloads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture
def chat_tokenizer() -> PreTrainedTokenizerFast:
    """``make_chat_tokenizer()`` over the test words."""
    return make_chat_tokenizer()


@pytest.fixture
def chat_model() -> LlamaForCausalLM:
    """A seeded tiny Llama whose vocabulary covers ``chat_tokenizer``."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def chat_checkpoint(tmp_path, chat_model, chat_tokenizer):
    """``chat_model`` and ``chat_tokenizer`` saved in a folder, as a local model path."""
    chat_model.save_pretrained(tmp_path / "tiny-llama")
    chat_tokenizer.save_pretrained(tmp_path / "tiny-llama")
    return tmp_path / "tiny-llama"


def fix_cheap_costs(target, max_tokens: int = 32) -> None:
    """Fix ``target``'s verify-cost model to a GPU-like profile (each draft token costs 1% of a forward), so that
    adaptive drafters decide independently of the wall clock (they draft, whatever the machine's load)."""
    from hf_speculative.core.costs import verify_costs_for

    verify_costs_for(target, max_tokens).fix([1.0 + 0.01 * k for k in range(max_tokens + 1)])


@pytest.fixture
def cheap_verification():
    """:func:`fix_cheap_costs` for one test: the targets it is applied to forget their costs after."""
    from hf_speculative.core.costs import forget_costs

    fixed = []

    def apply(target, max_tokens: int = 32):
        fix_cheap_costs(target, max_tokens)
        fixed.append(target)

    yield apply
    for target in fixed:
        forget_costs(target)


def load_benchmark(name: str):
    """The script ``benchmarks/<name>.py`` as a module (the benchmarks are scripts, not a package); ``name`` may
    name a folder's script (``"peers/run"``). Registered in ``sys.modules`` under ``benchmarks_<name>`` while it
    runs and after, since dataclasses look their module up there."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location("benchmarks_" + name.replace("/", "_"), path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# -- integrity tests -------------------------------------------------------------------------------
def corrupt_same_size(path: Path) -> None:
    """Overwrite a block in the middle of the file with 0xFF (the file keeps its size): 64 KiB of a large
    file, a quarter of a small one."""
    size = path.stat().st_size
    n = min(64 << 10, max(1, size // 4))
    with open(path, "r+b") as f:
        f.seek((size - n) // 2)
        f.write(b"\xff" * n)
    assert path.stat().st_size == size


def count_hashes(monkeypatch) -> list[str]:
    """The names of the files ``hf_speculative.registry.integrity`` hashes from now on (this test only)."""
    from hf_speculative.registry import integrity

    hashed: list[str] = []
    real = integrity.sha256_file

    def counting(path, update=None, **kwargs):
        hashed.append(Path(path).name)
        return real(path, update, **kwargs)

    monkeypatch.setattr(integrity, "sha256_file", counting)
    return hashed


def draft_once(generator, input_ids, depth: int):
    """One step of ``generator``'s drafting after ``input_ids`` `[1, L]`, at most ``depth`` deep, as the loop asks it:
    its :class:`DraftTree` (``.tokens`` for a chain). The plans come from one budget kept on the generator, so that
    successive calls see the sizing rules' state as a call would."""
    from hf_speculative.core.budget import DraftBudget

    budget = generator.__dict__.setdefault("_test_budget", DraftBudget(generator.sizing))
    return generator.draft(input_ids, budget.plan(depth))
