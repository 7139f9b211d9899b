"""DFlash drafters on disk: read transformers'/Meta's and z-lab's formats, write z-lab's.

Sources of the formats (read for facts; no code is executed or copied, ``trust_remote_code`` is never involved):

* transformers / Meta (``model_type: "muse_glimmer_assistant"``, ``architectures: ["MuseGlimmerAssistantModel"]``):
  transformers 5.24 ``models/muse_glimmer_assistant/configuration_muse_glimmer_assistant.py`` (flat fields, defaults
  RoPE theta 5e5, eps 1e-5, all layers ``sliding_attention`` with window 2048, transformers' ``|q - k| <= w``) and
  ``modeling_muse_glimmer_assistant.py`` (keys ``encoder.fc.weight``, ``encoder.output_norm_enc.weight``, ``norm``,
  ``layers.N.*``); z-lab/dflash ``tests/fixtures/assistant-config.json`` and ``assistant-safetensors-header.json``.
* z-lab DFlash v1 (``architectures: ["DFlashDraftModel"]``, ``model_type: "qwen3"``; e.g. z-lab/Qwen3-8B-DFlash-b16):
  z-lab/dflash ``model/dflash.py`` and ``dflash/model.py``: the Qwen3 fields, ``num_target_layers``, ``block_size``
  (top level or in ``dflash_config``), ``dflash_config: {target_layer_ids, mask_token_id, is_causal,
  input_embedding_scale}``; keys ``fc.weight``, ``hidden_norm.weight``, ``norm``, ``layers.N.*`` (Meta's but for those
  two, as z-lab's ``tests/test_muse_glimmer_adapter.py`` remaps). Its sliding layers see ``|q - k| < w`` and are
  causal unless ``is_causal`` says otherwise; it embeds the window by a raw table lookup times
  ``input_embedding_scale``. ``DFlash2DraftModel`` (convolutions, a candidate selector) is refused.

We write z-lab's format (``save_pretrained``), the one vLLM's and SGLang's DFlash support reads; a drafter that embeds
with the target's embedding module (transformers' semantics, ``embed_scale=None``) records that as
``dflash_config.embed_with_module`` (readers other than ours ignore it: they differ only for scaled embeddings such as
Gemma's).

A reduced draft vocabulary (``DFlashDraftModel.set_draft_vocab``) is ours: z-lab's format has no field for one, so
it is written beside the weights as ``draft_vocab.safetensors`` holding one int64 tensor ``d2t`` `[N]` in EAGLE-3's
convention (target id = draft id + d2t[draft id]); other readers ignore the file and draft over the full vocabulary.

Weights are safetensors only; config.json is untrusted (types, ranges and sizes checked before anything is
built, files confined to the folder, see ``drafters/checkpoints.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ... import compat
from .. import checkpoints as files
from ...options import escaped, shown
from ..checkpoints import MANIFEST, CheckpointError, check_manifest, find_folder, shipped_names
from .config import DFlashConfig
from .model import DFlashDraftModel

__all__ = [
    "FORMATS",
    "MANIFEST",
    "CheckpointError",
    "check_manifest",
    "find_folder",
    "load_checkpoint",
    "load_drafter",
    "read_config",
    "save_pretrained",
    "shipped_names",
]

FORMATS = ("transformers", "z-lab")
SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
META_RENAMES = {"encoder.fc.weight": "fc.weight", "encoder.output_norm_enc.weight": "hidden_norm.weight"}
IGNORED = ("rotary_emb.inv_freq",)  # a non-persistent buffer some exports keep
DRAFT_VOCAB = "draft_vocab.safetensors"
MAX_DRAFT_VOCAB = 1 << 20  # ids; more than any tokenizer here (Gemma's 262k) and far below a file that could hurt


def detect(cfg: dict) -> str:
    """The format of a config.json's object: ``"transformers"`` or ``"z-lab"``."""
    architectures = cfg.get("architectures") or []
    if not isinstance(architectures, list):
        architectures = []
    if "DFlash2DraftModel" in architectures:
        raise CheckpointError("This is a z-lab DFlash2 drafter (DFlash2DraftModel: convolutions and a candidate "
                              "selector), which hf_speculative does not run; use a DFlash v1 drafter "
                              "(DFlashDraftModel) or transformers' MuseGlimmerAssistantModel format.")
    if cfg.get("model_type") == "muse_glimmer_assistant" or "MuseGlimmerAssistantModel" in architectures:
        return "transformers"
    if "DFlashDraftModel" in architectures or "dflash_config" in cfg:
        return "z-lab"
    looks = _other_kind(cfg, architectures)
    raise CheckpointError(f"config.json is neither transformers' DFlash format (model_type 'muse_glimmer_assistant') "
                          f"nor z-lab's (architectures ['DFlashDraftModel'] with a dflash_config); it says model_type "
                          f"{shown(cfg.get('model_type'))}, architectures {shown(architectures)}.{looks}")


def _other_kind(cfg: dict, architectures: list) -> str:
    """A hint when a folder of another drafter kind was given to the DFlash loader (a user's easy mistake)."""
    fmt = cfg.get("format")
    if fmt == "hf_speculative.eagle" or "eagle_config" in cfg or any("Eagle" in str(a) for a in architectures):
        return " It looks like an EAGLE drafter: load it with hfs.Eagle.from_pretrained(folder)."
    if fmt == "hf_speculative.medusa" or "medusa_num_heads" in cfg:
        return " It looks like Medusa heads: load them with hfs.Medusa.from_pretrained(folder)."
    return ""


def _rope_theta(cfg: dict, default: float) -> float:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if params is not None:
        if not isinstance(params, dict):
            raise CheckpointError(f"rope_parameters must be an object, got {shown(params)}.")
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            raise CheckpointError(f"rope type {shown(kind)} is not supported by hf_speculative's DFlash drafter "
                                  "(default RoPE only).")
        if "rope_theta" in params:
            return params["rope_theta"]
    return cfg.get("rope_theta", default)


def _common(cfg: dict) -> dict:
    heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        head_dim = hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 else heads
    return dict(hidden_size=hidden, num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=heads,
                num_key_value_heads=cfg.get("num_key_value_heads", heads), head_dim=head_dim,
                intermediate_size=cfg["intermediate_size"], hidden_act=cfg.get("hidden_act", "silu"),
                max_position_embeddings=cfg.get("max_position_embeddings", 32768))


def read_config(fmt: str, cfg: dict) -> DFlashConfig:
    """The :class:`DFlashConfig` a config.json of ``fmt`` describes (validated by its constructor)."""
    if fmt == "transformers":
        layers = cfg["num_hidden_layers"]
        types = cfg.get("layer_types")
        if types is None and isinstance(layers, int) and 0 < layers <= 64:
            types = ["sliding_attention"] * layers  # transformers' default
        return DFlashConfig(**_common(cfg), target_layer_ids=cfg.get("target_layer_ids") or [1, 13, 25, 37, 49],
                            block_size=cfg.get("block_size", 16), mask_token_id=cfg.get("mask_token_id", 201818),
                            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5), rope_theta=_rope_theta(cfg, 500000.0),
                            layer_types=types, sliding_window=cfg.get("sliding_window", 2048))
    extra = cfg.get("dflash_config")
    if not isinstance(extra, dict):
        raise CheckpointError("its dflash_config must be an object holding target_layer_ids and mask_token_id.")
    for name in ("target_layer_ids", "mask_token_id"):
        if name not in extra:
            raise CheckpointError(f"its dflash_config lacks {name}, which a z-lab DFlash drafter needs.")
    for name, neutral in (("output_multiplier", 1.0), ("final_logit_softcapping", None)):
        if extra.get(name, cfg.get(name, neutral)) not in (neutral, None):
            raise CheckpointError(f"its {name} ({shown(extra.get(name, cfg.get(name)))}) is a DFlash2 feature "
                                  "hf_speculative does not apply.")
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    sliding = isinstance(types, list) and "sliding_attention" in types
    if sliding and isinstance(window, int) and window >= 1:
        window -= 1  # z-lab's |q - k| < w is |q - k| <= w - 1
    causal = extra.get("is_causal", cfg.get("is_causal"))
    if causal is None:  # z-lab: sliding layers causal, full ones bidirectional
        if sliding and isinstance(types, list) and "full_attention" in types:
            raise CheckpointError("it mixes causal sliding layers with bidirectional full ones (is_causal unset), "
                                  "which hf_speculative's DFlash drafter does not run.")
        causal = sliding
    scale = extra.get("input_embedding_scale", cfg.get("input_embedding_scale", 1.0))
    embed_scale = None if extra.get("embed_with_module") is True else scale
    return DFlashConfig(**_common(cfg), target_layer_ids=extra["target_layer_ids"],
                        block_size=extra.get("block_size", cfg.get("block_size", 16)),
                        mask_token_id=extra["mask_token_id"], vocab_size=cfg.get("vocab_size"),
                        num_target_layers=cfg.get("num_target_layers"), rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                        rope_theta=_rope_theta(cfg, 1_000_000.0), attention_bias=cfg.get("attention_bias", False),
                        layer_types=types if sliding else None, sliding_window=window if sliding else None,
                        causal=causal, embed_scale=embed_scale)


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    """Safetensors only: ``model.safetensors``, or its index with safetensors shards of this folder."""
    if (directory / SAFETENSORS[0]).exists():
        return files.read_weights_file(directory, SAFETENSORS[0])
    index = directory / SAFETENSORS[1]
    if not index.exists():
        raise CheckpointError(f"No weights in {escaped(directory)}: a DFlash drafter is read from "
                              f"{' or '.join(SAFETENSORS)} only (safetensors; pickled .bin files are not read).")
    weight_map = files.read_json(directory, SAFETENSORS[1]).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v.endswith(".safetensors")
                                                   for v in weight_map.values()):
        raise CheckpointError(f"{escaped(index)}: its weight_map must map weight names to .safetensors shards.")
    return files.read_weights(directory)  # shards confined to the folder


def validate_state_dict(config: DFlashConfig, state: dict[str, torch.Tensor], source: str) -> None:
    """Raise :class:`CheckpointError` unless ``state`` has exactly the keys, shapes and kinds of dtype ``config``
    describes."""
    with torch.device("meta"):
        expected = DFlashDraftModel(config).state_dict()
    problems = files.state_dict_problems(expected, state, "drafter")
    if problems:
        raise CheckpointError(
            f"{source} does not match the drafter its config describes ({config.num_hidden_layers} layers, hidden "
            f"{config.hidden_size}, {config.num_attention_heads}/{config.num_key_value_heads} heads of "
            f"{config.head_dim}, intermediate {config.intermediate_size}, {len(config.target_layer_ids)} target "
            f"layers): " + "; ".join(problems) + ". Use the config.json saved with these weights.")


def load_checkpoint(path: str | Path, *, dtype: torch.dtype | None = None, target_config: Any = None,
                    sha256: dict[str, str] | None = None) -> tuple[DFlashConfig, dict[str, torch.Tensor], str]:
    """Read a DFlash drafter folder of either format: ``(config, state dict in our names, format)``. With
    ``target_config``, a drafter that does not fit the target is refused first, naming both sides."""
    directory, cfg, state = files.read_checkpoint(path, sha256, _weights)
    config_path = directory / "config.json"
    fmt = files.checked_read(lambda: detect(cfg), config_path, "DFlash")
    config = files.checked_read(lambda: read_config(fmt, cfg), config_path, fmt)
    if target_config is not None:
        try:
            config.check_target(target_config)
        except ValueError as error:
            raise CheckpointError(f"{escaped(directory)} ({fmt}): {escaped(error, 2000)}") from None
    if fmt == "transformers":
        state = {META_RENAMES.get(k, k): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if k not in IGNORED}
    validate_state_dict(config, state, f"The checkpoint {escaped(directory)} ({fmt})")
    return config, files.cast(state, dtype), fmt


def load_drafter(path: str | Path, *, dtype: torch.dtype | None = None, target_config: Any = None,
                 sha256: dict[str, str] | None = None) -> DFlashDraftModel:
    """:func:`load_checkpoint` into a ready network (eval mode, no gradients), with the folder's draft vocabulary
    when it has one (:func:`read_draft_vocab`). Built with its constructor, never ``to_empty``: the rotary
    embedding's ``inv_freq`` is not in the state dict."""
    config, state, _ = load_checkpoint(path, dtype=dtype, target_config=target_config, sha256=sha256)
    vocab = read_draft_vocab(files.checkpoint_dir(path))
    known = config.vocab_size if target_config is None else int(compat.text_config(target_config).vocab_size)
    if vocab is not None and known is not None and int(vocab.max()) >= known:
        # known here: refused at load rather than at the first attach (the target's embedding would be indexed past)
        raise CheckpointError(f"{escaped(files.checkpoint_dir(path) / DRAFT_VOCAB)}: its d2t maps a draft id to the "
                              f"target id {int(vocab.max())}, outside the vocabulary of {known} (the "
                              f"{'config.json vocab_size' if target_config is None else 'target'}'s). It was made for "
                              "another tokenizer: write it again with the drafter's save_pretrained, or remove it to "
                              "draft over the whole vocabulary.")
    net = DFlashDraftModel(config)
    net.load_state_dict(state, strict=True)
    net = (net.to(dtype) if dtype is not None else net).eval().requires_grad_(False)
    net.set_draft_vocab(vocab)
    return net


def read_draft_vocab(directory: Path) -> torch.Tensor | None:
    """The target ids `[N]` of ``directory``'s ``draft_vocab.safetensors`` (``None`` without one): a file of the
    folder (a symlink out of it is refused), sized for at most ``MAX_DRAFT_VOCAB`` ids before it is read, holding
    exactly ``d2t``, int64, 1-D, whose target ids are distinct and non-negative (against the target's vocabulary
    when the drafter attaches: ``drafter.check_fits``)."""
    path = files.folder_file(directory, DRAFT_VOCAB, "the draft vocabulary")
    if not path.exists():
        return None
    files.check_weights_file(directory, DRAFT_VOCAB)
    limit = 8 * MAX_DRAFT_VOCAB + (1 << 16)  # the ids and a header
    if path.stat().st_size > limit:
        raise CheckpointError(f"{escaped(path)} has {path.stat().st_size} bytes, more than a draft vocabulary of "
                              f"{MAX_DRAFT_VOCAB} ids takes ({limit}): not a draft vocabulary. Remove it, or write it "
                              "again with the drafter's save_pretrained.")
    tensors = files.read_weights_file(directory, DRAFT_VOCAB)
    d2t = tensors.get("d2t")
    if set(tensors) != {"d2t"} or d2t.dim() != 1 or d2t.dtype != torch.int64 or not 1 <= d2t.numel():
        found = ", ".join(f"{shown(k)} {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in
                          list(tensors.items())[:4])
        raise CheckpointError(f"{escaped(path)} must hold exactly one tensor, d2t (int64, 1-D, target id = draft id + "
                              f"d2t[draft id]); it holds {found or 'nothing'}. Write it again with the drafter's "
                              "save_pretrained.")
    ids = torch.arange(d2t.numel()) + d2t
    if int(ids.min()) < 0 or ids.unique().numel() != ids.numel():
        raise CheckpointError(f"{escaped(path)}: its target ids (draft id + d2t) must be distinct and non-negative. "
                              "Write it again with the drafter's save_pretrained.")
    return ids


def zlab_config(config: DFlashConfig, dtype: torch.dtype | None = None) -> dict:
    """The z-lab ``config.json`` of a drafter (Qwen3 fields, ``dflash_config``); no ``auto_map``: nothing to execute."""
    extra: dict[str, Any] = {"target_layer_ids": list(config.target_layer_ids), "mask_token_id": config.mask_token_id,
                             "block_size": config.block_size, "is_causal": config.causal}
    if config.embed_scale is None:
        extra["embed_with_module"] = True
    else:
        extra["input_embedding_scale"] = config.embed_scale
    cfg: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers, "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size, "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta, "rope_scaling": None,
        "max_position_embeddings": config.max_position_embeddings, "attention_bias": config.attention_bias,
        "tie_word_embeddings": False, "block_size": config.block_size, "dflash_config": extra,
    }
    if config.layer_types is not None and "sliding_attention" in config.layer_types:
        cfg["layer_types"] = list(config.layer_types)
        cfg["sliding_window"] = config.sliding_window + 1  # ours is |q - k| <= w, z-lab's < w
        cfg["use_sliding_window"] = True
    if config.vocab_size is not None:
        cfg["vocab_size"] = config.vocab_size
    if config.num_target_layers is not None:
        cfg["num_target_layers"] = config.num_target_layers
    if dtype is not None:
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    return cfg


def save_pretrained(net: DFlashDraftModel, directory: str | Path) -> Path:
    """Write ``net`` in z-lab's format (``config.json`` and ``model.safetensors``, dtype kept): what vLLM and SGLang
    load as a DFlash drafter, and what :func:`load_checkpoint` reads back. Returns the folder."""
    state = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    dtype = next(iter(state.values())).dtype
    out = files.write_folder(directory, zlab_config(net.config, dtype), state)
    write_draft_vocab(out, net.draft_vocab)
    return out


def write_draft_vocab(directory: str | Path, target_ids: torch.Tensor | None) -> None:
    """Write ``target_ids`` `[N]` as ``directory``'s ``draft_vocab.safetensors`` (``d2t``); ``None`` removes the file,
    so that a folder written again without a vocabulary does not get the old one back on load."""
    path = Path(directory) / DRAFT_VOCAB
    if target_ids is None:
        path.unlink(missing_ok=True)
        return
    from safetensors.torch import save_file

    ids = target_ids.detach().cpu().long()
    save_file({"d2t": (ids - torch.arange(ids.numel())).contiguous()}, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # readable as the weights are (safetensors writes its file private)


def to_transformers(net: DFlashDraftModel) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(config fields, state dict)`` of ``net`` in transformers' ``MuseGlimmerAssistantModel`` terms (tests compare
    the two networks on the same weights; only a drafter with transformers' semantics maps: bidirectional, embedded
    with the module)."""
    config = net.config
    if config.causal or config.embed_scale is not None:
        raise ValueError("transformers' MuseGlimmerAssistantModel is bidirectional and embeds with the target's "
                         "module: this drafter (causal or raw-embedding) has no equivalent there.")
    fields = dict(hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
                  num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
                  head_dim=config.head_dim, intermediate_size=config.intermediate_size,
                  rms_norm_eps=config.rms_norm_eps, max_position_embeddings=config.max_position_embeddings,
                  hidden_act=config.hidden_act, block_size=config.block_size, mask_token_id=config.mask_token_id,
                  target_layer_ids=list(config.target_layer_ids),
                  layer_types=list(config.layer_types or ["full_attention"] * config.num_hidden_layers),
                  sliding_window=config.sliding_window or 2048,
                  rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta})
    renames = {v: k for k, v in META_RENAMES.items()}
    return fields, {renames.get(k, k): v for k, v in net.state_dict().items()}

