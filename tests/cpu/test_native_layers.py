"""Native decoder layers (``hf_speculative/cpu/layers.py``, ``csrc/decoder_layer.cpp``): the short forwards of
Llama, Qwen2, Qwen3 and Gemma3 layers as two C++ calls around the model's own cache. They compute the stock layer's
function, a verification row (chain or tree) is bitwise the row plain decoding computes, every drafter stays
token-identical to greedy, and whatever this path does not take runs the stock forward."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch

import hf_speculative as hfs
from hf_speculative import compat
from hf_speculative.core import kv_cache
from hf_speculative.core.tree import DraftTree
from hf_speculative.core.verify import forward_tree
from hf_speculative.cpu import kernel as cpu_kernel
from hf_speculative.cpu.layers import NativeLayer, native_layers, native_rows
from tests.conftest import ARCHS, build_model, make_drafter, prompt_inputs, stock_generate

needs_kernel = pytest.mark.skipif(not cpu_kernel.cpu_supports_kernel(), reason="the kernel needs AVX2 and FMA")
pytestmark = needs_kernel
GREEDY = dict(do_sample=False, max_new_tokens=40)

try:
    from transformers import Qwen3Config, Qwen3ForCausalLM
except ImportError:  # older transformers
    Qwen3ForCausalLM = None
FAMILIES = (*ARCHS, "qwen3") if Qwen3ForCausalLM is not None else ARCHS


def _model(arch: str, **kw):
    if arch == "qwen3":
        torch.manual_seed(0)
        config = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                             initializer_range=0.02, eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
        model = Qwen3ForCausalLM(config).eval()
        for layer in model.model.layers:  # random q/k norm weights: a wrong norm must show
            with torch.no_grad():
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
        return model
    model = build_model(arch, **kw)
    with torch.no_grad():  # the stock init leaves norms at 1 (Llama) or 0 (Gemma's 1 + w): make them matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5) if arch == "gemma3" else p.uniform_(0.5, 1.5)
    return model


def _native(arch: str, **kw):
    model = _model(arch, **kw)
    hfs.optimize_for_cpu(model, kernel=True)
    assert native_layers(model) == len(compat.decoder_of(model).layers)
    return model


class _Counting:
    """Stands in for the built extension; counts the native layer calls (rows of each)."""

    def __init__(self, kernel, calls: list, perturb: bool = False):
        self.kernel, self.calls, self.perturb = kernel, calls, perturb

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def attention_inputs(self, plan, x, cos, sin):
        self.calls.append(x.shape[0] * x.shape[1])
        return self.kernel.attention_inputs(plan, x, cos, sin)

    def layer_output(self, plan, x, *args):
        out = self.kernel.layer_output(plan, x, *args)
        if self.perturb and x.shape[1] > 1:  # a broken path whose rows depend on their neighbours
            out[:, -1] += 1e-3 * out[:, 0]
        return out


def _counting(monkeypatch, perturb: bool = False) -> list:
    calls: list = []
    monkeypatch.setattr(cpu_kernel, "_KERNEL", _Counting(cpu_kernel.load_kernel(), calls, perturb))
    return calls


def _cache_after(model, ids):
    cache = kv_cache.new_dynamic_cache()
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, **{compat.cache_kwarg(): cache})
    return cache


@pytest.mark.parametrize("arch", FAMILIES)
def test_native_layers_compute_the_stock_layers_function(arch, monkeypatch):
    """Forwards of 1, 3, 16 and 40 tokens after a 20-token prompt equal the same model's stock layers' within float
    rounding; the native calls ran for them (40 tokens and the prompt where the kernel's products take that many
    rows: native_rows)."""
    model = _native(arch)
    stock = copy.deepcopy(model)
    hfs.optimize_for_cpu(stock, kernel=True, native=False)
    assert native_layers(stock) == 0 and native_layers(model) > 0
    torch.manual_seed(1)
    prompt = torch.randint(4, 96, (1, 20))
    calls = _counting(monkeypatch)
    for rows in (1, 3, 16, 40):
        new = torch.randint(4, 96, (1, rows))
        with torch.no_grad():
            got = model(input_ids=new, use_cache=True, **{compat.cache_kwarg(): _cache_after(model, prompt)}).logits
            want = stock(input_ids=new, use_cache=True, **{compat.cache_kwarg(): _cache_after(stock, prompt)}).logits
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert (rows in calls) == (rows <= native_rows())
    assert (20 in calls) == (native_rows() >= 20)  # the prefill
    assert max(calls) <= native_rows()


def _plain_rows(model, prompt: torch.Tensor, path: list[int]) -> list[torch.Tensor]:
    """The logits plain decoding computes for each token of ``path`` after ``prompt``, one forward a token."""
    cache = _cache_after(model, prompt)
    rows = []
    with torch.no_grad():
        for token in path:
            out = model(input_ids=torch.tensor([[token]]), use_cache=True, **{compat.cache_kwarg(): cache})
            rows.append(out.logits[0, -1])
    return rows


def _verification_rows_match(model, prompt: torch.Tensor) -> bool:
    """Whether a chain of 5 and a tree (root 7; children 11, 12; 13 under 11; 14 under 12) verified in one forward
    give, row for row, bitwise the logits plain decoding gives along each row's path."""
    chain = [7, 11, 13, 17, 19, 23]  # the root (the last accepted token), then 5 drafts
    cache = _cache_after(model, prompt)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([chain]), use_cache=True, **{compat.cache_kwarg(): cache}).logits[0]
    plain = _plain_rows(model, prompt, chain)
    if not all(torch.equal(out[i], plain[i]) for i in range(len(chain))):
        return False
    tree = DraftTree(torch.tensor([11, 12, 13, 14]), torch.tensor([-1, -1, 0, 1]))
    cache = _cache_after(model, prompt)
    with torch.no_grad():
        rows = forward_tree(model, cache, torch.tensor([7]), tree)  # [1 + n, V]
    for node, path in ((1, [7, 11]), (2, [7, 12]), (3, [7, 11, 13]), (4, [7, 12, 14])):  # row 1 + i: node i
        if not torch.equal(rows[node], _plain_rows(model, prompt, path)[-1]):
            return False
    return torch.equal(rows[0], plain[0])


@pytest.mark.parametrize("arch", FAMILIES)
def test_a_verification_row_is_bitwise_plain_decodings_row(arch, monkeypatch):
    model = _native(arch)
    torch.manual_seed(2)
    prompt = torch.randint(4, 96, (1, 20))  # past Gemma3's sliding window of 8: its mask cuts keys
    calls = _counting(monkeypatch)
    assert _verification_rows_match(model, prompt)
    assert 6 in calls and 5 in calls  # the chain and the tree (its root and 4 nodes) ran natively
    # negative control: a path whose last row reads its first row's output is caught
    _counting(monkeypatch, perturb=True)
    assert not _verification_rows_match(model, prompt)


@pytest.mark.parametrize("arch", FAMILIES)
def test_a_long_verification_row_is_bitwise_plain_decodings_row(arch, monkeypatch):
    """Past the few-row code's 16 rows (a copy of 23 drafts, a tree of 4 branches x 5), where the kernel's
    cache-blocked product takes them: each row still bitwise the row plain decoding computes; negative control."""
    if not cpu_kernel.kernel_gemm():
        pytest.skip("HFS_KERNEL_GEMM=0: more than 16 rows on oneDNN")
    model = _native(arch)
    torch.manual_seed(3)
    prompt = torch.randint(4, 96, (1, 20))
    chain = torch.randint(4, 96, (24,)).tolist()  # the root, then 23 drafts
    branches = torch.randint(4, 96, (4, 5))
    tree = DraftTree(branches.flatten(), torch.tensor([-1 if d == 0 else 5 * b + d - 1 for b in range(4) for d in range(5)]))

    def rows_match() -> bool:
        cache = _cache_after(model, prompt)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([chain]), use_cache=True, **{compat.cache_kwarg(): cache}).logits[0]
        if not all(torch.equal(a, b) for a, b in zip(out, _plain_rows(model, prompt, chain))):
            return False
        with torch.no_grad():
            rows = forward_tree(model, _cache_after(model, prompt), torch.tensor([chain[0]]), tree)  # [1 + 20, V]
        for b in range(4):
            plain = _plain_rows(model, prompt, [chain[0]] + branches[b].tolist())
            if not all(torch.equal(rows[1 + 5 * b + d], plain[1 + d]) for d in range(5)):
                return False
        return True

    calls = _counting(monkeypatch)
    assert rows_match()
    assert 24 in calls and 21 in calls  # the chain and the tree ran natively
    _counting(monkeypatch, perturb=True)
    assert not rows_match()


@pytest.mark.parametrize("drafter_name", ["prompt-lookup", "prompt-lookup-tree", "draft-model", "eagle3", "eagle-tree",
                                          "early-exit", "medusa-tree", "oracle", "adversary"])
def test_drafters_identical_to_greedy_on_native_layers(arch, drafter_name, monkeypatch):
    model = hfs.enable(_model(arch))
    hfs.optimize_for_cpu(model, kernel=True)
    assert native_layers(model) > 0
    ref = stock_generate(model, **prompt_inputs(), **GREEDY)
    calls = _counting(monkeypatch)
    torch.manual_seed(0)
    out = model.generate(**prompt_inputs(), **GREEDY, candidate_generator=make_drafter(drafter_name, model, ref))
    assert out.tolist() == ref.tolist()
    assert calls  # the target's layers ran natively


def test_what_the_native_path_does_not_take_runs_the_stock_forward(monkeypatch):
    model = _native("llama")
    calls = _counting(monkeypatch)
    long_prompt = torch.randint(4, 96, (1, native_rows() + 1))
    with torch.no_grad():
        model(input_ids=long_prompt)
    assert calls == []  # a longer prefill: PyTorch's GEMMs
    seen = []
    handle = model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, a, o: seen.append(o.shape))
    with torch.no_grad():
        model(input_ids=long_prompt[:, :4])
    handle.remove()
    assert seen and len(calls) == len(model.model.layers) - 1  # the watched layer ran its own forward
    calls.clear()
    model.train()
    loss = model(input_ids=long_prompt[:, :4], labels=long_prompt[:, :4]).loss
    loss.backward()  # training: the stock forward, gradients as ever
    assert calls == [] and model.model.layers[0].mlp.down_proj.weight.grad is not None
    model.eval()
    with torch.no_grad():
        model(input_ids=long_prompt[:, :4], output_attentions=True)  # (5.x records them with hooks on the attention)
    assert calls == []


def test_switching_off_copies_and_pickles():
    model = _native("llama")
    ids = torch.randint(4, 96, (1, 5))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    for other in (copy.deepcopy(model), _pickled(model)):
        assert native_layers(other) == len(other.model.layers)
        with torch.no_grad():
            assert torch.equal(other(input_ids=ids).logits, want)
    hfs.optimize_for_cpu(model, False)
    assert native_layers(model) == 0
    assert all(type(layer).__name__ == "LlamaDecoderLayer" and not isinstance(layer, NativeLayer)
               for layer in model.model.layers)


def _pickled(model):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_a_weight_changed_in_place_is_followed():
    model = _native("qwen2")
    ids = torch.randint(4, 96, (1, 3))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        state = {k: v * 1.5 if "mlp" in k or "norm" in k else v for k, v in model.state_dict().items()}
        model.load_state_dict(state)
        after = model(input_ids=ids).logits
    fresh = _model("qwen2")
    fresh.load_state_dict(state)
    hfs.optimize_for_cpu(fresh, kernel=True)
    with torch.no_grad():
        assert not torch.equal(before, after) and torch.equal(after, fresh(input_ids=ids).logits)


def test_a_model_the_native_path_cannot_take_says_why():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                      bos_token_id=None, eos_token_id=None)).eval()
    with pytest.warns(UserWarning, match="GPT2LMHeadModel's decoder layers keep PyTorch's operators") as seen:
        hfs.optimize_for_cpu(model, kernel=True)
    assert len([w for w in seen if "decoder layers" in str(w.message)]) == 1
    llama = _model("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a family it takes: no warning
        hfs.optimize_for_cpu(llama, kernel=True)
    bf16 = _model("llama").to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"cannot run as native layers.*weights are bfloat16 \(it takes fp32 models\)"):
        hfs.optimize_for_cpu(bf16, kernel=True, native=True)
    assert native_layers(bf16) == 0
    with pytest.raises(ValueError, match=r"native=True\) needs the kernel"):
        hfs.optimize_for_cpu(llama, kernel=False, native=True)
    assert native_layers(llama) == len(llama.model.layers)  # refused before anything changed


def test_a_projection_swapped_after_the_layout_is_seen(monkeypatch):
    """A module put in place of a projection after optimize_for_cpu (an adapter, a LoRA layer) is what runs: the
    layer takes its stock forward from then on, and its output is the new module's."""
    model = _native("llama")
    ids = torch.randint(4, 96, (1, 3))
    layer = model.model.layers[1]

    class Doubled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return 2 * self.inner(x)

    with torch.no_grad():
        before = model(input_ids=ids).logits
        layer.mlp.down_proj = Doubled(layer.mlp.down_proj)
        calls = _counting(monkeypatch)
        after = model(input_ids=ids).logits
    stock = copy.deepcopy(model)
    hfs.optimize_for_cpu(stock, kernel=True, native=False)
    with torch.no_grad():
        torch.testing.assert_close(after, stock(input_ids=ids).logits, rtol=1e-4, atol=1e-5)
    assert not torch.equal(before, after) and len(calls) == len(model.model.layers) - 1


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("name", ["prompt-lookup-fixed", "eagle3", "lookup-tree"])
def test_native_layers_on_a_static_cache_equal_greedy(arch, name, monkeypatch):
    """transformers' StaticCache between the two calls (its full-length keys under the model's mask), as the loop's
    static verifier runs it."""
    model = hfs.enable(_model(arch))
    hfs.optimize_for_cpu(model, kernel=True)
    expected = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=30)
    calls = _counting(monkeypatch)
    strategy = (hfs.PromptLookup(tree=hfs.DynamicTree(nodes=6, depth=3, top_k=2), adaptive=False)
                if name == "lookup-tree" else make_drafter(name, model, expected))
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=30, candidate_generator=strategy,
                         cache_implementation="static")
    assert out.tolist() == expected.tolist()
    assert calls and hfs.last_stats(model).drafted_tokens > 0


def test_threads_share_a_native_model():
    """The native calls let go of the GIL (tensors only inside): calls on one model from several threads each give
    their own greedy text."""
    import threading

    model = hfs.enable(_model("llama"))
    hfs.optimize_for_cpu(model, kernel=True)
    prompts = [list(range(4, 4 + n)) * 2 for n in (5, 6, 7, 8)]
    expected = [stock_generate(model, **prompt_inputs(p), do_sample=False, max_new_tokens=24).tolist() for p in prompts]
    got: dict[int, list] = {}

    def work(i: int) -> None:
        for _ in range(3):
            got.setdefault(i, []).append(model.generate(**prompt_inputs(prompts[i]), do_sample=False, max_new_tokens=24,
                                                        candidate_generator=hfs.PromptLookup()).tolist())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[i] == [expected[i]] * 3 for i in range(len(prompts)))
