"""``hfs.DFlash``: DFlash block drafters (Chen et al. 2026) as a strategy and its per-call generator.

One drafter forward drafts a whole block: the window ``[anchor, mask x (B - 1)]`` after the last verified token
attends to the target's own hidden states on every verified token (the raw outputs of the layers
``target_layer_ids``, read through forward hooks) and to itself, and the target's lm_head turns its positions
1 .. B-1 into B-1 distributions, one per drafted position, all at once. A chain is their argmax (as long as the loop's
plan says it pays); a tree takes the top-k of each position under every node (Medusa's shape: the same children under
every parent, since a position's guess does not depend on the tokens before it in the block).

The drafter's context cache is kept in step with the verified text: only the features of verified tokens (the
prompt's, then the accepted path's of each verify forward, gathered along the accepted path of a tree) enter it, in
order, each once; nothing is ever rolled back (the window's keys and values are never stored).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import torch

from ... import compat
from ...core import regions
from ...core.chain_drafting import device_chain_length, draft_chain, host_chooses
from ...core.budget import Plan, Sizing
from ...core.costs import draft_price, record_draft_step
from ...core.features import VerifiedFeatures
from ...core.policy import check_chain_options
from ...cpu.kernel import WEIGHTS
from ...cpu.layout import follow_layout
from ...core.draft_guide import DraftGuide
from ...core.tree import DraftTree, Verdict
from ...core.tree_shapes import (DynamicTree, StaticTree, device_tree_levels, grow_dynamic_on_device,
                                 grow_paths_on_device, grow_tree, kept_paths)
from ...options import CheckedOnAssignment, shown
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..generator import TreeOrChainCandidateGenerator, check_network_once
from ..registry import Capabilities, ExampleNotApplicable, SpecFiles, example_label
from . import captured
from .model import DFlashDraftModel
from .static_drafting import open_static, window_embedding

PRETRAINED_DIR = Path(__file__).parent / "pretrained"


def pretrained_names() -> list[str]:
    """Targets for which a trained DFlash drafter ships with the package."""
    from ..checkpoints import shipped_names

    return shipped_names(PRETRAINED_DIR)


def _checkpoints() -> Any:
    """The DFlash checkpoint module (imported on use)."""
    from . import checkpoints

    return checkpoints


@dataclasses.dataclass(eq=False)
class DFlash(CheckedOnAssignment, DraftStrategy, method="dflash",
             capabilities=Capabilities(trees=True, batch=True, reads_target="features"),
             examples=("dflash", "dflash-tree"), live_fields=("network",),
             files=SpecFiles(network="checkpoint", subfolder="dflash", checkpoints=_checkpoints,
                             shipped_dir=PRETRAINED_DIR)):
    """Draft blocks with a DFlash network that reads the target's hidden states.

    Args:
        network (`DFlashDraftModel`): the network (see :meth:`from_pretrained`), on the target's device and dtype.
        num_tokens (`int`, defaults to 16): the longest chain; at most the network's ``block_size - 1``.
        confidence_threshold (`float`, defaults to 0.05): end a chain after a position the drafter gives less than this
            probability (0 disables).
        adaptive (`bool`, defaults to `True`): chains: draft a position only while its calibrated chance of acceptance
            pays for verifying it; trees: the node count per step follows the measured verify costs.
        draft_cost (`float`, *optional*): one drafter forward in target forwards; measured by default.
        tree (`StaticTree` or `DynamicTree`, *optional*): draft a tree of each position's ranked guesses, verified in
            one forward by hf_speculative's loop (``StaticTree`` rank paths: depth ``d`` is position ``d``'s guess of
            that rank; ``DynamicTree``: the likeliest nodes, the same guesses under every parent). ``None``: chains.
        kernel_weights (`str`, defaults to `"int8"`): on a target that runs hf_speculative's CPU kernel
            (``hfs.optimize_for_cpu(target)``), the network's products run there too, its kernel copies holding
            `"int8"` weights with one scale per output column (a quarter of the fp32 bytes; the drafts may change a
            little, the output not at all) or `"exact"` ones. SmolLM2's shipped drafter on an AVX2 CPU, 8 Spec-Bench
            prompts, blocks of 8 (``benchmarks/dflash_kernel_weights.py``): a median 16.9 ms a draft (int8) and 17.2
            (exact) against 23.1 on PyTorch's products, τ 1.248 / 1.251 / 1.251. Elsewhere it does nothing. The
            network is shared: the last call's setting holds for it.
    """

    network: DFlashDraftModel = dataclasses.field(repr=False)
    num_tokens: int = 16
    confidence_threshold: float = 0.05
    adaptive: bool = True
    draft_cost: float | None = None
    tree: StaticTree | DynamicTree | None = None
    kernel_weights: str = "int8"

    def __post_init__(self):
        if not isinstance(self.network, DFlashDraftModel):
            raise TypeError(f"DFlash(network=...) needs a DFlashDraftModel (use hfs.DFlash.from_pretrained(path, "
                            f"target=model)), got {type(self.network).__name__}.")
        check_chain_options(self)
        if self.tree is not None and not isinstance(self.tree, (StaticTree, DynamicTree)):
            raise ValueError(f"DFlash(tree={shown(self.tree)}): use hfs.StaticTree(paths), hfs.DynamicTree(...) or "
                             "None for chains.")
        if self.kernel_weights not in WEIGHTS:
            raise ValueError(f"DFlash(kernel_weights={shown(self.kernel_weights)}): use one of {WEIGHTS}.")
        block = self.network.config.block_size
        if isinstance(self.tree, StaticTree) and self.tree.depth > block - 1:
            raise ValueError(f"DFlash(tree=...): the tree is {self.tree.depth} deep but the network drafts "
                             f"{block - 1} positions (block_size {block}); drop the deeper rank paths.")

    @classmethod
    def from_pretrained(cls, path_or_name: str | os.PathLike, target: torch.nn.Module | None = None, *,
                        sha256: dict[str, str] | None = None, **options: Any) -> DFlash:
        """Load a drafter: a folder in transformers'/Meta's format (``model_type: "muse_glimmer_assistant"``) or
        z-lab's (``architectures: ["DFlashDraftModel"]``), safetensors only, no remote code (see ``checkpoints.py``);
        or the name of a target whose drafter ships with hf_speculative
        (``hfs.DFlash.from_pretrained("smollm2-135m-instruct", target=model)``).

        Args:
            path_or_name (`str`): the folder (``huggingface_hub.snapshot_download("z-lab/Qwen3-8B-DFlash-b16")``
                gives one), or a name from ``pretrained_names()``.
            target (`PreTrainedModel`, *optional*): the model it drafts for; gives the device and dtype, and is checked
                against the drafter (hidden size, vocabulary and mask id, layer ids).
            sha256 (`dict[str, str]`, *optional*): expected digests of the folder's files.
            **options: ``num_tokens``, ``confidence_threshold``, ``adaptive``, ``draft_cost``, ``tree``.
        """
        from ..checkpoints import find_folder
        from . import checkpoints

        path = find_folder(
            path_or_name, PRETRAINED_DIR, owner="DFlash.from_pretrained", argument="path_or_name",
            missing=f"No DFlash drafter at {str(path_or_name)!r}: give a folder with config.json and model.safetensors "
            "(train one with `hf-speculative train-dflash`, or e.g. huggingface_hub.snapshot_download("
            f"'z-lab/Qwen3-8B-DFlash-b16')), or one of the shipped drafters {pretrained_names()}.")
        param = None if target is None else next(target.parameters())
        net = checkpoints.load_drafter(path, dtype=None if param is None else param.dtype,
                                       target_config=None if target is None else target.config, sha256=sha256)
        if param is not None:
            net.to(param.device)
        strategy = cls(network=net, **options)
        if target is not None:
            strategy.validate_target(target)
            follow_layout(net, target, strategy.kernel_weights)  # after hfs.optimize_for_cpu(target): the kernel
        return strategy

    def save_pretrained_network(self, directory: str | os.PathLike):
        """Write the network in z-lab's format (``config.json``, ``model.safetensors``), which vLLM and SGLang load."""
        from .checkpoints import save_pretrained

        return save_pretrained(self.network, directory)

    def validate_target(self, target: torch.nn.Module) -> None:
        check_network_once(target, self.network, lambda t: check_fits(self.network, t), "The DFlash drafter",
                           "network")

    def open(self, ctx: CallContext) -> DFlashCandidateGenerator:
        # a target laid out since from_pretrained, or another kernel_weights: the network follows (else nothing)
        follow_layout(self.network, ctx.target, self.kernel_weights)
        return DFlashCandidateGenerator(ctx, self)

    # -- its spec (hf/spec.py) and its examples ----------------------------------------------------------
    def spec_network(self) -> DFlashDraftModel:
        return self.network

    @classmethod
    def load_network(cls, method: str, folder: Any, target: torch.nn.Module) -> DFlash:
        return cls.from_pretrained(folder, target=target)

    @classmethod
    def from_spec_options(cls, method: str, options: dict, network: Any = None) -> DFlash:
        return dataclasses.replace(network, **options)

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> DFlash:
        """A random network (:func:`random_network`) drafting at every step: ``"dflash"`` chains of its 5 positions,
        ``"dflash-tree"`` a static tree 3 wide at the top."""
        tree = None
        if example_label(cls, label) == "dflash-tree":
            tree = StaticTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)])
        settings = {"tree": tree, "num_tokens": 5, "confidence_threshold": 0.0, "adaptive": False}
        return cls(**{"network": random_network(target), **settings, **options})


def check_fits(net: DFlashDraftModel, target: Any) -> None:
    """Raise a ValueError unless ``net`` fits ``target`` (``DFlashConfig.check_target``) and its draft vocabulary,
    if any, holds target ids only."""
    net.config.check_target(target)
    if net.draft_vocab is not None:
        vocab = int(compat.text_config(getattr(target, "config", target)).vocab_size)
        highest = int(net.draft_vocab.max())
        if highest >= vocab:
            raise ValueError(f"This DFlash drafter's draft vocabulary holds the id {highest}, outside the target's "
                             f"vocabulary of {vocab}: it was made for another tokenizer. Use the draft_vocab."
                             "safetensors saved with this drafter, or none (drafter.network.set_draft_vocab(None)).")


def random_network(target: torch.nn.Module, seed: int = 7, scale: float = 0.3, **fields: Any) -> DFlashDraftModel:
    """A random DFlash network shaped for ``target`` (its hidden size and vocabulary, layers before its last, the mask
    id its last token id, a block of 6), weights ~ N(0, scale) seeded with ``seed``: the matrix's examples."""
    from ... import compat
    from .config import DFlashConfig

    if int(compat.text_config(target.config).num_hidden_layers) < 2:
        raise ExampleNotApplicable("a DFlash drafter reads a layer before the target's last; this target has one")
    torch.manual_seed(seed)
    net = DFlashDraftModel(DFlashConfig.for_target(target.config, **{"block_size": 6, **fields}))
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "norm" not in name:
                p.normal_(0, scale)
    param = next(target.parameters())
    return net.to(device=param.device, dtype=param.dtype).eval().requires_grad_(False)


class DFlashCandidateGenerator(TreeOrChainCandidateGenerator):
    """Per-call state: the target's verified features, the drafter's context cache, the sizing.

    Invariant between forwards: the context cache holds positions ``[0, n_ctx)``; ``features.pending`` holds the
    verified features of ``[n_ctx, L - 1)`` (``L`` = verified length; the newest token, the next anchor, has none
    until the next target forward). Drafting feeds the pending ones and runs the window at ``L - 1 .. L - 2 + B``.
    Under ``hfs.enable(model, compile=...)`` (no processors, no sampler) the context cache is ``static``'s fixed-shape
    one instead, and each step is one captured region and one read (``static_drafting``, ``captured``).
    """

    def __init__(self, ctx: CallContext, config: DFlash):
        super().__init__(ctx)
        self.config = config
        self.net = config.network
        net_config = self.net.config
        self.features = VerifiedFeatures(ctx.target, net_config.target_layer_ids, view=ctx.view)
        self.embed = ctx.target.get_input_embeddings()
        self.head = ctx.target.get_output_embeddings()
        self.cache = self.net.new_cache()
        self.n_ctx = 0
        self.drafted = net_config.drafted  # positions one forward drafts
        tree = config.tree
        nodes = 0 if tree is None else (tree.nodes if isinstance(tree, DynamicTree) else tree.size)
        tokens = min(config.num_tokens, self.drafted)
        self.verify_costs = ctx.verify_costs(max(tokens, nodes))
        self.sizing = Sizing(self.verify_costs, tokens=tokens, nodes=nodes, rule="confidence",
                             adaptive=config.adaptive, confidence_threshold=config.confidence_threshold,
                             draft_price=self._draft_price, chain_option=True,
                             draft_steps=None if tree is None else (lambda m: 1))
        self.static = self._open_static(ctx)

    def _open_static(self, ctx: CallContext):
        """Fixed-shape drafting (``static_drafting``, its steps drafted by ``captured`` regions) when the target is
        compiled and the device chooses the tokens; else ``None`` (eager drafting, as without compile=)."""
        from ...core.static_cache import compiled_mode

        mode = compiled_mode(ctx.target)
        if mode is None or host_chooses(ctx):
            return None
        return open_static(ctx.target, self.net, mode, vocab_size=ctx.vocab_size, max_length=ctx.max_length)

    def _draft_price(self) -> float:
        # until measured: a few layers over one block against a whole model
        return draft_price(self.net, self.verify_costs, self.config.draft_cost, 0.1)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The window's embeddings `[1, B, H]` (``static_drafting.window_embedding``)."""
        return window_embedding(self.net, self.embed, ids)

    def _pending(self, sequence: torch.LongTensor) -> tuple[bool, torch.Tensor | None]:
        """Whether the features are in step with ``sequence`` `[1, L]`, and the pending ones `[1, P, F]` (positions
        ``n_ctx .. L - 2``), taken from the queue."""
        pending = self.features.pop()
        fed = 0 if pending is None else pending.shape[1]
        if self.n_ctx + fed != sequence.shape[1] - 1:  # a forward not seen: features and tokens no longer line up
            self.features.lost = True
            return False, None
        return True, pending

    def window_logits(self, sequence: torch.LongTensor, depth: int | None = None,
                      full: int | None = None) -> torch.Tensor | None:
        """One drafter forward after ``sequence`` `[1, L]`: the logits of positions ``L .. L + D - 1`` over the
        target's vocabulary, `[D, V]` (float32), ``D = depth`` (default: all ``B - 1``); ``None`` when the features
        are not in step. The target's lm_head over a position costs more than the drafter's layers over the whole
        window, so only the positions a step can use go through it, in one call. ``full``: on the fixed-shape step,
        the depth of a step away from the call's end, whose region a last step runs (and keeps ``D`` rows of)."""
        length = sequence.shape[1]
        ok, pending = self._pending(sequence)  # [1, P, F]: positions n_ctx .. L - 2
        if not ok:
            return None
        start = time.perf_counter()
        device = sequence.device
        depth = self.drafted if depth is None else max(1, min(depth, self.drafted))
        if self.static is not None:  # the fixed-shape step (the host chooses this step's tokens)
            widest = depth if full is None else max(depth, min(full, self.drafted))
            logits = captured.window_logits(self.static, sequence[0, -1:], pending, self.n_ctx, widest)  # [D', V]
            logits = logits if widest == depth else logits[:depth]  # a last step's rows (no op a step otherwise)
        else:
            mask = torch.full((1, self.drafted), self.net.config.mask_token_id, dtype=torch.long, device=device)
            window = self._embed(torch.cat([sequence[:, -1:], mask], dim=1))  # [1, B, H]
            positions = torch.arange(self.n_ctx, length - 1 + self.drafted + 1, device=device)[None]  # [1, P + B]
            hidden = self.net(window, pending, positions, self.cache)  # [1, B, H]
            logits = self.net.draft_logits(hidden[:, : depth + 1], self.head)[0]  # [D, V] or [D, N]
            logits = self._to_target_vocab(logits, self.net.draft_vocab)  # [D, V]
        self.n_ctx = length - 1
        record_draft_step(self.net, time.perf_counter() - start)
        return logits

    def _captured(self, sequence: torch.LongTensor, draft) -> DraftTree:
        """The step drafted by a captured region: ``draft(anchor [1], pending [1, P, F], first)`` (``captured``)
        after the features pending since the last step."""
        ok, pending = self._pending(sequence)
        if not ok:
            return DraftTree.empty(sequence.device)
        tree = draft(sequence[0, -1:], pending, self.n_ctx)
        self.n_ctx = sequence.shape[1] - 1
        return tree

    @torch.no_grad()
    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        if self.features.lost or self.features.empty:
            return DraftTree.empty(sequence.device)  # before the prefill there are no features yet
        return super().draft(sequence, plan)

    def _chain(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        if not plan.start_chain():
            return DraftTree.empty(sequence.device)
        # every position the chain may reach through the lm_head at once: one pass over its weight (on a CPU a
        # 49k-row lm_head is read from memory once per call, so row by row costs as many passes as rows)
        length = min(plan.depth, self.sizing.tokens, self.drafted)
        if self.static is not None:
            tree = self._static_chain(sequence, plan, length, min(plan.full_depth, self.sizing.tokens, self.drafted))
            if tree is not None:
                return tree
        logits = self.window_logits(sequence, length, min(plan.full_depth, self.sizing.tokens))
        if logits is None:
            return DraftTree.empty(sequence.device)
        depth = iter(range(1, length))
        # the block's positions do not depend on the drafted tokens: the next one is already there
        return draft_chain(plan, self.ctx, sequence, logits[0], length, lambda token: logits[next(depth)],
                           on_device=True)

    def _static_chain(self, sequence: torch.LongTensor, plan: Plan, length: int, full: int) -> DraftTree | None:
        """The chain in one captured region where its length is fixed, or under the cost rules on a device where a
        region's extra positions cost less than a read per token (its longest length, the rules replayed after the
        read, as EAGLE's ``_static_chain``); ``None``: drafted from the window's logits on the host. The region is
        sized by ``full`` (``length`` away from the call's end), the chain kept within ``length``."""
        chain = device_chain_length(plan, self.ctx, length)
        ask = chain is None and regions.replays_longest_chain(self.static.device)
        if ask:
            chain = plan.longest_chain(length)
        widest = plan.region_chain(full, ask) if chain else 0
        run = captured.chain_region(self.static, widest) if chain else None
        if run is None:
            return None
        return self._captured(sequence, lambda anchor, pending, first: captured.captured_chain(
            self.static, run, self.net, plan, anchor, pending, first, widest, ask, keep=chain))

    def _static_tree(self, sequence: torch.LongTensor, nodes: int, depth: int, full: int) -> DraftTree | None:
        """The tree in one captured region (``captured``) of the shape of a step away from the call's end (``full``
        deep), kept ``depth`` deep; ``None`` where no region drafts it (past ``MAX_REGIONS`` shapes, or no rank path
        within ``full``)."""
        shape = self.config.tree
        if isinstance(shape, StaticTree):
            paths = kept_paths(shape.paths, full)
            run = captured.paths_region(self.static, paths) if paths else None
            draft = (lambda anchor, pending, first: captured.captured_paths(
                self.static, run, self.net, paths, anchor, pending, first, depth if depth < full else None))
        else:
            run = captured.dynamic_region(self.static, shape, nodes, device_tree_levels(shape, nodes, full))
            draft = (lambda anchor, pending, first: captured.captured_dynamic(
                self.static, run, self.net, anchor, pending, first, device_tree_levels(shape, nodes, depth)))
        return None if run is None else self._captured(sequence, draft)

    def _tree(self, sequence: torch.LongTensor, nodes: int, plan: Plan) -> DraftTree:
        """Each depth's guesses under every node of the level above (one forward for the whole tree)."""
        depth = min(plan.depth, self.drafted)
        if self.static is not None:
            tree = self._static_tree(sequence, nodes, depth, min(plan.full_depth, self.drafted))
            if tree is not None:
                return tree
        logits = self.window_logits(sequence, depth, plan.full_depth)
        if logits is None:
            return DraftTree.empty(sequence.device)
        logits = logits.float()  # [D, V]
        shape = self.config.tree
        if not host_chooses(self.ctx):  # no processors: the tree grows on the device, one read
            if isinstance(shape, StaticTree):
                tree = grow_paths_on_device(shape.paths, logits, depth)
            else:  # the same logits under every node of a level
                tree = grow_dynamic_on_device(shape, logits[0], lambda frontier, tokens, parents, level:
                                              logits[level + 1].expand(frontier.shape[0], -1), nodes, depth)
            return tree if tree.tokens.device == sequence.device else DraftTree(
                tree.tokens.to(sequence.device), tree.parents.to(sequence.device))
        level = 0

        def expand(frontier: list[int], tokens: torch.Tensor, parents: list[int]) -> torch.Tensor:
            nonlocal level  # shapes expand one level at a time, from the root's children down
            level += 1
            # the same logits under every parent (the grower processes them with each one's own branch)
            return logits[level].expand(len(frontier), -1)  # [k, V]

        tree = grow_tree(self.config.tree, logits[0], expand, nodes, depth,
                         DraftGuide(self.ctx.logits_processor, sequence))  # the call's processors per node
        return dataclasses.replace(tree, tokens=tree.tokens.to(sequence.device),
                                   parents=tree.parents.to(sequence.device))

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        """Queue the target's features of the verified rows (the accepted path of any drafter's tree)."""
        self.features.follow_tree(sequence.shape[1], tree.size, list(verdict.path))

    def close(self) -> None:
        self.features.close()
        self.cache = self.net.new_cache()
        if self.static is not None:
            self.static.close()
