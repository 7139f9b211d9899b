"""Native decoder layers: a Llama-shaped layer's short forwards in two C++ calls around the model's own KV cache.

On one CPU core a decoder layer written in PyTorch is ~55 small operators (RMSNorm, rotary, views, residual adds,
the attention wrapper), each a few microseconds of dispatch around almost no arithmetic: SmolLM2-135M's one-token
forward spent 13.5 of its 32 ms there, beside 16.2 ms in the kernel's products. ``optimize_for_cpu(model)`` (with
the kernel) now also gives each decoder layer of the families below a forward that, for 1-16 tokens of fp32 hidden
states without gradients (decoding, drafting with the target's layers, verification; up to 64 where the kernel's
products take them, :func:`native_rows`: larger trees and copies, short prompts), runs::

    q, k, v = kernel.attention_inputs(plan, x, cos, sin)    # input norm, q/k/v products, q/k norms, rotary
    K, V    = cache.update(k, v, layer_idx, ...)            # transformers' own cache object: keep / rollback as ever
    y       = kernel.layer_output(plan, x, q, K, V, mask)   # attention, o-proj, residual, norms, gated MLP, residual

(``csrc/decoder_layer.cpp``). Every row keeps its own arithmetic there as in the kernel's products and attention,
so a verification row is bitwise what plain decoding computes at that position (plain decoding takes this path
too). Anything else (longer prefills, gradients, training, other dtypes or devices, hooks on the layer's
submodules, ``output_attentions``, a mask or cache this path does not read) runs the layer's own forward, unchanged.

Families: Llama (SmolLM2, Llama 2/3), Qwen2 (Qwen2.5), Qwen3 and Gemma3 (its norms around attention and MLP, q/k
norms, ``1 + w`` weights, GELU). Others (GPT-2, Phi, Mistral-shaped models with other module names, MoE layers)
keep PyTorch's ops around the kernel's products; ``optimize_for_cpu`` says why in one warning. Nothing of
transformers is replaced: the model's own layer objects get a subclass of their class (as ``KernelLinear`` does to
``nn.Linear``), and ``optimize_for_cpu(model, False)`` gives them their class back.
"""

from __future__ import annotations

import dataclasses
import inspect

import torch

from .. import compat
from ..core import sdpa
from .attention import _visible, cpu_sdpa
from . import kernel as _kernel
from .kernel import MAX_ROWS, KernelLinear, load_kernel

ACTIVATIONS = {"silu": 0, "swish": 0, "gelu_pytorch_tanh": 1}  # csrc/decoder_layer.cpp's Activation


@dataclasses.dataclass(frozen=True)
class Family:
    """What a family's layer computes beyond Llama's: q/k norms per head, Gemma's norms around the attention's and the
    MLP's outputs, and RMSNorm weights used as ``1 + w``."""

    qk_norm: bool = False
    sandwich: bool = False
    norm_offset: bool = False


FAMILIES = {  # the stock class's name -> what it computes; its module is transformers.models.<folder>.modeling_<folder>
    "LlamaDecoderLayer": Family(),
    "Qwen2DecoderLayer": Family(),
    "Qwen3DecoderLayer": Family(qk_norm=True),
    "Gemma3DecoderLayer": Family(qk_norm=True, sandwich=True, norm_offset=True),
}
_FOLDERS = {"LlamaDecoderLayer": "llama", "Qwen2DecoderLayer": "qwen2", "Qwen3DecoderLayer": "qwen3",
            "Gemma3DecoderLayer": "gemma3"}


def _norm_weight(norm: torch.nn.Module | None) -> tuple[torch.Tensor | None, float | None]:
    if norm is None:
        return None, None
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    return getattr(norm, "weight", None), eps


def why_not(layer: torch.nn.Module) -> str | None:
    """Why ``layer`` cannot run natively (a short reason), or None when it can."""
    cls = type(layer).__dict__.get("_hfs_stock", type(layer))
    family = FAMILIES.get(cls.__name__)
    if family is None or not cls.__module__.startswith("transformers.models."):
        return f"{cls.__name__} is not a family the native layers know ({', '.join(sorted(FAMILIES))})"
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    linears = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    linears += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    dtypes = {m.weight.dtype for m in linears if isinstance(m, torch.nn.Linear)}
    if dtypes and dtypes != {torch.float32}:
        return f"its weights are {', '.join(sorted(str(d).replace('torch.', '') for d in dtypes))} (it takes fp32 models)"
    if not all(type(m) is KernelLinear and m.weight.device.type == "cpu" for m in linears):
        return "its linear layers are not fp32 CPU weights on the kernel"
    config = getattr(attn, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation != sdpa.CPU_ATTENTION:
        return f"its attention is {implementation!r}, not optimize_for_cpu's (load the model with 'sdpa')"
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    if act not in ACTIVATIONS:
        return f"its activation {act!r} is not one of {sorted(ACTIVATIONS)}"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1 splits its products"
    if getattr(attn, "attn_logit_softcapping", None) is not None:
        return "its attention soft-caps the logits"
    head_dim = getattr(attn, "head_dim", 0)
    if head_dim % 8 or head_dim > 128:
        return f"its head dim {head_dim} is not a multiple of 8 up to 128 (the kernel's attention)"
    names = ["input_layernorm", "post_attention_layernorm"]
    names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"] if family.sandwich else []
    norms = [getattr(layer, n, None) for n in names]
    norms += [getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)] if family.qk_norm else []
    weights = [_norm_weight(n) for n in norms]
    if any(w is None or w.dtype != torch.float32 or eps is None for w, eps in weights):
        return "its norms are not fp32 RMSNorms"
    if len({float(eps) for _, eps in weights}) != 1:
        return "its norms use different epsilons"
    if not {"position_embeddings", "position_embeddings_global"} & set(inspect.signature(cls.forward).parameters):
        return f"{cls.__name__} on transformers {compat.TRANSFORMERS_VERSION} takes rotary tables another way"
    return None


class Plan:
    """A ``LayerPlan`` (``csrc/decoder_layer.cpp``) and what it was built from: the modules (looked up again through
    their parents' ``_modules``, so that a projection swapped for another module, a LoRA layer say, is seen) and their
    weights' storage and version (the kernel's copies follow in-place changes: ``kernel.WeightCopy``), checked at
    every forward and built again when something changed. For a stock layer (:meth:`for_layer`) and for a drafter's
    own Llama-shaped layer (EAGLE's: :meth:`get`)."""

    def __init__(self) -> None:
        self.native = None
        self.modules: tuple = ()
        self.stamp: tuple = ()

    def for_layer(self, layer: torch.nn.Module, kernel, stock: type | None = None):
        modules = layer._modules
        attn, mlp = modules["self_attn"], modules["mlp"]
        if self.native is None or stock is not None:
            family = FAMILIES[(stock or type(layer)._hfs_stock).__name__]
            self.places, self.offset = _norm_places(family), family.norm_offset
        owners = {"layer": modules, "attn": attn._modules}
        norms = tuple(None if place is None else owners[place[0]][place[1]] for place in self.places)
        return self.get(kernel, attn, mlp, norms, self.offset)

    def get(self, kernel, attn: torch.nn.Module, mlp: torch.nn.Module, norms, norm_offset: bool = False):
        """The plan of q/k/v/o in ``attn`` and gate/up/down in ``mlp`` (``KernelLinear`` each) with ``norms``: the
        input, q, k, post-attention, pre-MLP and post-MLP RMSNorm modules (None where there is none)."""
        a, m = attn._modules, mlp._modules
        linears = (a["q_proj"], a["k_proj"], a["v_proj"], a["o_proj"], m["gate_proj"], m["up_proj"], m["down_proj"])
        if not all(type(lin) is KernelLinear for lin in linears):
            self.native = None  # a projection swapped for another module (a LoRA layer): the stock forward
            return None
        params = [lin._parameters["weight"] for lin in linears]
        params += [n._parameters["weight"] for n in norms if n is not None]
        # the weights as they are now, and their copies (another copy after optimize_for_cpu's weights= changed)
        stamp = tuple((p.data_ptr(), p._version) for p in params) + tuple(lin._hfs_blocked.serial for lin in linears)
        if (self.native is not None and stamp == self.stamp and self.modules[0] is attn and self.modules[1] is mlp
                and all(x is y for x, y in zip(self.modules[2] + self.modules[3], norms + linears))):
            return self.native
        if not all(lin.weight.dtype == torch.float32 for lin in linears):
            self.native = None  # cast to another dtype: the stock forward
            return None
        copies = [lin._hfs_blocked.get(lin.weight) for lin in linears]  # (blocked, scale) each
        config = attn.config
        act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
        eps = next(_norm_weight(n)[1] for n in norms if n is not None)
        self.native = kernel.layer_plan(
            [(blocked, lin.bias, scale, lin.out_features) for lin, (blocked, scale) in zip(linears, copies)],
            [None if n is None else n.weight.detach() for n in norms], norm_offset, float(eps), float(attn.scaling),
            config.num_attention_heads, config.num_key_value_heads, attn.head_dim, config.hidden_size,
            ACTIVATIONS[act])
        self.modules, self.stamp = (attn, mlp, tuple(norms), linears), stamp
        return self.native

    def __deepcopy__(self, memo: dict) -> "Plan":
        return Plan()

    def __getstate__(self) -> dict:
        return {"native": None, "modules": (), "stamp": ()}


def _norm_places(family: Family) -> tuple:
    """Where a layer of ``family`` keeps the plan's six norms: (``"layer"`` or ``"attn"``, name), None where absent."""
    return (("layer", "input_layernorm"), ("attn", "q_norm") if family.qk_norm else None,
            ("attn", "k_norm") if family.qk_norm else None,
            ("layer", "post_attention_layernorm") if family.sandwich else None,
            ("layer", "pre_feedforward_layernorm" if family.sandwich else "post_attention_layernorm"),
            ("layer", "post_feedforward_layernorm") if family.sandwich else None)


def _submodules(layer: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in layer.modules() if m is not layer]


class NativeLayer:
    """The forward of a native layer (mixed into a subclass of the layer's own class by :func:`use_native_layers`;
    ``_hfs_stock`` is that class)."""

    _hfs_stock: type

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        out = _native_forward(self, hidden_states, kwargs) if not args else None
        if out is None:
            return self._hfs_stock.forward(self, hidden_states, *args, **kwargs)
        return out


def native_rows() -> int:
    """The most rows (batch x tokens) a native forward takes: :data:`~..core.sdpa.CPU_ROWWISE_TOKENS` (the CPU
    attention's row-wise limit) where the kernel's products take that many on the few-row arithmetic
    (:func:`~.kernel.kernel_gemm`: larger trees and copies verified, short prompts prefilled, each row bitwise as
    plain decoding computes it), else the few-row code's :data:`~.kernel.MAX_ROWS`."""
    return sdpa.CPU_ROWWISE_TOKENS if _kernel.kernel_gemm() else MAX_ROWS


def _native_forward(layer, x: torch.Tensor, kwargs: dict) -> torch.Tensor | tuple | None:
    """The layer's output from the native calls, or None where this forward is not one they take."""
    attn = layer._modules["self_attn"]
    if (x.dim() != 3 or x.shape[0] * x.shape[1] > native_rows() or x.dtype != torch.float32 or x.device.type != "cpu"
            or layer.training or (torch.is_grad_enabled() and x.requires_grad) or kwargs.get("output_attentions")
            or attn.config._attn_implementation != sdpa.CPU_ATTENTION  # the user chose another
            or torch.compiler.is_compiling()):  # (a compiled forward traces the stock layer)
        return None
    rotary = kwargs.get("position_embeddings")
    if rotary is None and "position_embeddings_global" in kwargs:  # Gemma3 on 4.x: the table of the layer's kind
        rotary = kwargs["position_embeddings_local" if attn.is_sliding else "position_embeddings_global"]
    if rotary is None or rotary[0].dtype != torch.float32 or rotary[0].shape[-1] != attn.head_dim:
        return None  # partial rotary or no table
    mask = kwargs.get("attention_mask")
    if mask is not None and not (isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[1] == 1):
        return None  # a flex BlockMask, per-head masks
    if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return None
    if any(m._forward_hooks or m._forward_pre_hooks for m in layer._hfs_submodules):
        return None  # someone watches a submodule (output_attentions' recorders, a user's hook)
    kernel = _kernel._KERNEL or load_kernel()  # built: this layer was made native with it
    plan = layer._hfs_plan.for_layer(layer, kernel)
    if plan is None:
        return None
    cos, sin = rotary
    x = x.contiguous()
    q, k, v = kernel.attention_inputs(plan, x, cos, sin)  # [B, H, T, D], [B, Hkv, T, D]
    cache = kwargs.get(compat.cache_kwarg(), kwargs.get("past_key_values"))
    if cache is not None:
        k, v = compat.update_layer_cache(cache, k, v, attn.layer_idx, cos, sin, kwargs)
    if mask is None and k.shape[2] >= x.shape[1]:
        return _output(layer, kernel.layer_output(plan, x, q, k, v, None))
    if mask is not None and mask.shape[-1] == k.shape[2]:
        return _output(layer, kernel.layer_output(plan, x, q, k, v, _visible(mask).expand(x.shape[0], -1, -1)))
    # a mask the kernel's attention does not read as it is (another length than the keys): the attention of
    # optimize_for_cpu's CPU route (rows apart, as here), the rest of the layer native
    attended, _ = cpu_sdpa(attn, q, k, v, mask, scaling=attn.scaling, sliding_window=getattr(attn, "sliding_window", None))
    return _output(layer, kernel.layer_output(plan, x, None, None, None, None, attended))


def _output(layer, out: torch.Tensor) -> torch.Tensor | tuple:
    return (out,) if layer._hfs_returns_tuple else out


def use_native_layers(model: torch.nn.Module, enable: bool = True) -> tuple[int, list[str]]:
    """Give ``model``'s decoder layers the native forward (``enable``), or their own class back. Returns how many
    layers changed and, when enabling, the reasons some layers could not (one per kind)."""
    decoder = compat.decoder_of(model)
    if decoder is None:  # not a decoder stack: a drafter's own network is silent, a transformers model is told
        from transformers import PreTrainedModel

        known = isinstance(model, PreTrainedModel) and enable
        return 0, [f"{type(model).__name__} has no decoder stack of the families above"] if known else []
    layers = list(decoder.layers)
    changed, reasons = 0, []
    for layer in layers:
        stock = type(layer).__dict__.get("_hfs_stock")
        if not enable:
            if stock is not None:
                _drop(layer, stock)
                changed += 1
            continue
        if stock is not None:
            continue  # native already (a draft model follows its target's layout at every call): nothing to redo
        reason = why_not(layer)
        if reason is not None:
            if reason not in reasons:
                reasons.append(reason)
            continue
        plan, refused = Plan(), "its products are not all on the kernel"
        try:  # built now: a layer the plan refuses keeps its own forward, said here, not at generate time
            built = plan.for_layer(layer, load_kernel(), type(layer))
        except RuntimeError as err:
            built, refused = None, str(err).splitlines()[0]
        if built is None:
            reason = f"its plan was refused ({refused})"
            if reason not in reasons:
                reasons.append(reason)
            continue
        layer.__class__ = _native_class(type(layer))
        layer._hfs_plan = plan
        layer._hfs_submodules = _submodules(layer)
        layer._hfs_returns_tuple = "position_embeddings_global" in inspect.signature(stock_forward(layer)).parameters
        changed += 1
    return changed, reasons


def _drop(layer: torch.nn.Module, stock: type) -> None:
    layer.__class__ = stock
    for name in ("_hfs_plan", "_hfs_submodules", "_hfs_returns_tuple"):
        layer.__dict__.pop(name, None)


def stock_forward(layer: torch.nn.Module):
    return type(layer).__dict__.get("_hfs_stock", type(layer)).forward


_CLASSES: dict[type, type] = {}


def _native_class(stock: type) -> type:
    """``Native<stock>``: a subclass of the layer's own class with :class:`NativeLayer`'s forward, one per class,
    found by pickle under this module's name (:func:`__getattr__`)."""
    if stock not in _CLASSES:
        _CLASSES[stock] = type(f"Native{stock.__name__}", (NativeLayer, stock),
                               {"_hfs_stock": stock, "__module__": __name__, "__qualname__": f"Native{stock.__name__}"})
    return _CLASSES[stock]


def __getattr__(name: str) -> type:
    """``Native<stock>`` by name, for pickle (``torch.save(model)``; copies): made from transformers' class."""
    stock_name = name[len("Native"):] if name.startswith("Native") else None
    if stock_name in _FOLDERS:
        import importlib

        folder = _FOLDERS[stock_name]
        module = importlib.import_module(f"transformers.models.{folder}.modeling_{folder}")
        return _native_class(getattr(module, stock_name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def native_layers(model: torch.nn.Module) -> int:
    """How many of ``model``'s decoder layers have the native forward."""
    decoder = compat.decoder_of(model)
    return 0 if decoder is None else sum(isinstance(layer, NativeLayer) for layer in decoder.layers)


# -- a drafter's own Llama-shaped layer (EAGLE's) -------------------------------------------------------------------
def drafter_kernel(x: torch.Tensor, attn: torch.nn.Module):
    """The built kernel when a drafter layer's forward over ``x`` `[B, T, in]` can take the native calls (fp32 rows up
    to :func:`native_rows`, no gradients, not compiling, a SiLU MLP, a head dim the kernel's attention takes); else
    None (the layer's PyTorch operators). Whether its products are fp32 weights on the kernel, :meth:`Plan.get` says
    (None)."""
    if (_kernel._KERNEL is None or x.dim() != 3 or x.shape[0] * x.shape[1] > native_rows() or x.dtype != torch.float32
            or x.device.type != "cpu" or (torch.is_grad_enabled() and x.requires_grad)
            or torch.compiler.is_compiling()):
        return None
    act = getattr(attn.config, "hidden_act", None)
    if act not in ACTIVATIONS or attn.head_dim % 8 or attn.head_dim > 128:
        return None
    return _kernel._KERNEL


def kernel_mask(mask: torch.Tensor | None, batch: int, rows: int, keys: int) -> tuple[bool, torch.Tensor | None]:
    """A drafter's bool mask (`[T, S]` or `[B, T, S]`, True = seen; None = causal) as the kernel's attention reads
    it: ``(True, [B, T, S] or None)``, or ``(False, None)`` where it cannot (another length than the keys)."""
    if mask is None:
        return keys >= rows, None
    if mask.dtype != torch.bool or mask.shape[-1] != keys or mask.dim() not in (2, 3):
        return False, None
    return True, (mask[None] if mask.dim() == 2 else mask).expand(batch, rows, keys)
