"""Classic two-model speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a smaller
model with the same tokenizer drafts, the target verifies. With another tokenizer, given as ``tokenizer=`` beside the
target's ``target_tokenizer=``, the drafts go through text (other_tokenizer.py)."""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import torch

from ... import compat
from ...core import kv_cache
from ...core.chain_drafting import draft_chain
from ...cpu.kernel import WEIGHTS
from ...cpu.layout import follow_layout
from ...core.draft_guide import DraftGuide
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..generator import TreeOrChainCandidateGenerator
from ..registry import Capabilities, SpecFiles, example_label
from ...core.costs import draft_price, record_accept_rate, record_draft_step
from ...options import CheckedOnAssignment, shown
from ...registry import integrity
from ...core.state import state_of
from ...core.tree import DraftTree
from ...core.tree_shapes import DynamicTree, StaticTree, drafter_levels, grow_tree
from .feed import LONG_CATCH_UP, feed, size_ratio
from .other_tokenizer import OtherTokenizerCandidateGenerator, TokenizerBridge, bridge_for, check_tokenizer
from .saved_tokenizers import SPEC_OPTION, TOKENIZER_FILES, load_tokenizers, read_tokenizer, save_tokenizers
from .tree import model_tree_expander
from ...core.budget import Plan
from ...core.policy import check_chain_options


@dataclasses.dataclass(eq=False)
class DraftModel(CheckedOnAssignment, DraftStrategy, method="draft-model",
                 capabilities=Capabilities(trees=True, batch=True),
                 examples=("draft-model", "draft-model-copy", "draft-model-tree"),
                 live_fields=("model", "tokenizer", "target_tokenizer"),
                 # a spec names the draft model (its registry name, or its folder inside the model's); one loaded
                 # from elsewhere is saved beside the model first, into draft-model/
                 files=SpecFiles(network="model", subfolder="draft-model"),
                 # recorded by a spec beyond the fields: both tokenizers are kept with the model (saved_tokenizers.py)
                 spec_only_options={SPEC_OPTION: False}):
    """Draft with a smaller model that shares the target's tokenizer.

    The drafter keeps its own KV cache for the whole call and rolls it back to the verified
    prefix after every target forward. The draft stops early when the drafter is unsure (its
    probability of the token it chose falls below ``confidence_threshold``), and the longest draft
    adapts to what gets accepted. Under sampling it samples from its own processed distribution
    and hands exactly those logits to the rejection sampler, so the output follows the target's
    distribution exactly.

    Args:
        model (`PreTrainedModel`): the drafter, on the target's device. After ``hfs.optimize_for_cpu(target)`` its
            fp32 CPU weights are laid out as the target's at the first call (the kernel's copy of them included), so
            that its steps take the same fast path.
        num_tokens (`int`, defaults to 16): the longest draft (the confidence rule usually stops earlier).
        confidence_threshold (`float`, defaults to 0.3): stop drafting after a token whose drafter
            probability is below this (0 disables).
        adaptive (`bool`, defaults to `True`): grow the longest draft by 2 after a fully accepted
            draft, shrink it by 1 otherwise (within ``[1, num_tokens]``).
        draft_cost (`float`, *optional*): the cost of one drafter forward in target forwards
            (e.g. 0.1); by default it is measured during the calls (and, until measured, taken as
            the ratio of the two models' parameter counts).
        tokenizer / target_tokenizer (*optional*): the drafter's and the target's tokenizers. When the
            drafter's spells some token otherwise than the target's, the drafter drafts across tokenizers
            (universal assisted generation: its drafts are decoded to text and encoded with the target's tokenizer;
            chains only). When they agree (or are not given) the drafter's ids are the target's; without them the
            check compares vocabulary sizes and special tokens, and the tokenizers saved beside both models when
            both were loaded from local folders. A model saved with a drafter drafting across tokenizers as its
            default keeps both tokenizers in its folder, and loads them back (saved_tokenizers.py).
        tree (`DynamicTree` or `StaticTree`, *optional*): draft a tree of the draft model's top guesses, verified
            in one forward by hf_speculative's own loop: ``hfs.DynamicTree(nodes, depth, top_k)`` expands the
            ``top_k`` likeliest nodes of each depth (one drafter forward per depth, with a tree attention mask
            over the drafter's own cache) and keeps the best ``nodes``; ``hfs.StaticTree(paths)`` drafts fixed
            rank paths. With ``adaptive`` the node count per step (0 included) follows the measured verification
            cost and what trees kept. ``None``: chains. The draft model's attention must take a tree mask (SDPA
            or eager).
        kernel_weights (`str`, defaults to `"exact"`): on a target that runs hf_speculative's CPU kernel
            (``hfs.optimize_for_cpu(target)``), what the drafter's kernel copies hold: `"exact"`, the drafter's own
            values (in bf16 where that is exact, as for Qwen2.5's checkpoints); `"int8"`, int8 weights with one
            scale per output column, a quarter of the fp32 bytes per drafting step (the drafts change a little,
            the output not at all: the target verifies them). Measured on the Qwen2.5-Coder 1.5B/0.5B pair (bf16
            checkpoints): 1.03× greedy with int8 (τ 2.45) against 1.02× exact (τ 2.66), a tie; a drafter whose exact
            copy is fp32 reads 4× fewer bytes with int8 instead of 2× (not measured). Elsewhere it does nothing.
    """

    model: torch.nn.Module = dataclasses.field(repr=False)
    num_tokens: int = 16
    confidence_threshold: float = 0.3
    adaptive: bool = True
    tokenizer: Any = dataclasses.field(default=None, repr=False)
    target_tokenizer: Any = dataclasses.field(default=None, repr=False)
    draft_cost: float | None = None
    tree: DynamicTree | StaticTree | None = None
    kernel_weights: str = "exact"

    def __post_init__(self):
        if not hasattr(self.model, "config") or not callable(self.model):
            raise TypeError(f"DraftModel(model=...) needs a transformers causal LM, got {type(self.model).__name__}.")
        check_chain_options(self)
        if self.kernel_weights not in WEIGHTS:
            raise ValueError(f"DraftModel(kernel_weights={shown(self.kernel_weights)}): use one of {WEIGHTS}.")
        if self.tree is not None and not isinstance(self.tree, (DynamicTree, StaticTree)):
            raise ValueError(f"DraftModel(tree={shown(self.tree)}): use hfs.DynamicTree(nodes=..., depth=..., "
                             f"top_k=...), hfs.StaticTree(paths) or None for chains.")
        for field in ("tokenizer", "target_tokenizer"):
            if getattr(self, field) is not None:
                check_tokenizer("DraftModel", field, getattr(self, field))
        if self.tree is not None and self.other_tokenizer():
            raise ValueError("DraftModel(tree=...) drafts trees with the target's tokenizer only: the drafter's "
                             "tokenizer differs from the target's here, and its drafts are chains (tree=None).")

    def other_tokenizer(self) -> TokenizerBridge | None:
        """The bridge between the two tokenizers when both are given and the drafter's differs from the target's
        (it drafts across tokenizers), else ``None`` (compared once per pair of tokenizers)."""
        if self.tokenizer is None or self.target_tokenizer is None:
            return None
        return bridge_for(self.tokenizer, self.target_tokenizer)

    def validate_target(self, target: torch.nn.Module) -> None:
        # checked once per pair of models: loading two tokenizers to compare them takes seconds, and
        # strategies are rebuilt per call by the benchmark and the app
        checked = state_of(target).checked
        across = self.other_tokenizer() is not None  # (the tokenizers' check is remembered per pair, not here)
        if self.model in checked and not across:
            return
        if self.model is target:
            raise ValueError("DraftModel(model=...) is the target itself; use a smaller model (or hfs.EarlyExit).")
        draft_device, target_device = _device_of(self.model), _device_of(target)
        if draft_device != target_device:
            raise ValueError(
                f"The draft model is on {draft_device} and the target on {target_device}; move the draft model "
                f"with draft.to({str(target_device)!r})."
            )
        if across:
            return
        check_same_vocabulary(target, self.model, self.target_tokenizer, self.tokenizer)
        if self.tree is not None:
            from ...core.verify import check_tree_attention

            check_tree_attention(self.model)  # the drafter's own forwards take a tree mask too
        checked.add(self.model)

    def open(self, ctx: CallContext) -> DraftModelCandidateGenerator | OtherTokenizerCandidateGenerator:
        # after hfs.optimize_for_cpu(target): the drafter's steps take the same fast path (with the kernel, a second
        # copy of its weights, as the target's); a drafter already laid out, or a target that is not, is left alone
        follow_layout(self.model, ctx.target, self.kernel_weights)
        bridge = self.other_tokenizer()
        if bridge is not None:
            return OtherTokenizerCandidateGenerator(ctx, self, bridge)
        return DraftModelCandidateGenerator(ctx, self)

    # -- its spec (hf/spec.py) and its examples ----------------------------------------------------------
    def spec_path(self) -> str | None:
        name = getattr(self.model, "name_or_path", "")
        return str(name) if name else None

    def spec_network(self) -> torch.nn.Module:
        return self.model

    def spec_save_beside(self, directory: os.PathLike, path: str) -> dict:
        """After the spec named the draft model by ``path``: when it drafts across tokenizers, write both tokenizers
        with the model saved in ``directory`` (saved_tokenizers.py); the options that records."""
        if self.other_tokenizer() is None:
            return {}
        return save_tokenizers(self, Path(directory), path, "generation_config.candidate_generator.path")

    @classmethod
    def spec_load_beside(cls, options: dict, path: str, base_dir: Any, where: str) -> dict:
        """The spec's ``options`` with the tokenizers it keeps beside the model (``across_tokenizers``) read back."""
        return load_tokenizers(options, path, base_dir, where)

    @classmethod
    def from_spec_options(cls, method: str, options: dict, network=None) -> "DraftModel":
        return cls(network, **options)

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> "DraftModel":
        """``"draft-model"``: a random sibling of ``target`` (mostly wrong), chains; ``"draft-model-copy"``: a copy of
        ``target`` (always right); ``"draft-model-tree"``: the sibling drafting trees 3 wide. Fixed lengths."""
        label = example_label(cls, label)
        if label == "draft-model-copy":
            return cls(**{"model": copy_of(target), "confidence_threshold": 0.0, "adaptive": False, **options})
        tree = DynamicTree(nodes=8, depth=4, top_k=3) if label == "draft-model-tree" else None
        return cls(**{"model": random_sibling(target), "adaptive": False, "tree": tree, **options})


class DraftModelCandidateGenerator(TreeOrChainCandidateGenerator):
    """Per-call state: the drafter's cache, and the costs and calibration behind the draft length.

    Drafting token ``i`` pays when the chance that the whole draft up to it is accepted (the
    product of the drafter's confidences, calibrated against what was really accepted) exceeds
    its price in target forwards: one drafter forward plus the extra cost of verifying one more
    token, both measured during the call. When even the first token does not pay for several
    steps, drafting pauses (1, 2, 4, ... 32 steps) and the drafter catches up later in one forward.
    """

    def __init__(self, ctx: CallContext, config: DraftModel):
        super().__init__(ctx)
        self.config = config
        self.drafter = config.model
        self.cache = kv_cache.new_dynamic_cache()
        self.fed: list[int] = []  # tokens whose keys/values are in self.cache
        self._synced = 0  # self.fed[:_synced] is known to equal the verified sequence
        self._keep_last = compat.logits_to_keep_kwargs(self.drafter, 1)
        self._size_ratio = size_ratio(self.drafter, ctx.target)
        self._size_tree_or_chain(ctx, config)

    def _forward(self, tokens: list[int], device: torch.device) -> torch.Tensor:
        """Feed ``tokens`` to the drafter; its logits for the next position `[V_target]` (float32)."""
        return self._to_target_vocab(feed(self, tokens, device))

    def _rollback(self, input_ids: torch.LongTensor) -> int:
        """Crop the drafter's cache to the longest prefix it shares with the verified sequence."""
        length = input_ids.shape[1]
        tail = input_ids[0, self._synced : len(self.fed)].tolist()
        common = self._synced
        for fed_token, true_token in zip(self.fed[self._synced :], tail):
            if fed_token != true_token:
                break
            common += 1
        common = min(common, length - 1)  # the last token must be fed again for its logits
        compat.crop_cache(self.cache, len(self.fed) - common)
        del self.fed[common:]
        self._synced = common
        return common

    def _draft_price(self) -> float:
        """One drafter forward, in target forwards."""
        # until measured: forwards cost in proportion to parameters
        return draft_price(self.drafter, self.verify_costs, self.config.draft_cost, self._size_ratio)

    def _catch_up_pays(self, plan: Plan, tokens: int, length: int) -> bool:
        """Whether feeding the drafter the ``tokens`` it has not seen (the prompt, at the first draft) can be won back
        over the rest of the call (``Plan.catch_up_pays``: the budget left, and about as many tokens as the call
        has generated so far), its cost measured per token by earlier catch-ups of this drafter, at the acceptance
        of its earlier calls until this one has drafted. Short catch-ups, and any before one has been measured, go
        ahead."""
        if tokens < LONG_CATCH_UP:  # most steps: a token or a few since the last draft
            return True
        state = state_of(self.drafter)
        per_token, step = state.catch_up_token_s, self.verify_costs.seconds(0)
        if per_token is None or not step:
            return True
        generated = None if self.ctx.prompt_length is None else length - self.ctx.prompt_length
        return plan.catch_up_pays(tokens * per_token / step, self.ctx.max_length - length, state.accept_rate,
                                  generated)

    def _chain(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        common = self._rollback(sequence)  # (only crops the drafter's cache)
        # a prefill that the rest of the call cannot win back (a long prompt, a short budget): draft nothing, before
        # the chain rule is asked, so that it counts as no attempt
        if not self._catch_up_pays(plan, sequence.shape[1] - common, sequence.shape[1]):
            return DraftTree.empty(sequence.device)
        if not plan.start_chain():
            return DraftTree.empty(sequence.device)
        logits = self._forward(sequence[0, common:].tolist(), sequence.device)
        self._synced = sequence.shape[1]
        return draft_chain(plan, self.ctx, sequence, logits, plan.depth,
                           lambda token: self._forward([token], sequence.device))

    def _tree(self, input_ids: torch.LongTensor, nodes: int, plan: Plan) -> DraftTree:
        """One step's draft tree of at most ``nodes`` nodes (the ``tree=`` shape grown from the drafter's beliefs)."""
        start = time.perf_counter()
        common = self._rollback(input_ids)
        root = self._forward(input_ids[0, common:].tolist(), input_ids.device)  # [V] logits
        self._synced = input_ids.shape[1]
        expand, crop = model_tree_expander(self.drafter, self.cache, self._to_target_vocab)
        try:
            tree = grow_tree(self.config.tree, root, expand, nodes, plan.depth,
                             DraftGuide(self.ctx.logits_processor, input_ids))  # the call's processors per node
        finally:
            crop()  # the cache keeps verified tokens only (self.fed, the sequence up to the root)
        steps = drafter_levels(tree)
        record_draft_step(self.drafter, (time.perf_counter() - start) / steps)
        return tree

    def close(self):
        self.cache = None
        steps = self.ctx.stats.steps()  # this call's acceptance: what the next call's first catch-up expects
        record_accept_rate(self.drafter, steps["drafted"], steps["accepted"])
        self.fed = []


def random_sibling(target: torch.nn.Module, seed: int = 100, **overrides: Any) -> torch.nn.Module:
    """Another random model with ``target``'s architecture and vocabulary (``overrides`` set in its config), seeded
    with ``seed``: a real, mostly wrong drafter for tests."""
    config = copy.deepcopy(target.config)
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = type(target)(config).eval()
    model.generation_config = copy.deepcopy(target.generation_config)
    return model


def copy_of(target: torch.nn.Module) -> torch.nn.Module:
    """A model of ``target``'s class with its weights and nothing installed on it (hooks, an enabled
    ``generate``): a drafter that is always right."""
    clone = type(target)(copy.deepcopy(target.config))
    clone.load_state_dict(target.state_dict())
    clone.generation_config = copy.deepcopy(target.generation_config)
    param = next(target.parameters())
    return clone.to(device=param.device, dtype=param.dtype).eval()



def _device_of(model: torch.nn.Module) -> torch.device:
    hook = getattr(model, "_hf_hook", None)
    if hook is not None and getattr(hook, "execution_device", None) is not None:
        return torch.device(hook.execution_device)
    return next(model.parameters()).device


def _vocab_size(model: torch.nn.Module) -> int:
    return int(compat.text_config(model.config).vocab_size)


def _local_tokenizer(model: torch.nn.Module) -> Any:
    """The tokenizer saved beside a model loaded from a local folder (never downloads), or ``None`` when there is none
    or it cannot be read (no evidence either way). The folder may be a stranger's (a draft model a spec names): its
    files pass the checks of ``saved_tokenizers.read_tokenizer`` (a link out of the folder, a FIFO, a file over its cap,
    a ``tokenizer_config.json`` key naming a file elsewhere: none of them is read)."""
    path = getattr(model, "name_or_path", "") or ""
    if not os.path.isdir(path) or not any(
        os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")
    ):
        return None
    from transformers import AutoTokenizer

    try:
        if os.path.lexists(os.path.join(path, "tokenizer_config.json")):
            return read_tokenizer(Path(path), "the tokenizer saved beside the model", "save it again")
        for name in TOKENIZER_FILES:  # no tokenizer_config.json, so no key of it names a file: the files themselves
            integrity.folder_file(path, name, "the tokenizer saved beside the model")
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception:  # an unreadable or refused tokenizer is no evidence either way
        return None


def check_same_vocabulary(target, draft, target_tokenizer=None, draft_tokenizer=None) -> None:
    """Raise ``ValueError`` unless the two models, ``target`` and the ``draft`` model, share a vocabulary (token id ->
    text).

    lm_heads padded beyond the tokenizer (Qwen's 151936 rows) are fine: ids the tokenizer never
    produces cannot be drafted against the target's will.
    """
    target_tokenizer = target_tokenizer or _local_tokenizer(target)
    draft_tokenizer = draft_tokenizer or _local_tokenizer(draft)
    names = f"target {getattr(target, 'name_or_path', type(target).__name__)!r} and drafter {getattr(draft, 'name_or_path', type(draft).__name__)!r}"
    if target_tokenizer is not None and draft_tokenizer is not None:
        target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        mismatched = [tok for tok, i in draft_vocab.items() if target_vocab.get(tok, i) != i]
        mismatched += [tok for tok in draft_vocab if tok not in target_vocab]
        if mismatched:
            raise ValueError(
                f"The tokenizers of the {names} differ ({len(mismatched)} tokens, e.g. {mismatched[:3]}): a "
                "draft model must share the target's tokenizer, or be given both to draft across tokenizers: "
                "DraftModel(draft, tokenizer=draft_tok, target_tokenizer=target_tok)."
            )
        return
    target_size, draft_size = _vocab_size(target), _vocab_size(draft)
    if target_size != draft_size:
        raise ValueError(
            f"The vocabularies of the {names} differ in size ({target_size} vs {draft_size}): pass both "
            "tokenizers, DraftModel(..., tokenizer=draft_tok, target_tokenizer=target_tok), to draft across "
            "tokenizers (or, if they are one tokenizer and an lm_head is padded, for a full check)."
        )
    for field in ("eos_token_id", "bos_token_id"):
        a, b = getattr(target.generation_config, field, None), getattr(draft.generation_config, field, None)
        if a is not None and b is not None and a != b:
            raise ValueError(
                f"The {names} disagree on {field} ({a} vs {b}); they do not share a tokenizer."
            )
